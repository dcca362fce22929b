"""Tests of he_partition.methods.pviews: DP-Mondrian p-views (seed 000), exact budgets, exact noise and utility."""

from __future__ import annotations

import dataclasses
import itertools
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from scipy import stats

from he_partition.core.noise import SecureRandom, SeededRandom, discrete_laplace_variance, laplace_scale
from he_partition.methods.pviews import (
    SCORE_GRID,
    Block,
    PView,
    PViewBudget,
    PViewParams,
    aggregation_error,
    aggregation_error_sensitivity,
    box_sums,
    build_pview,
    identity_estimate,
    plan_budget,
)
from he_partition.methods import pviews as pv_module


def piecewise_tensor() -> np.ndarray:
    """16^3 tensor with a few constant boxes and large counts."""
    x = np.zeros((16, 16, 16))
    x[:8, :8, :8] = 100
    x[8:, :8, :] = 300
    x[:8, 8:, 4:12] = 50
    return x


def random_boxes(rng: np.random.Generator, shape: tuple[int, ...], n: int) -> tuple[np.ndarray, np.ndarray]:
    lows = np.empty((n, len(shape)), dtype=np.int64)
    highs = np.empty((n, len(shape)), dtype=np.int64)
    for q in range(n):
        for d, s in enumerate(shape):
            a, b = sorted(rng.integers(0, s, size=2))
            lows[q, d], highs[q, d] = a, b + 1
    return lows, highs


# ---- budget plan ----------------------------------------------------------------------


def test_plan_budget_exact_values_with_seed_defaults() -> None:
    b = plan_budget(1.0, (32, 32))
    assert b.total == 1
    assert b.recursion == Fraction(9, 10)
    assert b.perturbation == Fraction(1, 10)
    assert b.max_depth == 12  # ceil(1.2 * log2(1024)) = 12 exactly
    assert b.converge_per_level == Fraction(27, 400)  # 0.9 * 0.9 / 12
    assert b.cut_per_level == Fraction(3, 400)  # 0.1 * 0.9 / 12
    assert b.level == Fraction(3, 40)
    assert b.recursion + b.perturbation == b.total
    assert b.max_depth * b.level == b.recursion


def test_plan_budget_non_power_of_two_and_decimal_epsilon() -> None:
    b = plan_budget(0.1, (15, 16, 10, 2), PViewParams())
    # 4800 cells: 1.2 * log2(4800) = 14.68 -> 15
    assert b.max_depth == 15
    assert b.total == Fraction(1, 10)
    assert b.recursion == Fraction(9, 100)
    assert b.perturbation == Fraction(1, 100)
    assert b.converge_per_level == Fraction(9, 100) * Fraction(9, 10) / 15
    assert b.converge_per_level + b.cut_per_level == Fraction(9, 100) / 15


def test_plan_budget_single_cell() -> None:
    b = plan_budget(2.0, (1, 1))
    assert b.max_depth == 1
    assert b.recursion == Fraction(9, 5)


def test_budget_record_validates_its_arithmetic() -> None:
    with pytest.raises(ValueError, match="must equal total exactly"):
        PViewBudget(Fraction(1), Fraction(1, 2), Fraction(1, 3), 1, Fraction(1, 4), Fraction(1, 4))
    with pytest.raises(ValueError, match="must equal recursion exactly"):
        PViewBudget(Fraction(1), Fraction(1, 2), Fraction(1, 2), 2, Fraction(1, 4), Fraction(1, 4))


# ---- building views: budget along every path ------------------------------------------


def poisson(seed: int, lam: float, shape: tuple[int, ...]) -> np.ndarray:
    """Test data (numpy's generator is fine for data; noise never comes from it)."""
    return np.random.default_rng(seed).poisson(lam, size=shape).astype(float)


@pytest.mark.parametrize("eps", [0.1, 1.0, 3.0])
def test_every_path_spends_exactly_total_epsilon(eps: float) -> None:
    x = poisson(5, 3.0, (12, 9, 4))
    x[:6] += 40
    view = build_pview(x, eps, 5)
    assert view.budget.total == Fraction(repr(eps))
    for b in view.blocks:
        assert b.epsilon_total == view.budget.total
        # Each level charges at most one converge test and at most one cut.
        k = b.depth
        assert b.epsilon_cut == (k - 1) * view.budget.cut_per_level
        assert b.epsilon_converge in {
            (k - 1) * view.budget.converge_per_level,
            k * view.budget.converge_per_level,
        }
        assert 1 <= k <= view.budget.max_depth
        assert b.epsilon_perturbation >= view.budget.perturbation


def test_seed_rule_matches_equation_12() -> None:
    x = poisson(6, 5.0, (20, 20))
    params = PViewParams(perturbation_rule="seed")
    view = build_pview(x, 1.0, 6, params)
    bud = view.budget
    for b in view.blocks:
        expected = bud.perturbation + bud.recursion * (1 - Fraction(b.depth, bud.max_depth))
        assert b.epsilon_perturbation == expected
        slack = bud.total - b.epsilon_total
        if b.epsilon_converge == b.depth * bud.converge_per_level:  # stopped by its own test
            assert slack == bud.cut_per_level
        else:  # stopped at max depth or as a single cell, no test run
            assert slack == bud.level


def test_blocks_partition_the_tensor() -> None:
    x = poisson(7, 2.0, (10, 7, 3))
    view = build_pview(x, 1.0, 7)
    cover = np.zeros(x.shape, dtype=int)
    for b in view.blocks:
        cover[b.slices] += 1
    np.testing.assert_array_equal(cover, 1)
    assert sum(b.size for b in view.blocks) == x.size


def test_output_shape_and_consistency() -> None:
    x = poisson(8, 4.0, (6, 5, 4, 3))
    view = build_pview(x, 0.5, 8)
    est = view.estimate()
    assert isinstance(view, PView)
    assert view.shape == x.shape
    assert est.shape == x.shape
    assert est.dtype == np.float64
    # Released block counts are integers; the estimate spreads each evenly over its block.
    for b in view.blocks:
        assert type(b.noisy_sum) is int
        cell = est[b.slices]
        assert np.allclose(cell, cell.flat[0])
        assert cell.sum() == pytest.approx(b.noisy_sum, rel=1e-12, abs=1e-9)
    assert est.sum() == pytest.approx(sum(b.noisy_sum for b in view.blocks), rel=1e-12)


def test_range_count_agrees_with_estimate() -> None:
    x = poisson(9, 4.0, (9, 8, 5))
    view = build_pview(x, 1.0, 9)
    est = view.estimate()
    lows, highs = random_boxes(np.random.default_rng(1), x.shape, 50)
    vec = view.range_counts(lows, highs)
    for q in range(50):
        sl = tuple(slice(a, b) for a, b in zip(lows[q], highs[q]))
        assert view.range_count(lows[q], highs[q]) == pytest.approx(est[sl].sum(), rel=1e-9, abs=1e-9)
        assert vec[q] == pytest.approx(est[sl].sum(), rel=1e-9, abs=1e-9)
    assert view.range_count((0, 0, 0), (0, 8, 5)) == 0.0
    assert view.range_count((0, 0, 0), x.shape) == pytest.approx(est.sum(), rel=1e-12)


def test_same_seed_same_view() -> None:
    x = piecewise_tensor()
    a = build_pview(x, 1.0, 11)
    b = build_pview(x, 1.0, 11)
    c = build_pview(x, 1.0, 12)
    d = build_pview(x, 1.0, SeededRandom(11))
    assert a.blocks == b.blocks == d.blocks
    assert a.blocks != c.blocks
    np.testing.assert_array_equal(identity_estimate(x, 1.0, 3), identity_estimate(x, 1.0, SeededRandom(3)))


def test_secure_random_is_the_default() -> None:
    x = piecewise_tensor()
    for view in (build_pview(x, 1.0), build_pview(x, 1.0, None), build_pview(x, 1.0, SecureRandom())):
        cover = np.zeros(x.shape, dtype=int)
        for b in view.blocks:
            cover[b.slices] += 1
            assert b.epsilon_total == 1
        np.testing.assert_array_equal(cover, 1)
    ident = identity_estimate(x, 1.0)
    assert ident.shape == x.shape and ident.dtype == np.int64


def test_single_cell_and_1d() -> None:
    one = build_pview(np.array([[7.0]]), 1.0, 13)
    assert one.n_blocks == 1
    assert one.blocks[0].epsilon_perturbation == 1
    line = build_pview(np.r_[np.zeros(20), np.full(20, 500.0)], 1.0, 13)
    assert line.estimate().shape == (40,)
    ints = build_pview(np.arange(12, dtype=np.int64).reshape(3, 4), 1.0, 13)
    assert sum(b.size for b in ints.blocks) == 12


def test_gamma_edge_values() -> None:
    x = poisson(14, 3.0, (8, 8))
    no_converge = build_pview(x, 1.0, 14, PViewParams(gamma=0.0))
    for b in no_converge.blocks:  # never stops early: max depth or single cells only
        assert b.epsilon_converge == 0
        assert b.depth == no_converge.budget.max_depth or b.size == 1
        assert b.epsilon_total == 1
    random_cut = build_pview(x, 1.0, 14, PViewParams(gamma=1.0))
    assert random_cut.budget.cut_per_level == 0
    assert all(b.epsilon_total == 1 for b in random_cut.blocks)


# ---- mechanisms' building blocks ------------------------------------------------------


def test_aggregation_error_and_sensitivity() -> None:
    assert aggregation_error([1, 1, 1]) == 0.0
    assert aggregation_error([0, 4]) == 4.0
    assert aggregation_error(np.array([[0, 0], [0, 8]])) == 12.0  # mean 2: 2 + 2 + 2 + 6
    assert aggregation_error_sensitivity(1) == 0
    assert aggregation_error_sensitivity(4) == Fraction(3, 2)
    with pytest.raises(ValueError, match="size must be >= 1"):
        aggregation_error_sensitivity(0)


def test_scaled_aggregation_error_is_exact() -> None:
    block = np.array([[0, 0], [0, 8]], dtype=np.int64)
    assert pv_module._scaled_ae(block) == 4 * 12  # |B| * AE(B)
    x = np.array([1, 2, 4], dtype=np.int64)  # mean 7/3: AE = 4/3 + 1/3 + 5/3 = 10/3
    assert pv_module._scaled_ae(x) == 10


def test_aggregation_error_sensitivity_bound_is_tight_and_holds() -> None:
    # Theorem 3: adding one record changes AE by at most 2 (1 - 1/|B|), reached on a constant block.
    rng = np.random.default_rng(15)
    for size in (2, 3, 7, 20):
        bound = aggregation_error_sensitivity(size)
        worst = 0
        for _ in range(200):
            block = rng.poisson(2.0, size=size).astype(np.int64)
            j = rng.integers(size)
            plus = block.copy()
            plus[j] += 1
            # |B| AE is the integer the converge test noises: sensitivity 2 (|B| - 1) exactly.
            worst = max(worst, abs(pv_module._scaled_ae(plus) - pv_module._scaled_ae(block)))
        assert worst <= size * bound == 2 * (size - 1)
        const = np.full(size, 5, dtype=np.int64)
        bumped = const.copy()
        bumped[0] += 1
        assert abs(pv_module._scaled_ae(bumped) - pv_module._scaled_ae(const)) == 2 * (size - 1)


def _exact_ae(block: np.ndarray) -> Fraction:
    """AE(block) by Fractions."""
    vals = [int(v) for v in block.reshape(-1)]
    mean = Fraction(sum(vals), len(vals))
    return sum((abs(v - mean) for v in vals), Fraction(0))


def _grid_ae(block: np.ndarray) -> int:
    """ceil(SCORE_GRID * AE(block)) by Fractions."""
    return math.ceil(SCORE_GRID * _exact_ae(block))


@pytest.mark.parametrize("limit", [10**9, 0])  # broadcast path and loop path
def test_cut_scores_match_brute_force(limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pv_module, "_BROADCAST_LIMIT", limit)
    block = np.random.default_rng(16).poisson(3.0, size=(5, 4, 3)).astype(np.int64)
    cands, scores = pv_module._cut_candidates(block)
    assert len(cands) == 4 + 3 + 2
    assert scores.dtype == np.int64
    for (axis, off), score in zip(cands, scores):
        left = np.take(block, range(off), axis=axis)
        right = np.take(block, range(off, block.shape[axis]), axis=axis)
        assert score == -(_grid_ae(left) + _grid_ae(right))
        exact = _exact_ae(left) + _exact_ae(right)
        assert 0 <= Fraction(-int(score), SCORE_GRID) - exact < Fraction(2, SCORE_GRID)
        assert float(exact) == pytest.approx(aggregation_error(left) + aggregation_error(right), rel=1e-12)


def test_rounded_scores_keep_their_sensitivity() -> None:
    # Adding one record moves a grid score by at most ceil(G * 2 Delta_AE(|B|)), the Delta we use.
    rng = np.random.default_rng(22)
    for shape in ((2,), (3, 2), (4, 3, 2), (7, 5)):
        size = math.prod(shape)
        bound = pv_module._score_sensitivity(size)
        assert bound == math.ceil(SCORE_GRID * 4 * Fraction(size - 1, size))
        for _ in range(50):
            block = rng.poisson(3.0, size=shape).astype(np.int64)
            plus = block.copy()
            plus[tuple(int(rng.integers(s)) for s in shape)] += 1
            delta = np.abs(pv_module._cut_candidates(plus)[1] - pv_module._cut_candidates(block)[1])
            # Only one child changes: at most ceil(G Delta_AE(|B|)), half the bound used.
            assert delta.max() <= math.ceil(SCORE_GRID * aggregation_error_sensitivity(size)) <= bound


def test_permute_and_flip_coefficient_is_exact_or_rounded_down() -> None:
    coef = pv_module._pf_coefficient(Fraction(3, 400), 12345)
    assert coef == Fraction(3, 400) / 24690
    odd = Fraction(1, 3**45)  # denominator above 2**62: rounded down to the 2**-62 grid
    coef = pv_module._pf_coefficient(odd, 7)
    assert coef.denominator <= 2**62 and coef <= odd / 14 and odd / 14 - coef < Fraction(1, 2**62)


def test_random_cut_finds_a_strong_boundary() -> None:
    # Large counts make permute-and-flip pick the boundary at 16 almost surely.
    x = np.zeros((32,))
    x[16:] = 10_000
    params = PViewParams(gamma=0.5)
    hits = 0
    for seed in range(20):
        view = build_pview(x, 1.0, seed, params)
        hits += any(b.lo == (16,) or b.hi == (16,) for b in view.blocks)
    assert hits == 20


def test_box_sums_against_direct_slicing() -> None:
    rng = np.random.default_rng(17)
    t = rng.normal(size=(5, 6, 7))
    lows, highs = random_boxes(np.random.default_rng(2), t.shape, 40)
    lows[0] = highs[0] = (2, 2, 2)  # empty box
    got = box_sums(t, lows, highs)
    for q in range(40):
        sl = tuple(slice(a, b) for a, b in zip(lows[q], highs[q]))
        assert got[q] == pytest.approx(t[sl].sum(), abs=1e-9)
    assert got[0] == 0.0
    with pytest.raises(ValueError, match="0 <= lo <= hi <= shape"):
        box_sums(t, [[0, 0, 0]], [[6, 1, 1]])
    with pytest.raises(ValueError, match=r"shape \(q, 3\)"):
        box_sums(t, [[0, 0]], [[1, 1]])


@pytest.mark.statistical
def test_identity_estimate_noise_scale() -> None:
    x = np.full((200, 200), 10.0)
    est = identity_estimate(x, 0.5, 18)
    assert est.dtype == np.int64
    # DLap with scale 2 (exactly on the grid): variance 2 q / (1 - q)^2, q = exp(-1/2).
    assert laplace_scale(1, Fraction(1, 2)) == 2
    assert np.var(est - x) == pytest.approx(discrete_laplace_variance(2), rel=0.05)
    assert np.mean(est - x) == pytest.approx(0.0, abs=0.05)


# ---- validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        (np.array([1.0, -1.0]), r"counts must be >= 0, got minimum -1.0"),
        (np.array([1.0, np.nan]), "finite"),
        (np.array([1.5, 2.0]), "whole numbers"),
        (np.zeros((0, 3)), "non-empty"),
        (np.float64(3.0), "at least one axis"),
        (np.full(4, 2.0**59), "too large for exact integer arithmetic"),
    ],
)
def test_counts_validation(counts: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_pview(counts, 1.0, 0)


def test_epsilon_and_rng_validation() -> None:
    x = np.ones((4, 4))
    with pytest.raises(ValueError, match=r"epsilon must be > 0 and finite, got 0"):
        build_pview(x, 0, 0)
    with pytest.raises(ValueError, match="epsilon must be finite"):
        build_pview(x, float("inf"), 0)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        identity_estimate(x, -1.0, 0)
    # A numpy Generator has integers(low, high): it would silently draw the wrong values.
    with pytest.raises(TypeError, match="got a numpy Generator"):
        build_pview(x, 1.0, np.random.default_rng(0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got a numpy Generator"):
        identity_estimate(x, 1.0, np.random.default_rng(0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rng must be a RandomSource"):
        build_pview(x, 1.0, "seed")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rng must be a RandomSource"):
        identity_estimate(x, 1.0, True)  # type: ignore[arg-type]
    view = build_pview(x, 1.0, 0)
    with pytest.raises(ValueError, match=r"need 0 <= lo\[1\] <= hi\[1\] <= 4, got lo=3, hi=5"):
        view.range_count((0, 3), (4, 5))
    with pytest.raises(ValueError, match="must have 2 entries"):
        view.range_count((0,), (4,))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"theta": -1.0}, r"theta must be >= 0, got -1.0"),
        ({"recursion_ratio": 1.0}, r"recursion_ratio must be in \(0, 1\), got 1.0"),
        ({"recursion_ratio": 0.0}, "recursion_ratio must be in"),
        ({"beta": 0.0}, r"beta must be > 0, got 0.0"),
        ({"gamma": 1.5}, r"gamma must be in \[0, 1\], got 1.5"),
        ({"gamma": float("nan")}, "gamma must be finite"),
        ({"perturbation_rule": "loose"}, "perturbation_rule must be"),
    ],
)
def test_params_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PViewParams(**kwargs)  # type: ignore[arg-type]


def test_records_are_frozen() -> None:
    view = build_pview(np.ones((3, 3)), 1.0, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.blocks[0].noisy_sum = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.budget.total = Fraction(2)  # type: ignore[misc]
    with pytest.raises(ValueError, match="non-empty box"):
        Block((0,), (0,), 1, Fraction(0), Fraction(0), Fraction(1), 0)


def test_combinations_of_axes_in_cut_candidates() -> None:
    block = np.zeros((1, 3, 1, 2), dtype=np.int64)
    cands, scores = pv_module._cut_candidates(block)
    assert cands == [(1, 1), (1, 2), (3, 1)]
    assert np.all(scores == 0)
    assert list(itertools.chain.from_iterable(cands))  # non-empty


# ---- noise calibration: every draw at its planned epsilon ------------------------------


class _Spy:
    """Records every discrete Laplace scale and draw and every permute-and-flip call of build_pview."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.laplace: list[tuple[Fraction, int]] = []
        self.pf: list[tuple[np.ndarray, Fraction, int]] = []
        dlap, pf = pv_module.discrete_laplace, pv_module._permute_and_flip

        def spy_dlap(scale: Fraction, size: int, rng: Any) -> np.ndarray:
            out = dlap(scale, size, rng)
            self.laplace.extend((Fraction(scale), int(v)) for v in out)
            return out

        def spy_pf(scores: np.ndarray, coef: Fraction, rng: Any) -> int:
            choice = pf(scores, coef, rng)
            self.pf.append((scores.copy(), coef, choice))
            return choice

        monkeypatch.setattr(pv_module, "discrete_laplace", spy_dlap)
        monkeypatch.setattr(pv_module, "_permute_and_flip", spy_pf)


def test_noise_is_calibrated_to_the_planned_epsilons(monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    x = poisson(3, 20.0, (8, 8))
    view = build_pview(x, 1.0, 21)
    bud = view.budget
    # Converge tests: DLap on |B| AE(B), sensitivity 2 (|B| - 1), scale rounded up.
    conv_scales = {laplace_scale(2 * (s - 1), bud.converge_per_level) for s in range(2, 65)}
    leaf_scales = sorted(laplace_scale(1, b.epsilon_perturbation) for b in view.blocks)
    assert conv_scales.isdisjoint(leaf_scales)
    assert sorted(s for s, _ in spy.laplace if s not in conv_scales) == leaf_scales
    for s in conv_scales | set(leaf_scales):
        assert s.denominator <= 2**20
    # Every internal node (n_leaves - 1 of them) ran one test, plus leaves stopped by a test.
    stopped_by_test = sum(b.epsilon_converge == b.depth * bud.converge_per_level for b in view.blocks)
    assert sum(s in conv_scales for s, _ in spy.laplace) == view.n_blocks - 1 + stopped_by_test
    # The first draw is the root's test: |B| = 64, sensitivity 126.
    assert spy.laplace[0][0] == laplace_scale(126, bud.converge_per_level)
    # Cuts: permute-and-flip with coefficient eps_cut / (2 ceil(G * 2 Delta_AE(|B|))), exact.
    allowed = {bud.cut_per_level / (2 * pv_module._score_sensitivity(s)) for s in range(2, 65)}
    assert len(spy.pf) == view.n_blocks - 1
    assert {coef for _, coef, _ in spy.pf} <= allowed
    assert spy.pf[0][1] == bud.cut_per_level / (2 * math.ceil(SCORE_GRID * 4 * Fraction(63, 64)))


def test_converge_decision_is_the_exact_comparison(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two cells: the root runs one test, |B| AE = 2 |a - b|, and stops iff 2 |a - b| + noise <= 0.
    spy = _Spy(monkeypatch)
    for seed in range(60):
        spy.laplace.clear()
        a, b = seed % 3, 1
        view = build_pview(np.array([a, b]), 1.0, seed)
        conv_noise = spy.laplace[0][1]
        assert (view.n_blocks == 1) == (2 * abs(a - b) + conv_noise <= 0)
    theta = PViewParams(theta=2.5)  # |B| theta = 5: stops iff 2 |a - b| + noise <= 5
    for seed in range(60):
        spy.laplace.clear()
        view = build_pview(np.array([3, 0]), 1.0, seed, theta)
        assert (view.n_blocks == 1) == (6 + spy.laplace[0][1] <= 5)


# ---- seeded statistical tests of the samplers ------------------------------------------


def _dlap_chisquare(draws: np.ndarray, scale: Fraction) -> float:
    """p-value of a chi-square fit of integer draws to DLap(scale), tails pooled at expected >= 20."""
    q = math.exp(-1 / float(scale))
    n = draws.size
    lim = 0
    while n * (1 - q) / (1 + q) * q ** (lim + 1) >= 20:
        lim += 1
    ks = np.arange(-lim, lim + 1)
    pmf = (1 - q) / (1 + q) * q ** np.abs(ks)
    observed = np.array([(draws == k).sum() for k in ks])
    tail_obs = n - observed.sum()
    expected = n * pmf
    tail_exp = n - expected.sum()
    return float(stats.chisquare(np.append(observed, tail_obs), np.append(expected, tail_exp)).pvalue)


@pytest.mark.statistical
def test_perturbation_noise_is_discrete_laplace() -> None:
    # One cell: the view is S + DLap(laplace_scale(1, eps_B)), with no converge test.
    draws = np.array([build_pview(np.array([50]), 0.5, s).blocks[0].noisy_sum for s in range(3000)]) - 50
    assert _dlap_chisquare(draws, laplace_scale(1, Fraction(1, 2))) > 1e-3


@pytest.mark.statistical
def test_converge_noise_is_discrete_laplace(monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    for seed in range(3000):
        build_pview(np.array([4, 9]), 1.0, seed)
    conv = plan_budget(1.0, (2,)).converge_per_level
    scale = laplace_scale(2, conv)  # |B| = 2: sensitivity 2 (|B| - 1) = 2
    draws = np.array([v for s, v in spy.laplace if s == scale])
    assert draws.size == 3000  # one root test per build; no leaf has this scale
    assert _dlap_chisquare(draws, scale) > 1e-3


def _pf_probabilities(p: list[Fraction]) -> list[Fraction]:
    """Exact permute-and-flip output distribution for acceptance probabilities p, by permutations."""
    n = len(p)
    out = [Fraction(0)] * n
    perms = list(itertools.permutations(range(n)))
    for perm in perms:
        # Visit in this order until one is accepted; p[best] = 1 stops every pass, so no restart.
        reach = Fraction(1)
        for i in perm:
            out[i] += reach * p[i] / len(perms)
            reach *= 1 - p[i]
    return out


def _uniform_among_accepted(p: list[Fraction]) -> list[Fraction]:
    """The distribution our sampler draws: every coin, then a uniform accepted candidate."""
    n = len(p)
    out = [Fraction(0)] * n
    for coins in itertools.product((0, 1), repeat=n):
        prob = Fraction(1)
        for c, pi in zip(coins, p):
            prob *= pi if c else 1 - pi
        accepted = [i for i in range(n) if coins[i]]
        for i in accepted:
            out[i] += prob / len(accepted)
    return out


def test_uniform_among_accepted_is_permute_and_flip_exactly() -> None:
    for p in ([Fraction(1), Fraction(1, 2), Fraction(1, 3)],
              [Fraction(2, 7), Fraction(1), Fraction(5, 6), Fraction(1, 9)]):
        assert _uniform_among_accepted(p) == _pf_probabilities(p)


@pytest.mark.statistical
def test_permute_and_flip_frequencies() -> None:
    scores = np.array([-3, 0, -8], dtype=np.int64)
    coef = Fraction(1, 4)
    p = [math.exp(-float(coef) * (0 - s)) for s in scores]
    # Exact PF probabilities, by enumerating permutations (floats only in the expected values).
    probs = [0.0, 0.0, 0.0]
    for perm in itertools.permutations(range(3)):
        reach = 1.0
        for i in perm:
            probs[i] += reach * p[i] / 6
            reach *= 1 - p[i]
    assert sum(probs) == pytest.approx(1.0)
    rng = SeededRandom(2024)
    n = 20_000
    picks = np.bincount([pv_module._permute_and_flip(scores, coef, rng) for _ in range(n)], minlength=3)
    assert stats.chisquare(picks, n * np.array(probs)).pvalue > 1e-3
    # Never worse than the exponential mechanism with the same coefficient.
    em = np.exp(float(coef) * scores) / np.exp(float(coef) * scores).sum()
    assert probs[1] >= em[1]


def test_permute_and_flip_edge_cases() -> None:
    rng = SeededRandom(5)
    # Zero coefficient: uniform; one candidate: itself; a huge gap: never picked.
    assert {pv_module._permute_and_flip(np.array([0, -5, -9]), Fraction(0), rng) for _ in range(200)} == {0, 1, 2}
    assert pv_module._permute_and_flip(np.array([-7]), Fraction(1, 3), rng) == 0
    assert all(pv_module._permute_and_flip(np.array([-10**9, 0]), Fraction(1), rng) == 1 for _ in range(50))


# ---- utility (seeded statistical test) ------------------------------------------------


@pytest.mark.statistical
def test_pview_beats_identity_on_piecewise_constant_tensor() -> None:
    x = piecewise_tensor()
    lows, highs = random_boxes(np.random.default_rng(99), x.shape, 500)
    truth = box_sums(x, lows, highs)
    rng = SeededRandom(20240601)
    pview_rmse, identity_rmse = [], []
    for _ in range(5):
        view = build_pview(x, 1.0, rng)
        pview_rmse.append(np.sqrt(np.mean((view.range_counts(lows, highs) - truth) ** 2)))
        ident = identity_estimate(x, 1.0, rng)
        identity_rmse.append(np.sqrt(np.mean((box_sums(ident, lows, highs) - truth) ** 2)))
    # Identity's error on a box of c cells is about sqrt(2c) at eps = 1; the p-view pays one
    # noisy count per block instead, and the blocks follow the constant regions.
    assert np.mean(pview_rmse) < 0.5 * np.mean(identity_rmse)
