"""The agreed histogram domain: which CSV column, and how its values map to bins (`DomainSpec`).

The grammar (`column:lo:hi:n_bins`, `column:edges:...`, `column:categories:...`) is the one the
study contract records (`domain_spec`, see proto/dpagg/v1/common.proto); the data owner bins its
records with it (`dataset.read_histogram`), the CLI and the analyst's tables read ranges and labels
from it. Pure: numpy and the standard library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import numpy.typing as npt

from he_partition.core.errors import InvalidInputError

__all__ = ["DomainSpec"]

IntArray = npt.NDArray[np.int64]

_PARSE_HELP = (
    "use 'column:lo:hi:n_bins' (n_bins equal-width bins over [lo, hi)), "
    "'column:edges:e0,e1,...,ek' or 'column:categories:a,b,c'"
)


# --------------------------------------------------------------------------- domain
@dataclass(frozen=True)
class DomainSpec:
    """The agreed histogram domain: which CSV column, and how its values map to bins.

    Numeric domain: ``edges`` e_0 < e_1 < ... < e_k (finite) define k bins; bin i holds the
    values v with e_i <= v < e_{i+1}. Every bin is half-open, the last one included: a value
    equal to the upper edge e_k is **outside** the domain (so ``age:0:100:50`` counts ages in
    [0, 100); to include 100, use an upper edge above it, e.g. ``age:0:102:51``).
    Values below e_0, at or above e_k, and NaN map to -1 (out of domain).

    Categorical domain (`DomainSpec.categorical`): ``categories`` lists the k values in bin
    order and ``edges`` is (0, 1, ..., k); a value maps to the index of the category equal to
    ``str(value)``, anything else to -1.

    The domain is public and must be identical at every data owner: ``n_bins`` is the
    study's domain size.
    """

    column: str
    edges: tuple[float, ...]
    categories: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column.strip():
            raise InvalidInputError(f"the domain's column name must be a non-empty string, got {self.column!r}")
        try:
            edges = tuple(float(e) for e in self.edges)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"bin edges must be numbers, got {self.edges!r}") from exc
        if len(edges) < 2:
            raise InvalidInputError(f"a domain needs at least 2 bin edges (one bin), got {len(edges)}")
        _check_edges(np.asarray(edges, dtype=np.float64))  # whole-array checks: a million edges in milliseconds
        object.__setattr__(self, "edges", edges)
        if self.categories is not None:
            cats = tuple(self.categories)
            if not cats:
                raise InvalidInputError("a categorical domain needs at least one category")
            for c in cats:
                if not isinstance(c, str) or not c:
                    raise InvalidInputError(f"categories must be non-empty strings, got {c!r}")
            seen: set[str] = set()
            for c in cats:
                if c in seen:
                    raise InvalidInputError(f"category {c!r} is listed twice")
                seen.add(c)
            if edges != tuple(float(i) for i in range(len(cats) + 1)):
                raise InvalidInputError("a categorical domain's edges must be (0, 1, ..., number of categories)")
            object.__setattr__(self, "categories", cats)

    # -- constructors ------------------------------------------------------------------
    @classmethod
    def from_edges(cls, column: str, edges: Iterable[float]) -> "DomainSpec":
        """A numeric domain with explicit bin edges (>= 2, finite, strictly increasing)."""
        try:
            tup = tuple(edges)
        except TypeError as exc:
            raise InvalidInputError(f"bin edges must be a sequence of numbers, got {edges!r}") from exc
        return cls(column, tup)

    @classmethod
    def equal_width(cls, column: str, lo: float, hi: float, n_bins: int, *,
                    max_bins: int | None = None) -> "DomainSpec":
        """`n_bins` equal-width bins over [lo, hi); more than `max_bins` is refused before any edge is built."""
        return cls(column, tuple(_equal_width_edges(lo, hi, n_bins, max_bins).tolist()))

    @classmethod
    def categorical(cls, column: str, categories: Iterable[str]) -> "DomainSpec":
        """A categorical domain: bin i holds the records whose value equals categories[i]."""
        cats = tuple(categories)
        return cls(column, tuple(float(i) for i in range(len(cats) + 1)), cats)

    @classmethod
    def parse(cls, text: str, *, max_bins: int | None = None) -> "DomainSpec":
        """Parse a command-line domain spec; a spec of more than `max_bins` bins is refused before its edges
        are built (a 10^8-bin spec took half a minute and 5.7 GB to be refused after it was built).

        - ``"age:0:100:50"``: column ``age``, 50 equal-width bins over [0, 100);
        - ``"age:edges:0,18,65,120"``: explicit edges;
        - ``"sector:categories:retail,health,other"``: a categorical domain.

        The column name may itself contain ':' (the spec is split from the right).
        """
        if not isinstance(text, str):
            raise InvalidInputError(f"a domain spec must be a string, got {type(text).__name__}")
        parts = text.rsplit(":", 2)
        if len(parts) == 3 and parts[1] in ("edges", "categories"):
            column, kind, items = parts
            if max_bins is not None:  # count before splitting: k categories, or k + 1 edges for k bins
                _check_bins(items.count(",") + (1 if kind == "categories" else 0), max_bins)
            values = [v.strip() for v in items.split(",")]
            if kind == "categories":
                return cls.categorical(column, values)
            try:
                edges = [float(v) for v in values]
            except ValueError as exc:
                raise InvalidInputError(f"domain spec {text!r}: bin edges must be numbers ({exc})") from exc
            return cls.from_edges(column, edges)
        return cls.equal_width(*_equal_width_terms(text), max_bins=max_bins)

    @classmethod
    def count_bins(cls, text: str, *, max_bins: int | None = None) -> int:
        """The number of bins of `text`, refused exactly where `parse` refuses it, without building a
        `column:lo:hi:n_bins` spec's edges as Python numbers: what a contract checks its domain_spec with
        (a 4M-bin spec took seconds to parse, and every contract received parsed it again)."""
        if not isinstance(text, str):
            raise InvalidInputError(f"a domain spec must be a string, got {type(text).__name__}")
        parts = text.rsplit(":", 2)
        if len(parts) == 3 and parts[1] in ("edges", "categories"):  # the list is the text itself: parse it
            return cls.parse(text, max_bins=max_bins).n_bins
        column, lo, hi, n = _equal_width_terms(text)
        if not column.strip():
            raise InvalidInputError(f"the domain's column name must be a non-empty string, got {column!r}")
        _check_edges(_equal_width_edges(lo, hi, n, max_bins))
        return n

    # -- queries -----------------------------------------------------------------------
    @property
    def n_bins(self) -> int:
        """Number of bins: the study's domain size."""
        return len(self.edges) - 1

    def describe_range(self, lo: int, hi: int) -> str:
        """Bins [lo, hi) in the domain's own values, e.g. "age in [0, 20)" or "city in {a, b}"."""
        if self.categories is not None:
            shown = list(self.categories[lo:hi])
            more = f", ... ({hi - lo} values)" if len(shown) > 4 else ""
            return f"{self.column} in {{{', '.join(shown[:4])}{more}}}"
        return f"{self.column} in [{self.edges[lo]:g}, {self.edges[hi]:g})"

    @property
    def is_categorical(self) -> bool:
        return self.categories is not None

    def bin_of(self, values: Any) -> IntArray:
        """Bin index of each value (int64, same shape as `values`); -1 when outside the domain.

        Numeric: bin i is [e_i, e_{i+1}); values < e_0, >= e_k (the upper edge itself is
        outside) and NaN give -1. Categorical: the index of the category equal to
        ``str(value)``, else -1.
        """
        if self.categories is not None:
            index = {c: i for i, c in enumerate(self.categories)}
            arr = np.asarray(values, dtype=object)
            flat = [index.get(str(v), -1) for v in arr.ravel()]
            return np.asarray(flat, dtype=np.int64).reshape(arr.shape)
        try:
            vals = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(
                f"values of numeric column {self.column!r} must be numbers: {exc}"
            ) from exc
        edges = np.asarray(self.edges, dtype=np.float64)
        idx = np.searchsorted(edges, vals, side="right").astype(np.int64) - 1
        # NaN sorts after every edge, so it lands at n_bins like values >= the upper edge.
        return np.where((idx >= 0) & (idx < self.n_bins), idx, np.int64(-1))


def _equal_width_terms(text: str) -> tuple[str, float, float, int]:
    """(column, lo, hi, n_bins) of a `column:lo:hi:n_bins` spec; InvalidInputError naming what does not parse."""
    parts = text.rsplit(":", 3)
    if len(parts) != 4:
        raise InvalidInputError(f"cannot parse domain spec {text!r}: {_PARSE_HELP}")
    column, lo_s, hi_s, n_s = parts
    try:
        lo, hi = float(lo_s), float(hi_s)
    except ValueError as exc:
        raise InvalidInputError(f"domain spec {text!r}: lo and hi must be numbers; {_PARSE_HELP}") from exc
    try:
        n = int(n_s)
    except ValueError as exc:
        raise InvalidInputError(f"domain spec {text!r}: n_bins must be an integer, got {n_s!r}") from exc
    return column, lo, hi, n


def _equal_width_edges(lo: float, hi: float, n_bins: int, max_bins: int | None) -> npt.NDArray[np.float64]:
    """The n_bins + 1 edges of equal-width bins over [lo, hi), after the bounds and the bin count are checked."""
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise InvalidInputError(f"n_bins must be an integer >= 1, got {n_bins!r}")
    _check_bins(int(n_bins), max_bins)
    lo_f, hi_f = float(lo), float(hi)
    if not (math.isfinite(lo_f) and math.isfinite(hi_f)):
        raise InvalidInputError(f"domain bounds must be finite, got [{lo}, {hi})")
    if not hi_f > lo_f:
        raise InvalidInputError(f"the domain's upper bound must exceed its lower bound, got [{lo}, {hi})")
    return np.linspace(lo_f, hi_f, int(n_bins) + 1)


def _check_edges(edges: npt.NDArray[np.float64]) -> None:
    """Finite and strictly increasing, or InvalidInputError naming the first edge that is not."""
    bad = np.flatnonzero(~np.isfinite(edges))
    if bad.size:
        raise InvalidInputError(f"bin edges must be finite, got {float(edges[bad[0]])}")
    down = np.flatnonzero(~(edges[1:] > edges[:-1]))
    if down.size:
        i = int(down[0]) + 1
        raise InvalidInputError(f"bin edges must be strictly increasing, but edge {i} ({edges[i]:g}) <= edge {i - 1} "
                                f"({edges[i - 1]:g})")


def _check_bins(n: int, max_bins: int | None) -> None:
    if max_bins is not None and n > max_bins:
        raise InvalidInputError(f"the domain has {n:,} bins; a study holds 1 to {max_bins:,} bins")
