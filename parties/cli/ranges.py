"""`--range` for `query` and `direct-query`: bin ranges (LO:HI) or value ranges (COLUMN=LO:HI), and their labels."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Sequence

from he_partition.core.errors import InvalidInputError

from ..analyst.value_ranges import ValueRange, parse_range, resolve_ranges as _resolve

if TYPE_CHECKING:
    from ..data_owner.domain import DomainSpec

__all__ = ["ValueRange", "range_arg", "resolve_ranges", "range_label", "CUT_NOTE"]

#: Printed once under range answers flagged "*": what their +- leaves out.
CUT_NOTE = ("* the range cuts a partition of the release: its part of that partition is estimated as an even share "
            "of the partition's sum, a bias the +- (noise only) does not cover")


def range_arg(text: str) -> tuple[int, int] | ValueRange:
    """Parse `--range`: LO:HI are bin indices [LO, HI); COLUMN=LO:HI are values [LO, HI) of the domain."""
    try:
        return parse_range(text)
    except InvalidInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def resolve_ranges(ranges: Sequence[tuple[int, int] | ValueRange], domain: "DomainSpec | None",
                   study_id: str) -> list[tuple[int, int]]:
    """Bin ranges for the server: value ranges become the bins they cover exactly (else a clear error)."""
    return _resolve(ranges, domain, f"study {study_id}")


def range_label(lo: int, hi: int, domain: "DomainSpec | None") -> str:
    """`bins [lo, hi)`, and the values they hold when the domain is known: `bins [2, 4) = age in [20, 40)`."""
    where = f"bins [{lo}, {hi})"
    if domain is None or not 0 <= lo < hi <= domain.n_bins:
        return where
    return f"{where} = {domain.describe_range(lo, hi)}"
