"""Gap strategy: exact privacy arithmetic and the cut rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from he_partition import Budget, GapParams, gap_partition, release
from he_partition.core.errors import InvalidInputError
from he_partition.core.measurements import PartitionSums, PrefixDifferences
from he_partition.core.noise import discrete_laplace_variance, laplace_scale
from he_partition.protocol import ComputationSide, DecryptionSide, encrypt_histogram, make_strategy, run_strategy
from he_partition.core.backend import PlainBackend
from he_partition.core.noise import SeededRandom


def test_split_sums_to_epsilon() -> None:
    eg, es = GapParams().split(0.1)
    assert eg == 0.1 * 0.2
    assert eg + es == pytest.approx(0.1, rel=1e-15)
    with pytest.raises(InvalidInputError, match="gap_fraction"):
        GapParams(gap_fraction=1.0)
    with pytest.raises(InvalidInputError, match="max_partition_length"):
        GapParams(max_partition_length=0)


@pytest.mark.parametrize("c", [1, 3])
@pytest.mark.parametrize("parties", [1, 2])
def test_charges_scales_and_variances_are_exact(c: int, parties: int) -> None:
    eps = 0.5
    x = np.arange(40) % 7
    be = PlainBackend(16)
    rng = SeededRandom(0)
    budget = Budget(eps)
    cs = ComputationSide(be, rng)
    ds = DecryptionSide(be, rng, budget, parties)
    agg = cs.aggregate([encrypt_histogram(be, x)])
    seen = []

    def measure(m):  # type: ignore[no-untyped-def]
        seen.append(m)
        return ds.decrypt_measurement(m, cs.measure(agg, m))

    s = run_strategy(make_strategy("gap", 40, eps, noise_parties=parties, contribution_bound=c), measure)
    eg, es = GapParams().split(eps)
    assert isinstance(seen[0], PrefixDifferences) and isinstance(seen[1], PartitionSums)
    assert seen[0].sensitivity == 2 * c and seen[1].sensitivity == c
    assert seen[0].scale == laplace_scale(2 * c, eg)
    assert seen[1].scale == laplace_scale(c, es)
    assert budget.charges == [("prefix_differences", eg), ("partition_sums", es)]
    assert math.fsum(e for _, e in s.epsilon_spent) == pytest.approx(eps, rel=1e-15)
    assert s.sum_variance == (parties * discrete_laplace_variance(laplace_scale(c, es)),) * s.n_partitions
    assert s.contribution_bound == c and s.noise_parties == parties


def test_budget_refuses_overspend() -> None:
    b = Budget(1.0)
    b.charge("a", 0.7)
    b.charge("b", 0.3)  # exactly 7/10 + 3/10 = 1 in decimal arithmetic
    for tiny in (1e-6, 1e-12):  # no slack past the total
        with pytest.raises(Exception, match="would pass the total"):
            b.charge("c", tiny)
    assert [w for w, _ in b.charges] == ["a", "b"]
    thirds = Budget(1.0)
    for _ in range(3):
        thirds.charge("level", 1.0 / 3)  # a float split: booked exactly, never past 1
    assert thirds.spent <= 1.0


def test_cut_rule() -> None:
    p = GapParams(threshold_k=2.0, length_exponent=0.0, max_partition_length=4)
    gaps = np.zeros(12)
    gaps[5] = 3.0  # > 2 * sigma: cut
    gaps[9] = -1.9  # below threshold: no cut
    starts = gap_partition(gaps, 1.0, p)
    assert starts.tolist() == [0, 4, 5, 9]
    # Longer partitions cut more eagerly with a positive length exponent.
    p2 = GapParams(threshold_k=2.0, length_exponent=0.5, max_partition_length=100)
    g = np.zeros(10)
    g[4] = 1.5  # threshold at L=4 is 2/sqrt(4) = 1.0
    g[5] = 1.5  # threshold at L=1 is 2.0: no cut
    assert gap_partition(g, 1.0, p2).tolist() == [0, 4]


def test_single_noise_release_is_closer_than_double() -> None:
    x = np.repeat([50, 0, 200, 10], 64)
    err1 = err2 = 0.0
    for seed in range(20):
        err1 += float(np.sum((release([x], 0.5, noise_parties=1, rng=seed).estimate() - x) ** 2))
        err2 += float(np.sum((release([x], 0.5, noise_parties=2, rng=seed).estimate() - x) ** 2))
    assert err1 < err2
