"""Bayesian DP for correlated records: leakage coefficients and Laplace calibration (seed 003).

Size: over 500 lines on purpose: the leakage coefficients and the calibration are one derivation
(seed 003, Sec. 5-6), kept beside the equations they implement and tested together.

Seed 003 (Yang, Sato, Nakagawa) models correlated records x_1..x_n as a Gaussian Markov
random field on a weighted, undirected graph W (w_ij >= 0, "Gaussian correlation model",
Def. 5.1): the precision matrix is the graph Laplacian L = D - W, D = diag(sum_j w_ij),
optionally plus a Gaussian prior tau * I (Sec. 5.5 and 6.1: L_hat = L + tau I). An
adversary A(i, K) targets record i and knows the records in K; the others, U, are
marginalised. For the sum query s = sum_i x_i released as s + Lap(lambda), Theorem 5.1
gives the Bayesian DP leakage

    BDPL_A = (M / lambda) * (1 + l_A),   l_A = m * w_0i / w_0,

where M bounds how much one record's value can change, m = |U|, and (w_0, w_0i) are
entries of the precision matrix of (x_0, x_i, x_K) with x_0 the mean of the unknown
records (Proposition 5.1 shows how to obtain it by merging records into x_0 one at a
time). Theorem 5.2: l_A only grows when the adversary knows less, so the worst case is a
weak adversary A(i, {}) and lambda >= (1 + max_i l_i) * M / eps gives eps-BDP.

Readings of the seed made here (each checked by tests):

* l_A is the coefficient of x_i in E[s_U | x_i, x_K], i.e. the regression slope of the
  unknown records' sum on the target. Algorithm 1's base case prints ``w_0 / w_01``; that
  contradicts Theorem 5.1 (l = m w_0i / w_0) and gives the wrong tau = 0 limit, so we use
  Theorem 5.1. Algorithm 1 also reuses the counter m across its two branches; each branch
  must start from the m it was called with, which is what we do.
* Algorithm 1 is called with m = 1 and the first row of L as x_0, so it yields the
  coefficients of records 2..n; we obtain record 1's coefficient with one more chain of
  merges (using record 2 as x_0). Both stay O(n^3).
* With tau = 0 the model is improper, the seed assumes the graph connected (Sec. 5.1), and
  every weak adversary has 1 + l = n (eq. (29)); we require connectivity when tau = 0.
* The two-record examples of Sec. 3.3 / 4.2.3 (binary records, tables 3(a)-(c)) are not
  Gaussian; `discrete_sum_bdpl` evaluates Definition 4.1 exactly for such small tables and
  reproduces the seed's 0.196 (~2 eps, positive correlation) and 0.004 (negative).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from ..core.validation import positive_finite

__all__ = [
    "CorrelationModel",
    "leakage_coefficients",
    "leakage_coefficient",
    "max_leakage",
    "bayesian_laplace_scale",
    "combine",
    "correlation_terms",
    "adjacency_digest",
    "discrete_sum_bdpl",
    "sum_query_posterior",
]

FloatArray = npt.NDArray[np.float64]
LeakageMethod = Literal["algorithm1", "closed_form"]


def _components(adjacency: FloatArray) -> int:
    n = adjacency.shape[0]
    seen = np.zeros(n, dtype=bool)
    count = 0
    for start in range(n):
        if seen[start]:
            continue
        count += 1
        stack = [start]
        seen[start] = True
        while stack:
            v = stack.pop()
            for u in np.flatnonzero((adjacency[v] > 0) & ~seen):
                seen[u] = True
                stack.append(int(u))
    return count


@dataclass(frozen=True, eq=False)
class CorrelationModel:
    """Seed 003's Gaussian correlation model G(x, L) with prior tau: precision L + tau I.

    Attributes:
        adjacency: n x n weighted adjacency W (read-only float64 copy): symmetric,
            finite, w_ij >= 0, zero diagonal. w_ij > 0 means records i and j are
            positively correlated; the model cannot express negative correlation
            (seed 003, Sec. 5.6).
        tau: prior precision added to every record (>= 0). tau = 0 is the seed's bare
            model and requires a connected graph.

    Raises:
        ValueError: W is not a non-empty square 2-D array, has non-finite, negative or
            diagonal entries, is not symmetric, or tau is negative/non-finite, or
            tau = 0 with a disconnected graph.
    """

    adjacency: FloatArray
    tau: float = 0.0

    def __post_init__(self) -> None:
        try:
            w = np.array(self.adjacency, dtype=np.float64, copy=True)
        except (TypeError, ValueError):
            raise ValueError("adjacency must be a numeric n x n array") from None
        if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] == 0:
            raise ValueError(f"adjacency must be a non-empty square n x n array, got shape {w.shape}")
        if not np.all(np.isfinite(w)):
            raise ValueError("adjacency must contain only finite weights, got NaN or inf")
        if np.any(w < 0):
            i, j = np.argwhere(w < 0)[0]
            raise ValueError(
                f"adjacency weights must be >= 0 (the model only expresses positive correlation), "
                f"got w[{i},{j}]={w[i, j]}"
            )
        if np.any(np.diag(w) != 0):
            i = int(np.flatnonzero(np.diag(w) != 0)[0])
            raise ValueError(f"adjacency must have a zero diagonal (no self-loops), got w[{i},{i}]={w[i, i]}")
        if not np.array_equal(w, w.T):
            i, j = np.argwhere(w != w.T)[0]
            raise ValueError(
                f"adjacency must be symmetric, got w[{i},{j}]={w[i, j]} != w[{j},{i}]={w[j, i]}; "
                "symmetrise it, e.g. (W + W.T) / 2"
            )
        if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float, np.integer, np.floating)):
            raise TypeError(f"tau must be a real number, got {type(self.tau).__name__}")
        tau = float(self.tau)
        if not math.isfinite(tau) or tau < 0:
            raise ValueError(f"tau must be >= 0 and finite, got {self.tau!r}")
        if tau == 0.0 and w.shape[0] > 1:
            k = _components(w)
            if k > 1:
                raise ValueError(
                    f"with tau = 0 the correlation graph must be connected (seed 003, Sec. 5.1), "
                    f"got {k} components; pass tau > 0 or model each component separately"
                )
        w.setflags(write=False)
        object.__setattr__(self, "adjacency", w)
        object.__setattr__(self, "tau", tau)

    @property
    def n(self) -> int:
        """Number of records."""
        return int(self.adjacency.shape[0])

    @property
    def degrees(self) -> FloatArray:
        """Weighted degrees w_i = sum_j w_ij."""
        return np.asarray(self.adjacency.sum(axis=1), dtype=np.float64)

    @property
    def laplacian(self) -> FloatArray:
        """L = D - W (eq. (10))."""
        return np.diag(self.degrees) - self.adjacency

    @property
    def precision(self) -> FloatArray:
        """L + tau I, the precision matrix of the records."""
        return self.laplacian + self.tau * np.eye(self.n)

    def leakage_coefficients(self, method: LeakageMethod = "algorithm1") -> FloatArray:
        """Per-record leakage l_i of the weak adversary A(i, {}); see module `leakage_coefficients`."""
        if method == "algorithm1":
            return _leakage_algorithm1(self.precision)
        if method == "closed_form":
            return _leakage_closed_form(self)
        raise ValueError(f"method must be 'algorithm1' or 'closed_form', got {method!r}")

    def leakage_coefficient(self, target: int, known: Sequence[int] = ()) -> float:
        """Leakage l_A of the adversary A(target, known); see module `leakage_coefficient`."""
        return _leakage_general(self, target, known)

    def max_leakage(self) -> float:
        """max_A l_A = max_i l_i over weak adversaries (Theorem 5.2)."""
        return float(np.max(self.leakage_coefficients()))

    def laplace_scale(self, epsilon: float, sensitivity: float) -> float:
        """Smallest Laplace scale giving eps-BDP for the sum; see `bayesian_laplace_scale`."""
        eps = positive_finite("epsilon", epsilon)
        m = positive_finite("sensitivity", sensitivity)
        return m * (1.0 + self.max_leakage()) / eps


# ---- Proposition 5.1 and Algorithm 1 --------------------------------------------------


def combine(precision: FloatArray, j: int, m: int) -> FloatArray:
    """Proposition 5.1: merge record j into x_0, the mean of the m unknown records.

    `precision` is the precision matrix of (x_0, x_1, ..., x_k) with x_0 in row 0 and
    off-diagonal entries -w. Returns the precision matrix of (x_0', the rest in order)
    where x_0' = (m x_0 + x_j) / (m + 1). This is exact Gaussian marginalisation (a change
    of variables followed by a Schur complement); the seed's three formulas are used as
    printed and agree with it.

    Raises:
        ValueError: j is 0 or out of range, m < 1, or the merged block is degenerate.
    """
    p = np.asarray(precision, dtype=np.float64)
    k = p.shape[0]
    if not 1 <= j < k:
        raise ValueError(f"j must be in [1, {k - 1}], got {j}")
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    rest = np.array([c for c in range(1, k) if c != j], dtype=np.intp)
    w0 = p[0, 0]
    wj = p[j, j]
    w0j = -p[0, j]
    u = -p[0, rest]  # w_{0C'}
    v = -p[j, rest]  # w_{jC'}
    den = m * m * wj + 2 * m * w0j + w0
    if not den > 0:
        raise ValueError(f"cannot merge record {j}: degenerate precision (denominator {den})")
    out = np.empty((k - 1, k - 1))
    out[0, 0] = (m + 1) ** 2 * (w0 * wj - w0j * w0j) / den
    w0c = (m + 1) * ((w0j + m * wj) * u + (w0 + m * w0j) * v) / den
    out[0, 1:] = -w0c
    out[1:, 0] = -w0c
    d = u - m * v
    out[1:, 1:] = p[np.ix_(rest, rest)] - np.outer(d, d) / den
    return out


def _base_coefficient(p2: FloatArray, m: int) -> float:
    # Theorem 5.1: l_A = m * w_0i / w_0 for L_A = [[w_0, -w_0i], [-w_0i, w_i]].
    return float(m * (-p2[0, 1]) / p2[0, 0])


def _algorithm1(p: FloatArray, m: int, labels: list[int], out: FloatArray) -> None:
    """Seed 003 Algorithm 1 (CALCLEAKAGECOEFFICIENT), recording every leaf's coefficient.

    Row 0 of `p` is x_0 (mean of m unknown records); rows 1.. are records `labels`.
    Each branch merges half of the remaining records into x_0 and recurses on the other
    half, so every record becomes the lone known record of a 2 x 2 leaf.
    """
    n = p.shape[0]
    if n <= 2:
        out[labels[0]] = _base_coefficient(p, m)
        return
    k = math.ceil((n + 1) / 2)  # 1-based rows 2..k go into x_0 in the first branch
    p1, m1 = p, m
    for i in range(k, 1, -1):  # 1-based i, merged from the highest down as in the seed
        p1 = combine(p1, i - 1, m1)
        m1 += 1
    _algorithm1(p1, m1, labels[k - 1 :], out)
    p2, m2 = p, m
    for i in range(n, k, -1):
        p2 = combine(p2, i - 1, m2)
        m2 += 1
    _algorithm1(p2, m2, labels[: k - 1], out)


def _leakage_algorithm1(precision: FloatArray) -> FloatArray:
    n = precision.shape[0]
    out = np.zeros(n)
    if n == 1:
        return out  # no unknown records: a weak adversary knows nothing else to leak
    # Records 1..n-1 with record 0 as the initial x_0 (m = 1), as in the seed.
    _algorithm1(precision, 1, list(range(1, n)), out)
    # Record 0: use record 1 as x_0 and merge all others into it.
    order = [1, 0] + list(range(2, n))
    p = precision[np.ix_(order, order)]
    m = 1
    while p.shape[0] > 2:
        p = combine(p, p.shape[0] - 1, m)
        m += 1
    out[0] = _base_coefficient(p, m)
    return out


def _leakage_closed_form(model: CorrelationModel) -> FloatArray:
    n = model.n
    if n == 1:
        return np.zeros(1)
    if model.tau == 0.0:
        # Eq. (29): on a connected graph with no prior, 1 + l = n for every weak adversary.
        return np.full(n, float(n - 1))
    # l_i = Cov(s_U, x_i) / Var(x_i) with Sigma = (L + tau I)^{-1}. Since L 1 = 0,
    # Sigma 1 = 1 / tau, so l_i = 1 / (tau Sigma_ii) - 1, with tau Sigma_ii =
    # sum_k V_ik^2 tau / (lambda_k + tau). Rounding in the zero eigenvalue makes the
    # relative error about eps_machine * ||L|| / tau; prefer "algorithm1" for tiny tau.
    lam, vec = np.linalg.eigh(model.laplacian)
    lam = np.clip(lam, 0.0, None)
    t_sigma = (vec * vec) @ (model.tau / (lam + model.tau))
    return np.asarray(1.0 / t_sigma - 1.0, dtype=np.float64)


def _leakage_general(model: CorrelationModel, target: int, known: Sequence[int]) -> float:
    n = model.n
    if isinstance(target, bool) or not isinstance(target, (int, np.integer)) or not 0 <= target < n:
        raise ValueError(f"target must be a record index in [0, {n - 1}], got {target!r}")
    known_set = set()
    for k in known:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < n:
            raise ValueError(f"known must contain record indices in [0, {n - 1}], got {k!r}")
        if k == target:
            raise ValueError(f"known must not contain the target {target}")
        known_set.add(int(k))
    unknown = [u for u in range(n) if u != target and u not in known_set]
    if not unknown:
        return 0.0  # strong adversary: nothing is marginalised (Theorem 4.2)
    p = model.precision
    p_uu = p[np.ix_(unknown, unknown)]
    p_ui = p[unknown, target]
    # E[x_U | x_C] = -P_UU^{-1} P_UC x_C, so d E[s_U] / d x_i = -1^T P_UU^{-1} P_Ui.
    try:
        y = np.linalg.solve(p_uu, p_ui)
    except np.linalg.LinAlgError:
        raise ValueError(
            "the unknown records' precision block is singular: some unknown records are not "
            "connected to any known record; pass tau > 0"
        ) from None
    return float(-np.sum(y))


# ---- public functional API ------------------------------------------------------------


def _model(adjacency: npt.ArrayLike | CorrelationModel, tau: float) -> CorrelationModel:
    if isinstance(adjacency, CorrelationModel):
        if float(tau) != adjacency.tau:
            raise ValueError(f"tau={tau!r} disagrees with the model's tau={adjacency.tau!r}")
        return adjacency
    return CorrelationModel(np.asarray(adjacency, dtype=np.float64), tau)


def leakage_coefficients(
    adjacency: npt.ArrayLike | CorrelationModel,
    tau: float,
    *,
    method: LeakageMethod = "algorithm1",
) -> FloatArray:
    """Leakage coefficients l_i of the weak adversaries A(i, {}), i = 0..n-1 (seed 003).

    l_i = m w_0i / w_0 with m = n - 1 (Theorem 5.1): how much the expected sum of the
    other records moves per unit change of record i, under the correlation model with
    precision L + tau I. These are the largest leakages over all adversaries targeting i
    (Theorem 5.2). tau = 0 gives n - 1 for every record (eq. (29)); larger tau, smaller
    leakage (Fig. 4, 5).

    Args:
        adjacency: n x n weighted adjacency (see CorrelationModel) or a CorrelationModel.
        tau: prior precision (>= 0); must equal the model's tau if a model is passed.
        method: "algorithm1" (Prop. 5.1 merges in Algorithm 1's divide-and-conquer order,
            O(n^3)) or "closed_form" (one eigendecomposition, O(n^3)); they agree.

    Raises:
        ValueError: invalid model (see CorrelationModel) or method.
    """
    return _model(adjacency, tau).leakage_coefficients(method)


def leakage_coefficient(
    adjacency: npt.ArrayLike | CorrelationModel,
    tau: float,
    target: int,
    known: Sequence[int] = (),
) -> float:
    """Leakage coefficient l_A of the adversary A(target, known) (seed 003, Theorem 5.1).

    Computed directly as the coefficient of x_target in E[sum of unknown records |
    x_target, x_known] (O(n^3) per adversary); 0 for the strong adversary who knows all
    other records. Useful to check Theorem 5.2 (l_A <= l_A' when A' knows less).

    Raises:
        ValueError: invalid model, target or known indices, or a singular unknown block.
    """
    return _model(adjacency, tau).leakage_coefficient(target, known)


def max_leakage(adjacency: npt.ArrayLike | CorrelationModel, tau: float) -> float:
    """max_A l_A over all adversaries = max_i l_i over weak adversaries (Theorem 5.2)."""
    return _model(adjacency, tau).max_leakage()


def bayesian_laplace_scale(
    adjacency: npt.ArrayLike | CorrelationModel,
    epsilon: float,
    sensitivity: float,
    tau: float,
) -> float:
    """Laplace scale lambda_0 = (1 + max_A l_A) * M / eps for an eps-BDP sum (seed 003, Sec. 5.4).

    Privacy map: releasing s + Lap(lambda) for s = sum of the records satisfies
    eps-Bayesian DP (Def. 4.1) against every adversary A(i, K) iff
    lambda >= (1 + max_A l_A) M / eps (Theorems 5.1, 5.2).

    * epsilon: the BDP level (no delta).
    * sensitivity M: the largest change of one record's value, |x_i - x_i'| <= M; the
      neighbouring relation is "one record's value changes while the others follow the
      correlation model given what the adversary knows" (not add/remove). With no
      correlation (W = 0, tau > 0) lambda = M / eps, plain DP for the sum.
    * Who learns the noise: only the curator that samples it; the scale (and the model)
      are public, as the seed assumes (assumption 3).
    * Assumes the Gaussian correlation model is correct and public (assumption 1); the
      guarantee is only as good as that model.

    Raises:
        ValueError: epsilon or sensitivity not > 0 and finite, or an invalid model.
    """
    return _model(adjacency, tau).laplace_scale(epsilon, sensitivity)


def adjacency_digest(adjacency: npt.ArrayLike | CorrelationModel) -> str:
    """SHA-256 (hex) of the validated n x n adjacency as little-endian float64, row-major.

    Independent of the file format it was read from, so anyone holding the matrix can
    check a study's `correlation_source` ("w_sha256=...").
    """
    w = adjacency.adjacency if isinstance(adjacency, CorrelationModel) else CorrelationModel(
        np.asarray(adjacency, dtype=np.float64), 1.0).adjacency  # tau only matters for connectivity here
    return hashlib.sha256(np.ascontiguousarray(w, dtype="<f8").tobytes()).hexdigest()


def correlation_terms(
    adjacency: npt.ArrayLike | CorrelationModel,
    tau: float,
    *,
    source_label: str = "",
) -> dict[str, float | str]:
    """The study-contract terms for correlated records: {"correlation_leakage": L, "correlation_source": text}.

    L = max_A l_A (Theorem 5.2) of the Gaussian correlation model with adjacency W and
    prior tau; a study opened with it (`ComputationClient.open_study(...,
    **correlation_terms(W, tau))`, or `dpagg open-study --correlation-graph`) treats its
    epsilon as Bayesian DP (Def. 4.1) under this model and multiplies every noise scale
    by 1 + L, as lambda >= (1 + L) M / eps requires (Sec. 5.4). The source text records
    the model: "[<source_label> ]w_sha256=<adjacency_digest> tau=<tau> n=<records>", so
    the contract (whose hash covers it) names the exact graph.

    Assumed: the model is correct and public (seed 003, assumptions 1 and 3); the
    guarantee is no better than the model.

    Raises:
        ValueError: invalid model (see CorrelationModel), or a label that is not printable.
    """
    model = _model(adjacency, tau)
    if not isinstance(source_label, str) or not source_label.isprintable() or len(source_label) > 256:
        raise ValueError(f"source_label must be printable text of at most 256 characters, got {source_label!r:.80}")
    source = f"w_sha256={adjacency_digest(model)} tau={model.tau!r} n={model.n}"
    if source_label:
        source = f"{source_label} {source}"
    return {"correlation_leakage": model.max_leakage(), "correlation_source": source}


# ---- exact BDPL for small discrete tables (seed 003, Sec. 3.3 and 4.2) ------------------


def _check_joint(joint: npt.ArrayLike) -> FloatArray:
    p = np.asarray(joint, dtype=np.float64)
    if p.ndim < 1 or p.size == 0:
        raise ValueError(f"joint must be a non-empty array with one axis per record, got shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError("joint must contain finite probabilities >= 0")
    total = float(p.sum())
    if not math.isclose(total, 1.0, rel_tol=0.0, abs_tol=1e-9):
        raise ValueError(f"joint probabilities must sum to 1, got {total!r}")
    return p


def _check_record(name: str, i: int, n: int) -> int:
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < n:
        raise ValueError(f"{name} must be a record index in [0, {n - 1}], got {i!r}")
    return int(i)


def _sum_distribution(
    p: FloatArray, fixed: Mapping[int, int]
) -> tuple[FloatArray, FloatArray] | None:
    """Distribution of the sum of all records given the fixed values (None if P(fixed)=0)."""
    index = tuple(fixed.get(ax, slice(None)) for ax in range(p.ndim))
    sub = p[index]
    mass = float(np.sum(sub))
    if mass <= 0.0:
        return None
    free = [ax for ax in range(p.ndim) if ax not in fixed]
    base = sum(fixed.values())
    sums = np.zeros(sub.shape, dtype=np.float64) + base
    for pos, ax in enumerate(free):
        shape = [1] * len(free)
        shape[pos] = p.shape[ax]
        sums = sums + np.arange(p.shape[ax], dtype=np.float64).reshape(shape)
    values, inverse = np.unique(np.ravel(sums), return_inverse=True)
    weights = np.bincount(inverse, weights=np.ravel(sub)) / mass
    return values, weights


def _log_density(r: FloatArray, values: FloatArray, weights: FloatArray, scale: float) -> FloatArray:
    # log sum_s w_s exp(-|r - s| / scale), up to the common constant -log(2 scale).
    z = -np.abs(r[:, None] - values[None, :]) / scale + np.log(np.where(weights > 0, weights, 1e-300))[None, :]
    z = np.where(weights[None, :] > 0, z, -np.inf)
    zmax = np.max(z, axis=1, keepdims=True)
    out = (zmax + np.log(np.sum(np.exp(z - zmax), axis=1, keepdims=True)))[:, 0]
    return np.asarray(out, dtype=np.float64)


def discrete_sum_bdpl(
    joint: npt.ArrayLike,
    laplace_scale: float,
    target: int,
    known: Sequence[int] = (),
) -> float:
    """Exact BDPL (Def. 4.1) of s + Lap(laplace_scale) against A(target, known), small tables.

    `joint[x_0, ..., x_{n-1}]` is the joint probability of records taking values
    0..size-1 on each axis; s is their sum. Unknown records are marginalised given the
    target and the known records (eq. (4)); the supremum over outputs r is attained at the
    support points of the sum (between them the likelihood ratio is monotone, beyond them
    constant), so evaluating there is exact. Cost: exponential in n; for worked examples.

    Seed 003, Sec. 4.2.3 with Lap(1/eps), eps = 0.1: table 3(b) (positive correlation)
    gives 0.196 ~ 2 eps for A(1, {}), table 3(c) (negative) gives 0.004; a strong adversary
    gets exactly eps (Theorem 4.2), and with independent records (3(a)) BDP = DP
    (Theorem 4.1).

    Raises:
        ValueError: joint is not a probability table, bad indices, or laplace_scale <= 0.
    """
    p = _check_joint(joint)
    scale = positive_finite("laplace_scale", laplace_scale)
    i = _check_record("target", target, p.ndim)
    ks = [_check_record("known", k, p.ndim) for k in known]
    if i in ks:
        raise ValueError(f"known must not contain the target {i}")
    if len(set(ks)) != len(ks):
        raise ValueError(f"known must not repeat records, got {list(known)!r}")
    best = 0.0
    for xk in itertools.product(*(range(p.shape[k]) for k in ks)):
        dists = []
        for xi in range(p.shape[i]):
            d = _sum_distribution(p, {**dict(zip(ks, xk)), i: xi})
            if d is not None:
                dists.append(d)
        if len(dists) < 2:
            continue
        points = np.unique(np.concatenate([v for v, _ in dists]))
        logs = [_log_density(points, v, w, scale) for v, w in dists]
        for a, b in itertools.combinations(logs, 2):
            best = max(best, float(np.max(np.abs(a - b))))
    return best


def sum_query_posterior(
    joint: npt.ArrayLike,
    laplace_scale: float,
    target: int,
    known: Mapping[int, int],
    r: float,
) -> FloatArray:
    """Posterior P(x_target | r, x_known) after seeing r = s + Lap(laplace_scale).

    Seed 003, Sec. 4.4 (table 3(b), Lap(10), r = 2): the strong adversary knowing x_2 = 1
    moves from {0.02, 0.98} to {0.018, 0.982}; the weak adversary from {0.5, 0.5} to
    {0.45, 0.55}.

    Raises:
        ValueError: bad table, indices or values, or P(x_known) = 0.
    """
    p = _check_joint(joint)
    scale = positive_finite("laplace_scale", laplace_scale)
    i = _check_record("target", target, p.ndim)
    fixed: dict[int, int] = {}
    for k, v in known.items():
        kk = _check_record("known", k, p.ndim)
        if kk == i:
            raise ValueError(f"known must not contain the target {i}")
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < p.shape[kk]:
            raise ValueError(f"known value of record {kk} must be in [0, {p.shape[kk] - 1}], got {v!r}")
        fixed[kk] = int(v)
    prior_index = tuple(fixed.get(ax, slice(None)) for ax in range(p.ndim))
    if float(np.sum(p[prior_index])) <= 0.0:
        raise ValueError("the known values have probability 0 under joint")
    post = np.zeros(p.shape[i])
    for xi in range(p.shape[i]):
        d = _sum_distribution(p, {**fixed, i: xi})
        if d is None:
            continue
        values, weights = d
        index = tuple({**fixed, i: xi}.get(ax, slice(None)) for ax in range(p.ndim))
        mass = float(np.sum(p[index]))
        post[xi] = mass * float(np.sum(weights * np.exp(-np.abs(r - values) / scale)))
    return np.asarray(post / post.sum(), dtype=np.float64)
