"""K holders' shares of one discrete Laplace draw: exact pmf arithmetic, distributions, fixed work."""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from he_partition.core.errors import InvalidInputError
from he_partition.core.noise import SeededRandom, discrete_laplace_variance
from he_partition.core.noise_shares import (
    _nb_cdf_table,
    discrete_laplace_share,
    discrete_laplace_share_draw_count,
    holder_noise_source,
    negative_binomial_coefficients,
    share_variance,
)

from .test_noise_constant_work import CountingRandom


@pytest.mark.parametrize("holders", [2, 3, 5])
def test_coefficients_of_k_shares_convolve_to_the_geometric_exactly(holders: int) -> None:
    """With fractions: the K-fold convolution of C(k + 1/K - 1, k) is 1 for every k (the geometric's
    coefficient), and (1 - q)^(1/K) K times is (1 - q): K NB(1/K) draws sum to one geometric."""
    n = 40
    coeffs = negative_binomial_coefficients(holders, n)
    conv = [Fraction(1)] + [Fraction(0)] * (n - 1)
    for _ in range(holders):
        conv = [sum((conv[j] * coeffs[k - j] for j in range(k + 1)), Fraction(0)) for k in range(n)]
    assert conv == [Fraction(1)] * n
    # And fewer than K of them do not (the test can fail).
    assert negative_binomial_coefficients(holders, 3)[1] == Fraction(1, holders)


def test_coefficients_match_the_binomial_formula() -> None:
    r = Fraction(1, 3)
    for k, c in enumerate(negative_binomial_coefficients(3, 12)):
        expected = Fraction(1)
        for j in range(1, k + 1):
            expected *= (j - 1 + r) / j
        assert c == expected


@pytest.mark.parametrize("scale,holders", [(Fraction(1), 2), (Fraction(7, 3), 3), (Fraction(20), 5)])
def test_the_cdf_table_matches_an_independent_high_precision_cdf(scale: Fraction, holders: int) -> None:
    """Each threshold is floor(CDF_k * 2^124) to within 2 units: the CDF recomputed here from the exact
    coefficients and 80-digit decimals; the last entry leaves a tail <= 2^-110."""
    hi, lo = _nb_cdf_table(scale.numerator, scale.denominator, holders)
    table = [(int(h) << 62) | int(l) for h, l in zip(hi, lo)]
    ctx = decimal.Context(prec=80)
    q = ctx.exp(ctx.divide(decimal.Decimal(-scale.denominator), decimal.Decimal(scale.numerator)))
    p0 = ctx.power(ctx.subtract(decimal.Decimal(1), q), ctx.divide(decimal.Decimal(1), decimal.Decimal(holders)))
    coeffs = negative_binomial_coefficients(holders, len(table))
    cdf, qk = decimal.Decimal(0), decimal.Decimal(1)
    for k, c in enumerate(coeffs):
        term = ctx.multiply(ctx.multiply(p0, qk), ctx.divide(decimal.Decimal(c.numerator), decimal.Decimal(c.denominator)))
        cdf = ctx.add(cdf, term)
        qk = ctx.multiply(qk, q)
        expected = int(ctx.multiply(cdf, decimal.Decimal(1 << 124)).to_integral_value(decimal.ROUND_FLOOR))
        assert abs(table[k] - expected) <= 2, k
    assert ctx.subtract(decimal.Decimal(1), cdf) <= decimal.Decimal(2) ** -110
    assert all(a <= b for a, b in zip(table, table[1:]))


def _dl_pmf(k: npt.NDArray[np.int64], scale: float) -> npt.NDArray[np.float64]:
    q = math.exp(-1 / scale)
    return (1 - q) / (1 + q) * q ** np.abs(k)


def _share_pmf(k: npt.NDArray[np.int64], scale: float, holders: int) -> npt.NDArray[np.float64]:
    """P[N - N' = d] = sum_j nb(j) nb(j + |d|), NB(1/K, q) from scipy (independent of the sampler)."""
    q = math.exp(-1 / scale)
    support = np.arange(0, int(200 * scale) + 200)
    nb = stats.nbinom(1 / holders, 1 - q).pmf(support)
    return np.array([float(np.dot(nb[: nb.size - abs(d)], nb[abs(d):])) for d in k])


def _chi_square_p(x: npt.NDArray[np.int64], pmf: npt.NDArray[np.float64], values: npt.NDArray[np.int64]) -> float:
    """Chi-square p-value of x against pmf on `values`, the two tails merged into one cell each."""
    n = x.size
    expected = np.concatenate([[0.0], pmf * n, [0.0]])
    expected[0] = n * (1 - pmf.sum()) / 2
    expected[-1] = n * (1 - pmf.sum()) / 2
    observed = np.concatenate([[np.sum(x < values[0])], [np.sum(x == v) for v in values], [np.sum(x > values[-1])]])
    keep = expected >= 5
    # Cells with too few expected counts are folded into the tails (total preserved).
    obs, exp = observed[keep].astype(float), expected[keep]
    obs = np.append(obs, observed[~keep].sum())
    exp = np.append(exp, expected[~keep].sum())
    if exp[-1] < 5:
        obs[-2] += obs[-1]
        exp[-2] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    exp *= obs.sum() / exp.sum()
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.mark.statistical
@pytest.mark.parametrize("holders", [2, 3, 5])
@pytest.mark.parametrize("scale", [Fraction(3, 2), Fraction(20)])
def test_sum_of_k_shares_is_one_discrete_laplace(holders: int, scale: Fraction) -> None:
    """K holders with their own keyed sources: the sum of their shares against the discrete Laplace pmf
    (chi-square and KS), mean 0, variance 2q / (1 - q)^2; a single share is clearly not that distribution."""
    n = 60_000
    shares = [discrete_laplace_share(scale, holders, n, holder_noise_source(bytes([7 + i]) * 32, i, holders, b"t"))
              for i in range(holders)]
    total = np.sum(shares, axis=0)
    var = discrete_laplace_variance(scale)
    values = np.arange(-int(6 * scale) - 3, int(6 * scale) + 4)
    assert _chi_square_p(total, _dl_pmf(values, float(scale)), values) > 1e-3
    cdf = np.cumsum(_dl_pmf(np.arange(-int(40 * scale) - 40, int(40 * scale) + 41), float(scale)))
    grid = np.arange(-int(40 * scale) - 40, int(40 * scale) + 41)
    empirical = np.searchsorted(np.sort(total), grid, side="right") / n
    assert np.max(np.abs(empirical - cdf)) < 1.95 / math.sqrt(n)  # KS at alpha ~ 1e-3
    assert abs(float(total.mean())) < 4 * math.sqrt(var / n)
    assert abs(float(total.var()) / var - 1) < 0.05
    assert share_variance(scale, holders) * holders == pytest.approx(var, rel=1e-12)
    # The same test on one share fails: it is narrower (variance 1/K of the sum's).
    assert _chi_square_p(shares[0], _dl_pmf(values, float(scale)), values) < 1e-6


@pytest.mark.statistical
@pytest.mark.parametrize("holders", [2, 3, 5])
def test_a_single_share_follows_its_negative_binomial_difference_pmf(holders: int) -> None:
    scale, n = Fraction(5, 2), 60_000
    x = discrete_laplace_share(scale, holders, n, SeededRandom(100 + holders))
    values = np.arange(-20, 21)
    assert _chi_square_p(x, _share_pmf(values, float(scale), holders), values) > 1e-3
    assert abs(float(x.mean())) < 4 * math.sqrt(share_variance(scale, holders) / n)
    assert abs(float(x.var()) / share_variance(scale, holders) - 1) < 0.05
    # ... and not the full discrete Laplace (so the pmf check above can tell them apart).
    assert _chi_square_p(x, _dl_pmf(values, float(scale)), values) < 1e-6


@pytest.mark.statistical
def test_work_per_share_is_independent_of_the_value_drawn() -> None:
    values, draws, calls = [], [], []
    for i in range(1500):
        src = CountingRandom(9_000 + i)
        values.append(int(discrete_laplace_share(Fraction(4), 3, 1, src)[0]))
        draws.append(src.integers_drawn)
        calls.append(src.calls)
    assert np.unique(np.abs(values)).size > 5
    assert set(draws) == {discrete_laplace_share_draw_count(1)} and set(calls) == {1}
    big = CountingRandom(1)
    discrete_laplace_share(Fraction(4), 3, 3 * 16_384 + 5, big)
    assert big.calls == 4 and big.integers_drawn == discrete_laplace_share_draw_count(3 * 16_384 + 5)


def test_keyed_shares_repeat_per_request_and_differ_per_holder_and_request() -> None:
    key = b"k" * 32
    a = discrete_laplace_share(Fraction(10), 3, 500, holder_noise_source(key, 0, 3, b"req-1"))
    assert np.array_equal(a, discrete_laplace_share(Fraction(10), 3, 500, holder_noise_source(key, 0, 3, b"req-1")))
    for other in (holder_noise_source(key, 1, 3, b"req-1"), holder_noise_source(key, 0, 3, b"req-2"),
                  holder_noise_source(key, 0, 2, b"req-1"), holder_noise_source(b"j" * 32, 0, 3, b"req-1")):
        assert not np.array_equal(a, discrete_laplace_share(Fraction(10), 3, 500, other))
    with pytest.raises(InvalidInputError, match="at least 16 bytes"):
        holder_noise_source(b"short", 0, 3, b"req")
    with pytest.raises(InvalidInputError, match="holder must be in"):
        holder_noise_source(key, 3, 3, b"req")


@pytest.mark.parametrize("scale,holders,size,message", [
    (Fraction(0), 3, 5, "scale must be > 0"),
    (Fraction(2), 0, 5, "holders must be an integer"),
    (Fraction(2), 65, 5, "holders must be an integer"),
    (Fraction(2), 3, -1, "size must be >= 0"),
    (Fraction(10 ** 6), 3, 5, "too large for a noise share"),
])
def test_bad_parameters_are_refused_with_the_problem_named(scale: Fraction, holders: int, size: int,
                                                           message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        discrete_laplace_share(scale, holders, size, SeededRandom(0))


def test_one_holder_draws_a_full_discrete_laplace() -> None:
    """K = 1 (the embedded default): the share is the whole draw, variance 2q / (1 - q)^2."""
    x = discrete_laplace_share(Fraction(3), 1, 50_000, SeededRandom(3))
    assert abs(float(x.var()) / discrete_laplace_variance(3) - 1) < 0.05


@pytest.mark.parametrize("holders,low,high", [(2, 0.45, 0.55), (3, 0.9, 1.0), (5, 1.45, 1.6)])
def test_one_share_alone_protects_less_than_the_full_draw(holders: int, low: float, high: float) -> None:
    """The figure docs/threshold.md states for the CS colluding with K - 1 holders: the privacy loss of one
    share at sensitivity 1, max_d |ln P[d] / P[d + 1]| (scale 20), is 0.50 / 0.94 / 1.52 for K = 2 / 3 / 5,
    against 1 / scale = 0.05 for the sum of all K shares (the discrete Laplace)."""
    scale, d = 20.0, np.arange(-60, 61)
    loss = np.abs(np.diff(np.log(_share_pmf(d, scale, holders))))
    assert low < float(loss.max()) < high
    full = np.abs(np.diff(np.log(_dl_pmf(d, scale))))
    assert float(full.max()) == pytest.approx(1 / scale, rel=1e-9)
