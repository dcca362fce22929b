"""Holder shares that tolerate T colluders (`noise_tolerates`): the computation server with K - 1 holders.

The attack: the computation server (CS) colluding with K - 1 of the K key holders knows its own
draw and their shares, subtracts them and is left with x + (one honest holder's share). With the
plain split (T = 0) that share has 1/K of one discrete Laplace draw's variance and the likelihood-
ratio test tells x from x + 1 far better than epsilon allows; with T = K - 1 the honest share is
a full discrete Laplace draw and the test does exactly as well as against the single key holder.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest

from he_partition.core.errors import InvalidInputError
from he_partition.core.noise import SeededRandom, discrete_laplace_variance
from he_partition.core.noise_shares import holder_noise_source, share_variance, tolerant_share, \
    tolerant_sum_variance_factor

from .test_noise_shares import _chi_square_p, _dl_pmf, _share_pmf

K, SCALE = 3, 10  # epsilon 0.1 at sensitivity 1
N = 100_000  # residuals per neighbouring value


def _residuals(tolerates: int, x: int, seed: int) -> npt.NDArray[np.int64]:
    """What the CS that knows holders 1..K-1's shares (and its own draw) is left with: x + holder 0's share."""
    return x + tolerant_share(Fraction(SCALE), K, tolerates, N, holder_noise_source(bytes([seed]) * 32, 0, K, b"r"))


def _best_test_accuracy(noise_pmf: npt.NDArray[np.float64], support: npt.NDArray[np.int64],
                        y0: npt.NDArray[np.int64], y1: npt.NDArray[np.int64]) -> float:
    """Accuracy of the likelihood-ratio test of x = 0 against x = 1 (equal priors) on the residuals y0 (x = 0)
    and y1 (x = 1), with the residual noise's exact pmf: guess 1 where P[y - 1] > P[y] (ties: 0)."""
    lo = int(support[0])

    def p(d: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        i = d - lo
        inside = (i >= 0) & (i < support.size)
        return np.where(inside, noise_pmf[np.clip(i, 0, support.size - 1)], 0.0)

    def guess_one(y: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        return p(y - 1) > p(y)

    return float((np.count_nonzero(~guess_one(y0)) + np.count_nonzero(guess_one(y1))) / (2 * N))


def test_k_minus_1_colluders_face_one_full_discrete_laplace_and_the_plain_split_does_not() -> None:
    """K = 3, scale 10 (epsilon 0.1). The ideal accuracy of telling x from x + 1 through one discrete Laplace
    draw is (1 + P[0]) / 2 = 1/2 + tanh(1 / (2 scale)) / 2 = e^eps / (1 + e^eps) = 0.52498, the most any test
    may reach under eps-DP. With T = K - 1 the measured accuracy (0.5240 with these seeds) is inside its 95%
    interval (+-0.0022); with T = 0 (the plain split) the same attack reaches 0.622 (exactly 0.6217)."""
    support = np.arange(-40 * SCALE, 40 * SCALE + 1)
    dl = _dl_pmf(support, SCALE)
    ideal = 0.5 + math.tanh(1 / (2 * SCALE)) / 2
    assert ideal == pytest.approx((1 + dl[support == 0][0]) / 2, rel=1e-12)
    assert ideal == pytest.approx(math.exp(1 / SCALE) / (1 + math.exp(1 / SCALE)), rel=1e-12)
    half_width = 1.96 * math.sqrt(ideal * (1 - ideal) / (2 * N))

    tolerant = _best_test_accuracy(dl, support, _residuals(K - 1, 0, 1), _residuals(K - 1, 1, 2))
    assert abs(tolerant - ideal) <= half_width, (tolerant, ideal, half_width)

    plain_pmf = _share_pmf(support, SCALE, K)
    plain = _best_test_accuracy(plain_pmf, support, _residuals(0, 0, 1), _residuals(0, 1, 2))
    assert plain > 0.6  # the attack: about 0.62, ten times the promised advantage
    assert plain - ideal > 40 * half_width


@pytest.mark.statistical
def test_the_honest_share_with_t_k_minus_1_is_the_discrete_laplace_pmf() -> None:
    values = np.arange(-6 * SCALE - 3, 6 * SCALE + 4)
    r = _residuals(K - 1, 0, 3)
    assert _chi_square_p(r, _dl_pmf(values, SCALE), values) > 1e-3
    assert _chi_square_p(_residuals(0, 0, 3), _dl_pmf(values, SCALE), values) < 1e-6


@pytest.mark.parametrize("holders,tolerates", [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2), (5, 2), (5, 4)])
def test_all_k_shares_sum_to_k_over_k_minus_t_draws_exactly(holders: int, tolerates: int) -> None:
    """With fractions: K NB(1/(K - T)) pmfs convolve to the NB(K/(K - T)) pmf (their rational coefficients
    C(k + r - 1, k) convolve exactly; the (1 - q)^r q^k parts multiply to (1 - q)^(sum r) q^k), so the sum of
    the K shares is NB(K/(K - T)) - NB(K/(K - T)), variance K/(K - T) times one discrete Laplace draw's;
    any K - T of them sum to NB(1) - NB(1), one full draw."""
    count = 40

    def coefficients(r: Fraction) -> list[Fraction]:
        out, c = [], Fraction(1)
        for k in range(count):
            out.append(c)
            c = c * (k + r) / (k + 1)
        return out

    def convolve(a: list[Fraction], b: list[Fraction]) -> list[Fraction]:
        return [sum((a[i] * b[k - i] for i in range(k + 1)), Fraction(0)) for k in range(count)]

    one = coefficients(Fraction(1, holders - tolerates))
    total = one
    for _ in range(holders - 1):
        total = convolve(total, one)
    assert total == coefficients(Fraction(holders, holders - tolerates))
    honest = one
    for _ in range(holders - tolerates - 1):
        honest = convolve(honest, one)
    assert honest == [Fraction(1)] * count  # the geometric's: one full discrete Laplace draw
    factor = tolerant_sum_variance_factor(holders, tolerates)
    assert factor == Fraction(holders, holders - tolerates)
    assert holders * share_variance(SCALE, holders - tolerates) == pytest.approx(
        float(factor) * discrete_laplace_variance(SCALE), rel=1e-12)


@pytest.mark.statistical
def test_the_sum_of_all_k_tolerant_shares_has_the_stated_variance() -> None:
    n = 60_000
    total = np.sum([tolerant_share(Fraction(SCALE), K, K - 1, n, holder_noise_source(bytes([20 + i]) * 32, i, K, b"v"))
                    for i in range(K)], axis=0)
    assert abs(float(total.var()) / (K * discrete_laplace_variance(SCALE)) - 1) < 0.05


@pytest.mark.parametrize("holders,tolerates", [(3, 3), (3, -1), (1, 1), (3, True)])
def test_tolerating_k_or_more_is_refused(holders: int, tolerates: int) -> None:
    with pytest.raises(InvalidInputError, match=r"noise_tolerates must be an integer in \[0, K - 1\]"):
        tolerant_share(Fraction(SCALE), holders, tolerates, 5, SeededRandom(0))
    with pytest.raises(InvalidInputError, match="noise_tolerates"):
        tolerant_sum_variance_factor(holders, tolerates)
