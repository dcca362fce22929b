"""Plaintext p-views of count tensors by DP-Mondrian / HDPView bisection (seed 000), trusted curator.

Size: over 500 lines on purpose: one algorithm (the seed's bisection, its budget split, the
block estimator and its error bound) whose steps share private helpers; split, Algorithm 1 and 2
would be spread over files that only make sense together.

A p-view partitions a d-dimensional count tensor into axis-aligned blocks, releases one
noisy count per block and spreads it uniformly over the block's cells (seed 000, Sec. 3-4).
The partition is found by recursive bisection (Algorithm 1, 2 of the seed):

* random converge: a block stops splitting when AE(B) + Lap(Delta_AE / eps_conv) <= theta,
  where AE(B) = sum_{x in B} |x - S/|B|| is the aggregation error and
  Delta_AE = 2 (1 - 1/|B|) (Theorem 3);
* random cut: otherwise a cutting point p (any axis, any interior position) is chosen by a
  score-based selection with score q(B, p) = -(AE(B_L) + AE(B_R)) and sensitivity
  Delta_q = 2 Delta_AE (Sec. 4.3, eq. (10), (11)); the seed uses the exponential
  mechanism, we use permute-and-flip (below);
* adaptive perturbation: every final block's sum gets Laplace noise at the perturbation
  budget plus whatever its path did not spend on the recursion (Sec. 4.5, eq. (12)).

Parameters and defaults (seed 000, Sec. 5.1: (theta, eps_r/eps_B, beta, gamma) = (0, 0.9,
1.2, 0.9), fixed independently of the data): theta, the convergence threshold on the
noisy AE; recursion_ratio = eps_r / eps_B, the share of the total budget eps_B used for
partitioning (the rest, eps_p, perturbs); beta, the maximum depth factor,
kappa = ceil(beta * log2(number of cells)) (the seed writes beta log2 n; the authors'
published HDPView code rounds up); gamma, the share of each level's budget eps_r / kappa
spent on random converge (the rest, (1 - gamma) eps_r / kappa, on random cut). The VLDB
version (HDPView) adds an alpha parameter and a PrivTree-style biased converge test; we
implement the seed's version, not that one.

Corrections to the seed's printed pseudo-code (each is what its text says):

* Algorithm 2 line 12 prints eps_cut <- 1 - eps_conv; the text (Sec. 4.1) and Lemma 1 say
  (1 - gamma) eps_r / kappa, which we use.
* Algorithm 2 line 7 prints Lap(1 / eps_conv); eq. (9) scales by Delta_AE, which we use.
* Blocks of a single cell cannot be cut; they stop without a test (a data-independent
  decision, so it costs nothing).

Budget accounting is exact (fractions.Fraction, a float epsilon read as the decimal it
prints as). Along every root-to-leaf path the converge tests, the cuts and the final
perturbation sum to exactly eps_B with the default perturbation_rule="exact": the leaf
gets eps_B minus what its path spent. The seed's eq. (12), eps_p + eps_r (1 - k / kappa)
(perturbation_rule="seed"), charges the whole of level k even when its cut never ran, so
it leaves (1 - gamma) eps_r / kappa (or eps_r / kappa at the maximum depth) unused.
Either way, blocks are disjoint at every level, so by parallel composition along paths
the view is eps_B-DP (seed 000, Lemma 1, 2, Theorem 4).

Exact noise. Every random draw is an exactly uniform integer from a `RandomSource`
(he_partition.core.noise: `CipherRandom`, AES-CTR under a fresh OS key, by default; `SeededRandom`
for tests),
and all arithmetic on data and noise is on integers or Fractions, so there are no
floating-point samplers to attack (Mironov 2012):

* Perturbation: block sums are integers of sensitivity 1; each gets one discrete Laplace
  draw (Canonne-Kamath-Steinke) of scale `laplace_scale(1, eps_block)`, i.e. 1 / eps_block
  rounded *up* to a multiple of 2^-20. Released block counts are integers.
* Random converge: |B| AE(B) = sum | |B| x - S | is an integer of sensitivity
  |B| Delta_AE = 2 (|B| - 1); the test is |B| AE(B) + DLap(laplace_scale(2 (|B| - 1),
  eps_conv)) <= |B| theta, compared exactly. This is the seed's test with discrete
  Laplace noise on the 1/|B| grid AE lives on.
* Random cut, a deviation from the seed: permute-and-flip (McKenna & Sheldon, NeurIPS
  2020) instead of the exponential mechanism, which cannot be sampled exactly with
  floats. Candidate i is accepted with probability exp(eps_cut / (2 Delta) (q_i - q*)),
  q* the best score, each an exact Bernoulli(exp(-gamma)) draw with rational gamma
  (`noise.bernoulli_exp`); candidates are visited in a uniformly random order and the
  first accepted wins. We draw every candidate's coin and return a uniformly random
  accepted one, which is the same distribution (coins are independent of the order, so
  the first accepted in a uniform order is uniform among the accepted). Permute-and-flip
  is eps_cut-DP with the same scaling as the exponential mechanism and its expected
  score is never lower (McKenna & Sheldon 2020). To keep the arithmetic on
  bounded integers, each child's AE in a score is rounded up to a multiple of 2^-20
  (SCORE_GRID); only one child changes under add/remove one record, so the rounded score
  has sensitivity at most ceil(2^20 Delta_q) / 2^20, which we use as Delta (a relative
  increase below 2^-21). If the coefficient eps_cut / (2 Delta) has a denominator above
  2^62 it is rounded down to a multiple of 2^-62. Every rounding adds noise or lowers
  the coefficient, so each step spends at most its planned epsilon.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, Sequence

import numpy as np
import numpy.typing as npt

from ..core.accounting import exact_decimal
from ..core.noise import RandomSource, as_random_source, bernoulli_exp, discrete_laplace, laplace_scale

__all__ = [
    "SCORE_GRID",
    "PViewParams",
    "PViewBudget",
    "Block",
    "PView",
    "plan_budget",
    "build_pview",
    "identity_estimate",
    "aggregation_error",
    "aggregation_error_sensitivity",
    "box_sums",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
PerturbationRule = Literal["exact", "seed"]

#: Cut scores are sums of two children's AE, each rounded up to a multiple of 1/SCORE_GRID.
SCORE_GRID = 1 << 20

# Permute-and-flip coefficients with a larger denominator are rounded down to this grid.
_COEF_GRID = 1 << 62

# Above this many intermediate integers the cut scores of one axis are computed in a loop
# rather than in one broadcast (memory, not speed, is the limit).
_BROADCAST_LIMIT = 4_000_000

# Bound on (cells * total count) so that every integer the mechanisms form fits in int64.
_MAX_CELLS_TIMES_TOTAL = 1 << 60


def _real(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


@dataclass(frozen=True)
class PViewParams:
    """Algorithm parameters of DP-Mondrian; defaults are seed 000's (Sec. 5.1).

    Attributes:
        theta: convergence threshold on the noisy aggregation error (finite, >= 0).
        recursion_ratio: eps_r / eps_B, in (0, 1); the rest of eps_B perturbs counts.
        beta: maximum depth factor, kappa = max(1, ceil(beta * log2 n_cells)); > 0.
        gamma: share of each level's budget spent on random converge, in [0, 1]; gamma = 0
            never stops early, gamma = 1 cuts uniformly at random.
        perturbation_rule: "exact" gives each leaf eps_B minus its path's spending;
            "seed" uses eq. (12), eps_p + eps_r (1 - k / kappa).

    Raises:
        ValueError: a parameter is out of range (message names it and its value).
    """

    theta: float = 0.0
    recursion_ratio: float = 0.9
    beta: float = 1.2
    gamma: float = 0.9
    perturbation_rule: PerturbationRule = "exact"

    def __post_init__(self) -> None:
        theta = _real("theta", self.theta)
        if theta < 0:
            raise ValueError(f"theta must be >= 0, got {self.theta!r}")
        ratio = _real("recursion_ratio", self.recursion_ratio)
        if not 0.0 < ratio < 1.0:
            raise ValueError(f"recursion_ratio must be in (0, 1), got {self.recursion_ratio!r}")
        beta = _real("beta", self.beta)
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta!r}")
        gamma = _real("gamma", self.gamma)
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma!r}")
        if self.perturbation_rule not in ("exact", "seed"):
            raise ValueError(f"perturbation_rule must be 'exact' or 'seed', got {self.perturbation_rule!r}")
        for name, v in (("theta", theta), ("recursion_ratio", ratio), ("beta", beta), ("gamma", gamma)):
            object.__setattr__(self, name, v)


@dataclass(frozen=True)
class PViewBudget:
    """The exact budget plan of one p-view (all epsilons as Fractions).

    Attributes:
        total: eps_B.
        recursion: eps_r = recursion_ratio * eps_B.
        perturbation: eps_p = eps_B - eps_r.
        max_depth: kappa; the root has depth 1 and blocks at depth kappa are not split.
        converge_per_level: gamma * eps_r / kappa, spent by each random converge test.
        cut_per_level: (1 - gamma) * eps_r / kappa, spent by each random cut.

    Raises:
        ValueError: the parts do not add up exactly or are negative.
    """

    total: Fraction
    recursion: Fraction
    perturbation: Fraction
    max_depth: int
    converge_per_level: Fraction
    cut_per_level: Fraction

    def __post_init__(self) -> None:
        if self.total <= 0:
            raise ValueError(f"total must be > 0, got {self.total}")
        if self.max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {self.max_depth}")
        for name in ("recursion", "perturbation", "converge_per_level", "cut_per_level"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.recursion + self.perturbation != self.total:
            raise ValueError(
                f"recursion + perturbation must equal total exactly, got "
                f"{self.recursion} + {self.perturbation} != {self.total}"
            )
        if self.max_depth * (self.converge_per_level + self.cut_per_level) != self.recursion:
            raise ValueError(
                "max_depth * (converge_per_level + cut_per_level) must equal recursion exactly"
            )

    @property
    def level(self) -> Fraction:
        """eps_r / kappa, the budget of one level of bisection."""
        return self.converge_per_level + self.cut_per_level


def _max_depth(n_cells: int, beta: float) -> int:
    if n_cells <= 1:
        return 1
    if n_cells & (n_cells - 1) == 0:
        # Exact for powers of two, so 1.2 * log2(1024) is 12, not ceil(12.000000000000002).
        return max(1, math.ceil(exact_decimal(beta) * (n_cells.bit_length() - 1)))
    return max(1, math.ceil(beta * math.log2(n_cells)))


def plan_budget(epsilon: float, shape: Sequence[int], params: PViewParams = PViewParams()) -> PViewBudget:
    """Split eps_B into the recursion and perturbation phases for a tensor of `shape`.

    Raises:
        ValueError: epsilon not > 0 and finite, or shape has an extent < 1.
    """
    eps = _real("epsilon", epsilon)
    if eps <= 0:
        raise ValueError(f"epsilon must be > 0 and finite, got {epsilon!r}")
    dims = tuple(int(s) for s in shape)
    if not dims or any(s < 1 for s in dims):
        raise ValueError(f"shape must have at least one axis and all extents >= 1, got {tuple(shape)!r}")
    total = exact_decimal(eps)
    recursion = total * exact_decimal(params.recursion_ratio)
    kappa = _max_depth(math.prod(dims), params.beta)
    level = recursion / kappa
    conv = level * exact_decimal(params.gamma)
    return PViewBudget(
        total=total,
        recursion=recursion,
        perturbation=total - recursion,
        max_depth=kappa,
        converge_per_level=conv,
        cut_per_level=level - conv,
    )


@dataclass(frozen=True)
class Block:
    """One final block of a p-view and the exact budget its path consumed.

    Attributes:
        lo, hi: the half-open box [lo, hi) of cells it covers.
        depth: its depth (root = 1).
        epsilon_converge: sum of the converge-test epsilons on its path (its own included).
        epsilon_cut: sum of the cut epsilons on its path.
        epsilon_perturbation: planned epsilon of the noise on its sum (sensitivity 1); the
            discrete Laplace scale is 1 / epsilon_perturbation rounded up to 2^-20.
        noisy_sum: S + DLap(laplace_scale(1, epsilon_perturbation)), an integer; the only
            data-dependent value kept.
    """

    lo: tuple[int, ...]
    hi: tuple[int, ...]
    depth: int
    epsilon_converge: Fraction
    epsilon_cut: Fraction
    epsilon_perturbation: Fraction
    noisy_sum: int

    def __post_init__(self) -> None:
        if len(self.lo) != len(self.hi) or any(a >= b for a, b in zip(self.lo, self.hi)):
            raise ValueError(f"block must be a non-empty box, got lo={self.lo} hi={self.hi}")
        if self.epsilon_perturbation <= 0:
            raise ValueError(f"epsilon_perturbation must be > 0, got {self.epsilon_perturbation}")

    @property
    def size(self) -> int:
        """Number of cells."""
        return math.prod(b - a for a, b in zip(self.lo, self.hi))

    @property
    def epsilon_total(self) -> Fraction:
        """Everything spent on this block's path: converge + cut + perturbation."""
        return self.epsilon_converge + self.epsilon_cut + self.epsilon_perturbation

    @property
    def slices(self) -> tuple[slice, ...]:
        """Index of the block in the tensor."""
        return tuple(slice(a, b) for a, b in zip(self.lo, self.hi))


@dataclass(frozen=True, eq=False)
class PView:
    """A released p-view: a partition into blocks, one noisy count per block.

    Everything here is public output (post-processing of eps_B-DP releases); the true
    counts and the noise values are not kept.
    """

    shape: tuple[int, ...]
    blocks: tuple[Block, ...]
    budget: PViewBudget

    def estimate(self) -> FloatArray:
        """The count tensor estimate: each block's noisy sum spread uniformly over its cells."""
        out = np.zeros(self.shape, dtype=np.float64)
        for b in self.blocks:
            out[b.slices] = b.noisy_sum / b.size
        return out

    def range_count(self, lo: Sequence[int], hi: Sequence[int]) -> float:
        """Estimated count in the half-open box [lo, hi) (empty boxes give 0.0).

        Raises:
            ValueError: lo/hi have the wrong length or are outside 0 <= lo <= hi <= shape.
        """
        qlo, qhi = _check_box(self.shape, lo, hi)
        total = 0.0
        for b in self.blocks:
            overlap = 1
            for a, c, x, y in zip(b.lo, b.hi, qlo, qhi):
                overlap *= max(0, min(c, y) - max(a, x))
                if overlap == 0:
                    break
            if overlap:
                total += b.noisy_sum * overlap / b.size
        return total

    def range_counts(self, lows: npt.ArrayLike, highs: npt.ArrayLike) -> FloatArray:
        """Vectorised `range_count` for many boxes (rows of lows/highs)."""
        return box_sums(self.estimate(), lows, highs)

    @property
    def n_blocks(self) -> int:
        """Number of blocks (the view's size in counts)."""
        return len(self.blocks)


def _check_box(
    shape: tuple[int, ...], lo: Sequence[int], hi: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    ql = tuple(int(v) for v in lo)
    qh = tuple(int(v) for v in hi)
    if len(ql) != len(shape) or len(qh) != len(shape):
        raise ValueError(f"lo and hi must have {len(shape)} entries, got {len(ql)} and {len(qh)}")
    for d, (a, b, s) in enumerate(zip(ql, qh, shape)):
        if not 0 <= a <= b <= s:
            raise ValueError(f"need 0 <= lo[{d}] <= hi[{d}] <= {s}, got lo={a}, hi={b}")
    return ql, qh


def _check_counts(counts: npt.ArrayLike) -> IntArray:
    try:
        x = np.array(counts, dtype=np.float64, copy=True)
    except (TypeError, ValueError):
        raise ValueError("counts must be a numeric array") from None
    if x.ndim < 1 or x.size == 0:
        raise ValueError(f"counts must be a non-empty array with at least one axis, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("counts must be finite, got NaN or inf")
    if np.any(x < 0):
        raise ValueError(f"counts must be >= 0, got minimum {float(x.min())!r}")
    if np.any(x != np.round(x)):
        raise ValueError("counts must be whole numbers (one record adds 1 to one cell)")
    if float(x.sum()) * x.size >= _MAX_CELLS_TIMES_TOTAL:
        raise ValueError(
            f"counts too large for exact integer arithmetic: cells * total must be < 2**60, got "
            f"{x.size} * {float(x.sum()):g}; use a coarser tensor"
        )
    return np.asarray(counts, dtype=np.int64) if np.asarray(counts).dtype.kind in "iu" else x.astype(np.int64)


def _check_rng(rng: RandomSource | int | None) -> RandomSource:
    # np.random.Generator has an `integers` method, so it passes the RandomSource protocol
    # check, but its integers(low, high) signature would silently draw the wrong values.
    if isinstance(rng, np.random.Generator):
        raise TypeError(
            "rng must be a RandomSource (CipherRandom, SeededRandom), an int seed or None, got a "
            "numpy Generator; pass an int seed for reproducible tests"
        )
    return as_random_source(rng)


def aggregation_error(block: npt.ArrayLike) -> float:
    """AE(B) = sum_{x in B} |x - S / |B||, seed 000 eq. (5), as a float (for reports)."""
    x = np.asarray(block, dtype=np.float64)
    return float(np.abs(x - x.mean()).sum())


def aggregation_error_sensitivity(size: int) -> Fraction:
    """Delta_AE = 2 (1 - 1/|B|) under add/remove one record (seed 000, Theorem 3)."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return 2 * (1 - Fraction(1, size))


def _scaled_ae(block: IntArray) -> int:
    """|B| * AE(B) = sum | |B| x - S |, an exact integer of sensitivity 2 (|B| - 1)."""
    return int(np.abs(block.size * block - int(block.sum())).sum())


def _grid_ceil(num: IntArray, den: IntArray) -> IntArray:
    """ceil(SCORE_GRID * num / den) elementwise, without forming SCORE_GRID * num."""
    q, r = np.divmod(num, den)
    return np.asarray(SCORE_GRID * q - ((-SCORE_GRID * r) // den), dtype=np.int64)


def _split_ae_one_axis(moved: IntArray) -> IntArray:
    """ceil(G AE(B_L)) + ceil(G AE(B_R)) (G = SCORE_GRID) for every cut 1..s-1 along axis 0 of `moved` (s, r)."""
    s, r = moved.shape
    cum = np.cumsum(moved.sum(axis=1))
    p = np.arange(1, s, dtype=np.int64)
    size_l, size_r = p * r, (s - p) * r
    sum_l = cum[:-1]
    sum_r = cum[-1] - sum_l
    if (s - 1) * s * r <= _BROADCAST_LIMIT:
        # n_L(p) = sum_{t < p} | |B_L| x_t - S_L | = |B_L| AE(B_L), and likewise on the right.
        dev_l = np.abs(size_l[:, None, None] * moved[None, :, :] - sum_l[:, None, None]).sum(axis=2)
        dev_r = np.abs(size_r[:, None, None] * moved[None, :, :] - sum_r[:, None, None]).sum(axis=2)
        t = np.arange(s)[None, :]
        n_l = np.where(t < p[:, None], dev_l, 0).sum(axis=1)
        n_r = np.where(t >= p[:, None], dev_r, 0).sum(axis=1)
    else:
        n_l = np.empty(s - 1, dtype=np.int64)
        n_r = np.empty(s - 1, dtype=np.int64)
        for k, cut in enumerate(p):
            n_l[k] = np.abs(size_l[k] * moved[:cut] - sum_l[k]).sum()
            n_r[k] = np.abs(size_r[k] * moved[cut:] - sum_r[k]).sum()
    return _grid_ceil(n_l, size_l) + _grid_ceil(n_r, size_r)


def _cut_candidates(block: IntArray) -> tuple[list[tuple[int, int]], IntArray]:
    """Every interior cut (axis, offset) and its score -(ceil(G AE(B_L)) + ceil(G AE(B_R))), G = SCORE_GRID."""
    cands: list[tuple[int, int]] = []
    scores: list[IntArray] = []
    for axis, s in enumerate(block.shape):
        if s < 2:
            continue
        moved = np.moveaxis(block, axis, 0).reshape(s, -1)
        scores.append(-_split_ae_one_axis(moved))
        cands.extend((axis, off) for off in range(1, s))
    return cands, np.concatenate(scores)


def _score_sensitivity(size: int) -> int:
    """Sensitivity of the grid scores: ceil(SCORE_GRID * Delta_q), Delta_q = 2 Delta_AE(|B|) as in the seed.

    Only the child holding the changed cell changes, by at most ceil(G Delta_AE(child))
    <= ceil(G Delta_AE(|B|)) <= ceil(G Delta_q), so this bound holds for the rounded scores.
    """
    return math.ceil(SCORE_GRID * 2 * aggregation_error_sensitivity(size))


def _pf_coefficient(epsilon: Fraction, score_sensitivity: int) -> Fraction:
    """epsilon / (2 * score_sensitivity), rounded down to a multiple of 2^-62 if its denominator is larger."""
    coef = epsilon / (2 * score_sensitivity)
    if coef.denominator > _COEF_GRID:
        coef = Fraction(math.floor(coef * _COEF_GRID), _COEF_GRID)
    return coef


def _permute_and_flip(scores: IntArray, coef: Fraction, rng: RandomSource) -> int:
    """Permute-and-flip selection (McKenna & Sheldon 2020), exactly: returns a candidate index.

    Candidate i is accepted with probability exp(-coef * (max(scores) - scores[i])); the
    first accepted one in a uniformly random order wins. Drawing every coin and returning
    a uniformly random accepted candidate has the same distribution. With integer scores
    of sensitivity Delta and coef <= eps / (2 Delta) this is eps-DP.
    """
    gaps = scores.max() - scores
    accepted = np.flatnonzero(bernoulli_exp([coef.numerator * int(g) for g in gaps], coef.denominator, rng))
    # The best candidate has gap 0 and is always accepted, so `accepted` is never empty.
    return int(accepted[int(rng.integers(accepted.size, 1)[0])])


def build_pview(
    counts: npt.ArrayLike,
    epsilon: float,
    rng: RandomSource | int | None = None,
    params: PViewParams = PViewParams(),
) -> PView:
    """Build an eps-DP p-view of a count tensor (seed 000, Algorithms 1-2) with exact noise.

    Privacy: eps-DP (epsilon = eps_B, no delta); neighbouring relation add/remove one
    record, i.e. one cell of `counts` changes by 1. Mechanisms and sensitivities: converge test on |B| AE(B),
    sensitivity 2 (|B| - 1), discrete Laplace; cut selection by permute-and-flip on the
    grid-rounded scores, sensitivity ceil(2^20 * 2 Delta_AE(|B|)) in units of 2^-20 (the
    seed's Delta_q = 2 Delta_AE, rounded up); block sum, sensitivity 1, discrete Laplace.
    Each noise scale is sensitivity / epsilon rounded up to a multiple of 2^-20, and the
    permute-and-flip coefficient is never above eps_cut / (2 Delta), so every step spends
    at most its planned epsilon. The planned budgets are in the returned view
    (`PView.budget`, `Block.epsilon_*`); with the default rule every path spends exactly
    eps_B. Who knows the noise: only this trusted curator (the function); the view keeps
    only the partition and the noisy block sums, which are integers (possibly negative).

    Args:
        counts: non-negative whole-number counts, any number of axes
            (cells * total < 2**60).
        epsilon: the total budget eps_B.
        rng: the randomness: None (default) draws from AES-CTR under a fresh OS key
            (`CipherRandom`), the only choice for a real release; an int seed or a `SeededRandom` for tests.
        params: algorithm parameters (seed defaults).

    Raises:
        ValueError: invalid counts, epsilon, params or rng (InvalidInputError for rng).
        TypeError: rng is a numpy Generator (its integers() signature differs).
    """
    source = _check_rng(rng)
    x = _check_counts(counts)
    budget = plan_budget(epsilon, x.shape, params)
    kappa = budget.max_depth
    conv_eps = budget.converge_per_level
    cut_eps = budget.cut_per_level
    theta = exact_decimal(params.theta)

    blocks: list[Block] = []
    # Depth-first, left child first, as the seed's recursion.
    stack: list[tuple[tuple[int, ...], tuple[int, ...], int, Fraction, Fraction]] = [
        (tuple(0 for _ in x.shape), tuple(x.shape), 1, Fraction(0), Fraction(0))
    ]
    while stack:
        lo, hi, depth, spent_conv, spent_cut = stack.pop()
        view = x[tuple(slice(a, b) for a, b in zip(lo, hi))]
        size = view.size
        stop = depth >= kappa or size == 1
        if not stop and conv_eps > 0:
            scale = laplace_scale(2 * (size - 1), conv_eps)
            noisy = _scaled_ae(view) + int(discrete_laplace(scale, 1, source)[0])
            spent_conv = spent_conv + conv_eps
            stop = noisy <= size * theta
        if stop:
            blocks.append(_perturb(view, lo, hi, depth, spent_conv, spent_cut, budget, params, source))
            continue
        cands, scores = _cut_candidates(view)
        if cut_eps > 0:
            choice = _permute_and_flip(scores, _pf_coefficient(cut_eps, _score_sensitivity(size)), source)
        else:
            choice = int(source.integers(len(cands), 1)[0])
        spent_cut = spent_cut + cut_eps
        axis, off = cands[choice]
        mid = lo[axis] + off
        left_hi = hi[:axis] + (mid,) + hi[axis + 1 :]
        right_lo = lo[:axis] + (mid,) + lo[axis + 1 :]
        stack.append((right_lo, hi, depth + 1, spent_conv, spent_cut))
        stack.append((lo, left_hi, depth + 1, spent_conv, spent_cut))
    return PView(tuple(x.shape), tuple(blocks), budget)


def _perturb(
    view: IntArray,
    lo: tuple[int, ...],
    hi: tuple[int, ...],
    depth: int,
    spent_conv: Fraction,
    spent_cut: Fraction,
    budget: PViewBudget,
    params: PViewParams,
    rng: RandomSource,
) -> Block:
    """The block's noisy sum: its count + DLap(laplace_scale(1, eps)).

    Privacy: epsilon = eps, what the perturbation rule leaves this block (exact rule: eps_B less
    what its path spent on converge tests and cuts); sensitivity 1 (the block sum under a
    neighbouring relation of add/remove one record); only the curator running
    `build_pview` knows the draw.
    """
    if params.perturbation_rule == "exact":
        eps = budget.total - spent_conv - spent_cut
    else:  # seed 000 eq. (12)
        eps = budget.perturbation + budget.recursion * (1 - Fraction(depth, budget.max_depth))
    noisy = int(view.sum()) + int(discrete_laplace(laplace_scale(1, eps), 1, rng)[0])
    return Block(lo, hi, depth, spent_conv, spent_cut, eps, noisy)


def identity_estimate(counts: npt.ArrayLike, epsilon: float, rng: RandomSource | int | None = None) -> IntArray:
    """The Identity baseline: every cell + DLap(laplace_scale(1, eps)) (seed 000, [2]).

    Privacy: eps-DP, neighbouring relation add/remove one record (the count vector's L1
    sensitivity is 1);
    the scale 1/eps is rounded up to a multiple of 2^-20. Who knows the noise: only the
    caller (trusted curator). `rng` as in `build_pview` (None: OS CSPRNG). Returns
    integers (possibly negative), shaped like `counts`.

    Raises:
        ValueError: invalid counts, epsilon or rng. TypeError: rng is a numpy Generator.
    """
    source = _check_rng(rng)
    x = _check_counts(counts)
    eps = _real("epsilon", epsilon)
    if eps <= 0:
        raise ValueError(f"epsilon must be > 0 and finite, got {epsilon!r}")
    noise = discrete_laplace(laplace_scale(1, exact_decimal(eps)), x.size, source)
    return np.asarray(x + noise.reshape(x.shape), dtype=np.int64)


def box_sums(tensor: npt.ArrayLike, lows: npt.ArrayLike, highs: npt.ArrayLike) -> FloatArray:
    """Sums of `tensor` over many half-open boxes [lows[q], highs[q]) via a summed-area table.

    Raises:
        ValueError: lows/highs are not (q, ndim) integer arrays with 0 <= lo <= hi <= shape.
    """
    t = np.asarray(tensor, dtype=np.float64)
    lo = np.atleast_2d(np.asarray(lows))
    hi = np.atleast_2d(np.asarray(highs))
    d = t.ndim
    if lo.shape != hi.shape or lo.ndim != 2 or lo.shape[1] != d:
        raise ValueError(f"lows and highs must both have shape (q, {d}), got {lo.shape} and {hi.shape}")
    if lo.size and not (np.issubdtype(lo.dtype, np.integer) and np.issubdtype(hi.dtype, np.integer)):
        raise ValueError("lows and highs must be integer arrays")
    shape = np.asarray(t.shape)
    if lo.size and (np.any(lo < 0) or np.any(lo > hi) or np.any(hi > shape[None, :])):
        raise ValueError("every box must satisfy 0 <= lo <= hi <= shape")
    sat = np.zeros(tuple(s + 1 for s in t.shape))
    sat[tuple(slice(1, None) for _ in range(d))] = t
    for axis in range(d):
        np.cumsum(sat, axis=axis, out=sat)
    out = np.zeros(lo.shape[0])
    for corner in itertools.product((0, 1), repeat=d):
        idx = tuple(np.where(bit, hi[:, k], lo[:, k]) for k, bit in enumerate(corner))
        sign = -1.0 if (d - sum(corner)) % 2 else 1.0
        out += sign * sat[idx]
    return out
