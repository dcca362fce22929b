"""`--range` for `query` and `direct-query`: bin ranges (LO:HI) or value ranges (COLUMN=LO:HI), and their labels."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from he_partition.core.errors import DPAggError

if TYPE_CHECKING:
    from ..data_owner.domain import DomainSpec

__all__ = ["ValueRange", "range_arg", "resolve_ranges", "range_label", "CUT_NOTE"]

#: Printed once under range answers flagged "*": what their +- leaves out.
CUT_NOTE = ("* the range cuts a partition of the release: its part of that partition is estimated as an even share "
            "of the partition's sum, a bias the +- (noise only) does not cover")


@dataclass(frozen=True)
class ValueRange:
    """`--range COLUMN=LO:HI`: the values [LO, HI) of the study's column; LO and HI must be bin edges."""

    column: str
    lo: float
    hi: float

    def __str__(self) -> str:
        return f"{self.column}={self.lo:g}:{self.hi:g}"


def range_arg(text: str) -> tuple[int, int] | ValueRange:
    """Parse `--range`: LO:HI are bin indices [LO, HI); COLUMN=LO:HI are values [LO, HI) of the domain."""
    column, sep, rest = text.partition("=")
    if not sep:
        try:
            lo, hi = (int(v) for v in text.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"a range is LO:HI (bin indices, HI exclusive) or COLUMN=LO:HI (values, "
                                             f"e.g. age=20:40), got {text!r}") from None
        return lo, hi
    try:
        lo_v, hi_v = (float(v) for v in rest.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a value range is COLUMN=LO:HI with numbers LO < HI (e.g. age=20:40), got "
                                         f"{text!r}") from None
    if not column.strip() or not (math.isfinite(lo_v) and math.isfinite(hi_v) and lo_v < hi_v):
        raise argparse.ArgumentTypeError(f"a value range is COLUMN=LO:HI with numbers LO < HI (e.g. age=20:40), got "
                                         f"{text!r}")
    return ValueRange(column.strip(), lo_v, hi_v)


def _edge_index(domain: "DomainSpec", value: float, given: ValueRange) -> int:
    for i, edge in enumerate(domain.edges):
        if math.isclose(edge, value, rel_tol=1e-9, abs_tol=1e-12):
            return i
    below = max((e for e in domain.edges if e < value), default=None)
    above = min((e for e in domain.edges if e > value), default=None)
    near = " or ".join(f"{e:g}" for e in (below, above) if e is not None)
    raise DPAggError(f"--range {given}: {value:g} is not a bin edge of the domain {domain.column} (answers cover whole "
                     f"bins; the nearest edges are {near}), or give bins as LO:HI")


def resolve_ranges(ranges: Sequence[tuple[int, int] | ValueRange], domain: "DomainSpec | None",
                   study_id: str) -> list[tuple[int, int]]:
    """Bin ranges for the server: value ranges become the bins they cover exactly (else a clear error)."""
    out: list[tuple[int, int]] = []
    for r in ranges:
        if not isinstance(r, ValueRange):
            out.append(r)
            continue
        if domain is None:
            raise DPAggError(f"--range {r}: study {study_id} records no domain spec, so its bins have no values; "
                             "give bin ranges LO:HI")
        if domain.is_categorical:
            raise DPAggError(f"--range {r}: {domain.column} is categorical; give bin ranges LO:HI")
        if r.column != domain.column:
            raise DPAggError(f"--range {r}: study {study_id} bins the column {domain.column!r}, not {r.column!r}")
        out.append((_edge_index(domain, r.lo, r), _edge_index(domain, r.hi, r)))
    return out


def range_label(lo: int, hi: int, domain: "DomainSpec | None") -> str:
    """`bins [lo, hi)`, and the values they hold when the domain is known: `bins [2, 4) = age in [20, 40)`."""
    where = f"bins [{lo}, {hi})"
    if domain is None or not 0 <= lo < hi <= domain.n_bins:
        return where
    return f"{where} = {domain.describe_range(lo, hi)}"
