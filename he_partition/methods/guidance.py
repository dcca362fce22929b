"""Choosing epsilon: Hoshino's variance floor and guessing bound for a single count (seed 002)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..core.validation import positive_finite

__all__ = [
    "PRACTICAL_EPSILON_MIN",
    "PRACTICAL_EPSILON_MAX",
    "DECISIVE_EPSILON",
    "variance_lower_bound",
    "guessing_bound",
    "epsilon_for_guessing_bound",
    "EpsilonAssessment",
    "assess_epsilon",
]

# Seed 002 (Hoshino 2021), Table 1: at eps = 0.1 every unbiased estimator of one count has
# V >= 90.4 (S.D. >= 9.51), at eps = 0.01 V >= 9900.4. Below 0.1 the noise swamps any
# count smaller than a few tens, so we warn about utility there.
PRACTICAL_EPSILON_MIN = 0.1

# Seed 002, last slide: alpha_eps = 10%, 5%, 1% give eps = 1.991, 2.297, 3.045, which the
# author says are "not far from existing practice" (Google ln 3 ~ 1.1, Apple 1..2). Above
# ln(21) ~ 3.045 an adversary's claim to know a count exactly can no longer be denied even at
# the 1% level, so we warn about privacy there.
# Seed 004 (DEIM 2023 tutorial, slide 23) draws an epsilon scale 0 / 0.5 / 1 / 2 / 4 / 8 / inf
# labelled "strong ... practical range ... weak"; the text extraction does not show where the
# "practical range" bracket starts and ends, so we take the numeric thresholds from seed 002.
PRACTICAL_EPSILON_MAX = math.log(21.0)

# Seed 002, Table 2 (Kass & Raftery 1995): a likelihood ratio exp(eps) > 100, i.e.
# eps > ln 100 ~ 4.6, is "decisive" evidence; Table 3 (Evett et al. 2000) calls it
# "moderately strong" from 4.6 on.
DECISIVE_EPSILON = math.log(100.0)


def _inverse_expm1_squared(eps: float) -> float:
    """Return 1 / (e^eps - 1)^2: +inf below eps ~ 1e-154, 0.0 above eps ~ 709 (float range)."""
    try:
        inv = 1.0 / math.expm1(eps)
    except OverflowError:
        return 0.0
    if inv > 1e154:  # inv**2 would overflow
        return math.inf
    return inv * inv


def variance_lower_bound(epsilon: float) -> float:
    """Lower bound 1/(e^eps - 1)^2 on the variance of any unbiased estimator of one count.

    Seed 002, Proposition 1: if a release satisfies eps-DP, where neighbouring data sets
    differ by one unit in one count (add/remove one record changes one cell of the count
    vector by 1), then by the Hammersley-Chapman-Robbins inequality every unbiased
    estimator of that count has variance at least 1/(e^eps - 1)^2. The bound holds for any
    eps-DP mechanism, not only the Laplace one; it says nothing about biased estimators.

    Seed 002, Table 1: eps 0.01 -> 9900.4, 0.1 -> 90.4, 0.5 -> 2.38, 1 -> 0.339,
    2 -> 0.024, 3 -> 0.003.

    Raises:
        ValueError: epsilon is not > 0 and finite.
    """
    return _inverse_expm1_squared(positive_finite("epsilon", epsilon))


def guessing_bound(epsilon: float) -> float:
    """Hoshino's alpha_eps = 4/(e^eps - 1)^2 (seed 002, eq. (2)); may exceed 1.

    The seed applies Chebyshev's inequality, P(|n_hat - n| >= 1/2) <= 4 V(n_hat), at the
    smallest variance Proposition 1 allows (``variance_lower_bound``). An adversary who
    knows counts are integers and rounds an unbiased estimate is wrong with probability
    at most alpha_eps in that best case, so the seed reads alpha_eps as a deniability
    level: a claim to have recovered a count exactly, made at a significance level below
    alpha_eps, can be denied. Small alpha_eps therefore means weak protection.

    This is a Chebyshev heuristic, not a guarantee about every adversary. The value is
    returned unclipped; when it is >= 1 (eps <= ln 3 ~ 1.0986) it is vacuous as a
    probability bound, i.e. no claim of exact recovery can be supported at any level.
    ``EpsilonAssessment.guessing_bound_clipped`` carries min(1, alpha_eps).

    Raises:
        ValueError: epsilon is not > 0 and finite.
    """
    return 4.0 * _inverse_expm1_squared(positive_finite("epsilon", epsilon))


def epsilon_for_guessing_bound(alpha: float) -> float:
    """The epsilon at which alpha_eps = alpha: eps = ln(1 + 2/sqrt(alpha)).

    Seed 002: alpha 10% -> 1.991, 5% -> 2.297, 1% -> 3.045. alpha = 1 gives ln 3 (the
    largest epsilon whose bound is vacuous); values above 1 are rejected because a
    probability bound above 1 is not a target anyone can ask for.

    Raises:
        ValueError: alpha is not in (0, 1] or not finite.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"alpha must be a real number, got {type(alpha).__name__}")
    a = float(alpha)
    if not math.isfinite(a) or a <= 0.0 or a > 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
    return math.log1p(2.0 / math.sqrt(a))


@dataclass(frozen=True)
class EpsilonAssessment:
    """What seed 002 lets us say about one epsilon; derived fields are computed, not passed.

    Attributes:
        epsilon: the privacy parameter assessed (> 0, finite).
        variance_lower_bound: 1/(e^eps - 1)^2, floor on an unbiased count estimator's variance.
        std_lower_bound: its square root.
        guessing_bound: alpha_eps = 4/(e^eps - 1)^2, unclipped (may exceed 1).
        guessing_bound_clipped: min(1, alpha_eps), usable as a probability.
        warnings: human-readable warnings (a tuple so the record stays immutable); empty
            when epsilon lies in [PRACTICAL_EPSILON_MIN, PRACTICAL_EPSILON_MAX].
    """

    epsilon: float
    variance_lower_bound: float = field(init=False)
    std_lower_bound: float = field(init=False)
    guessing_bound: float = field(init=False)
    guessing_bound_clipped: float = field(init=False)
    warnings: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        eps = positive_finite("epsilon", self.epsilon)
        var = _inverse_expm1_squared(eps)
        alpha = 4.0 * var
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "variance_lower_bound", var)
        object.__setattr__(self, "std_lower_bound", math.sqrt(var))
        object.__setattr__(self, "guessing_bound", alpha)
        object.__setattr__(self, "guessing_bound_clipped", min(1.0, alpha))
        object.__setattr__(self, "warnings", _warnings_for(eps, var, alpha))

    @property
    def guessing_bound_is_vacuous(self) -> bool:
        """True when alpha_eps >= 1 (eps <= ln 3): the Chebyshev bound says nothing."""
        return self.guessing_bound >= 1.0

    @property
    def in_practical_range(self) -> bool:
        """True when PRACTICAL_EPSILON_MIN <= epsilon <= PRACTICAL_EPSILON_MAX."""
        return PRACTICAL_EPSILON_MIN <= self.epsilon <= PRACTICAL_EPSILON_MAX


def _warnings_for(eps: float, var: float, alpha: float) -> tuple[str, ...]:
    out: list[str] = []
    if eps < PRACTICAL_EPSILON_MIN:
        out.append(
            f"epsilon {eps:g} is below {PRACTICAL_EPSILON_MIN:g}: any unbiased estimate of a "
            f"single count has standard deviation >= {math.sqrt(var):.3g} (seed 002, Table 1), "
            "so small counts will be lost in the noise; raise epsilon or release coarser "
            "aggregates"
        )
    if eps > PRACTICAL_EPSILON_MAX:
        out.append(
            f"epsilon {eps:g} is above ln 21 = {PRACTICAL_EPSILON_MAX:.3f}: the guessing bound "
            f"alpha_eps = {alpha:.3g} is below 1%, so an adversary's claim to know a count "
            "exactly cannot be denied at the 1% level (seed 002 proposes eps 1.991..3.045 for "
            "alpha 10%..1%); lower epsilon or justify it explicitly"
        )
    if eps > DECISIVE_EPSILON:
        out.append(
            f"epsilon {eps:g} is above ln 100 = {DECISIVE_EPSILON:.3f}: one output can be "
            "more than 100 times likelier under one neighbour than the other, 'decisive' "
            "evidence on the Kass-Raftery scale (seed 002, Table 2)"
        )
    return tuple(out)


def assess_epsilon(epsilon: float) -> EpsilonAssessment:
    """Assess epsilon against seed 002's bounds and the practical range; see EpsilonAssessment.

    The neighbouring relation assumed is the seed's: one unit change in one count
    (add/remove one record). Nothing is released and no budget is spent.

    Raises:
        ValueError: epsilon is not > 0 and finite.
    """
    return EpsilonAssessment(epsilon)
