"""Plaintext p-views of count tensors by DP-Mondrian / HDPView bisection (seed 000), trusted curator.

A p-view partitions a d-dimensional count tensor into axis-aligned blocks, releases one
noisy count per block and spreads it uniformly over the block's cells (seed 000, Sec. 3-4).
The partition is found by recursive bisection (Algorithm 1, 2 of the seed):

* random converge: a block stops splitting when AE(B) + Lap(Delta_AE / eps_conv) <= theta,
  where AE(B) = sum_{x in B} |x - S/|B|| is the aggregation error and
  Delta_AE = 2 (1 - 1/|B|) (Theorem 3);
* random cut: otherwise a cutting point p (any axis, any interior position) is drawn by the
  exponential mechanism with score q(B, p) = -(AE(B_L) + AE(B_R)) and sensitivity
  Delta_q = 2 Delta_AE (Sec. 4.3, eq. (10), (11));
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

Noise is sampled with numpy's floating-point Laplace and exponential-mechanism sampling
from the caller's np.random.Generator, with each epsilon rounded down and each scale
rounded up to a float. This is a research / benchmarking implementation for a trusted
curator: floating-point samplers are not hardened against Mironov-style attacks, and the
noise must come from a generator seeded from `secrets` in any real use, e.g.
``np.random.default_rng(secrets.randbits(128))``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, Sequence

import numpy as np
import numpy.typing as npt

__all__ = [
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
PerturbationRule = Literal["exact", "seed"]

# Above this many intermediate floats the cut scores of one axis are computed in a loop
# rather than in one broadcast (memory, not speed, is the limit).
_BROADCAST_LIMIT = 4_000_000


def _exact(x: float) -> Fraction:
    return Fraction(repr(float(x)))


def _float_down(x: Fraction) -> float:
    f = float(x)
    return math.nextafter(f, -math.inf) if Fraction(f) > x else f


def _float_up(x: Fraction) -> float:
    f = float(x)
    return math.nextafter(f, math.inf) if Fraction(f) < x else f


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
        return max(1, math.ceil(_exact(beta) * (n_cells.bit_length() - 1)))
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
    total = _exact(eps)
    recursion = total * _exact(params.recursion_ratio)
    kappa = _max_depth(math.prod(dims), params.beta)
    level = recursion / kappa
    conv = level * _exact(params.gamma)
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
        epsilon_perturbation: epsilon of the Laplace noise on its sum (sensitivity 1).
        noisy_sum: S + Lap(1 / epsilon_perturbation), the only data-dependent value kept.
    """

    lo: tuple[int, ...]
    hi: tuple[int, ...]
    depth: int
    epsilon_converge: Fraction
    epsilon_cut: Fraction
    epsilon_perturbation: Fraction
    noisy_sum: float

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


def _check_counts(counts: npt.ArrayLike) -> FloatArray:
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
    return x


def aggregation_error(block: npt.ArrayLike) -> float:
    """AE(B) = sum_{x in B} |x - S / |B||, seed 000 eq. (5)."""
    x = np.asarray(block, dtype=np.float64)
    return float(np.abs(x - x.mean()).sum())


def aggregation_error_sensitivity(size: int) -> Fraction:
    """Delta_AE = 2 (1 - 1/|B|) under add/remove one record (seed 000, Theorem 3)."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return 2 * (1 - Fraction(1, size))


def _split_ae_one_axis(moved: FloatArray) -> FloatArray:
    """AE(B_L) + AE(B_R) for every cut 1..s-1 along axis 0 of `moved` (shape (s, r))."""
    s, r = moved.shape
    cum = np.cumsum(moved.sum(axis=1))
    total = cum[-1]
    p = np.arange(1, s)
    mean_l = cum[:-1] / (p * r)
    mean_r = (total - cum[:-1]) / ((s - p) * r)
    if (s - 1) * s * r <= _BROADCAST_LIMIT:
        row_l = np.abs(moved[None, :, :] - mean_l[:, None, None]).sum(axis=2)
        row_r = np.abs(moved[None, :, :] - mean_r[:, None, None]).sum(axis=2)
        t = np.arange(s)[None, :]
        left = np.where(t < p[:, None], row_l, 0.0).sum(axis=1)
        right = np.where(t >= p[:, None], row_r, 0.0).sum(axis=1)
        return np.asarray(left + right, dtype=np.float64)
    out = np.empty(s - 1)
    for k, cut in enumerate(p):
        out[k] = np.abs(moved[:cut] - mean_l[k]).sum() + np.abs(moved[cut:] - mean_r[k]).sum()
    return out


def _cut_candidates(block: FloatArray) -> tuple[list[tuple[int, int]], FloatArray]:
    cands: list[tuple[int, int]] = []
    scores: list[FloatArray] = []
    for axis, s in enumerate(block.shape):
        if s < 2:
            continue
        moved = np.moveaxis(block, axis, 0).reshape(s, -1)
        scores.append(-_split_ae_one_axis(moved))
        cands.extend((axis, off) for off in range(1, s))
    return cands, np.concatenate(scores)


def _exponential_mechanism(rng: np.random.Generator, scores: FloatArray, coef: float) -> int:
    # P(i) proportional to exp(coef * score_i) with coef = eps / (2 Delta_q).
    z = coef * (scores - scores.max())
    w = np.exp(z)
    return int(rng.choice(scores.shape[0], p=w / w.sum()))


def build_pview(
    counts: npt.ArrayLike,
    epsilon: float,
    rng: np.random.Generator,
    params: PViewParams = PViewParams(),
) -> PView:
    """Build an eps-DP p-view of a count tensor (seed 000, Algorithms 1-2).

    Privacy: eps-DP (epsilon = eps_B, no delta) under add/remove one record, i.e. one cell
    of `counts` changes by 1. Sensitivities: AE 2(1 - 1/|B|) (converge test), cut score
    2 * Delta_AE (exponential mechanism, as the seed), block sum 1 (perturbation). The
    per-level budgets and the per-block perturbation epsilons are in the returned view
    (`PView.budget`, `Block.epsilon_*`); with the default rule every path spends exactly
    eps_B. Who knows the noise: only this trusted curator (the function); the view keeps
    only noisy sums. Block counts are real numbers (not rounded, may be negative).

    Args:
        counts: non-negative whole-number counts, any number of axes.
        epsilon: the total budget eps_B.
        rng: the only randomness source. Tests pass a seeded generator; production must
            pass one seeded from `secrets` (np.random.default_rng(secrets.randbits(128))).
        params: algorithm parameters (seed defaults).

    Raises:
        ValueError: invalid counts, epsilon or params.
        TypeError: rng is not a numpy Generator.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    x = _check_counts(counts)
    budget = plan_budget(epsilon, x.shape, params)
    kappa = budget.max_depth
    conv_eps = budget.converge_per_level
    cut_eps = budget.cut_per_level

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
            sens = aggregation_error_sensitivity(size)
            noisy_ae = aggregation_error(view) + rng.laplace(0.0, _float_up(sens / conv_eps))
            spent_conv = spent_conv + conv_eps
            stop = noisy_ae <= params.theta
        if stop:
            blocks.append(_perturb(view, lo, hi, depth, spent_conv, spent_cut, budget, params, rng))
            continue
        cands, scores = _cut_candidates(view)
        if cut_eps > 0:
            delta_q = 2 * aggregation_error_sensitivity(size)
            choice = _exponential_mechanism(rng, scores, _float_down(cut_eps / (2 * delta_q)))
        else:
            choice = int(rng.integers(len(cands)))
        spent_cut = spent_cut + cut_eps
        axis, off = cands[choice]
        mid = lo[axis] + off
        left_hi = hi[:axis] + (mid,) + hi[axis + 1 :]
        right_lo = lo[:axis] + (mid,) + lo[axis + 1 :]
        stack.append((right_lo, hi, depth + 1, spent_conv, spent_cut))
        stack.append((lo, left_hi, depth + 1, spent_conv, spent_cut))
    return PView(tuple(x.shape), tuple(blocks), budget)


def _perturb(
    view: FloatArray,
    lo: tuple[int, ...],
    hi: tuple[int, ...],
    depth: int,
    spent_conv: Fraction,
    spent_cut: Fraction,
    budget: PViewBudget,
    params: PViewParams,
    rng: np.random.Generator,
) -> Block:
    if params.perturbation_rule == "exact":
        eps = budget.total - spent_conv - spent_cut
    else:  # seed 000 eq. (12)
        eps = budget.perturbation + budget.recursion * (1 - Fraction(depth, budget.max_depth))
    noisy = float(view.sum()) + rng.laplace(0.0, _float_up(1 / eps))
    return Block(lo, hi, depth, spent_conv, spent_cut, eps, float(noisy))


def identity_estimate(counts: npt.ArrayLike, epsilon: float, rng: np.random.Generator) -> FloatArray:
    """The Identity baseline: every cell + Lap(1/eps) (seed 000, [2]).

    Privacy: eps-DP under add/remove one record (the count vector's L1 sensitivity is 1).
    Who knows the noise: only the caller (trusted curator). Same RNG caveats as
    `build_pview`.

    Raises:
        ValueError: invalid counts or epsilon. TypeError: rng is not a Generator.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    x = _check_counts(counts)
    eps = _real("epsilon", epsilon)
    if eps <= 0:
        raise ValueError(f"epsilon must be > 0 and finite, got {epsilon!r}")
    return x + rng.laplace(0.0, _float_up(1 / _exact(eps)), size=x.shape)


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
