"""Data-aware (DAWA-like) strategy: privacy arithmetic, partition from released values only, BFV equivalence."""

from __future__ import annotations

import numpy as np
import pytest

from he_partition import release
from he_partition.strategies.dawa import DawaParams, choose_partition, dawa_strategy, l1_costs
from he_partition.core.errors import InvalidInputError
from he_partition.core.measurements import PartitionSums

from .test_hier import check_privacy, drive


@pytest.mark.parametrize("cost", ["l1", "sse"])
@pytest.mark.parametrize("c", [1, 2])
def test_dawa_privacy_accounting(cost, c):
    x = np.zeros(500, dtype=np.int64)
    x[50:60] = 80
    x[300:450] = 5
    summary, seen = drive(dawa_strategy(500, 0.9, noise_parties=2, contribution_bound=c, params=DawaParams(cost=cost)),
                          x, noise_seed=2)
    assert all(isinstance(m, PartitionSums) for m in seen)
    check_privacy(summary, seen, 0.9, lambda m: c)
    stage1 = seen[0]
    assert stage1.starts == tuple(range(500)) and stage1.epsilon == pytest.approx(0.9 * 0.25)
    # Stage 2 levels refine each other and end at the buckets the summary spreads.
    assert seen[-1].starts == summary.starts
    for coarse, fine in zip(seen[1:], seen[2:]):
        assert set(coarse.starts) <= set(fine.starts)


def test_partition_depends_only_on_released_stage1_values():
    """Two different datasets with the same released stage-1 values get the same buckets."""
    truth = np.concatenate([np.zeros(200), np.full(50, 40.0), np.zeros(250)])
    noisy = truth + np.random.default_rng(0).laplace(0.0, np.sqrt(2.0), truth.size)  # variance 4
    a = choose_partition(noisy, 4.0, 8.0, DawaParams())
    b = choose_partition(noisy.copy(), 4.0, 8.0, DawaParams())
    assert np.array_equal(a, b)
    assert a[0] == 0 and np.all(np.diff(a) > 0)
    assert a.size < 40  # flat runs are merged
    # Spreading each bucket's true sum keeps the block and the zeros apart.
    lengths = np.diff(np.append(a, truth.size))
    spread = np.repeat(np.add.reduceat(truth, a) / lengths, lengths)
    assert np.all(spread[205:245] > 30) and np.all(spread[:195] < 3) and np.all(spread[256:] < 3)


def test_l1_costs_debias_pure_noise():
    rng = np.random.default_rng(0)
    var = 50.0
    noise = rng.laplace(0, np.sqrt(var / 2), 4096)
    costs = l1_costs(noise, var)
    assert len(costs) == 13 and costs[0].size == 4096 and costs[12].size == 1
    # Pure noise: de-biased deviation of long buckets is small relative to the raw deviation.
    assert costs[10].mean() < 0.1 * 1024 * np.sqrt(var / 2)


def test_dawa_params_validation():
    with pytest.raises(InvalidInputError, match="stage1_fraction"):
        DawaParams(stage1_fraction=1.0)
    with pytest.raises(InvalidInputError, match="cost"):
        DawaParams(cost="l7")


@pytest.mark.parametrize("n,owners", [(2, 1), (300, 3), (5000, 2)])
def test_bfv_equals_plain(n, owners):
    rng = np.random.default_rng(n)
    hs = [rng.integers(0, 6, n) * (rng.random(n) < 0.4) for _ in range(owners)]
    assert release(hs, 0.5, strategy="dawa", backend="bfv", rng=5) == release(hs, 0.5, strategy="dawa", rng=5)


@pytest.mark.statistical
def test_standard_errors_on_uniform_data():
    """On uniform data spreading is unbiased, so the SE must match the spread of range errors."""
    n = 256
    x = np.full(n, 30, dtype=np.int64)
    ranges = np.array([[0, 256], [5, 6], [10, 90], [100, 230], [31, 32]])
    truth = 30 * (ranges[:, 1] - ranges[:, 0])
    z2 = []
    for seed in range(300):
        s = release([x], 0.5, strategy="dawa", rng=seed)
        counts = s.range_counts(ranges)
        z2.append([((c.value - t) / c.standard_error) ** 2 for c, t in zip(counts, truth)])
    m = np.mean(z2, axis=0)
    assert np.all((m > 0.7) & (m < 1.35)), m
