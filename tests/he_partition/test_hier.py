"""Hierarchical strategy: exact privacy arithmetic, consistency, pruning, BFV equivalence, standard errors."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from he_partition import release
from he_partition.core.errors import InvalidInputError
from he_partition.strategies.hier import HierParams, hb_branching, hier_strategy, level_budgets, tree_levels
from he_partition.core.measurements import PartitionSums, owner_encoding
from he_partition.core.noise import SeededRandom, discrete_laplace, discrete_laplace_variance, laplace_scale
from he_partition.protocol import Budget, run_strategy


def drive(strategy, x, *, noise_seed=None):
    """Run a strategy on histogram x in plaintext, recording every measurement it asks for.

    Each measurement's values are decoded from the exact prefix slots (so `decode` runs),
    plus one discrete Laplace draw of the measurement's scale when noise_seed is given.
    """
    seen = []
    rng = SeededRandom(noise_seed) if noise_seed is not None else None
    p = owner_encoding(x)

    def measure(m):
        seen.append(m)
        slots = p.copy()
        used = m.measured_slots()
        if used is not None:  # the computation side pads the other slots; decode must ignore them
            slots[~used] = np.arange(int((~used).sum())) * 7919 + 1
        values = m.decode(slots)
        if rng is not None:
            values = values + discrete_laplace(m.scale, m.count, rng)
        return values

    return run_strategy(strategy, measure), seen


def check_privacy(summary, seen, epsilon, unit_sensitivity):
    """Exact accounting: sensitivities, scales, per-measurement epsilons summing to the total."""
    budget = Budget(epsilon)
    for m in seen:
        assert m.sensitivity == unit_sensitivity(m)
        assert m.scale == laplace_scale(m.sensitivity, m.epsilon)
        assert m.scale >= Fraction(m.sensitivity) / Fraction(m.epsilon)  # rounding only adds noise
        budget.charge(m.kind, m.epsilon)
    assert math.isclose(math.fsum(m.epsilon for m in seen), epsilon, rel_tol=1e-12)
    assert summary.epsilon_spent == tuple((m.kind, m.epsilon) for m in seen)
    assert math.isclose(math.fsum(e for _, e in summary.epsilon_spent), summary.epsilon, rel_tol=1e-12)


def test_hb_branching_and_levels():
    assert hb_branching(4096) == 16
    assert hb_branching(65536) == 16
    levels = tree_levels(4096, 16)
    assert [lv.size for lv in levels] == [16, 256, 4096]
    assert [lv.size for lv in tree_levels(4096, 16, include_root=True)] == [1, 16, 256, 4096]
    odd = tree_levels(300, 16)  # 256 < 300: two regular levels plus bins, the last blocks short
    assert [lv.tolist()[:3] for lv in odd] == [[0, 256], [0, 16, 32], [0, 1, 2]]
    assert tree_levels(1, 2)[0].tolist() == [0]


@pytest.mark.parametrize("params", [HierParams(), HierParams(budget="geometric", geometric_ratio=1.7),
                                    HierParams(branching=4, measure_root=True)])
def test_level_budgets_sum_exactly(params):
    for eps in (0.1, 0.3, 1.0, 7.0):
        for k in (1, 2, 3, 5):
            split = level_budgets(eps, k, params)
            assert len(split) == k and all(e > 0 for e in split)
            assert math.fsum(split) == pytest.approx(eps, rel=1e-15, abs=0)


@pytest.mark.parametrize("prune", [False, True])
@pytest.mark.parametrize("c", [1, 3])
def test_hier_privacy_accounting(prune, c):
    x = np.zeros(700, dtype=np.int64)
    x[100:140] = 50
    summary, seen = drive(hier_strategy(700, 0.7, noise_parties=2, contribution_bound=c,
                                        params=HierParams(prune=prune)), x, noise_seed=1)
    assert all(isinstance(m, PartitionSums) for m in seen)
    check_privacy(summary, seen, 0.7, lambda m: c)
    # Each level is one measurement over disjoint cells, refining the previous one.
    for coarse, fine in zip(seen, seen[1:]):
        assert set(coarse.starts) <= set(fine.starts)
    for r, m in zip(summary.released, seen):
        assert r.variance == 2 * m.noise_variance


def test_hier_consistent_estimate_is_exact_without_noise():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 30, 1000)
    summary, _ = drive(hier_strategy(1000, 1.0, noise_parties=2), x)
    assert np.allclose(summary.estimate(), x)
    rc = summary.range_count(10, 500)
    assert rc.value == pytest.approx(x[10:500].sum())


def test_pruning_keeps_empty_regions_whole():
    x = np.zeros(4096, dtype=np.int64)
    x[1000:1010] = 500
    summary, seen = drive(hier_strategy(4096, 1.0, noise_parties=2, params=HierParams(prune=True)), x, noise_seed=3)
    assert len(summary.starts) < 200  # far fewer cells than bins: empty blocks were not refined
    assert all(set(range(1000, 1011)) <= set(m.starts) for m in seen[-1:])  # the data region reaches single bins
    dense = np.full(4096, 200, dtype=np.int64)
    summary_dense, _ = drive(hier_strategy(4096, 1.0, noise_parties=2, params=HierParams(prune=True)), dense,
                             noise_seed=3)
    assert len(summary_dense.starts) == 4096  # nothing looks empty: plain HB


def test_hier_params_validation():
    with pytest.raises(InvalidInputError, match="branching"):
        HierParams(branching=1)
    with pytest.raises(InvalidInputError, match="budget"):
        HierParams(budget="nope")
    with pytest.raises(InvalidInputError, match="bad params"):
        release([np.ones(10, dtype=int)], 1.0, strategy="hier", params={"nope": 1})


@pytest.mark.parametrize("n,owners", [(1, 1), (300, 3), (5000, 2)])
@pytest.mark.parametrize("prune", [False, True])
def test_bfv_equals_plain(n, owners, prune):
    rng = np.random.default_rng(n)
    hs = [rng.integers(0, 4, n) * (rng.random(n) < 0.3) for _ in range(owners)]
    kw = dict(strategy="hier", rng=11, params=HierParams(prune=prune))
    assert release(hs, 0.4, backend="bfv", **kw) == release(hs, 0.4, backend="plain", **kw)


@pytest.mark.statistical
def test_standard_errors_match_empirical_spread():
    """The reported SE of range counts matches the spread of their errors (seeded, 300 releases)."""
    n = 256
    x = np.random.default_rng(5).integers(0, 40, n)
    lo = np.array([0, 3, 17, 100, 200, 0, 128])
    hi = np.array([256, 4, 90, 101, 256, 128, 255])
    truth = np.array([x[a:b].sum() for a, b in zip(lo, hi)])
    errs = []
    for seed in range(300):
        s = release([x], 0.5, strategy="hier", rng=seed)
        counts = s.range_counts(np.stack([lo, hi], axis=1))
        errs.append([c.value for c in counts] - truth)
    se = np.array([c.standard_error for c in counts])
    z2 = np.mean(np.array(errs) ** 2, axis=0) / se**2
    assert np.all((z2 > 0.75) & (z2 < 1.3)), z2
    # The variance itself is the exact discrete Laplace arithmetic: one level's cell.
    levels = tree_levels(n, hb_branching(n))
    v = 2 * discrete_laplace_variance(laplace_scale(1, 0.5 / len(levels)))
    assert s.released[0].variance == v
