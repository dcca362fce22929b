"""2-D grids as 1-D domains: flattening along a Hilbert curve, rectangles as sets of 1-D ranges.

Along a Hilbert curve every aligned 2^j x 2^j square is one contiguous run of 4^j cells, so
contiguous 1-D partitions are compact 2-D regions and a b-ary tree with b a power of 4
(e.g. the default b = 16) is a quadtree. A rectangle becomes a union of 1-D ranges; its
count and standard error come from `Summary.weighted_count` (the ranges' noise is
correlated, so it is not a sum of per-range variances).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import numpy.typing as npt

from ..core.errors import InvalidInputError
from ..core.summary import Summary

__all__ = [
    "hilbert_index",
    "hilbert_order",
    "flatten",
    "unflatten",
    "rectangle_ranges",
    "rectangle_weights",
    "RectangleCount",
    "rectangle_count",
    "grid_order",
]

IntArray = npt.NDArray[np.int64]


def grid_order(side: int) -> int:
    """k with side == 2^k (the curve's order); refuses other sizes."""
    if side < 1 or side & (side - 1):
        raise InvalidInputError(f"a Hilbert grid must be 2^k x 2^k, got side {side}")
    return side.bit_length() - 1


def hilbert_index(row: npt.ArrayLike, col: npt.ArrayLike, order: int) -> IntArray:
    """Position along the Hilbert curve of order k (side 2^k) of cells (row, col); vectorised."""
    x = np.array(col, dtype=np.int64, copy=True)
    y = np.array(row, dtype=np.int64, copy=True)
    side = 1 << order
    if np.any((x < 0) | (x >= side) | (y < 0) | (y >= side)):
        raise InvalidInputError(f"cells must lie in [0, {side}) x [0, {side})")
    d = np.zeros(np.broadcast(x, y).shape, dtype=np.int64)
    s = side >> 1
    while s > 0:
        rx = ((x & s) > 0).astype(np.int64)
        ry = ((y & s) > 0).astype(np.int64)
        d += s * s * ((3 * rx) ^ ry)
        # Rotate the quadrant so the sub-curve has the canonical orientation.
        flip = (ry == 0) & (rx == 1)
        x = np.where(flip, side - 1 - x, x)
        y = np.where(flip, side - 1 - y, y)
        swap = ry == 0
        x, y = np.where(swap, y, x), np.where(swap, x, y)
        s >>= 1
    return d


def hilbert_order(order: int) -> IntArray:
    """perm with perm[d] = row-major index (row * side + col) of the d-th cell along the curve."""
    side = 1 << order
    rows, cols = np.divmod(np.arange(side * side, dtype=np.int64), side)
    d = hilbert_index(rows, cols, order)
    perm = np.empty(side * side, dtype=np.int64)
    perm[d] = np.arange(side * side, dtype=np.int64)
    return perm


def flatten(grid: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """A 2^k x 2^k grid of counts as a 1-D histogram along the Hilbert curve."""
    g = np.asarray(grid)
    if g.ndim != 2 or g.shape[0] != g.shape[1]:
        raise InvalidInputError(f"expected a square 2-D grid, got shape {g.shape}")
    k = grid_order(g.shape[0])
    return np.asarray(g).reshape(-1)[hilbert_order(k)]


def unflatten(values: npt.ArrayLike, order: int | None = None) -> npt.NDArray[np.float64]:
    """Inverse of `flatten` (e.g. for per-bin estimates)."""
    v = np.asarray(values)
    if order is None:
        order = grid_order(int(round(np.sqrt(v.size))))
    side = 1 << order
    if v.size != side * side:
        raise InvalidInputError(f"expected {side * side} values for a {side} x {side} grid, got {v.size}")
    out = np.empty(side * side, dtype=v.dtype)
    out[hilbert_order(order)] = v
    return out.reshape(side, side)


def _check_rect(r0: int, r1: int, c0: int, c1: int, side: int) -> None:
    if not (0 <= r0 < r1 <= side and 0 <= c0 < c1 <= side):
        raise InvalidInputError(f"rectangle rows [{r0}, {r1}) x cols [{c0}, {c1}) must lie inside a {side} grid")


def rectangle_ranges(r0: int, r1: int, c0: int, c1: int, order: int) -> IntArray:
    """Rows [r0, r1) x cols [c0, c1) as disjoint, sorted 1-D ranges [lo, hi) along the curve."""
    side = 1 << order
    _check_rect(r0, r1, c0, c1, side)
    rows, cols = np.meshgrid(np.arange(r0, r1), np.arange(c0, c1), indexing="ij")
    d = np.sort(hilbert_index(rows.ravel(), cols.ravel(), order))
    breaks = np.flatnonzero(np.diff(d) != 1) + 1
    lo = d[np.concatenate([[0], breaks])]
    hi = d[np.concatenate([breaks - 1, [d.size - 1]])] + 1
    return np.stack([lo, hi], axis=1)


def rectangle_weights(r0: int, r1: int, c0: int, c1: int, order: int) -> npt.NDArray[np.float64]:
    """0/1 indicator, over the flattened domain, of a rectangle."""
    side = 1 << order
    _check_rect(r0, r1, c0, c1, side)
    w = np.zeros((side, side))
    w[r0:r1, c0:c1] = 1.0
    return w.reshape(-1)[hilbert_order(order)]


@dataclass(frozen=True)
class RectangleCount:
    """An estimated count over rows [r0, r1) x cols [c0, c1) and the standard error of its noise."""

    rows: tuple[int, int]
    cols: tuple[int, int]
    value: float
    standard_error: float


def rectangle_count(summary: Summary, r0: int, r1: int, c0: int, c1: int) -> RectangleCount:
    """Count of a rectangle from a summary released over a Hilbert-flattened grid."""
    k = grid_order(int(round(np.sqrt(summary.domain_size))))
    if (1 << (2 * k)) != summary.domain_size:
        raise InvalidInputError(f"summary has {summary.domain_size} bins, not a 2^k x 2^k grid")
    value, se = summary.weighted_count(rectangle_weights(r0, r1, c0, c1, k))
    return RectangleCount((r0, r1), (c0, c1), value, se)


def rectangle_counts(summary: Summary, rects: Sequence[tuple[int, int, int, int]]) -> list[RectangleCount]:
    return [rectangle_count(summary, *r) for r in rects]
