"""Tests of he_partition.pviews: DP-Mondrian p-views (seed 000), exact budgets and utility."""

from __future__ import annotations

import dataclasses
import itertools
from fractions import Fraction

import numpy as np
import pytest

from he_partition.pviews import (
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
from he_partition import pviews as pv_module


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


@pytest.mark.parametrize("eps", [0.1, 1.0, 3.0])
def test_every_path_spends_exactly_total_epsilon(eps: float) -> None:
    rng = np.random.default_rng(5)
    x = rng.poisson(3.0, size=(12, 9, 4)).astype(float)
    x[:6] += 40
    view = build_pview(x, eps, rng)
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
    rng = np.random.default_rng(6)
    x = rng.poisson(5.0, size=(20, 20)).astype(float)
    params = PViewParams(perturbation_rule="seed")
    view = build_pview(x, 1.0, rng, params)
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
    rng = np.random.default_rng(7)
    x = rng.poisson(2.0, size=(10, 7, 3)).astype(float)
    view = build_pview(x, 1.0, rng)
    cover = np.zeros(x.shape, dtype=int)
    for b in view.blocks:
        cover[b.slices] += 1
    np.testing.assert_array_equal(cover, 1)
    assert sum(b.size for b in view.blocks) == x.size


def test_output_shape_and_consistency() -> None:
    rng = np.random.default_rng(8)
    x = rng.poisson(4.0, size=(6, 5, 4, 3)).astype(float)
    view = build_pview(x, 0.5, rng)
    est = view.estimate()
    assert isinstance(view, PView)
    assert view.shape == x.shape
    assert est.shape == x.shape
    assert est.dtype == np.float64
    # Constant within each block, summing to the noisy block count.
    for b in view.blocks:
        cell = est[b.slices]
        assert np.allclose(cell, cell.flat[0])
        assert cell.sum() == pytest.approx(b.noisy_sum, rel=1e-12, abs=1e-9)
    assert est.sum() == pytest.approx(sum(b.noisy_sum for b in view.blocks), rel=1e-12)


def test_range_count_agrees_with_estimate() -> None:
    rng = np.random.default_rng(9)
    x = rng.poisson(4.0, size=(9, 8, 5)).astype(float)
    view = build_pview(x, 1.0, rng)
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
    a = build_pview(x, 1.0, np.random.default_rng(11))
    b = build_pview(x, 1.0, np.random.default_rng(11))
    c = build_pview(x, 1.0, np.random.default_rng(12))
    assert a.blocks == b.blocks
    assert a.blocks != c.blocks


def test_single_cell_and_1d() -> None:
    rng = np.random.default_rng(13)
    one = build_pview(np.array([[7.0]]), 1.0, rng)
    assert one.n_blocks == 1
    assert one.blocks[0].epsilon_perturbation == 1
    line = build_pview(np.r_[np.zeros(20), np.full(20, 500.0)], 1.0, rng)
    assert line.estimate().shape == (40,)


def test_gamma_edge_values() -> None:
    rng = np.random.default_rng(14)
    x = rng.poisson(3.0, size=(8, 8)).astype(float)
    no_converge = build_pview(x, 1.0, rng, PViewParams(gamma=0.0))
    for b in no_converge.blocks:  # never stops early: max depth or single cells only
        assert b.epsilon_converge == 0
        assert b.depth == no_converge.budget.max_depth or b.size == 1
        assert b.epsilon_total == 1
    random_cut = build_pview(x, 1.0, rng, PViewParams(gamma=1.0))
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


def test_aggregation_error_sensitivity_bound_is_tight_and_holds() -> None:
    # Theorem 3: adding one record changes AE by at most 2 (1 - 1/|B|), reached on a constant block.
    rng = np.random.default_rng(15)
    for size in (2, 3, 7, 20):
        bound = float(aggregation_error_sensitivity(size))
        worst = 0.0
        for _ in range(200):
            block = rng.poisson(2.0, size=size).astype(float)
            j = rng.integers(size)
            plus = block.copy()
            plus[j] += 1
            worst = max(worst, abs(aggregation_error(plus) - aggregation_error(block)))
        assert worst <= bound + 1e-12
        const = np.full(size, 5.0)
        bumped = const.copy()
        bumped[0] += 1
        assert abs(aggregation_error(bumped) - aggregation_error(const)) == pytest.approx(bound)


@pytest.mark.parametrize("limit", [10**9, 0])  # broadcast path and loop path
def test_cut_scores_match_brute_force(limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pv_module, "_BROADCAST_LIMIT", limit)
    rng = np.random.default_rng(16)
    block = rng.poisson(3.0, size=(5, 4, 3)).astype(float)
    cands, scores = pv_module._cut_candidates(block)
    assert len(cands) == 4 + 3 + 2
    for (axis, off), score in zip(cands, scores):
        left = np.take(block, range(off), axis=axis)
        right = np.take(block, range(off, block.shape[axis]), axis=axis)
        assert score == pytest.approx(-(aggregation_error(left) + aggregation_error(right)), rel=1e-12)


def test_random_cut_finds_a_strong_boundary() -> None:
    # Large counts make the exponential mechanism pick the boundary at 16 almost surely.
    x = np.zeros((32,))
    x[16:] = 10_000
    params = PViewParams(gamma=0.5)
    hits = 0
    for seed in range(20):
        view = build_pview(x, 1.0, np.random.default_rng(seed), params)
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


def test_identity_estimate_noise_scale() -> None:
    rng = np.random.default_rng(18)
    x = np.full((200, 200), 10.0)
    est = identity_estimate(x, 0.5, rng)
    # Lap(2): variance 8.
    assert np.var(est - x) == pytest.approx(8.0, rel=0.05)
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
    ],
)
def test_counts_validation(counts: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_pview(counts, 1.0, np.random.default_rng(0))


def test_epsilon_and_rng_validation() -> None:
    x = np.ones((4, 4))
    with pytest.raises(ValueError, match=r"epsilon must be > 0 and finite, got 0"):
        build_pview(x, 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="epsilon must be finite"):
        build_pview(x, float("inf"), np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        build_pview(x, 1.0, np.random.RandomState(0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        identity_estimate(x, 1.0, None)  # type: ignore[arg-type]
    view = build_pview(x, 1.0, np.random.default_rng(0))
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
    view = build_pview(np.ones((3, 3)), 1.0, np.random.default_rng(0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.blocks[0].noisy_sum = 0.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.budget.total = Fraction(2)  # type: ignore[misc]
    with pytest.raises(ValueError, match="non-empty box"):
        Block((0,), (0,), 1, Fraction(0), Fraction(0), Fraction(1), 0.0)


# ---- utility (seeded statistical test) ------------------------------------------------


@pytest.mark.statistical
def test_pview_beats_identity_on_piecewise_constant_tensor() -> None:
    x = piecewise_tensor()
    lows, highs = random_boxes(np.random.default_rng(99), x.shape, 500)
    truth = box_sums(x, lows, highs)
    rng = np.random.default_rng(20240601)
    pview_rmse, identity_rmse = [], []
    for _ in range(5):
        view = build_pview(x, 1.0, rng)
        pview_rmse.append(np.sqrt(np.mean((view.range_counts(lows, highs) - truth) ** 2)))
        ident = identity_estimate(x, 1.0, rng)
        identity_rmse.append(np.sqrt(np.mean((box_sums(ident, lows, highs) - truth) ** 2)))
    # Identity's error on a box of c cells is sqrt(2c) at eps = 1; the p-view pays one noisy
    # count per block instead, and the blocks follow the constant regions.
    assert np.mean(pview_rmse) < 0.5 * np.mean(identity_rmse)


@pytest.mark.statistical
def test_block_noise_has_the_planned_scale() -> None:
    # One cell: the view is S + Lap(1 / eps_B); check its spread over many seeds.
    draws = np.array([build_pview(np.array([50.0]), 0.5, np.random.default_rng(s)).blocks[0].noisy_sum
                      for s in range(4000)])
    assert np.var(draws - 50.0) == pytest.approx(2 * (1 / 0.5) ** 2, rel=0.1)
    assert np.median(draws) == pytest.approx(50.0, abs=0.3)


def test_combinations_of_axes_in_cut_candidates() -> None:
    block = np.zeros((1, 3, 1, 2))
    cands, scores = pv_module._cut_candidates(block)
    assert cands == [(1, 1), (1, 2), (3, 1)]
    assert np.all(scores == 0)
    assert list(itertools.chain.from_iterable(cands))  # non-empty


class _RecordingGenerator(np.random.Generator):
    """A seeded Generator that records every Laplace scale it is asked for."""

    def __init__(self, seed: int) -> None:
        super().__init__(np.random.PCG64(seed))
        self.laplace_scales: list[float] = []

    def laplace(self, loc: float = 0.0, scale: float = 1.0, size: None = None) -> float:  # type: ignore[override]
        self.laplace_scales.append(float(scale))
        return float(super().laplace(loc, scale, size))


def test_noise_is_calibrated_to_the_planned_epsilons(monkeypatch: pytest.MonkeyPatch) -> None:
    coefs: list[float] = []
    original = pv_module._exponential_mechanism

    def spy(rng: np.random.Generator, scores: np.ndarray, coef: float) -> int:
        coefs.append(coef)
        return original(rng, scores, coef)

    monkeypatch.setattr(pv_module, "_exponential_mechanism", spy)
    rng = _RecordingGenerator(21)
    x = np.random.default_rng(3).poisson(20.0, size=(8, 8)).astype(float)
    view = build_pview(x, 1.0, rng)
    bud = view.budget
    up, down = pv_module._float_up, pv_module._float_down
    # Converge tests draw Lap(Delta_AE(|B|) / eps_conv), scale rounded up.
    conv_scales = {up(aggregation_error_sensitivity(s) / bud.converge_per_level) for s in range(2, 65)}
    # Leaves draw Lap(1 / eps_leaf), one each.
    leaf_scales = sorted(up(1 / b.epsilon_perturbation) for b in view.blocks)
    assert conv_scales.isdisjoint(leaf_scales)
    assert sorted(s for s in rng.laplace_scales if s not in conv_scales) == leaf_scales
    # Every internal node (n_leaves - 1 of them) ran one test, plus leaves stopped by a test.
    stopped_by_test = sum(b.epsilon_converge == b.depth * bud.converge_per_level for b in view.blocks)
    n_conv = sum(s in conv_scales for s in rng.laplace_scales)
    assert n_conv == view.n_blocks - 1 + stopped_by_test
    # The first draw is the root's test, at the full-size sensitivity 2 (1 - 1/64).
    assert rng.laplace_scales[0] == up(Fraction(126, 64) / bud.converge_per_level)
    # Cuts: exponential mechanism with eps_cut / (2 Delta_q), Delta_q = 2 Delta_AE(|B|).
    allowed = {down(bud.cut_per_level / (2 * 2 * aggregation_error_sensitivity(s))) for s in range(2, 65)}
    assert len(coefs) == view.n_blocks - 1
    assert set(coefs) <= allowed
    assert coefs[0] == down(bud.cut_per_level / (4 * Fraction(126, 64)))


def test_float_rounding_helpers_are_directed() -> None:
    third = Fraction(1, 3)
    assert Fraction(pv_module._float_down(third)) <= third <= Fraction(pv_module._float_up(third))
    assert pv_module._float_up(Fraction(1, 2)) == 0.5 == pv_module._float_down(Fraction(1, 2))
