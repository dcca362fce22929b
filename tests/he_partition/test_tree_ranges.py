"""Range answers of least-squares tree and wavelet summaries: the same as a dense row per range, without forming one.

The oracles below are the former implementations (a weight row over every leaf through the
adjoint `query_variance`, and a row over every bin through `haar_prefix_adjoint`), kept here
only to check the O(depths) / O(log n) answers against them.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from he_partition import release
from he_partition.core import estimation
from he_partition.core.errors import InvalidInputError
from he_partition.core.estimation import IntervalTree, haar_prefix_adjoint, haar_range_variance, range_weights
from he_partition.core.summary import ReleasedValues, Summary

RTOL = 1e-9


def _oracle_tree_variance(tree: IntervalTree, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    out = np.empty(lo.size)
    for i in range(0, lo.size, 256):
        w = range_weights(tree.leaf_starts, tree.domain_size, lo[i:i + 256], hi[i:i + 256])
        out[i:i + 256] = tree.query_variance(w)
    return out


def _oracle_haar_variance(n: int, lo: np.ndarray, hi: np.ndarray, variance: float) -> np.ndarray:
    out = []
    for a, b in zip(lo.tolist(), hi.tolist()):
        w = np.zeros(n)
        w[a:b] = 1.0
        g = w - np.append(w[1:], 0.0)  # weights on the inclusive prefix sums
        out.append(variance * float(np.sum(haar_prefix_adjoint(g) ** 2)))
    return np.array(out)


def _oracle_summary(s: Summary, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    est = s.estimate()
    values = np.array([est[a:b].sum() for a, b in zip(lo.tolist(), hi.tolist())])
    if s.estimator == "tree":
        var = _oracle_tree_variance(s._tree, lo, hi)  # noqa: SLF001
    else:
        var = _oracle_haar_variance(s.domain_size, lo, hi, s.released[0].variance)
    return values, np.sqrt(np.maximum(var, 0.0))


def _ranges(rng: np.random.Generator, n: int, k: int, starts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Random ranges, plus the whole domain, single bins, and ranges on and next to partition edges."""
    a = rng.integers(0, n + 1, k)
    b = rng.integers(0, n + 1, k)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    keep = lo < hi
    lo, hi = list(lo[keep]), list(hi[keep])
    lo += [0, 0, n - 1]
    hi += [n, 1, n]
    if starts is not None and starts.size > 2:
        edges = np.append(starts, n)
        for _ in range(50):
            i, j = sorted(rng.choice(edges.size, 2, replace=False).tolist())
            for da, db in ((0, 0), (1, 0), (0, -1), (1, -1), (-1, 1)):
                x, y = int(edges[i]) + da, int(edges[j]) + db
                if 0 <= x < y <= n:
                    lo.append(x)
                    hi.append(y)
    return np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64)


def _random_chain(rng: np.random.Generator, n: int, levels: int, split: float) -> list[tuple[np.ndarray, np.ndarray,
                                                                                              np.ndarray]]:
    """A chain of refinements where each level splits only some cells (leaves at uneven depths), per-cell
    variances, and one level measured twice."""
    starts = np.array([0])
    parts = []
    for _ in range(levels):
        new = [starts]
        ends = np.append(starts[1:], n)
        for a, b in zip(starts.tolist(), ends.tolist()):
            if b - a > 1 and rng.random() < split:
                k = int(rng.integers(1, min(b - a, 6)))
                new.append(np.sort(rng.choice(np.arange(a + 1, b), k, replace=False)))
        starts = np.unique(np.concatenate(new))
        parts.append((starts, rng.normal(50, 20, starts.size), rng.uniform(0.3, 5.0, starts.size)))
    mid = parts[len(parts) // 2]
    parts.append((mid[0], rng.normal(40, 20, mid[0].size), np.full(mid[0].size, 2.0)))
    return parts


@pytest.mark.parametrize("seed", range(6))
def test_tree_range_variance_equals_the_dense_adjoint(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    parts = _random_chain(rng, n, int(rng.integers(1, 6)), float(rng.uniform(0.3, 1.0)))
    finest = max((p[0] for p in parts), key=lambda s: s.size)
    cells_options = [None] + [p[0] for p in parts[:-1]]  # the finest partition, or a coarser one (cells with children)
    for cells in cells_options:
        tree = IntervalTree(n, parts, cells=cells)
        lo, hi = _ranges(rng, n, 400, finest if cells is None else np.asarray(cells))
        got = tree.range_variance(lo, hi)
        want = _oracle_tree_variance(tree, lo, hi)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=0)


def test_tree_range_variance_of_a_single_level_and_of_roots_that_are_cells() -> None:
    rng = np.random.default_rng(11)
    n = 50
    starts = np.array([0, 7, 8, 20, 33])
    one = IntervalTree(n, [(starts, rng.normal(size=5), rng.uniform(1, 2, 5))])
    lo, hi = _ranges(rng, n, 300, starts)
    np.testing.assert_allclose(one.range_variance(lo, hi), _oracle_tree_variance(one, lo, hi), rtol=RTOL, atol=0)
    # Some roots are leaves, others have a subtree.
    parts = [(starts, rng.normal(size=5), 1.5), (np.array([0, 7, 8, 12, 20, 21, 33]), rng.normal(size=7), 0.7),
             (np.array([0, 7, 8, 12, 20, 21, 25, 33]), rng.normal(size=8), 0.2)]
    tree = IntervalTree(n, parts)
    np.testing.assert_allclose(tree.range_variance(lo, hi), _oracle_tree_variance(tree, lo, hi), rtol=RTOL, atol=0)
    with pytest.raises(InvalidInputError, match="ranges must satisfy"):
        tree.range_variance([3], [3])


def test_tree_range_variance_of_a_laminar_family_that_is_no_chain() -> None:
    rng = np.random.default_rng(5)
    n = 40
    starts = [np.array([0, 20]), np.array([0, 20, 30]), np.array([0, 10, 20]), np.array([0, 5, 10, 20, 25, 30, 35]),
              np.arange(0, n, 1)]
    parts = [(s, rng.normal(size=s.size), rng.uniform(0.5, 2.0, s.size)) for s in starts]
    for cells in (None, starts[3]):
        tree = IntervalTree(n, parts, cells=cells)
        lo, hi = _ranges(rng, n, 300, starts[3])
        np.testing.assert_allclose(tree.range_variance(lo, hi), _oracle_tree_variance(tree, lo, hi), rtol=RTOL,
                                   atol=0)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 37, 64, 100, 257, 1000])
def test_haar_range_variance_equals_the_dense_adjoint(n: int) -> None:
    rng = np.random.default_rng(n)
    lo, hi = _ranges(rng, n, 300)
    np.testing.assert_allclose(haar_range_variance(n, lo, hi, 2.5), _oracle_haar_variance(n, lo, hi, 2.5),
                               rtol=RTOL, atol=0)


@pytest.mark.parametrize("strategy,n", [("auto", 3000), ("auto", 700), ("hier", 1000), ("dawa", 513),
                                        ("privelet", 1000), ("privelet", 333)])
def test_summary_range_counts_equal_the_former_answers(strategy: str, n: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.integers(0, 6, n) * (rng.random(n) < 0.3)  # sparse: pruned trees have leaves at several depths
    s = release([x], 0.8, strategy=strategy, rng=5)
    summaries = [s]
    if s.estimator == "haar":
        summaries.append(Summary(**{**{f: getattr(s, f) for f in s.__dataclass_fields__},
                                    "estimator": "haar_nonnegative"}))
    for summ in summaries:
        lo, hi = _ranges(rng, n, 300, np.asarray(summ.starts))
        values, ses = _oracle_summary(summ, lo, hi)
        got = summ.range_counts(np.stack([lo, hi], axis=1))
        np.testing.assert_allclose([c.value for c in got], values, rtol=RTOL, atol=1e-9)
        np.testing.assert_allclose([c.standard_error for c in got], ses, rtol=RTOL, atol=0)
        one = summ.range_count(int(lo[0]), int(hi[0]))
        assert one == got[0]
        with_ci = summ.range_counts(np.stack([lo[:5], hi[:5]], axis=1), confidence=0.9)
        assert [c.standard_error for c in with_ci] == [c.standard_error for c in got[:5]]


def _big_tree_summary(leaves_per_node: int = 16, depth: int = 4) -> Summary:
    """A synthetic 4-level tree summary with 16^4 = 65,536 leaves, built without a release."""
    n = leaves_per_node ** depth
    rng = np.random.default_rng(0)
    released = []
    for d in range(1, depth + 1):
        step = n // leaves_per_node ** d
        starts = tuple(range(0, n, step))
        released.append(ReleasedValues(kind="partition_sums", values=tuple(rng.integers(0, 50, len(starts)).tolist()),
                                       variance=8.0, epsilon=0.25, starts=starts))
    last = released[-1]
    return Summary(domain_size=n, epsilon=1.0, strategy="hier", noise_parties=1, starts=last.starts,
                   sums=last.values, sum_variance=(8.0,) * len(last.starts), estimator="tree",
                   released=tuple(released))


def test_range_answers_form_no_row_over_every_leaf_or_bin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The work per range is independent of the number of leaves: no dense path is taken, and after the
    once-per-summary tables a batch of ranges allocates far less than one float per leaf."""
    s = _big_tree_summary()
    w = np.zeros(s.domain_size)
    w[100:40000] = 1.0
    value, se = s.weighted_count(w)  # the general path (any weights) still uses the dense adjoint
    s.range_counts([(0, 1)])  # builds the cached tables and prefix sums

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a range answer formed a dense row")

    monkeypatch.setattr(IntervalTree, "query_variance", refuse)
    monkeypatch.setattr(estimation, "range_weights", refuse)
    monkeypatch.setattr(estimation, "haar_prefix_adjoint", refuse)
    leaves = len(s.starts)
    ranges = [(17, 40_001), (0, s.domain_size), (5, 6), (4096, 8192), (1, s.domain_size - 1)] * 4
    tracemalloc.start()
    try:
        got = s.range_counts(ranges)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * leaves // 4, peak  # a single row over the leaves would be 8 * leaves bytes
    assert s.range_count(100, 40000).value == pytest.approx(value, rel=1e-12)
    assert s.range_count(100, 40000).standard_error == pytest.approx(se, rel=1e-9)
    assert len(got) == len(ranges)

    n = 1 << 16
    tracemalloc.start()
    try:
        haar_range_variance(n, np.array([3, 0, 1000]), np.array([n, n, 60_000]), 2.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * n // 4, peak


@pytest.mark.parametrize("strategy", ["hier", "privelet"])
def test_the_range_benchmark_runs_small(strategy: str) -> None:
    from benchmarks.perf import _ranges

    r = _ranges(2048, strategy, count=40, dense=2)  # also checks one batch equals one range at a time
    assert r["estimator"] in ("tree", "haar") and r["ranges"] == 40
