"""Data-aware two-stage strategy in the spirit of DAWA (Li et al., VLDB 2014), HE-friendly.

Stage 1 buys a noisy view of every bin (one PartitionSums measurement over single bins,
budget rho * eps). From those DP values only, a partition into buckets is chosen in
plaintext by dynamic programming (post-processing). Stage 2 measures a b-ary tree over
the buckets (one PartitionSums per level, the rest of the budget); the estimate is the
least-squares consistent tree, each bucket spread evenly over its bins. The stage-1
values are released too and, by default, join the least-squares estimate of the bucket
sums (they refine the buckets, so the family stays a tree); per-bin estimates still
spread each bucket evenly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Generator

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from ..core.errors import InvalidInputError
from .hier import hb_branching, tree_levels
from ..core.measurements import Measurement, PartitionSums
from ..core.noise import discrete_laplace_variance, laplace_scale
from ..core.summary import ReleasedValues, Summary

__all__ = ["DawaParams", "l1_costs", "choose_partition", "dawa_strategy"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

COSTS = ("l1", "sse")


@dataclass(frozen=True)
class DawaParams:
    """Parameters of the data-aware strategy.

    `stage1_fraction` (rho): share of epsilon spent on the noisy per-bin view (DAWA: 0.25).
    `cost`: "l1" is DAWA's: a bucket costs its absolute deviation from its mean, computed
    on the noisy bins and de-biased by what pure noise explains (see `l1_costs`), plus
    `noise_cost_factor` times the expected absolute noise of one stage-2 bucket sum;
    buckets have lengths 1, 2, 4, ... (any start), as in DAWA. "sse" is penalised least
    squares segmentation (change-point detection): the squared deviation plus
    `noise_cost_factor` * 2 * log(n) * (stage-1 noise variance) per bucket, any lengths.
    `use_stage1`: let the stage-1 values join the least-squares estimate of bucket sums
    (they refine the buckets; per-bin estimates still spread each bucket evenly).
    `max_bucket_length`: longest bucket considered by the "l1" cost (bounds its O(n * L) work).
    `noise_discount`: share of the pure-noise deviation the "l1" cost subtracts (see `l1_costs`).
    """

    stage1_fraction: float = 0.25
    cost: str = "l1"
    noise_cost_factor: float = 1.0
    use_stage1: bool = True
    max_bucket_length: int = 4096
    noise_discount: float = 0.94

    def __post_init__(self) -> None:
        if not 0.0 < self.stage1_fraction < 1.0:
            raise InvalidInputError(f"stage1_fraction must be in (0, 1), got {self.stage1_fraction}")
        if self.cost not in COSTS:
            raise InvalidInputError(f"cost must be one of {', '.join(COSTS)}, got {self.cost!r}")
        if not (math.isfinite(self.noise_cost_factor) and self.noise_cost_factor >= 0):
            raise InvalidInputError(f"noise_cost_factor must be >= 0, got {self.noise_cost_factor}")
        if not 0.0 <= self.noise_discount <= 1.0:
            raise InvalidInputError(f"noise_discount must be in [0, 1], got {self.noise_discount}")
        if self.max_bucket_length < 1:
            raise InvalidInputError(f"max_bucket_length must be >= 1, got {self.max_bucket_length}")


def _abs_noise_moments(bin_variance: float, noise_parties: int) -> tuple[float, float]:
    """E|e| and sd(|e|) of one stage-1 value's noise: a sum of `noise_parties` Laplace draws.

    With b the scale of one draw (variance 2 b^2 each): one draw has E|e| = b, sd = b; the
    sum of two has density (1 + |t|/b) e^(-|t|/b) / (4b), so E|e| = 1.5 b, E e^2 = 4 b^2.
    """
    b = math.sqrt(bin_variance / (2.0 * noise_parties))
    if noise_parties == 1:
        return b, b
    return 1.5 * b, math.sqrt(4.0 - 2.25) * b


def l1_costs(noisy: npt.ArrayLike, bin_variance: float, max_length: int | None = None,
             noise_parties: int = 1, discount: float = 0.94) -> list[FloatArray]:
    """cost[k][a]: de-biased absolute deviation from the mean of bucket [a, a + 2^k), from noisy bins.

    Pure noise makes a bucket of length L look uneven by about L * sqrt(1 - 1/L) * E|e|.
    Only `discount` of that is subtracted. With the full expectation, flat-looking buckets
    cost 0 half of the time whatever their length, and per-bin deviations just below the
    noise level, which add up to a large error at range ends inside a long bucket, would
    be merged for free; a per-bin margin (6% by default, measured on DPBench) prevents
    that. `bin_variance` = 0 gives the plain deviation (true data).
    """
    x = np.asarray(noisy, dtype=np.float64)
    n = x.size
    limit = n if max_length is None else min(n, max_length)
    mean_abs = _abs_noise_moments(bin_variance, noise_parties)[0] if bin_variance > 0 else 0.0
    out: list[FloatArray] = []
    k = 0
    while (1 << k) <= limit:
        length = 1 << k
        if length == 1:
            out.append(np.zeros(n))
        else:
            windows = sliding_window_view(x, length)
            raw = np.empty(windows.shape[0])
            step = max(1, (1 << 22) // length)  # bound the temporary to ~32 MB
            for i in range(0, windows.shape[0], step):
                w = windows[i : i + step]
                raw[i : i + step] = np.sum(np.abs(w - w.mean(axis=1, keepdims=True)), axis=1)
            explained = discount * length * math.sqrt(1.0 - 1.0 / length) * mean_abs
            out.append(np.maximum(raw - explained, 0.0))
        k += 1
    return out


def _backtrack(choice: IntArray, n: int, *, lengths: bool) -> IntArray:
    starts = []
    j = n
    while j > 0:
        j = j - int(choice[j]) if lengths else int(choice[j])
        starts.append(j)
    return np.asarray(starts[::-1], dtype=np.int64)


def _dyadic_partition(costs: list[FloatArray], penalty: float, n: int) -> IntArray:
    """DP over bucket ends: min sum of (cost + penalty) over partitions into dyadic-length buckets."""
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    choice = np.ones(n + 1, dtype=np.int64)
    for j in range(1, n + 1):
        bj, cj = np.inf, 1
        for k, cost in enumerate(costs):
            length = 1 << k
            if length > j:
                break
            v = best[j - length] + cost[j - length]
            if v < bj:
                bj, cj = v, length
        best[j] = bj + penalty
        choice[j] = cj
    return _backtrack(choice, n, lengths=True)


def _sse_partition(noisy: FloatArray, penalty: float) -> IntArray:
    """Optimal partitioning (any lengths): min sum of squared deviations + penalty per bucket, O(n^2)."""
    n = noisy.size
    s1 = np.concatenate([[0.0], np.cumsum(noisy)])
    s2 = np.concatenate([[0.0], np.cumsum(noisy * noisy)])
    best = np.zeros(n + 1)
    arg = np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):
        a = np.arange(j)
        s = s1[j] - s1[a]
        v = best[a] + (s2[j] - s2[a]) - s * s / (j - a)
        k = int(np.argmin(v))
        best[j] = v[k] + penalty
        arg[j] = k
    return _backtrack(arg, n, lengths=False)


def choose_partition(noisy: npt.ArrayLike, bin_variance: float, stage2_node_variance: float,
                     params: DawaParams, noise_parties: int = 2) -> IntArray:
    """Bucket starts chosen from DP-noised bins only (post-processing: no privacy cost).

    `bin_variance`: total noise variance of one stage-1 value; `stage2_node_variance`:
    noise variance of one bucket sum if all of stage 2 went to a single level.
    """
    x = np.asarray(noisy, dtype=np.float64)
    n = x.size
    if params.cost == "l1":
        penalty = params.noise_cost_factor * math.sqrt(stage2_node_variance / 2.0)
        costs = l1_costs(x, bin_variance, params.max_bucket_length, noise_parties=noise_parties,
                         discount=params.noise_discount)
        return _dyadic_partition(costs, penalty, n)
    penalty = params.noise_cost_factor * 2.0 * math.log(max(n, 2)) * bin_variance
    return _sse_partition(x, penalty)


def dawa_strategy(
    domain_size: int,
    epsilon: float,
    *,
    noise_parties: int,
    contribution_bound: int = 1,
    params: DawaParams = DawaParams(),
) -> Generator[Measurement, IntArray, Summary]:
    """Data-aware strategy as a coroutine.

    Privacy: stage 1 is a PartitionSums measurement over single bins at rho * eps (L1
    sensitivity c); stage 2 is one PartitionSums measurement per tree level over the
    buckets (disjoint: sensitivity c each) at epsilons summing to (1 - rho) * eps.
    Sequential composition: eps in total, under add/remove of one record (one person with
    at most c records); each noise party's draw alone gives this. The buckets are chosen
    from stage-1 released values only.
    """
    c = contribution_bound
    eps1 = epsilon * params.stage1_fraction
    eps2 = epsilon - eps1
    stage1 = PartitionSums(domain_size, eps1, c, starts=tuple(range(domain_size)))
    noisy = yield stage1
    var1 = noise_parties * stage1.noise_variance
    node_var = noise_parties * discrete_laplace_variance(laplace_scale(c, eps2))
    buckets = choose_partition(noisy, var1, node_var, params, noise_parties)
    m = buckets.size
    b = hb_branching(m)
    levels = [buckets[idx] for idx in tree_levels(m, b)]
    h = len(levels)
    eps_levels = [eps2 / h] * (h - 1)
    eps_levels.append(eps2 - math.fsum(eps_levels))
    released = []
    for starts, eps in zip(levels, eps_levels):
        meas = PartitionSums(domain_size, eps, c, starts=tuple(int(s) for s in starts))
        values = yield meas
        released.append(ReleasedValues(kind=meas.kind, values=tuple(int(v) for v in values),
                                       variance=noise_parties * meas.noise_variance, epsilon=eps, starts=meas.starts))
    first = ReleasedValues(kind=stage1.kind, values=tuple(int(v) for v in noisy), variance=var1, epsilon=eps1,
                           starts=stage1.starts)
    spent = ((stage1.kind, eps1),) + tuple((r.kind, r.epsilon) for r in released)
    finest = released[-1]
    return Summary(
        domain_size=domain_size,
        epsilon=epsilon,
        strategy="dawa",
        noise_parties=noise_parties,
        contribution_bound=c,
        starts=finest.starts,
        sums=finest.values,
        sum_variance=(finest.variance,) * len(finest.starts),
        epsilon_spent=spent,
        params={**asdict(params), "branching_used": b, "buckets": m},
        estimator="tree",
        released=((first,) if params.use_stage1 else ()) + tuple(released),
    )
