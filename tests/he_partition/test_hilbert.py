"""Hilbert flattening of 2-D grids: a bijection with adjacency, aligned squares contiguous, rectangles as ranges."""

from __future__ import annotations

import numpy as np
import pytest

from he_partition import release
from he_partition.core.errors import InvalidInputError
from he_partition.strategies.hilbert import (
    flatten,
    hilbert_order,
    rectangle_count,
    rectangle_ranges,
    rectangle_weights,
    unflatten,
)


@pytest.mark.parametrize("k", [0, 1, 2, 3, 5])
def test_curve_is_a_path_through_aligned_squares(k):
    perm = hilbert_order(k)
    side = 1 << k
    assert sorted(perm.tolist()) == list(range(side * side))
    r, c = np.divmod(perm, side)
    if side > 1:
        assert np.all(np.abs(np.diff(r)) + np.abs(np.diff(c)) == 1)  # consecutive cells are neighbours
    for j in range(k + 1):  # every aligned 2^j x 2^j square is one run of 4^j cells
        blk, s = 4**j, 1 << j
        rr, cc = r.reshape(-1, blk), c.reshape(-1, blk)
        assert np.all(rr.max(1) - rr.min(1) == s - 1) and np.all(cc.max(1) - cc.min(1) == s - 1)


def test_flatten_round_trip_and_errors():
    g = np.arange(64).reshape(8, 8)
    assert np.array_equal(unflatten(flatten(g)), g)
    with pytest.raises(InvalidInputError, match="2\\^k"):
        flatten(np.zeros((6, 6)))
    with pytest.raises(InvalidInputError, match="square"):
        flatten(np.zeros((4, 8)))


def test_rectangles_as_ranges():
    k = 4
    for r0, r1, c0, c1 in [(0, 16, 0, 16), (3, 9, 2, 15), (5, 6, 7, 8), (0, 1, 0, 16)]:
        ranges = rectangle_ranges(r0, r1, c0, c1, k)
        w = np.zeros(256)
        for lo, hi in ranges:
            w[lo:hi] = 1
        assert np.array_equal(w, rectangle_weights(r0, r1, c0, c1, k))
        assert w.sum() == (r1 - r0) * (c1 - c0)
        assert np.all(ranges[1:, 0] > ranges[:-1, 1])  # disjoint, sorted, maximal runs
    assert len(rectangle_ranges(0, 16, 0, 16, k)) == 1
    with pytest.raises(InvalidInputError, match="inside"):
        rectangle_ranges(0, 17, 0, 1, k)


def test_rectangle_count_from_a_release():
    rng = np.random.default_rng(0)
    grid = rng.integers(0, 5, (32, 32)) * (rng.random((32, 32)) < 0.3)
    s = release([flatten(grid)], 1.0, rng=2)
    rc = rectangle_count(s, 4, 20, 3, 30)
    est = unflatten(s.estimate())
    assert rc.value == pytest.approx(est[4:20, 3:30].sum())
    assert rc.standard_error == pytest.approx(s.weighted_count(rectangle_weights(4, 20, 3, 30, 5))[1])
    exact = release([flatten(grid)], 1e6, strategy="hier", rng=2)  # negligible noise
    assert rectangle_count(exact, 4, 20, 3, 30).value == pytest.approx(grid[4:20, 3:30].sum(), abs=1e-3)
