"""Confidence intervals for released values and range answers, from the discrete Laplace noise they carry.

Meaning (one sentence): in at least `confidence` of releases (over the noise, for any true
data) the interval contains the true count; the bias of spreading a partition's count
evenly over its bins (ranges that cut a partition) is not covered.

Post-processing only: an interval is a deterministic function of released numbers (values,
noise variances, the number of noise draws per value); it adds no noise, draws no
randomness and spends no privacy budget.

The noise of one released value is the sum of `draws` independent discrete Laplace draws of
one scale (the computation server's and the key holders'; a threshold study's holders add
K/(K - T) draws' worth, a negative-binomial difference, which is the same family with a
fractional `draws`). A discrete Laplace draw of variance v has the moment generating
function E[exp(u X)] = 1 / (1 - v (cosh u - 1)) (for v (cosh u - 1) < 1), so a value with
total variance V made of r draws has log-MGF  r * psi(V / r, u),  psi(v, u) = -log(1 - v (cosh u - 1)).

Method, by how much is known:

* "exact": one value whose noise is one or two draws of one scale: the distribution of the
  noise is known in closed form (P[D1 + D2 = y] = c^2 q^|y| (|y| + 1 + 2q^2/(1 - q^2)),
  c = (1 - q)/(1 + q)); the half-width is the least integer k with P[|noise| > k] <= 1 - confidence,
  so coverage is at least `confidence` (more only by the lattice's discreteness).
* A "tree" summary of one released partition (auto's one count per bin) estimates each cell by
  its released value, so its ranges get the partition methods below, exact for whole cells.
* "exact" also for a sum of whole released values (a range made of whole partitions): r
  draws of one scale sum to N - N' with N, N' ~ NB(r, q), and the sum over scales is a
  convolution; the distribution is computed on the integer lattice (FFT, with a 1e-9 slack
  on the tail probability for rounding and the cut-off mass, on the conservative side) up
  to MAX_EXACT_SUPPORT points, beyond which the Chernoff bound is used.
* "exact" also for a range that cuts a partition (fractions of up to a few values on top of
  whole ones): the cut values' noise is enumerated atom by atom against the whole part's
  lattice distribution, and the half-width found by bisection on the exact tail (same
  slack), up to MAX_CUT_ATOMS atoms.
* "chernoff": where the exact computations do not fit, or the number of draws is not a
  whole number: a linear combination sum_j a_j N_j of values with known weights and
  variances (the "partition" estimator: whole partitions and fractions of cut ones). Its exact
  log-MGF is sum_j r psi(V_j / r, a_j u), and the Chernoff bound
  P[|Y| >= t] <= 2 exp(K(u) - u t) for every u > 0 gives the half-width
  t = min_u (K(u) + log(2 / (1 - confidence))) / u. It is a guarantee for any u, so a
  numerically imperfect minimisation only widens it. Measured: about 1.7 times the exact
  half-width for one value at 95% (1.5 at 99%), 2.8 standard errors for a sum of ten
  partitions at 95% (a normal interval would claim 1.96). Chebyshev (k = 1/sqrt(1 - confidence):
  4.47 standard errors at 95%) was rejected as far too wide; a normal interval (1.96) is
  not guaranteed and does under-cover for a single value at small noise (see the tests).
* "chernoff" also for the least-squares estimators (a tree of more than one level, wavelets): the
  answer is a linear combination of independent released values whose weights the estimator's
  adjoint gives (`IntervalTree.query_terms`, `haar_prefix_adjoint`), so the Chernoff bound above
  applies to it directly: about 2.8 standard errors at 95%. A value measured twice (one interval at
  two tree levels) enters once with its combined variance, which only enlarges the MGF. Used up to
  `summary.MAX_TERMS` cells or bins, and only where it is narrower than the "bound" below.
* "bound": only the standard error sigma of a linear combination is known (least-squares
  "tree" and wavelet estimators), plus the smallest variance V_min of any released value
  that enters it. Each term's log-MGF is a power series in its variance share s_j = a_j^2 V_j
  with non-negative coefficients that grows as V_j shrinks, so (by superadditivity)
  K(u) <= r psi(V_min / r, u sigma / sqrt(V_min)): the answer's noise has an MGF no larger
  than that of one released value of the smallest variance, scaled to standard error sigma,
  so the Chernoff bound of the latter holds for it. That half-width is used: about 3.6 standard errors at 95% for
  moderate scales, wide (the exact 95% quantile of one Laplace-like value is about 2.1),
  but guaranteed without the least-squares weights. "haar_nonnegative" refines the linear
  wavelet estimate non-linearly; its interval is the linear estimate's (centred on it).

Fewer draws per value with the same total variance give a larger MGF (r psi(V / r, u) falls as
r grows), so where the number of draws is only known from below (a threshold study's K/(K - T)
seen from a client that does not know K) the Chernoff bound for the fewer draws (the contract's
noise_parties) stays valid; the exact methods are used only where the draws are known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import numpy.typing as npt

from .errors import InvalidInputError

__all__ = [
    "DEFAULT_CONFIDENCE",
    "ConfidenceInterval",
    "check_confidence",
    "exact_halfwidth",
    "chernoff_halfwidth",
    "exact_sum_halfwidth",
    "exact_cut_halfwidth",
    "bound_halfwidth",
    "grouped_terms",
    "noise_halfwidth",
    "weighted_sum_halfwidth",
    "value_interval",
    "describe",
]

DEFAULT_CONFIDENCE = 0.95

#: What an interval promises, in one sentence (shown by the CLI and the docs).
MEANING = ("in at least {pct} of releases the interval contains the true count, over the noise; "
           "the bias of spreading a count evenly inside a partition is not covered")


@dataclass(frozen=True)
class ConfidenceInterval:
    """[lo, hi] around an estimate: contains the true count in at least `confidence` of releases (over the
    noise; not the bias of spreading a partition's count evenly over its bins). `method`: "exact", "chernoff"
    or "bound" (see this module's docstring)."""

    lo: float
    hi: float
    confidence: float
    method: str


def check_confidence(confidence: float) -> float:
    """`confidence` as a float in (0, 1), or InvalidInputError."""
    c = float(confidence)
    if not (0.0 < c < 1.0):
        raise InvalidInputError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    return c


def _q_from_variance(v: float) -> float:
    """q = exp(-1/scale) of the discrete Laplace draw of variance v = 2q/(1 - q)^2."""
    # v (1 - q)^2 = 2 q  <=>  v q^2 - (2v + 2) q + v = 0; the root in (0, 1).
    return (v + 1.0 - math.sqrt(2.0 * v + 1.0)) / v


def _two_draw_tail(q: float, k: int) -> float:
    """P[D1 + D2 > k] for two independent discrete Laplace draws with parameter q, k >= 0."""
    c2 = ((1.0 - q) / (1.0 + q)) ** 2
    a = 1.0 + 2.0 * q * q / (1.0 - q * q)
    t = k + 1
    geo = q**t / (1.0 - q)                               # sum_{y >= t} q^y
    lin = q**t * (t * (1.0 - q) + q) / (1.0 - q) ** 2    # sum_{y >= t} y q^y
    return c2 * (lin + a * geo)


def _one_draw_tail(q: float, k: int) -> float:
    """P[D > k] for one discrete Laplace draw, k >= 0: q^(k+1) / (1 + q)."""
    return float(q ** (k + 1) / (1.0 + q))


def exact_halfwidth(variance: float, confidence: float, draws: int = 2) -> int:
    """Least integer k with P[|noise| > k] <= 1 - confidence for one value whose noise is `draws` (1 or 2)
    independent discrete Laplace draws of one scale and total variance `variance` (exact)."""
    alpha = 1.0 - check_confidence(confidence)
    if draws not in (1, 2):
        raise InvalidInputError(f"the exact interval knows one or two draws, got {draws}")
    if variance <= 0:
        return 0
    q = _q_from_variance(variance / draws)
    tail = _two_draw_tail if draws == 2 else _one_draw_tail
    hi = 1
    while 2.0 * tail(q, hi) > alpha:
        hi *= 2
    lo = 0
    if 2.0 * tail(q, 0) <= alpha:
        return 0
    while hi - lo > 1:  # 2 * tail(lo) > alpha >= 2 * tail(hi)
        mid = (lo + hi) // 2
        if 2.0 * tail(q, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


#: Largest lattice (entries) the exact distribution of a sum is computed on; wider sums use the Chernoff bound.
MAX_EXACT_SUPPORT = 1 << 21
#: Slack on a computed tail probability (FFT and summation rounding), on the conservative side.
_TAIL_SLACK = 1e-9


def _nb_difference_pmf(q: float, r: float) -> npt.NDArray[np.float64] | None:
    """pmf of N - N' on [-L, L] for independent N, N' ~ NB(r, q) (r discrete Laplace draws of parameter q),
    or None when L would exceed MAX_EXACT_SUPPORT / 2."""
    mean, sd = r * q / (1.0 - q), math.sqrt(r * q) / (1.0 - q)
    length = int(mean + 40.0 * sd + 64.0)
    while True:
        if 2 * length + 1 > MAX_EXACT_SUPPORT:
            return None
        k = np.arange(1, length, dtype=np.float64)
        logp = np.concatenate([[r * math.log1p(-q)], r * math.log1p(-q) + np.cumsum(np.log(q * (k + r - 1.0) / k))])
        p = np.exp(logp)
        if 1.0 - math.fsum(p.tolist()) < 1e-11:  # the cut mass, well inside _TAIL_SLACK
            break
        length *= 2
    n = 1 << int(2 * length - 1).bit_length()
    fp = np.fft.rfft(p, n)
    corr = np.fft.irfft(fp * np.conj(fp), n)  # corr[d] = sum_k p[k + d] p[k], circular
    pmf = np.concatenate([corr[n - length + 1:], corr[:length]])
    return np.asarray(np.clip(pmf, 0.0, None), dtype=np.float64)


def _sum_pmf(variances: npt.NDArray[np.float64], counts: npt.NDArray[np.float64],
             draws: int) -> npt.NDArray[np.float64] | None:
    """pmf on [-H, H] (index H is 0) of the noise of a sum of whole values: counts[g] values of variance
    variances[g], each `draws` draws; None when it would not fit MAX_EXACT_SUPPORT."""
    pmf: npt.NDArray[np.float64] = np.ones(1)
    for var, cnt in zip(variances, counts):
        if var <= 0 or cnt <= 0:
            continue
        part = _nb_difference_pmf(_q_from_variance(float(var) / draws), float(cnt) * draws)
        if part is None or pmf.size + part.size - 1 > MAX_EXACT_SUPPORT:
            return None
        size = pmf.size + part.size - 1
        m = 1 << int(size - 1).bit_length()
        pmf = np.clip(np.fft.irfft(np.fft.rfft(pmf, m) * np.fft.rfft(part, m), m)[:size], 0.0, None)
    return pmf


def exact_sum_halfwidth(variances: Sequence[float] | npt.ArrayLike, counts: Sequence[float] | npt.ArrayLike,
                        confidence: float, draws: int = 2) -> int | None:
    """Least integer k with P[|noise| > k] <= 1 - confidence for a sum of whole released values: counts[g]
    values of noise variance variances[g], each `draws` independent discrete Laplace draws (a sum of r such
    draws is N - N', N and N' ~ NB(r, q)). The distribution is computed on the integer lattice (FFT, with a
    1e-9 slack on the tail, on the conservative side); None when it would not fit MAX_EXACT_SUPPORT."""
    alpha = 1.0 - check_confidence(confidence)
    pmf = _sum_pmf(np.asarray(variances, dtype=np.float64).reshape(-1),
                   np.asarray(counts, dtype=np.float64).reshape(-1), draws)
    if pmf is None:
        return None
    half = pmf.size // 2  # pmf[half] is P[noise = 0]
    upper = pmf[half + 1:]  # P[noise = 1], P[noise = 2], ...
    tails = np.cumsum(upper[::-1])[::-1]  # tails[k - 1] = P[noise >= k]
    # P[|noise| > k] = 2 P[noise >= k + 1] (symmetric); the least k with that (plus slack) <= alpha.
    ok = np.flatnonzero(2.0 * (tails + _TAIL_SLACK) <= alpha)
    if ok.size == 0:
        return int(upper.size)
    return int(ok[0])


#: Most atoms of the fractional part of a cut range's noise that `exact_cut_halfwidth` enumerates.
MAX_CUT_ATOMS = 1 << 18


def exact_cut_halfwidth(variances: Sequence[float] | npt.ArrayLike, counts: Sequence[float] | npt.ArrayLike,
                        cut_weights: Sequence[float] | npt.ArrayLike, cut_variances: Sequence[float] | npt.ArrayLike,
                        confidence: float, draws: int = 2) -> float | None:
    """Half-width t with P[|noise| > t] <= 1 - confidence for a range that cuts partitions: the noise is a
    sum of whole values (as in `exact_sum_halfwidth`) plus cut_weights[j] times the noise of value j.

    The whole part's distribution is on the integers; the cut values' (at most a few) are enumerated
    atom by atom, so P[|noise| > t] = sum over atoms w of p(w) (P[Y > t - w] + P[Y > t + w]) is computed
    exactly (up to the 1e-9 slack, plus the mass of atoms dropped below 1e-15) and t found by bisection,
    ending on the side that covers. None when the supports are too large (then use `chernoff_halfwidth`).
    """
    alpha = 1.0 - check_confidence(confidence)
    atoms, probs = np.zeros(1), np.ones(1)
    lost = 0.0
    for w, v in zip(np.asarray(cut_weights, dtype=np.float64).reshape(-1),
                    np.asarray(cut_variances, dtype=np.float64).reshape(-1)):
        if w == 0 or v <= 0:
            continue
        pmf = _sum_pmf(np.array([v]), np.ones(1), draws)
        if pmf is None or pmf.size * atoms.size > 4 * MAX_CUT_ATOMS:
            return None
        values = w * (np.arange(pmf.size) - pmf.size // 2)
        atoms = (atoms[:, None] + values[None, :]).reshape(-1)
        probs = (probs[:, None] * pmf[None, :]).reshape(-1)
        keep = probs >= 1e-15
        lost += float(probs[~keep].sum())
        atoms, probs = atoms[keep], probs[keep]
        if atoms.size > MAX_CUT_ATOMS:
            return None
    base = _sum_pmf(np.asarray(variances, dtype=np.float64).reshape(-1),
                    np.asarray(counts, dtype=np.float64).reshape(-1), draws)
    if base is None:
        return None
    h = base.size // 2
    # above[i] = P[Y >= i - h] for i = 0 .. 2h + 1 (0 beyond the support)
    above = np.append(np.cumsum(base[::-1])[::-1], 0.0)

    def exceed(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """P[Y > x] for real x: P[Y >= floor(x) + 1]."""
        idx = np.clip(np.floor(x).astype(np.int64) + 1 + h, 0, 2 * h + 1)
        return np.asarray(above[idx], dtype=np.float64)

    def tail(t: float) -> float:
        return float(np.sum(probs * (exceed(t - atoms) + exceed(t + atoms)))) + lost + _TAIL_SLACK

    lo_t, hi_t = 0.0, float(h + np.max(np.abs(atoms)) + 1.0)
    if tail(hi_t) > alpha:
        return None
    if tail(lo_t) <= alpha:
        return 0.0
    for _ in range(60):  # tail(lo_t) > alpha >= tail(hi_t)
        mid = 0.5 * (lo_t + hi_t)
        if tail(mid) > alpha:
            lo_t = mid
        else:
            hi_t = mid
        if hi_t - lo_t < 1e-6 * max(1.0, hi_t):
            break
    return hi_t


def _log_mgf(u: float, weights: npt.NDArray[np.float64], variances: npt.NDArray[np.float64],
             counts: npt.NDArray[np.float64], draws: float) -> float:
    """sum_j counts_j * draws * psi(variances_j / draws, weights_j * u); inf outside the domain."""
    x = (variances / draws) * np.expm1(np.abs(weights) * u) ** 2 / (2.0 * np.exp(np.abs(weights) * u))
    # cosh(w) - 1 = (e^w - 1)^2 / (2 e^w), accurate for small w
    if np.any(x >= 1.0):
        return math.inf
    return float(np.sum(counts * draws * -np.log1p(-x)))


def chernoff_halfwidth(weights: Sequence[float] | npt.ArrayLike, variances: Sequence[float] | npt.ArrayLike,
                       confidence: float, draws: float = 2.0,
                       counts: Sequence[float] | npt.ArrayLike | None = None) -> float:
    """Half-width t with P[|sum_j a_j N_j| >= t] <= 1 - confidence, by the Chernoff bound on the exact MGF.

    N_j is value j's noise: `draws` independent discrete Laplace draws of total variance
    variances[j]; `counts[j]` (default 1) repeats a term (many whole partitions of one
    variance). Any u gives a valid bound; the minimum over u is found by golden-section
    search on log u, where (K(u) + log(2/alpha)) / u is unimodal (K is convex).
    """
    alpha = 1.0 - check_confidence(confidence)
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    v = np.asarray(variances, dtype=np.float64).reshape(-1)
    n = np.ones_like(w) if counts is None else np.asarray(counts, dtype=np.float64).reshape(-1)
    if w.shape != v.shape or w.shape != n.shape:
        raise InvalidInputError("weights, variances and counts must have equal lengths")
    if not draws > 0:
        raise InvalidInputError(f"draws must be > 0, got {draws}")
    keep = (w != 0) & (v > 0) & (n > 0)
    w, v, n = np.abs(w[keep]), v[keep], n[keep]
    if w.size == 0:
        return 0.0
    c = math.log(2.0 / alpha)
    # Domain: (v / draws)(cosh(w u) - 1) < 1 for every term.
    u_max = float(np.min(np.arccosh(1.0 + draws / v) / w))

    def f(log_u: float) -> float:
        u = math.exp(log_u)
        k = _log_mgf(u, w, v, n, draws)
        return (k + c) / u if math.isfinite(k) else math.inf

    sigma = math.sqrt(float(np.sum(n * w * w * v)))
    a, b = math.log(u_max) - 40.0, math.log(u_max) - 1e-12
    a = min(a, math.log(1e-6 / sigma))
    g = (math.sqrt(5.0) - 1.0) / 2.0
    x1, x2 = b - g * (b - a), a + g * (b - a)
    f1, f2 = f(x1), f(x2)
    for _ in range(200):
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - g * (b - a)
            f1 = f(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + g * (b - a)
            f2 = f(x2)
        if b - a < 1e-10:
            break
    best = min(f1, f2)
    return best * (1.0 + 1e-9)  # every u gives a valid bound: only rounding to guard against


def grouped_terms(weights: npt.ArrayLike, variances: npt.ArrayLike,
                  ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(weights, variances, counts) for `chernoff_halfwidth`: terms of equal variance whose |weights| agree to
    within a factor 2^(2^-20) merged into one term of the largest of those weights, repeated. A larger |weight|
    only enlarges a term's MGF, so the merged bound holds for the original terms (wider by under 1e-6);
    a least-squares answer's thousands of weights take a few distinct values, which keeps the search short."""
    w = np.abs(np.asarray(weights, dtype=np.float64).reshape(-1))
    v = np.asarray(variances, dtype=np.float64).reshape(-1)
    keep = (w > 0) & (v > 0) & np.isfinite(v)
    w, v = w[keep], v[keep]
    if w.size == 0:
        return w, v, np.ones(0)
    bucket = np.floor(np.log2(w) * (1 << 20)).astype(np.int64)
    keys = np.stack([bucket, np.unique(v, return_inverse=True)[1].reshape(-1)], axis=1)
    uniq, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    top = np.zeros(uniq.shape[0])
    np.maximum.at(top, inverse, w)
    var = np.zeros(uniq.shape[0])
    var[inverse] = v
    return top, var, counts.astype(np.float64)


def bound_halfwidth(standard_error: float, min_value_variance: float, confidence: float,
                    draws: float = 2.0) -> float:
    """Half-width for a linear combination of released values known only by its standard error and the
    smallest variance of a value in it: the Chernoff half-width of one value of variance `min_value_variance`
    scaled to `standard_error` (a bound on the combination's MGF; see the module docstring)."""
    check_confidence(confidence)
    if standard_error <= 0:
        return 0.0
    if not min_value_variance > 0:
        raise InvalidInputError(f"the smallest value variance must be > 0, got {min_value_variance}")
    weight = standard_error / math.sqrt(min_value_variance)
    return chernoff_halfwidth([weight], [min_value_variance], confidence, draws)


def noise_halfwidth(variance: float, confidence: float, draws: float = 2.0) -> tuple[float, str]:
    """Half-width and method for one released value of noise variance `variance` made of `draws` draws:
    exact for one or two draws, the Chernoff bound otherwise (a threshold study's fractional draws)."""
    check_confidence(confidence)
    if variance <= 0:
        return 0.0, "exact"
    if draws in (1, 2, 1.0, 2.0):
        return float(exact_halfwidth(variance, confidence, int(draws))), "exact"
    return chernoff_halfwidth([1.0], [variance], confidence, draws), "chernoff"


def weighted_sum_halfwidth(weights: npt.ArrayLike, variances: npt.ArrayLike, confidence: float,
                           draws: float = 2.0) -> tuple[float, str]:
    """Half-width and method for sum_j weights[j] N_j, N_j a released value's noise (`draws` draws, variance
    variances[j]), weights in (0, 1]: 1 for a whole partition, its overlapping share for a cut one. Exact for
    one value, for whole values (`exact_sum_halfwidth`) and for whole plus cut ones (`exact_cut_halfwidth`)
    where the distribution fits; the Chernoff bound otherwise (or for fractional draws)."""
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    var = np.asarray(variances, dtype=np.float64).reshape(-1)
    if w.size == 1 and w[0] == 1.0:
        return noise_halfwidth(float(var[0]), confidence, draws)
    whole = w == 1.0
    uniq, counts = np.unique(var[whole], return_counts=True)
    exact: float | None = None
    if float(draws).is_integer():
        exact = exact_sum_halfwidth(uniq, counts, confidence, int(draws)) if whole.all() else \
            exact_cut_halfwidth(uniq, counts, w[~whole], var[~whole], confidence, int(draws))
    if exact is not None:
        return float(exact), "exact"
    cw = np.concatenate([np.ones(uniq.size), w[~whole]])
    cv = np.concatenate([uniq, var[~whole]])
    n = np.concatenate([counts.astype(np.float64), np.ones(int((~whole).sum()))])
    return chernoff_halfwidth(cw, cv, confidence, draws, counts=n), "chernoff"


def value_interval(value: float, standard_error: float, confidence: float = DEFAULT_CONFIDENCE, *,
                   draws: float = 2.0, draws_exact: bool = True) -> ConfidenceInterval:
    """The interval of one measured value (e.g. a direct range count) from its standard error: its noise is
    `draws` discrete Laplace draws of one scale. `draws_exact` False means the value carries at least
    `draws` draws' worth (a threshold study's key holders add K/(K - T) with K unknown here): then the
    Chernoff bound for `draws` draws is used, which stays valid for more (see the module docstring).
    Post-processing: adds no noise, spends no budget."""
    variance = float(standard_error) ** 2
    if draws_exact:
        half, method = noise_halfwidth(variance, confidence, draws)
    else:
        half, method = chernoff_halfwidth([1.0], [variance], confidence, draws), "chernoff"
    return ConfidenceInterval(value - half, value + half, check_confidence(confidence), method)


def describe(confidence: float) -> str:
    """The meaning of an interval at level `confidence`, in one sentence."""
    return MEANING.format(pct=f"{100.0 * check_confidence(confidence):g}%")
