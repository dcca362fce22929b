"""Tests of noise.bernoulli_exp, the exact Bernoulli(exp(-gamma)) sampler behind the p-views' permute-and-flip."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from he_partition.core.errors import InvalidInputError
from he_partition.core.noise import SecureRandom, SeededRandom, bernoulli_exp


def test_edge_values_are_exact() -> None:
    rng = SeededRandom(1)
    assert bernoulli_exp([0] * 1000, 7, rng).all()  # exp(0) = 1
    assert bernoulli_exp([], 3, rng).shape == (0,)
    out = bernoulli_exp(np.zeros((2, 3), dtype=np.int64), 1, rng)
    assert out.shape == (6,) and out.dtype == np.bool_
    # exp(-1000) is never drawn as 1 in practice; numerators may be Python ints beyond int64.
    assert not bernoulli_exp([1000 * 2**62] * 200, 2**62, rng).any()


@pytest.mark.parametrize(
    ("numerators", "denominator", "message"),
    [
        ([1], 0, r"denominator must be in \[1, 2\*\*62\], got 0"),
        ([1], 2**62 + 1, "denominator must be in"),
        ([-1], 3, "numerators must be >= 0, got -1"),
        ([2**70], 1, "must fit in int64"),
    ],
)
def test_validation(numerators: list[int], denominator: int, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        bernoulli_exp(numerators, denominator, SeededRandom(0))


def test_seeded_draws_are_reproducible() -> None:
    nums = [0, 1, 5, 17, 40]
    a = bernoulli_exp(nums * 100, 9, SeededRandom(3))
    b = bernoulli_exp(nums * 100, 9, SeededRandom(3))
    np.testing.assert_array_equal(a, b)


@pytest.mark.statistical
@pytest.mark.parametrize("source", ["seeded", "secure"])
@pytest.mark.parametrize(
    ("num", "den"),
    [
        (1, 2),  # gamma < 1
        (1, 1),  # gamma = 1
        (7, 3),  # gamma > 1: two exp(-1) draws and exp(-1/3)
        (3 * 2**61, 2**62),  # gamma = 1.5 with the largest denominator
        (2**62 - 1, 2**62),  # just below 1
    ],
    ids=["half", "one", "seven-thirds", "three-halves-2^62", "just-below-one"],
)
def test_frequencies_match_exp(source: str, num: int, den: int) -> None:
    rng = SeededRandom(777) if source == "seeded" else SecureRandom()
    n = 40_000
    hits = int(bernoulli_exp([num] * n, den, rng).sum())
    p = math.exp(-num / den)
    # Seeded draws are fixed; the secure source cannot be seeded: a false alarm below 1e-9 there.
    assert stats.binomtest(hits, n, p).pvalue > (1e-3 if source == "seeded" else 1e-9)


@pytest.mark.statistical
def test_mixed_numerators_in_one_call() -> None:
    # One vectorised call with different gammas per element: each element has its own rate.
    nums = np.array([0, 2, 5, 9, 14], dtype=np.int64)
    rng = SeededRandom(11)
    reps = 20_000
    draws = bernoulli_exp(np.tile(nums, reps), 4, rng).reshape(reps, nums.size)
    for j, v in enumerate(nums):
        assert stats.binomtest(int(draws[:, j].sum()), reps, math.exp(-int(v) / 4)).pvalue > 1e-3
