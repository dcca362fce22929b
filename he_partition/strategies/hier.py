"""Hierarchical (b-ary tree) strategy: HB branching, per-level budgets, least-squares consistency."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Generator, Sequence

import numpy as np
import numpy.typing as npt

from ..core.errors import InvalidInputError
from ..core.estimation import IntervalTree
from ..core.measurements import Measurement, PartitionSums
from ..core.summary import ReleasedValues, Summary

__all__ = ["HierParams", "hb_branching", "tree_levels", "level_budgets", "hier_strategy", "measure_levels",
           "prune_cells", "tree_summary"]

IntArray = npt.NDArray[np.int64]

BUDGETS = ("uniform", "geometric")


@dataclass(frozen=True)
class HierParams:
    """Design of the hierarchical strategy.

    `branching`: fan-out b of the tree; 0 picks it as in HB (Qardaji, Yang, Li, VLDB 2013):
    the b minimising (b - 1) * h(b)^3 with h(b) = ceil(log_b n) measured levels, their
    closed form for the average noise of a random range under an even budget split.
    `budget`: "uniform" gives every measured level eps / h (HB); "geometric" gives level l
    (0 = coarsest measured) a share proportional to `geometric_ratio` ** l, so a ratio > 1
    favours fine levels, in the spirit of Cormode et al. (ICDE 2012).
    `measure_root`: also spend budget on the grand total (HB does not: the total is the sum
    of the first measured level, and each measured value costs the same share).
    Defaults were chosen by the exact noise variance of the DPBench random-range workload
    (4,096 bins), computed with `he_partition.core.estimation`: with b = 16 and consistency,
    uniform budgets were best (geometric ratios 0.6-1.6, explicit per-level grids and
    mixed-radix chains were all equal or worse), and measuring the root cost accuracy.

    `prune`: adaptive refinement. After each level is released, a cell whose least-squares
    estimate is at most `prune_threshold` standard errors (i.e. consistent with being
    empty or nearly so) is not split further: every later level measures it whole again
    (free under parallel composition, and it sharpens its sum), and its estimate is spread
    evenly over its bins. On dense data nothing is pruned and this is plain HB; on sparse
    data ranges ending in empty regions stop paying for the noise of the lower levels.
    The decision uses released values only. Caveat: standard errors are computed for the
    design that was chosen (they ignore that the choice looked at the noise).
    """

    branching: int = 0
    budget: str = "uniform"
    geometric_ratio: float = 1.0
    measure_root: bool = False
    prune: bool = False
    prune_threshold: float = 3.0

    def __post_init__(self) -> None:
        if self.branching != 0 and self.branching < 2:
            raise InvalidInputError(f"branching must be 0 (automatic) or >= 2, got {self.branching}")
        if self.budget not in BUDGETS:
            raise InvalidInputError(f"budget must be one of {', '.join(BUDGETS)}, got {self.budget!r}")
        if not (math.isfinite(self.geometric_ratio) and self.geometric_ratio > 0):
            raise InvalidInputError(f"geometric_ratio must be > 0, got {self.geometric_ratio}")
        if not math.isfinite(self.prune_threshold):
            raise InvalidInputError(f"prune_threshold must be finite, got {self.prune_threshold}")


def _height(n: int, b: int) -> int:
    """Smallest h with b^h >= n."""
    h, size = 0, 1
    while size < n:
        size *= b
        h += 1
    return h


def hb_branching(n: int, candidates: Sequence[int] = tuple(range(2, 129))) -> int:
    """HB's branching factor: argmin_b (b - 1) * ceil(log_b n)^3 (ties to the smaller b)."""
    if n <= 2:
        return 2
    return min(candidates, key=lambda b: ((b - 1) * _height(n, b) ** 3, b))


def tree_levels(n: int, branching: int, *, include_root: bool = False) -> list[IntArray]:
    """Partition starts of each level, coarsest first: level l has blocks of b^(h - l) bins.

    Regular blocks; the last block of a level is shorter when n is not a power of b. The
    leaf level is every single bin.
    """
    if n < 1:
        raise InvalidInputError(f"domain size must be >= 1, got {n}")
    h = _height(n, branching)
    first = 0 if include_root or h == 0 else 1
    return [np.arange(0, n, branching ** (h - lvl), dtype=np.int64) for lvl in range(first, h + 1)]


def level_budgets(epsilon: float, levels: int, params: HierParams) -> list[float]:
    """Per-level epsilons, coarsest first, summing to `epsilon` (sequential composition)."""
    if levels < 1:
        raise InvalidInputError("need at least one level")
    if params.budget == "uniform":
        w = np.ones(levels)
    else:
        w = params.geometric_ratio ** np.arange(levels, dtype=np.float64)
    w = w / w.sum()
    eps = [float(epsilon * v) for v in w[:-1]]
    eps.append(float(epsilon - math.fsum(eps)))  # the split adds up to epsilon
    return eps


def measure_levels(
    domain_size: int,
    level_starts: Sequence[IntArray],
    epsilons: Sequence[float],
    *,
    noise_parties: int,
    contribution_bound: int,
) -> Generator[Measurement, IntArray, list[ReleasedValues]]:
    """Measure each level's partition sums, one measurement per level (sub-coroutine).

    Privacy: level l is a PartitionSums measurement at epsilons[l] with L1 sensitivity c
    (its blocks are disjoint); levels compose sequentially, so the total is sum(epsilons),
    under add/remove of one record (one person with at most c records). Each noise party's
    draw alone gives this.
    """
    out = []
    for starts, eps in zip(level_starts, epsilons):
        m = PartitionSums(domain_size, eps, contribution_bound, starts=tuple(np.asarray(starts, dtype=np.int64).tolist()))
        values = yield m
        out.append(ReleasedValues(kind=m.kind, values=tuple(np.asarray(values, dtype=np.int64).tolist()),
                                  variance=noise_parties * m.noise_variance, epsilon=eps, starts=m.starts))
    return out


def prune_cells(domain_size: int, released: Sequence[ReleasedValues], threshold: float) -> npt.NDArray[np.bool_]:
    """Which cells of the latest released partition look empty: estimate <= threshold * SE (post-processing)."""
    tree = IntervalTree(domain_size, [(r.starts, r.values, r.variance) for r in released], cells=released[-1].starts)
    return np.asarray(tree.leaf_estimates() <= threshold * np.sqrt(tree.cell_variances()))


def _refine(starts: IntArray, frozen: npt.NDArray[np.bool_], n: int, block: int) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """Split every non-frozen cell into aligned blocks of `block` bins; frozen cells stay whole."""
    ends = np.append(starts[1:], n)
    new, new_frozen = [], []
    for a, e, f in zip(starts.tolist(), ends.tolist(), frozen.tolist()):
        if f:
            new.append(a)
            new_frozen.append(True)
        else:
            first = -(-a // block) * block
            pieces = [a] + [c for c in range(first, e, block) if c != a]
            new.extend(pieces)
            new_frozen.extend([False] * len(pieces))
    return np.asarray(new, dtype=np.int64), np.asarray(new_frozen, dtype=bool)


def tree_summary(domain_size: int, epsilon: float, strategy: str, noise_parties: int, contribution_bound: int,
                 released: Sequence[ReleasedValues], extra_spent: Sequence[tuple[str, float]] = (),
                 params: dict[str, Any] | None = None) -> Summary:
    """A "tree" summary over released partition sums; the legacy fields hold the finest one."""
    finest = max(released, key=lambda r: len(r.starts))
    return Summary(
        domain_size=domain_size,
        epsilon=epsilon,
        strategy=strategy,
        noise_parties=noise_parties,
        contribution_bound=contribution_bound,
        starts=finest.starts,
        sums=finest.values,
        sum_variance=(finest.variance,) * len(finest.starts),
        epsilon_spent=tuple(extra_spent) + tuple((r.kind, r.epsilon) for r in released),
        params=dict(params or {}),
        estimator="tree",
        released=tuple(released),
    )


def hier_strategy(
    domain_size: int,
    epsilon: float,
    *,
    noise_parties: int,
    contribution_bound: int = 1,
    params: HierParams = HierParams(),
) -> Generator[Measurement, IntArray, Summary]:
    """Hierarchical strategy as a coroutine: one PartitionSums measurement per tree level.

    Privacy: h measurements (one per level, blocks disjoint: L1 sensitivity c each) at
    epsilons summing to `epsilon` (sequential composition), under add/remove of one record
    (one person with at most c records); each noise party's draw alone gives this. The
    design is data-independent; the estimate is the least-squares consistent tree
    (post-processing), so its range standard errors are exact.
    """
    b = params.branching or hb_branching(domain_size)
    levels = tree_levels(domain_size, b, include_root=params.measure_root)
    eps = level_budgets(epsilon, len(levels), params)
    if not params.prune:
        released = yield from measure_levels(domain_size, levels, eps, noise_parties=noise_parties,
                                             contribution_bound=contribution_bound)
        return tree_summary(domain_size, epsilon, "hier", noise_parties, contribution_bound, released,
                            params={**asdict(params), "branching_used": b})
    # Adaptive refinement: level l + 1 splits only the cells of level l that do not look empty.
    released = []
    starts = levels[0]
    frozen = np.zeros(starts.size, dtype=bool)
    height = _height(domain_size, b)
    blocks = [b ** (height - h) for h in range(height + 1 - len(levels), height + 1)]  # block size per level
    for lvl, e in enumerate(eps):
        if lvl:
            starts, frozen = _refine(starts, frozen, domain_size, blocks[lvl])
        part = yield from measure_levels(domain_size, [starts], [e], noise_parties=noise_parties,
                                         contribution_bound=contribution_bound)
        released.extend(part)
        if lvl + 1 < len(eps):
            frozen = frozen | prune_cells(domain_size, released, params.prune_threshold)
    return tree_summary(domain_size, epsilon, "hier", noise_parties, contribution_bound, released,
                        params={**asdict(params), "branching_used": b, "cells": int(starts.size)})
