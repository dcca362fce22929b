"""Tests of he_partition.methods.bayesian against seed 003's worked examples and theorems."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from he_partition.methods.bayesian import (
    CorrelationModel,
    bayesian_laplace_scale,
    combine,
    discrete_sum_bdpl,
    leakage_coefficient,
    leakage_coefficients,
    max_leakage,
    sum_query_posterior,
)

# Seed 003, table 3: Pr(x1, x2), indexed here as joint[x1, x2].
INDEPENDENT = np.array([[0.10, 0.30], [0.15, 0.45]])  # 3(a)
POSITIVE = np.array([[0.49, 0.01], [0.01, 0.49]])  # 3(b)
NEGATIVE = np.array([[0.01, 0.49], [0.49, 0.01]])  # 3(c)


def random_graph(rng: np.random.Generator, n: int, p: float, weighted: bool = True) -> np.ndarray:
    mask = np.triu(rng.random((n, n)) < p, 1)
    w = mask * (rng.random((n, n)) + 0.1 if weighted else 1.0)
    return w + w.T


def path_graph(n: int) -> np.ndarray:
    w = np.zeros((n, n))
    for i in range(n - 1):
        w[i, i + 1] = w[i + 1, i] = 1.0
    return w


# ---- the two-record worked examples (Sec. 4.2.3, 4.4) ----------------------------------


def test_positive_correlation_leaks_about_two_epsilon() -> None:
    eps = 0.1
    got = discrete_sum_bdpl(POSITIVE, 1 / eps, target=0)
    # Seed: |log((0.98 + 0.02 e^-eps) / (0.02 e^-eps + 0.98 e^-2eps))| ~ 0.196 ~ 2 eps.
    closed = math.log((0.98 + 0.02 * math.exp(-eps)) / (0.02 * math.exp(-eps) + 0.98 * math.exp(-2 * eps)))
    assert got == pytest.approx(closed, rel=1e-12)
    assert round(got, 3) == 0.196
    assert eps < got < 2 * eps


def test_negative_correlation_leaks_almost_nothing() -> None:
    eps = 0.1
    got = discrete_sum_bdpl(NEGATIVE, 1 / eps, target=0)
    closed = math.log((0.02 + 0.98 * math.exp(-eps)) / (0.98 * math.exp(-eps) + 0.02 * math.exp(-2 * eps)))
    assert got == pytest.approx(closed, rel=1e-9)
    assert round(got, 3) == 0.004


def test_strong_adversary_gets_exactly_epsilon_theorem_4_2() -> None:
    eps = 0.1
    for joint in (INDEPENDENT, POSITIVE, NEGATIVE):
        assert discrete_sum_bdpl(joint, 1 / eps, target=0, known=[1]) == pytest.approx(eps, rel=1e-12)
        assert discrete_sum_bdpl(joint, 1 / eps, target=1, known=[0]) == pytest.approx(eps, rel=1e-12)


def test_independent_records_bdp_equals_dp_theorem_4_1() -> None:
    eps = 0.1
    assert discrete_sum_bdpl(INDEPENDENT, 1 / eps, target=0) == pytest.approx(eps, rel=1e-12)
    assert discrete_sum_bdpl(INDEPENDENT, 1 / eps, target=1) == pytest.approx(eps, rel=1e-12)


def test_perfectly_correlated_family_leaks_n_epsilon() -> None:
    # Sec. 1.1: 10 records that are always equal behave like one record counted 10 times.
    n, eps = 4, 0.1
    joint = np.zeros((2,) * n)
    joint[(0,) * n] = joint[(1,) * n] = 0.5
    assert discrete_sum_bdpl(joint, 1 / eps, target=2) == pytest.approx(n * eps, rel=1e-12)


def test_posteriors_of_section_4_4() -> None:
    strong = sum_query_posterior(POSITIVE, 10.0, target=0, known={1: 1}, r=2.0)
    assert strong == pytest.approx([0.018, 0.982], abs=5e-4)
    weak = sum_query_posterior(POSITIVE, 10.0, target=0, known={}, r=2.0)
    assert weak == pytest.approx([0.45, 0.55], abs=5e-3)
    # Exact values behind the printed ones.
    e = math.exp(-0.1)
    assert strong[0] == pytest.approx(0.02 * e / (0.02 * e + 0.98), rel=1e-12)
    assert weak[0] == pytest.approx((0.98 * e * e + 0.02 * e) / (0.98 * e * e + 0.04 * e + 0.98), rel=1e-12)


def test_discrete_validation() -> None:
    with pytest.raises(ValueError, match="sum to 1"):
        discrete_sum_bdpl(POSITIVE * 2, 1.0, 0)
    with pytest.raises(ValueError, match=">= 0"):
        discrete_sum_bdpl(np.array([[1.5, -0.5], [0, 0]]), 1.0, 0)
    with pytest.raises(ValueError, match=r"laplace_scale must be > 0 and finite, got 0"):
        discrete_sum_bdpl(POSITIVE, 0, 0)
    with pytest.raises(ValueError, match=r"target must be a record index in \[0, 1\], got 2"):
        discrete_sum_bdpl(POSITIVE, 1.0, 2)
    with pytest.raises(ValueError, match="must not contain the target"):
        discrete_sum_bdpl(POSITIVE, 1.0, 0, known=[0])
    with pytest.raises(ValueError, match="probability 0"):
        sum_query_posterior(np.array([[0.5, 0.0], [0.5, 0.0]]), 1.0, 0, {1: 1}, 0.0)


# ---- Gaussian correlation model -------------------------------------------------------


def test_two_records_closed_form() -> None:
    w = np.array([[0.0, 3.0], [3.0, 0.0]])
    # Precision [[3 + tau, -3], [-3, 3 + tau]]: slope of x_j on x_i is 3 / (3 + tau).
    for method in ("algorithm1", "closed_form"):
        assert leakage_coefficients(w, 1.0, method=method) == pytest.approx([0.75, 0.75], rel=1e-14)
    assert max_leakage(w, 1.0) == pytest.approx(0.75, rel=1e-14)
    # lambda = M (1 + 0.75) / eps = 2 * 1.75 / 0.5
    assert bayesian_laplace_scale(w, epsilon=0.5, sensitivity=2.0, tau=1.0) == pytest.approx(7.0, rel=1e-14)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13])
def test_tau_zero_gives_n_minus_one_eq_29(n: int) -> None:
    rng = np.random.default_rng(n)
    w = path_graph(n) + random_graph(rng, n, 0.3)  # path keeps it connected
    model = CorrelationModel(w, 0.0)
    np.testing.assert_allclose(model.leakage_coefficients("algorithm1"), n - 1, rtol=1e-9)
    np.testing.assert_array_equal(model.leakage_coefficients("closed_form"), np.full(n, n - 1.0))
    for i in range(n):
        assert model.leakage_coefficient(i) == pytest.approx(n - 1, rel=1e-9)
    # 1 + l = n: the noise must be n times larger than plain DP's M / eps.
    assert bayesian_laplace_scale(model, 1.0, 1.0, 0.0) == pytest.approx(n, rel=1e-9)


@pytest.mark.parametrize("tau", [1e-3, 0.05, 0.5, 2.0, 50.0])
@pytest.mark.parametrize("n", [1, 2, 3, 6, 11, 20])
def test_algorithm1_matches_closed_form_and_direct(n: int, tau: float) -> None:
    rng = np.random.default_rng(1000 * n + int(tau * 100))
    w = random_graph(rng, n, 0.35)
    model = CorrelationModel(w, tau)
    a1 = model.leakage_coefficients("algorithm1")
    cf = model.leakage_coefficients("closed_form")
    direct = np.array([model.leakage_coefficient(i) for i in range(n)])
    assert a1.shape == (n,)
    np.testing.assert_allclose(a1, direct, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(cf, direct, rtol=1e-8, atol=1e-12)
    assert np.all(a1 >= -1e-12)
    assert np.all(a1 <= n - 1 + 1e-9)


def test_no_correlation_means_no_leakage() -> None:
    model = CorrelationModel(np.zeros((5, 5)), 1.0)
    np.testing.assert_array_equal(model.leakage_coefficients(), np.zeros(5))
    assert model.laplace_scale(0.5, 1.0) == 2.0  # plain DP: M / eps


def test_theorem_5_2_knowing_more_never_leaks_more() -> None:
    rng = np.random.default_rng(52)
    n = 9
    model = CorrelationModel(random_graph(rng, n, 0.4) + path_graph(n), 0.3)
    for _ in range(30):
        i = int(rng.integers(n))
        others = [k for k in range(n) if k != i]
        known = [k for k in others if rng.random() < 0.5]
        if not known:
            continue
        j = known[int(rng.integers(len(known)))]
        ancestor = [k for k in known if k != j]
        assert model.leakage_coefficient(i, known) <= model.leakage_coefficient(i, ancestor) + 1e-12
    # Weak adversaries are the worst case and strong adversaries leak nothing extra.
    weak = model.leakage_coefficients()
    for i in range(n):
        assert model.leakage_coefficient(i, [k for k in range(n) if k != i]) == 0.0
        assert model.leakage_coefficient(i, []) == pytest.approx(weak[i], rel=1e-10)


def test_hub_of_a_star_leaks_most_fig_5() -> None:
    n = 12
    w = np.zeros((n, n))
    w[0, 1:] = w[1:, 0] = 1.0
    l = leakage_coefficients(w, 0.5)
    assert int(np.argmax(l)) == 0
    assert np.all(l[0] > l[1:])
    np.testing.assert_allclose(l[1:], l[1], rtol=1e-10)  # leaves are symmetric


def test_leakage_falls_with_tau_and_rises_with_edges_fig_4() -> None:
    rng = np.random.default_rng(4)
    n = 15
    sparse = random_graph(rng, n, 0.15, weighted=False)
    dense = np.maximum(sparse, random_graph(rng, n, 0.4, weighted=False))
    taus = [0.01, 0.1, 1.0, 10.0]
    maxima = [max_leakage(sparse, t) for t in taus]
    assert maxima == sorted(maxima, reverse=True)
    assert maxima[0] < n - 1
    # Adding edges can only increase every record's leakage (the covariance shrinks).
    for t in taus:
        assert np.all(leakage_coefficients(dense, t) >= leakage_coefficients(sparse, t) - 1e-12)
    assert max_leakage(dense, 0.1) > max_leakage(sparse, 0.1)
    # tau -> 0 approaches n - 1 (Fig. 4: "approaches n").
    connected = sparse + path_graph(n)
    assert max_leakage(connected, 1e-7) == pytest.approx(n - 1, rel=1e-4)


def test_combine_is_exact_marginalisation() -> None:
    rng = np.random.default_rng(11)
    n, m = 6, 3
    a = rng.normal(size=(n, n))
    prec = a @ a.T + n * np.eye(n)  # x_0 = mean of 3 unknowns, rows 1.. records
    merged = combine(prec, 2, m)
    # Covariance route: x_0' = (m x_0 + x_2) / (m + 1); marginal of (x_0', x_1, x_3, ...).
    cov = np.linalg.inv(prec)
    t = np.zeros((n - 1, n))
    t[0, 0] = m / (m + 1)
    t[0, 2] = 1 / (m + 1)
    for row, col in enumerate([1, 3, 4, 5], start=1):
        t[row, col] = 1.0
    np.testing.assert_allclose(merged, np.linalg.inv(t @ cov @ t.T), rtol=1e-10)
    with pytest.raises(ValueError, match=r"j must be in \[1, 5\], got 0"):
        combine(prec, 0, m)
    with pytest.raises(ValueError, match="m must be >= 1"):
        combine(prec, 1, 0)


def _log_laplace_gauss(r: np.ndarray, mu: float, var: float, lam: float) -> np.ndarray:
    """log density of N(mu, var) + Lap(lam); log erfc(a) = log 2 + log_ndtr(-a sqrt 2)."""
    s = math.sqrt(var)
    t = r - mu
    a = (var / lam - t) / (s * math.sqrt(2.0))
    b = (var / lam + t) / (s * math.sqrt(2.0))
    la = -t / lam + special.log_ndtr(-a * math.sqrt(2.0))
    lb = t / lam + special.log_ndtr(-b * math.sqrt(2.0))
    return np.asarray(var / (2 * lam * lam) - math.log(2 * lam) + np.logaddexp(la, lb))


def test_theorem_5_1_calibrated_scale_gives_epsilon_bdpl() -> None:
    # With lambda from bayesian_laplace_scale, the weak adversary's worst log-ratio of
    # p(r | x_i = 0) and p(r | x_i = M) approaches eps in the tails and never exceeds it.
    rng = np.random.default_rng(51)
    n, tau, eps, sens = 7, 0.4, 0.8, 1.0
    model = CorrelationModel(random_graph(rng, n, 0.5) + path_graph(n), tau)
    lam = bayesian_laplace_scale(model, eps, sens, tau)
    i = int(np.argmax(model.leakage_coefficients()))
    cov = np.linalg.inv(model.precision)
    ones = np.ones(n)
    slope = (cov @ ones)[i] / cov[i, i]  # d E[s | x_i] / d x_i = 1 + l_i
    var_s = ones @ cov @ ones - (cov @ ones)[i] ** 2 / cov[i, i]
    assert slope == pytest.approx(1 + model.max_leakage(), rel=1e-10)
    r = np.linspace(-60 * lam, 60 * lam, 20001)
    ratio = _log_laplace_gauss(r, 0.0, var_s, lam) - _log_laplace_gauss(r, slope * sens, var_s, lam)
    assert np.max(np.abs(ratio)) <= eps + 1e-9
    assert np.max(np.abs(ratio)) == pytest.approx(eps, rel=1e-6)


# ---- validation -----------------------------------------------------------------------


def test_model_is_frozen_and_copies_input() -> None:
    w = path_graph(3)
    model = CorrelationModel(w, 0.0)
    w[0, 1] = 99.0
    assert model.adjacency[0, 1] == 1.0
    with pytest.raises(ValueError):
        model.adjacency[0, 1] = 5.0
    with pytest.raises(AttributeError):
        model.tau = 1.0  # type: ignore[misc]
    np.testing.assert_array_equal(model.laplacian, [[1, -1, 0], [-1, 2, -1], [0, -1, 1]])
    np.testing.assert_array_equal(CorrelationModel(path_graph(3), 0.5).precision.diagonal(), [1.5, 2.5, 1.5])


@pytest.mark.parametrize(
    ("w", "tau", "message"),
    [
        (np.zeros((2, 3)), 1.0, r"square n x n array, got shape \(2, 3\)"),
        (np.zeros((0, 0)), 1.0, "non-empty"),
        (np.zeros(3), 1.0, "square"),
        (np.array([[0, np.nan], [np.nan, 0]]), 1.0, "finite"),
        (np.array([[0, -1.0], [-1.0, 0]]), 1.0, r"must be >= 0 .* got w\[0,1\]=-1.0"),
        (np.array([[1.0, 0], [0, 0]]), 1.0, r"zero diagonal .* got w\[0,0\]=1.0"),
        (np.array([[0, 1.0], [2.0, 0]]), 1.0, r"symmetric, got w\[0,1\]=1.0 != w\[1,0\]=2.0"),
        (path_graph(3), -1.0, r"tau must be >= 0 and finite, got -1.0"),
        (path_graph(3), math.inf, "tau must be >= 0"),
        (np.zeros((3, 3)), 0.0, "connected .* got 3 components"),
    ],
)
def test_model_validation(w: np.ndarray, tau: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CorrelationModel(w, tau)


def test_disconnected_graph_is_fine_with_a_prior() -> None:
    w = np.zeros((4, 4))
    w[0, 1] = w[1, 0] = 1.0
    w[2, 3] = w[3, 2] = 1.0
    l = leakage_coefficients(w, 1.0)
    # Each pair is its own two-record model: 1 / (1 + 1); the other pair adds nothing.
    np.testing.assert_allclose(l, [0.5, 0.5, 0.5, 0.5], rtol=1e-12)


def test_functional_api_validation() -> None:
    w = path_graph(3)
    with pytest.raises(ValueError, match=r"epsilon must be > 0 and finite, got 0"):
        bayesian_laplace_scale(w, 0, 1.0, 0.0)
    with pytest.raises(ValueError, match=r"sensitivity must be > 0 and finite, got -1"):
        bayesian_laplace_scale(w, 1.0, -1, 0.0)
    with pytest.raises(ValueError, match="method must be"):
        leakage_coefficients(w, 0.0, method="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="disagrees"):
        leakage_coefficients(CorrelationModel(w, 0.0), 1.0)
    with pytest.raises(ValueError, match=r"target must be a record index in \[0, 2\], got 3"):
        leakage_coefficient(w, 0.0, 3)
    with pytest.raises(ValueError, match="must not contain the target"):
        leakage_coefficient(w, 0.0, 1, [1])
    with pytest.raises(TypeError, match="tau must be a real number"):
        CorrelationModel(w, "1")  # type: ignore[arg-type]


def test_algorithm1_is_fast_for_a_few_hundred_records() -> None:
    rng = np.random.default_rng(9)
    n = 200
    w = random_graph(rng, n, 0.05, weighted=False)
    l = leakage_coefficients(w, 1.0)
    np.testing.assert_allclose(l, leakage_coefficients(w, 1.0, method="closed_form"), rtol=1e-9)
