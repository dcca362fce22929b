"""Confidence intervals: coverage by simulation with the real discrete Laplace sampler, exactness, width."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from he_partition.core.intervals import (bound_halfwidth, chernoff_halfwidth, describe, exact_cut_halfwidth,
                                         exact_halfwidth, exact_sum_halfwidth, value_interval)
from he_partition.core.noise import SeededRandom, discrete_laplace, discrete_laplace_variance
from he_partition.core.summary import Summary

LEVELS = (0.9, 0.95, 0.99)
TRIALS = 20_000


def _margin(level: float, n: int) -> float:
    """Three Monte-Carlo standard errors of an empirical coverage at `level` over n trials."""
    return 3.0 * math.sqrt(level * (1.0 - level) / n)


def _noise(scale: Fraction, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Two independent discrete Laplace draws per value (the computation server's and the key holders')."""
    rng = SeededRandom(seed)
    size = int(np.prod(shape))
    return (discrete_laplace(scale, size, rng) + discrete_laplace(scale, size, rng)).reshape(shape)


def _two_draw_cdf_tail(scale: Fraction, k: int) -> float:
    """P[|D1 + D2| > k] by direct summation of the convolution (independent of the closed form)."""
    q = math.exp(-1.0 / float(scale))
    c = (1.0 - q) / (1.0 + q)
    xs = np.arange(-4000, 4001)
    p = c * q ** np.abs(xs)
    conv = np.convolve(p, p)
    ys = np.arange(-8000, 8001)
    return float(conv[np.abs(ys) > k].sum())


@pytest.mark.statistical
@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(3)])
def test_one_value_of_two_draws_covers_at_every_level_and_is_exact(scale: Fraction) -> None:
    noise = _noise(scale, (TRIALS,), seed=11)
    variance = 2 * discrete_laplace_variance(scale)
    for level in LEVELS:
        k = exact_halfwidth(variance, level)
        coverage = float(np.mean(np.abs(noise) <= k))
        assert coverage >= level - _margin(level, TRIALS), (scale, level, k, coverage)
        # exact: k covers, k - 1 does not (the least such integer)
        assert _two_draw_cdf_tail(scale, k) <= 1 - level + 1e-12
        if k > 0:
            assert _two_draw_cdf_tail(scale, k - 1) > 1 - level
        assert exact_sum_halfwidth([variance], [1], level) == k  # the lattice computation agrees


@pytest.mark.statistical
def test_range_sums_and_cut_partitions_cover_at_every_level() -> None:
    """Six partitions at two noise scales; ranges of whole partitions and cutting ones: the exact intervals the
    Summary gives, and the Chernoff bound (used where the exact computation does not fit) on the same ranges."""
    starts = (0, 4, 10, 12, 20, 25)
    scales = [Fraction(2), Fraction(2), Fraction(5), Fraction(5), Fraction(2), Fraction(5)]
    domain = 32
    trials = 8_000
    noise = np.stack([_noise(s, (trials,), seed=100 + j) for j, s in enumerate(scales)], axis=1)
    variances = tuple(2 * discrete_laplace_variance(s) for s in scales)
    truth = np.array([7, 0, 30, 2, 11, 5])  # spread evenly inside partitions: no spreading bias here
    lengths = np.diff(np.append(starts, domain))
    ranges = [(0, 32), (4, 20), (10, 12), (2, 22), (5, 26), (13, 14)]
    s0 = Summary(domain_size=domain, epsilon=1.0, strategy="gap", noise_parties=2, starts=starts,
                 sums=tuple(int(v) for v in truth), sum_variance=variances)
    for level in LEVELS:
        for lo, hi in ranges:
            ci = s0.interval(lo, hi, level)
            half = (ci.hi - ci.lo) / 2
            assert ci.method == "exact"
            overlap = np.clip(np.minimum(np.append(starts[1:], domain), hi) - np.maximum(starts, lo), 0, None)
            weights = overlap / lengths
            err = noise @ weights  # estimate - truth over the trials (linear in the noise)
            coverage = float(np.mean(np.abs(err) <= half + 1e-9))
            assert coverage >= level - _margin(level, trials), (lo, hi, level, coverage)
            chernoff = chernoff_halfwidth(weights, variances, level)
            assert chernoff >= half - 1e-9  # a bound: never tighter than the exact half-width
            assert float(np.mean(np.abs(err) <= chernoff)) >= level - _margin(level, trials)
    # the Summary's own answers: the interval is centred on the value it reports
    s1 = Summary(domain_size=domain, epsilon=1.0, strategy="gap", noise_parties=2, starts=starts,
                 sums=tuple(int(v) for v in truth + noise[0]), sum_variance=variances)
    for c in s1.range_counts(ranges, confidence=0.95):
        assert c.ci_lo is not None and c.ci_hi is not None and c.confidence == 0.95
        assert c.ci_lo < c.value < c.ci_hi
        assert math.isclose((c.ci_lo + c.ci_hi) / 2, c.value)


@pytest.mark.statistical
def test_a_normal_interval_under_covers_where_the_exact_one_does_not() -> None:
    """At small noise (scale 1/2, two draws) value +- 1.96 se misses more than 5% of the time; ours does not."""
    scale = Fraction(1, 2)
    variance = 2 * discrete_laplace_variance(scale)
    noise = _noise(scale, (TRIALS,), seed=7)
    for level, z in ((0.95, 1.959964), (0.99, 2.575829)):
        normal = z * math.sqrt(variance)
        assert _two_draw_cdf_tail(scale, math.floor(normal)) > 1 - level  # exactly: it under-covers
        normal_cov = float(np.mean(np.abs(noise) <= normal))
        assert normal_cov < level - _margin(level, TRIALS), (level, normal_cov)  # and visibly so
        ours = float(np.mean(np.abs(noise) <= exact_halfwidth(variance, level)))
        assert ours >= level - _margin(level, TRIALS)


def test_widths_are_not_absurd() -> None:
    """The Chernoff bound stays within 2x of the exact quantile where that is computable (plus one lattice
    step: at scale 1 the exact 90% half-width is the integer 3); exact sums are
    close to a normal interval for many partitions (where the normal is about right)."""
    for scale in (Fraction(1), Fraction(5), Fraction(50)):
        v = 2 * discrete_laplace_variance(scale)
        for level in LEVELS:
            for n in (1, 4, 10):
                exact = exact_sum_halfwidth([v], [n], level)
                assert exact is not None
                bound = chernoff_halfwidth([1.0], [v], level, counts=[n])
                assert exact <= bound <= 2.0 * exact + 1.0, (scale, level, n, exact, bound)
        exact_many = exact_sum_halfwidth([v], [100], 0.95)
        assert exact_many is not None
        assert abs(exact_many - 1.96 * math.sqrt(100 * v)) <= 0.05 * 1.96 * math.sqrt(100 * v) + 1
    # the standard-error-only bound: wider, still a small multiple of the standard error
    assert 3.0 < bound_halfwidth(10.0, 2 * discrete_laplace_variance(5), 0.95) / 10.0 < 4.0


def test_a_cut_interval_is_the_exact_quantile() -> None:
    """One value times 0.3 (all of a range inside one partition): the exact cut half-width is 0.3 times the
    value's exact integer half-width (to the bisection's precision), and the atom-by-atom tail agrees."""
    v = 2 * discrete_laplace_variance(Fraction(5))
    for level in LEVELS:
        half = exact_cut_halfwidth([], [], [0.3], [v], level)
        assert half is not None
        assert 0.3 * exact_halfwidth(v, level) <= half <= 0.3 * exact_halfwidth(v, level) + 1e-5


def test_fewer_draws_for_the_same_variance_give_a_wider_bound() -> None:
    """Why assuming the fewest draws (the contract's noise_parties) is conservative for threshold studies."""
    v = 200.0
    assert chernoff_halfwidth([1.0], [v], 0.95, draws=2) > chernoff_halfwidth([1.0], [v], 0.95, draws=2.5) \
        > chernoff_halfwidth([1.0], [v], 0.95, draws=4)
    ci = value_interval(100.0, math.sqrt(v), 0.95, draws=2, draws_exact=False)
    assert ci.method == "chernoff" and ci.lo < 100 < ci.hi


@pytest.mark.statistical
def test_least_squares_tree_answers_cover() -> None:
    """A tree release (three levels of partition sums, least squares): the standard-error bound covers."""
    from he_partition.core.summary import ReleasedValues

    domain, scale = 16, Fraction(2)
    levels = [(0,), (0, 8), (0, 4, 8, 12)]
    var = 2 * discrete_laplace_variance(scale)
    truth = np.arange(domain) % 5
    trials = 600
    ranges = [(0, 16), (4, 12), (0, 4), (8, 16)]
    noise = [_noise(scale, (trials, len(st)), seed=300 + i) for i, st in enumerate(levels)]
    covered = {r: 0 for r in ranges}
    half = None
    for t in range(trials):
        released = tuple(
            ReleasedValues(kind="partition_sums", epsilon=1.0, variance=var, starts=st,
                           values=tuple(int(truth[a:b].sum()) + int(e)
                                        for a, b, e in zip(st, (*st[1:], domain), noise[i][t])))
            for i, st in enumerate(levels))
        s = Summary(domain_size=domain, epsilon=1.0, strategy="hier", noise_parties=2, starts=levels[-1],
                    sums=released[-1].values, sum_variance=(var,) * 4, estimator="tree", released=released)
        for c in s.range_counts(ranges, confidence=0.9):
            assert c.ci_lo is not None and c.ci_hi is not None
            half = (c.ci_hi - c.ci_lo) / 2
            covered[(c.lo, c.hi)] += int(c.ci_lo <= truth[c.lo:c.hi].sum() <= c.ci_hi)
    assert half is not None
    for r, k in covered.items():
        assert k / trials >= 0.9 - _margin(0.9, trials), (r, k / trials)


def test_bad_levels_are_refused_and_the_meaning_is_one_sentence() -> None:
    for bad in (0.0, 1.0, 95.0, -0.1):
        with pytest.raises(InvalidInputError):
            exact_halfwidth(10.0, bad)
    text = describe(0.95)
    assert text.startswith("in at least 95% of releases") and "not covered" in text and text.count(".") == 0


def test_threshold_holder_noise_uses_the_bound_for_fractional_draws() -> None:
    """A threshold study (noise_tolerates > 0): each value carries 1 + K/(K - T) draws' worth, not 2."""
    v = 2.5 * discrete_laplace_variance(Fraction(3))
    s = Summary(domain_size=8, epsilon=1.0, strategy="gap", noise_parties=2, starts=(0, 4), sums=(10, 20),
                sum_variance=(v, v), params={"holder_noise": {"key_holders": 3, "noise_tolerates": 1,
                                                              "holder_variance_factor": 1.5}})
    assert s.draws_per_value == 2.5
    ci = s.interval(0, 4, 0.95)
    assert ci.method == "chernoff" and ci.lo < 10 < ci.hi
    assert (ci.hi - ci.lo) / 2 >= exact_halfwidth(v, 0.95)  # never tighter than two draws of the same variance
