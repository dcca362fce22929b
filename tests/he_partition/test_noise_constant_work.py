"""The discrete Laplace sampler's work does not depend on the value it draws (timing)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from he_partition.core.noise import SeededRandom, discrete_laplace, discrete_laplace_draw_count


class CountingRandom:
    """A seeded source that counts the calls and the uniform integers each draw consumes."""

    def __init__(self, seed: int) -> None:
        self._inner = SeededRandom(seed)
        self.calls = 0
        self.integers_drawn = 0

    def integers(self, high: npt.NDArray[np.int64] | int, size: int) -> npt.NDArray[np.int64]:
        self.calls += 1
        self.integers_drawn += size
        return self._inner.integers(high, size)


def _work_per_draw(scale: Fraction, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    values, draws, calls = [], [], []
    for i in range(n):
        src = CountingRandom(seed * 100_003 + i)
        values.append(int(discrete_laplace(scale, 1, src)[0]))
        draws.append(src.integers_drawn)
        calls.append(src.calls)
    return np.abs(np.array(values)), np.array(draws), np.array(calls)


@pytest.mark.statistical
@pytest.mark.parametrize("scale", [Fraction(1, 3), Fraction(5, 2), Fraction(20)])
def test_work_is_independent_of_the_value_drawn(scale: Fraction) -> None:
    """The randomness consumed (and so the loop work) is one number per (scale, size).

    The former sampler (Canonne-Kamath-Steinke with data-dependent loops) consumed about
    |eta| / scale more draws for larger |eta|: its Spearman correlation was ~0.5 and the
    counts took dozens of values, so both assertions below fail on it.
    """
    size_abs, draws, calls = _work_per_draw(scale, 2000, seed=int(scale * 6))
    assert np.unique(size_abs).size > 1  # the draws do vary
    assert set(draws.tolist()) == {discrete_laplace_draw_count(scale, 1)}
    assert set(calls.tolist()) == {1}
    # Belt and braces: no rank correlation between the magnitude and the work done.
    if np.unique(draws).size > 1:
        rho = stats.spearmanr(size_abs, draws).statistic
        assert abs(rho) < 0.1, f"work correlates with |eta|: Spearman {rho:.3f}"


def test_work_grows_only_with_size_and_scale() -> None:
    a = CountingRandom(1)
    discrete_laplace(Fraction(7, 2), 300, a)
    assert a.integers_drawn == discrete_laplace_draw_count(Fraction(7, 2), 300) == 300 * discrete_laplace_draw_count(
        Fraction(7, 2), 1)


@pytest.mark.statistical
def test_draws_past_one_block_are_fixed_work_and_discrete_laplace() -> None:
    """Large draws go in blocks of 16,384 values (bounded memory): still a call and word count fixed
    by the size, and the same distribution (variance 2q/(1-q)^2, q = exp(-1/scale))."""
    scale, size = Fraction(5, 2), 3 * 16_384 + 5
    src = CountingRandom(7)
    x = discrete_laplace(scale, size, src)
    assert src.calls == 4 and src.integers_drawn == discrete_laplace_draw_count(scale, size)
    q = float(np.exp(-1 / float(scale)))
    expected_var = 2 * q / (1 - q) ** 2
    assert abs(float(np.mean(x))) < 5 * np.sqrt(expected_var / size)
    assert abs(float(np.var(x)) / expected_var - 1) < 0.05
    # each block draws fresh values (no block repeats another)
    assert not np.array_equal(x[:16_384], x[16_384:32_768])
