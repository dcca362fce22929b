"""Ranges an analyst asks in bins (LO:HI) or in the study's values (COLUMN=LO:HI), and the domain a release records.

A value range becomes the bins it covers exactly: its ends must be bin edges of the study's domain,
which every release of a study with a domain spec records in its summary (`params["domain_spec"]`),
so the range resolves wherever the release is read (the computation server, `dpagg serve-analyst`
or a saved summary). Post-processing: nothing here spends budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from he_partition.core.errors import InvalidInputError

from ..data_owner.domain import DomainSpec

if TYPE_CHECKING:
    from he_partition.core.summary import Summary

__all__ = ["ValueRange", "RangeSpec", "parse_range", "resolve_ranges", "summary_domain", "has_value_ranges",
           "RANGE_HELP"]

RANGE_HELP = "a range is LO:HI (bin indices, HI exclusive) or COLUMN=LO:HI (values, e.g. age=20:40)"


@dataclass(frozen=True)
class ValueRange:
    """COLUMN=LO:HI: the values [LO, HI) of the study's column; LO and HI must be bin edges."""

    column: str
    lo: float
    hi: float

    def __str__(self) -> str:
        return f"{self.column}={self.lo:g}:{self.hi:g}"


#: What a caller may ask: bins (lo, hi), a ValueRange, or the text of either ("3:7", "age=20:40").
RangeSpec = tuple[int, int] | ValueRange | str


def parse_range(text: str) -> tuple[int, int] | ValueRange:
    """Parse LO:HI (bin indices [LO, HI)) or COLUMN=LO:HI (values [LO, HI) of the domain); InvalidInputError
    naming the accepted forms otherwise."""
    if not isinstance(text, str):
        raise InvalidInputError(f"{RANGE_HELP}; got {text!r}")
    column, sep, rest = text.partition("=")
    if not sep:
        try:
            lo, hi = (int(v) for v in text.split(":"))
        except ValueError:
            raise InvalidInputError(f"{RANGE_HELP}; got {text!r}") from None
        return lo, hi
    try:
        lo_v, hi_v = (float(v) for v in rest.split(":"))
    except ValueError:
        raise InvalidInputError(f"a value range is COLUMN=LO:HI with numbers LO < HI (e.g. age=20:40), got "
                                f"{text!r}") from None
    if not column.strip() or not (math.isfinite(lo_v) and math.isfinite(hi_v) and lo_v < hi_v):
        raise InvalidInputError(f"a value range is COLUMN=LO:HI with numbers LO < HI (e.g. age=20:40), got {text!r}")
    return ValueRange(column.strip(), lo_v, hi_v)


def _edge_index(domain: DomainSpec, value: float, given: ValueRange) -> int:
    for i, edge in enumerate(domain.edges):
        if math.isclose(edge, value, rel_tol=1e-9, abs_tol=1e-12):
            return i
    below = max((e for e in domain.edges if e < value), default=None)
    above = min((e for e in domain.edges if e > value), default=None)
    near = " or ".join(f"{e:g}" for e in (below, above) if e is not None)
    raise InvalidInputError(f"range {given}: {value:g} is not a bin edge of the domain {domain.column} (answers "
                            f"cover whole bins; the nearest edges are {near}), or give bins as LO:HI")


def has_value_ranges(ranges: Iterable[Any]) -> bool:
    """Whether any of `ranges` is asked in values (a ValueRange or the text COLUMN=LO:HI)."""
    return any(isinstance(r, ValueRange) or (isinstance(r, str) and "=" in r) for r in ranges)


def resolve_ranges(ranges: Sequence[Any], domain: DomainSpec | None, what: str) -> list[tuple[int, int]]:
    """Bin ranges for the server: text is parsed (`parse_range`), value ranges become the bins they cover
    exactly. `what` names where the domain would come from (e.g. "study ages" or "release r-1"), for the
    error when there is none."""
    out: list[tuple[int, int]] = []
    for raw in ranges:
        r = parse_range(raw) if isinstance(raw, str) else raw
        if not isinstance(r, ValueRange):
            try:
                lo, hi = (int(v) for v in r)
            except (TypeError, ValueError):
                raise InvalidInputError(f"{RANGE_HELP}, or a pair (lo, hi) of bin indices; got {raw!r}") from None
            out.append((lo, hi))
            continue
        if domain is None:
            raise InvalidInputError(
                f"range {r}: {what} records no domain spec, so its bins have no values (the study was opened "
                "without --domain, or the release was made before releases recorded their domain); give bin "
                "ranges LO:HI")
        if domain.is_categorical:
            raise InvalidInputError(f"range {r}: {domain.column} is categorical; give bin ranges LO:HI")
        if r.column != domain.column:
            raise InvalidInputError(f"range {r}: {what} bins the column {domain.column!r}, not {r.column!r}")
        out.append((_edge_index(domain, r.lo, r), _edge_index(domain, r.hi, r)))
    return out


def summary_domain(summary: "Summary") -> DomainSpec | None:
    """The domain a release records (`params["domain_spec"]`), or None when it records none or it does not
    match the release's size."""
    spec = summary.params.get("domain_spec")
    if not isinstance(spec, str) or not spec:
        return None
    try:
        domain = DomainSpec.parse(spec, max_bins=summary.domain_size)
    except InvalidInputError:
        return None
    return domain if domain.n_bins == summary.domain_size else None
