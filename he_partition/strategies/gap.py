"""HE-friendly gap-threshold partitioning (Ushiyama et al., BigData 2022) with an adaptive cut rule."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Generator

import numpy as np
import numpy.typing as npt

from ..core.errors import InvalidInputError
from ..core.measurements import Measurement, PartitionSums, PrefixDifferences
from ..core.summary import Summary

__all__ = ["GapParams", "gap_partition", "gap_strategy"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class GapParams:
    """Budget split and cut rule of the gap strategy.

    Rule: walking left to right, start a new partition at bin i when the current one
    (length L) has reached `max_partition_length`, or when

        |noisy gap_i| > threshold_k * sigma_gap * L ** (-length_exponent)

    where sigma_gap is the standard deviation of the total noise on one gap (every noise
    party's draw, so the rule adapts to epsilon, the split, the contribution bound and the
    number of noise parties). Why: on a flat run, a gap is pure noise, so k * sigma makes
    a spurious cut rare; a real level shift left inside a partition of length L misplaces
    mass over O(L) bins, so longer partitions cut more eagerly (L^-a); and the cap bounds
    the error of slow drifts that no single gap reveals. The paper's fixed rule
    (eps_gap = eps/4, cut at 1/eps_sum) makes cuts nearly at random at eps = 0.1
    (design-notes section 5). Defaults chosen on DPBench-1D, two noise parties: mean
    RMSE / Identity 0.73 at eps = 0.1 and 0.80 at eps = 1.0 (simulation, 4 repetitions).
    """

    gap_fraction: float = 0.2
    threshold_k: float = 2.5
    length_exponent: float = 0.25
    max_partition_length: int = 32

    def __post_init__(self) -> None:
        if not 0.0 < self.gap_fraction < 1.0:
            raise InvalidInputError(f"gap_fraction must be in (0, 1), got {self.gap_fraction}")
        if not (math.isfinite(self.threshold_k) and self.threshold_k >= 0):
            raise InvalidInputError(f"threshold_k must be >= 0, got {self.threshold_k}")
        if not (math.isfinite(self.length_exponent) and self.length_exponent >= 0):
            raise InvalidInputError(f"length_exponent must be >= 0, got {self.length_exponent}")
        if self.max_partition_length < 1:
            raise InvalidInputError(f"max_partition_length must be >= 1, got {self.max_partition_length}")

    def split(self, epsilon: float) -> tuple[float, float]:
        """(eps_gap, eps_sum) with eps_gap + eps_sum == epsilon."""
        eps_gap = epsilon * self.gap_fraction
        return eps_gap, epsilon - eps_gap


def gap_partition(noisy_gaps: npt.ArrayLike, sigma_gap: float, params: GapParams) -> IntArray:
    """Partition starts chosen from DP-noised gaps only (post-processing: no privacy cost)."""
    g = np.abs(np.asarray(noisy_gaps, dtype=np.float64))
    n = g.size
    if n == 0:
        raise InvalidInputError("cannot partition an empty domain")
    lmax = params.max_partition_length
    # Threshold per possible current length L = 1..lmax (L == lmax always cuts).
    lengths = np.arange(1, lmax + 1, dtype=np.float64)
    thresholds = params.threshold_k * sigma_gap * lengths ** (-params.length_exponent)
    starts = [0]
    length = 1
    for i in range(1, n):
        if length >= lmax or g[i] > thresholds[length - 1]:
            starts.append(i)
            length = 1
        else:
            length += 1
    return np.asarray(starts, dtype=np.int64)


def gap_strategy(
    domain_size: int,
    epsilon: float,
    *,
    noise_parties: int,
    contribution_bound: int = 1,
    params: GapParams = GapParams(),
) -> Generator[Measurement, IntArray, Summary]:
    """The gap strategy as a coroutine: yields measurements, receives their released values.

    Privacy: two measurements, sequentially composed: noisy adjacent differences at
    eps_gap (L1 sensitivity 2c) and noisy partition sums at eps_sum (L1 sensitivity c,
    disjoint partitions). Total epsilon = eps_gap + eps_sum, under add/remove of one
    record (one person contributing at most c records). Each noise party's draw alone
    gives this; the partition is chosen from released (noised) values only.
    """
    eps_gap, eps_sum = params.split(epsilon)
    c = contribution_bound
    diffs = PrefixDifferences(domain_size, eps_gap, 2 * c)
    noisy_gaps = yield diffs
    sigma_gap = math.sqrt(noise_parties * diffs.noise_variance)
    starts = gap_partition(noisy_gaps, sigma_gap, params)
    sums_m = PartitionSums(domain_size, eps_sum, c, starts=tuple(int(s) for s in starts))
    noisy_sums = yield sums_m
    var = noise_parties * sums_m.noise_variance
    return Summary(
        domain_size=domain_size,
        epsilon=epsilon,
        strategy="gap",
        noise_parties=noise_parties,
        contribution_bound=c,
        starts=sums_m.starts,
        sums=tuple(int(v) for v in noisy_sums),
        sum_variance=(var,) * len(starts),
        epsilon_spent=((diffs.kind, eps_gap), (sums_m.kind, eps_sum)),
        params=asdict(params),
    )
