"""The default strategy: picks a design from domain size and epsilon, then adapts to sparsity seen in DP values."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Generator

import numpy as np
import numpy.typing as npt

from ..core.errors import InvalidInputError
from .hier import HierParams, _height, hb_branching, hier_strategy
from ..core.measurements import Measurement
from ..core.noise import discrete_laplace_variance, laplace_scale
from ..core.summary import Summary

__all__ = ["AutoParams", "auto_strategy", "choose_design", "modelled_range_variance"]

IntArray = npt.NDArray[np.int64]

#: Average noise variance of a random range from a least-squares b-ary tree with h measured
#: levels is about TREE_NOISE_CONSTANT * (b - 1) * h * v, v the variance of one node
#: (exact computation with he_partition.core.estimation on the DPBench workload: 0.38-0.41 for
#: h >= 2; a single level is Identity, modelled exactly).
TREE_NOISE_CONSTANT = 0.4


@dataclass(frozen=True)
class AutoParams:
    """Parameters of the default strategy.

    `mean_range_width`: the analysts' typical range width, used only to compare Identity
    with a tree; 0 means n / 2 (ranges of uniformly random width, as in the benchmarks).
    `prune_threshold`: see `HierParams` (adaptive refinement of the tree).
    """

    mean_range_width: float = 0.0
    prune_threshold: float = 3.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean_range_width) and self.mean_range_width >= 0):
            raise InvalidInputError(f"mean_range_width must be >= 0, got {self.mean_range_width}")
        if not math.isfinite(self.prune_threshold):
            raise InvalidInputError(f"prune_threshold must be finite, got {self.prune_threshold}")


def modelled_range_variance(n: int, epsilon: float, branching: int, contribution_bound: int = 1,
                            mean_width: float | None = None) -> float:
    """Modelled average noise variance (one noise party) of a random range under a b-ary tree.

    branching >= n is a single level of bins (Identity): mean_width * v(c / eps), exact.
    Discrete Laplace variances are used, so the comparison is right at large epsilon too.
    """
    w = n / 2.0 if mean_width is None else mean_width
    h = max(_height(n, branching), 1)
    v = discrete_laplace_variance(laplace_scale(contribution_bound * h, epsilon))
    if h == 1:
        return w * v
    return TREE_NOISE_CONSTANT * (branching - 1) * h * v


def choose_design(n: int, epsilon: float, contribution_bound: int = 1, mean_width: float | None = None) -> int:
    """Branching of the tree to use: HB's choice, or n (Identity) when that is modelled better."""
    b = hb_branching(n)
    tree = modelled_range_variance(n, epsilon, b, contribution_bound, mean_width)
    flat = modelled_range_variance(n, epsilon, max(n, 2), contribution_bound, mean_width)
    return b if tree < flat else max(n, 2)


def auto_strategy(
    domain_size: int,
    epsilon: float,
    *,
    noise_parties: int,
    contribution_bound: int = 1,
    params: AutoParams = AutoParams(),
) -> Generator[Measurement, IntArray, Summary]:
    """Default strategy: a least-squares tree whose shape is chosen from (n, eps), refined adaptively.

    Design choice (data-independent): HB's branching factor, or a single level of bins
    (Identity) when its modelled range variance is lower, which happens for small domains
    and at large epsilon where discrete noise of small scale is cheap.
    Adaptation (post-processing of DP values only): after each level is released, cells
    whose least-squares estimate is within `prune_threshold` standard errors of empty are
    not split further (see HierParams.prune); the share of first-level cells found empty is
    the DP-noised sparsity estimate recorded in the summary's params. On dense data this is
    exactly HB with consistency.

    Privacy: as `hier_strategy`: one PartitionSums measurement per level (L1 sensitivity c,
    disjoint cells) at epsilons summing to `epsilon` (sequential composition), under
    add/remove of one record (one person with at most c records); each noise party's draw
    alone gives this.
    """
    width = params.mean_range_width or None
    b = choose_design(domain_size, epsilon, contribution_bound, width)
    hp = HierParams(branching=b, prune=True, prune_threshold=params.prune_threshold)
    summary = yield from hier_strategy(domain_size, epsilon, noise_parties=noise_parties,
                                       contribution_bound=contribution_bound, params=hp)
    first = summary.released[0]
    sparsity = 0.0
    if len(summary.released) > 1:
        s1 = np.asarray(first.starts, dtype=np.int64)
        s2 = np.asarray(summary.released[1].starts, dtype=np.int64)
        lengths = np.diff(np.append(s1, domain_size))
        pieces = np.bincount(np.searchsorted(s1, s2, side="right") - 1, minlength=s1.size)
        block2 = b ** (_height(domain_size, b) - 2)
        splittable = lengths > block2
        if splittable.any():
            sparsity = float(np.mean(pieces[splittable] == 1))
    return dataclasses.replace(
        summary,
        strategy="auto",
        params={**asdict(params), "design": "identity" if b >= domain_size else "tree", "branching_used": b,
                "levels": len(summary.released), "sparsity_estimate": sparsity, "cells": len(summary.starts)},
    )
