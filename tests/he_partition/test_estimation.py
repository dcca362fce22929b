"""Least-squares tree consistency and Haar transforms: exact against dense linear algebra."""

from __future__ import annotations

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from he_partition.core.estimation import (
    IntervalTree,
    haar_depth,
    haar_forward,
    haar_inverse_prefix,
    haar_nonnegative_prefix,
    haar_prefix_adjoint,
    range_weights,
)


def _dense_gls(n, parts, cells):
    """Reference GLS over the cells (unknowns), each measurement a sum of cells."""
    cs = np.asarray(cells)
    ce = np.append(cs[1:], n)
    rows, ys, ws = [], [], []
    for starts, values, var in parts:
        s = np.asarray(starts)
        e = np.append(s[1:], n)
        for a, b, v, vv in zip(s, e, values, np.broadcast_to(var, np.shape(values))):
            rows.append(((cs >= a) & (ce <= b)).astype(float))
            ys.append(v)
            ws.append(1.0 / vv)
    a_mat = np.array(rows)
    w = np.diag(ws)
    cov = np.linalg.inv(a_mat.T @ w @ a_mat)
    return cov @ a_mat.T @ w @ np.array(ys), cov


@pytest.fixture
def design():
    rng = np.random.default_rng(3)
    n = 37
    levels = [np.array([0]), np.array([0, 9, 20, 30]), np.array([0, 3, 9, 11, 15, 20, 25, 30, 33]), np.arange(n)]
    parts = [(s, rng.normal(size=s.size) * 10 + 50, rng.uniform(0.5, 3.0, size=s.size)) for s in levels]
    parts.append((levels[1], rng.normal(size=4) * 10, np.full(4, 2.0)))  # a node measured twice
    return n, parts, levels


def test_tree_matches_dense_gls(design):
    n, parts, levels = design
    tree = IntervalTree(n, parts)
    est, cov = _dense_gls(n, parts, levels[-1])
    assert np.allclose(tree.leaf_estimates(), est, atol=1e-9)
    lo, hi = np.array([0, 3, 5, 10, 0, 36]), np.array([37, 4, 30, 11, 1, 37])
    q = range_weights(levels[-1], n, lo, hi)
    assert np.allclose(tree.range_variance(lo, hi), np.einsum("ij,jk,ik->i", q, cov, q), atol=1e-12)
    assert np.allclose(tree.cell_variances(), np.diag(cov), atol=1e-12)


def test_tree_with_coarser_cells(design):
    """Cells coarser than the finest partition: spread evenly, the finer values still inform their sums."""
    n, parts, levels = design
    cells = levels[2]
    tree = IntervalTree(n, parts, cells=cells)
    # Reference: GLS over bins, then sum the bins of each cell.
    est_bins, cov_bins = _dense_gls(n, parts, levels[-1])
    agg = range_weights(levels[-1], n, cells, np.append(cells[1:], n)) > 0
    assert np.allclose(tree.leaf_estimates(), agg @ est_bins, atol=1e-9)
    assert np.allclose(tree.cell_variances(), np.diag(agg @ cov_bins @ agg.T), atol=1e-9)
    lengths = np.diff(np.append(cells, n))
    assert np.allclose(tree.bin_estimates(), np.repeat(agg @ est_bins / lengths, lengths))


def test_tree_without_finest_level(design):
    n, parts, levels = design
    parts = [p for p in parts if len(p[0]) < n]
    tree = IntervalTree(n, parts)
    est, cov = _dense_gls(n, parts, levels[2])
    assert np.allclose(tree.leaf_estimates(), est, atol=1e-9)
    lo, hi = np.array([0, 4, 10]), np.array([37, 30, 12])
    q = range_weights(levels[2], n, lo, hi)
    assert np.allclose(tree.range_variance(lo, hi), np.einsum("ij,jk,ik->i", q, cov, q), atol=1e-12)


def test_tree_refuses_overlapping_partitions():
    with pytest.raises(InvalidInputError, match="do not nest"):
        IntervalTree(4, [([0, 2], [1, 1], 1.0), ([0, 1], [1, 1], 1.0)])


def test_tree_refuses_cells_that_were_not_measured():
    with pytest.raises(InvalidInputError, match="measured intervals"):
        IntervalTree(4, [([0, 2], [1, 1], 1.0)], cells=[0, 1, 2])


def test_tree_refuses_bad_variance():
    with pytest.raises(InvalidInputError, match="variances"):
        IntervalTree(4, [([0, 2], [1, 1], -1.0)])
    exact = IntervalTree(4, [([0, 2], [3, 5], 0.0), ([0, 1, 2, 3], [1, 1, 1, 1], 1.0)])  # a zero variance is floored
    assert np.allclose(exact.leaf_estimates(), [1.5, 1.5, 2.5, 2.5])


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 37, 64, 100])
def test_haar_round_trip_adjoint_and_sensitivity(n):
    rng = np.random.default_rng(n)
    x = rng.integers(0, 20, n)
    w = haar_forward(x)
    assert np.array_equal(haar_inverse_prefix(w), np.cumsum(x))
    assert w[-1] == x.sum()
    inv = np.array([haar_inverse_prefix(np.eye(n)[i]) for i in range(n)]).T  # P = inv @ w
    g = rng.normal(size=n)
    assert np.allclose(haar_prefix_adjoint(g), inv.T @ g)
    # Exact L1 sensitivity: one record changes the total and one detail per level.
    worst = max(int(np.abs(haar_forward(np.eye(n, dtype=np.int64)[i])).sum()) for i in range(n))
    assert worst == 1 + haar_depth(n)


def test_haar_nonnegative_refinement():
    x = np.array([0, 0, 5, 0, 0, 0, 3, 1])
    w = haar_forward(x).astype(float)
    assert np.allclose(haar_nonnegative_prefix(w), np.cumsum(x))  # no negatives: same as the inverse
    noisy = w + np.array([4.0, -3.0, 2.0, -5.0, 1.0, 6.0, -2.0, 0.0])
    p = haar_nonnegative_prefix(noisy)
    assert np.all(np.diff(np.concatenate([[0.0], p])) >= -1e-12)
    assert p[-1] == pytest.approx(max(noisy[-1], 0.0))  # the total is kept (clamped at 0)


def test_chain_fast_path_builds_exactly_the_general_tree():
    """The vectorised chain construction and the general laminar one give identical node arrays."""
    from he_partition.core.estimation import _chain_nodes, _laminar_nodes

    rng = np.random.default_rng(5)
    n = 300
    levels = [np.array([0])]
    for _ in range(4):  # each level refines the previous one (some cells kept whole, as pruning does)
        prev = levels[-1]
        extra = rng.choice(np.arange(1, n), size=25, replace=False)
        levels.append(np.union1d(prev, extra))
    parts = [(s, rng.normal(100, 10, s.size), np.full(s.size, 4.0 + i)) for i, s in enumerate(levels)]
    parts.append((levels[2], rng.normal(100, 10, levels[2].size), np.full(levels[2].size, 9.0)))  # a repeat
    fast = _chain_nodes(n, parts)
    slow = _laminar_nodes(n, parts, levels[-1])
    assert fast is not None
    assert len(fast[0]) == len(slow[0])
    for a, b in zip(fast[0], slow[0]):
        for name in ("lo", "hi", "parent", "child_lo", "child_hi"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert np.allclose(a.y, b.y) and np.allclose(a.prec, b.prec)
    for x, y in zip(fast[1:], slow[1:]):
        assert np.array_equal(x, y)
    # A laminar family that is no chain still takes the general path.
    not_chain = [(np.array([0, 2, 4]), np.ones(3), 1.0), (np.array([0, 4, 6]), np.ones(3), 1.0),
                 (np.arange(8), np.ones(8), 1.0)]
    assert _chain_nodes(8, [(np.asarray(s), np.asarray(v), np.full(len(s), w)) for s, v, w in not_chain]) is None
    tree = IntervalTree(8, not_chain)
    assert tree.bin_estimates().shape == (8,)
