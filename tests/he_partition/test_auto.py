"""Default strategy: design choice from (n, eps), privacy arithmetic, BFV equivalence (several ciphertexts)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from he_partition import DEFAULT_STRATEGY, STRATEGIES, release
from he_partition.strategies.auto import AutoParams, auto_strategy, choose_design, modelled_range_variance
from he_partition.core.errors import InvalidInputError
from he_partition.core.measurements import PartitionSums
from he_partition.core.noise import discrete_laplace_variance, laplace_scale

from .test_hier import check_privacy, drive


def test_auto_is_the_default_of_release():
    assert DEFAULT_STRATEGY == "auto" and "auto" in STRATEGIES
    assert inspect.signature(release).parameters["strategy"].default == "auto"
    s = release([np.arange(50) % 7], 1.0, rng=1)
    assert s.strategy == "auto" and s.estimator == "tree"


def test_design_choice():
    assert choose_design(4096, 0.1) == 16  # HB's branching
    assert choose_design(4096, 1.0) == 16
    assert choose_design(4096, 10.0) == 4096  # tiny discrete noise: Identity (one level of bins) wins
    assert choose_design(16, 0.1) == 16  # small domains: a single level of bins
    # The Identity model is exact: mean width times one bin's variance.
    assert modelled_range_variance(100, 0.5, 100, mean_width=10) == 10 * discrete_laplace_variance(laplace_scale(1, 0.5))


@pytest.mark.parametrize("eps,c", [(0.2, 1), (1.0, 2), (12.0, 1)])
def test_auto_privacy_accounting(eps, c):
    x = np.zeros(3000, dtype=np.int64)
    x[:900] = np.random.default_rng(0).integers(0, 60, 900)
    summary, seen = drive(auto_strategy(3000, eps, noise_parties=2, contribution_bound=c), x, noise_seed=6)
    assert all(isinstance(m, PartitionSums) for m in seen)
    check_privacy(summary, seen, eps, lambda m: c)
    assert summary.params["design"] == ("identity" if eps > 10 else "tree")
    assert 0.0 <= summary.params["sparsity_estimate"] <= 1.0
    if eps < 10:
        assert summary.params["sparsity_estimate"] > 0.3  # the empty two thirds were seen (in noised values)


def test_auto_params_validation():
    with pytest.raises(InvalidInputError, match="mean_range_width"):
        AutoParams(mean_range_width=-1)


@pytest.mark.parametrize("n,owners", [(1, 1), (3, 2), (257, 3), (5000, 4)])
def test_bfv_equals_plain(n, owners):
    rng = np.random.default_rng(n)
    hs = [rng.integers(0, 5, n) * (rng.random(n) < 0.2) for _ in range(owners)]
    assert release(hs, 0.3, backend="bfv", rng=21) == release(hs, 0.3, backend="plain", rng=21)


@pytest.mark.slow
def test_bfv_equals_plain_many_owners_three_ciphertexts():
    rng = np.random.default_rng(99)
    hs = [rng.integers(0, 3, 10000) * (rng.random(10000) < 0.1) for _ in range(10)]
    for strategy in ("auto", "dawa", "privelet"):
        a = release(hs, 1.0, strategy=strategy, backend="bfv", rng=4, contribution_bound=2)
        b = release(hs, 1.0, strategy=strategy, backend="plain", rng=4, contribution_bound=2)
        assert a == b


@pytest.mark.statistical
def test_standard_errors_on_uniform_data():
    n = 512
    x = np.full(n, 12, dtype=np.int64)
    x[300:] = 0  # an empty region (pruned) next to a uniform one: spreading is unbiased in both
    ranges = np.array([[0, 512], [5, 6], [10, 290], [310, 500], [250, 350]])
    truth = np.array([x[a:b].sum() for a, b in ranges])
    z2 = []
    for seed in range(300):
        s = release([x], 0.5, rng=seed)
        counts = s.range_counts(ranges)
        z2.append([((c.value - t) / c.standard_error) ** 2 for c, t in zip(counts, truth)])
    m = np.mean(z2, axis=0)
    assert np.all((m > 0.7) & (m < 1.4)), m
