"""Tests of he_partition.methods.guidance against the numbers printed in seed 002."""

from __future__ import annotations

import dataclasses
import math

import pytest

from he_partition.methods.guidance import (
    DECISIVE_EPSILON,
    PRACTICAL_EPSILON_MAX,
    PRACTICAL_EPSILON_MIN,
    EpsilonAssessment,
    assess_epsilon,
    epsilon_for_guessing_bound,
    guessing_bound,
    variance_lower_bound,
)


@pytest.mark.parametrize(
    ("alpha", "expected"),
    [(0.10, 1.991), (0.05, 2.297), (0.01, 3.045)],
)
def test_epsilon_for_guessing_bound_reproduces_seed_002(alpha: float, expected: float) -> None:
    assert round(epsilon_for_guessing_bound(alpha), 3) == expected


def test_epsilon_for_guessing_bound_closed_forms() -> None:
    # alpha = 1% -> e^eps - 1 = 20, alpha = 1 -> e^eps - 1 = 2.
    assert epsilon_for_guessing_bound(0.01) == pytest.approx(math.log(21.0), rel=1e-15)
    assert epsilon_for_guessing_bound(1.0) == pytest.approx(math.log(3.0), rel=1e-15)
    assert epsilon_for_guessing_bound(0.04) == pytest.approx(math.log(11.0), rel=1e-15)


@pytest.mark.parametrize("alpha", [1e-12, 0.003, 0.01, 0.05, 0.1, 0.5, 1.0])
def test_guessing_bound_inverts(alpha: float) -> None:
    assert guessing_bound(epsilon_for_guessing_bound(alpha)) == pytest.approx(alpha, rel=1e-12)


# Seed 002, Table 1 (V lower bound and S.D. lower bound, as printed).
@pytest.mark.parametrize(
    ("epsilon", "variance", "digits_v", "sd", "digits_sd"),
    [
        (0.01, 9900.4, 1, 99.5, 1),
        (0.1, 90.4, 1, 9.51, 2),
        (0.5, 2.38, 2, 1.54, 2),
        (1.0, 0.339, 3, 0.582, 3),
        (2.0, 0.024, 3, 0.155, 3),
        (3.0, 0.003, 3, 0.055, 3),
    ],
)
def test_variance_lower_bound_reproduces_table_1(
    epsilon: float, variance: float, digits_v: int, sd: float, digits_sd: int
) -> None:
    printed_v = round(variance_lower_bound(epsilon), digits_v)
    assert printed_v == variance
    # The seed's S.D. row is the square root of the *rounded* variance: at eps = 2 and 3
    # the true S.D. floors are 0.1565 and 0.0524, but sqrt(0.024) = 0.155 and
    # sqrt(0.003) = 0.055 are what Table 1 prints. Reproduce the table exactly that way...
    assert round(math.sqrt(printed_v), digits_sd) == sd
    # ...and check the unrounded S.D. is within what the rounding of V can explain.
    half_unit = 0.5 * 10.0**-digits_v
    assert math.sqrt(max(variance - half_unit, 0.0)) <= math.sqrt(variance_lower_bound(epsilon))
    assert math.sqrt(variance_lower_bound(epsilon)) <= math.sqrt(variance + half_unit)


def test_variance_lower_bound_exact_value() -> None:
    assert variance_lower_bound(math.log(2.0)) == pytest.approx(1.0, rel=1e-15)
    assert variance_lower_bound(math.log(3.0)) == pytest.approx(0.25, rel=1e-15)
    assert guessing_bound(math.log(3.0)) == pytest.approx(1.0, rel=1e-15)
    assert guessing_bound(math.log(5.0)) == pytest.approx(0.25, rel=1e-15)


def test_bounds_decrease_with_epsilon() -> None:
    eps = [0.01, 0.1, 0.5, 1.0, 2.0, 3.0, 10.0]
    values = [variance_lower_bound(e) for e in eps]
    assert values == sorted(values, reverse=True)
    assert len(set(values)) == len(values)


def test_extreme_epsilons_do_not_raise() -> None:
    assert variance_lower_bound(1e-200) == math.inf
    assert variance_lower_bound(1000.0) == 0.0
    assert guessing_bound(1e-200) == math.inf


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, -math.inf, math.nan])
def test_epsilon_validation(bad: float) -> None:
    with pytest.raises(ValueError, match="epsilon must be > 0 and finite, got"):
        variance_lower_bound(bad)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        guessing_bound(bad)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        assess_epsilon(bad)


def test_epsilon_error_message_names_value() -> None:
    with pytest.raises(ValueError, match=r"epsilon must be > 0 and finite, got -1"):
        assess_epsilon(-1)


@pytest.mark.parametrize("bad", [True, "1.0", None])
def test_epsilon_type_validation(bad: object) -> None:
    with pytest.raises(TypeError, match="epsilon must be a real number"):
        variance_lower_bound(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.0000001, 2.0, math.nan, math.inf])
def test_alpha_validation(bad: float) -> None:
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\], got"):
        epsilon_for_guessing_bound(bad)


def test_assessment_fields_are_consistent() -> None:
    a = assess_epsilon(2.0)
    assert isinstance(a, EpsilonAssessment)
    assert a.epsilon == 2.0
    assert a.variance_lower_bound == variance_lower_bound(2.0)
    assert a.std_lower_bound == pytest.approx(math.sqrt(a.variance_lower_bound), rel=1e-15)
    assert a.guessing_bound == guessing_bound(2.0)
    assert a.guessing_bound_clipped == a.guessing_bound
    assert not a.guessing_bound_is_vacuous
    assert a.in_practical_range
    assert a.warnings == ()


def test_assessment_is_frozen_and_computed() -> None:
    a = EpsilonAssessment(1.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.epsilon = 3.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        EpsilonAssessment(1.5, 0.0)  # type: ignore[call-arg]


def test_vacuous_guessing_bound_is_clipped_separately() -> None:
    a = assess_epsilon(0.5)  # alpha_eps = 4 * 2.376 = 9.5
    assert a.guessing_bound == pytest.approx(4 * 2.376204006495965, rel=1e-12)
    assert a.guessing_bound > 1.0
    assert a.guessing_bound_clipped == 1.0
    assert a.guessing_bound_is_vacuous
    # ln 3 is exactly the boundary; just above it the bound is informative.
    assert not assess_epsilon(math.log(3.0) * 1.0001).guessing_bound_is_vacuous


def test_no_warning_inside_practical_range() -> None:
    for eps in (PRACTICAL_EPSILON_MIN, 0.5, 1.0, math.log(3.0), 1.991, 2.297, PRACTICAL_EPSILON_MAX):
        assert assess_epsilon(eps).warnings == (), eps


def test_warns_below_practical_range_with_table_value() -> None:
    a = assess_epsilon(0.05)
    assert not a.in_practical_range
    assert len(a.warnings) == 1
    assert "below 0.1" in a.warnings[0]
    assert "seed 002, Table 1" in a.warnings[0]


def test_warns_above_practical_range() -> None:
    a = assess_epsilon(3.1)
    assert not a.in_practical_range
    assert len(a.warnings) == 1
    assert "above ln 21" in a.warnings[0]
    assert "1%" in a.warnings[0]
    assert a.guessing_bound < 0.01


def test_decisive_warning_adds_to_upper_warning() -> None:
    assert len(assess_epsilon(DECISIVE_EPSILON).warnings) == 1
    a = assess_epsilon(8.0)
    assert len(a.warnings) == 2
    assert "Kass-Raftery" in a.warnings[1]


def test_practical_range_constants() -> None:
    assert PRACTICAL_EPSILON_MAX == pytest.approx(3.0445224377, abs=1e-10)
    assert round(PRACTICAL_EPSILON_MAX, 3) == 3.045
    assert DECISIVE_EPSILON == pytest.approx(4.605170186, abs=1e-9)
