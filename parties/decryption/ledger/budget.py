"""Exact privacy-budget arithmetic of the ledger: charges, spent / reserved / available, the charge rule."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from he_partition.core.accounting import epsilon_left, exact_decimal
from he_partition.core.errors import BudgetExhaustedError, InvalidInputError
from he_partition.protocol import EPSILON_TOLERANCE

__all__ = [
    "DIRECT_KIND",
    "Budget",
    "Charge",
    "available",
    "budget",
    "check_charge",
    "exact_left",
    "exact_reserved",
    "exact_sum",
    "reserved_epsilon",
]

#: The `kind` of the ledger rows that pay for directly answered range counts.
DIRECT_KIND = "range_count"


@dataclass(frozen=True)
class Charge:
    """One immutable ledger event: `epsilon` spent on a `kind` measurement of a release of a study."""

    charge_id: int
    study_id: str
    release_id: str
    kind: str
    epsilon: float
    release_epsilon: float
    created_at: str
    #: What was decrypted for this charge: canonical JSON with the contract hash, the SHA-256
    #: of the measurement spec and of the ciphertext, and the number of values released.
    detail: str = ""


def exact_sum(values: Iterable[float]) -> Fraction:
    """Exact sum of epsilons, each taken as the decimal it prints as (0.1 is 1/10)."""
    return sum((exact_decimal(v) for v in values), Fraction(0))


def _below(x: Fraction) -> float:
    """The largest float whose decimal is <= x (a booked charge never rounds up)."""
    f = float(x)
    while exact_decimal(f) > x:
        f = math.nextafter(f, -math.inf)
    return f


def _above(x: Fraction) -> float:
    """The smallest float whose decimal is >= x (a direct-query charge never rounds down)."""
    f = float(x)
    while exact_decimal(f) < x:
        f = math.nextafter(f, math.inf)
    return f


@dataclass(frozen=True)
class Budget:
    """A study's budget, exactly: `spent` (sum of charges), `reserved` (max of spent and the started
    releases' declared epsilons; what the next request is checked against) and `available`
    (total - reserved, never below 0)."""

    total: Fraction
    spent: Fraction
    reserved: Fraction

    @property
    def available(self) -> Fraction:
        return max(Fraction(0), self.total - self.reserved)


def budget(total: float, charges: Sequence[Charge], *, excluding: str | None = None) -> Budget:
    """THE budget arithmetic: spent, reserved and available of a study, in exact decimal arithmetic.

    Every epsilon is the decimal it prints as (0.1 is 1/10). A release reserves its whole
    declared epsilon with its first charge and keeps it, finished or not (a release that fails
    part way does not give it back), so releases that interleave can never together promise
    more than the study's total. `excluding` leaves one release's charges out of the
    reservations (not out of `spent`): the release being checked.
    """
    by_release: dict[str, list[Charge]] = {}
    for c in charges:
        if c.release_id != excluding:
            by_release.setdefault(c.release_id, []).append(c)
    held = sum((max(exact_decimal(cs[0].release_epsilon), exact_sum(c.epsilon for c in cs))
                for cs in by_release.values()), Fraction(0))
    spent = exact_sum(c.epsilon for c in charges)
    return Budget(exact_decimal(total), spent, max(spent, held) if excluding is None else held)


def exact_reserved(charges: Sequence[Charge], *, excluding: str | None = None) -> Fraction:
    """Epsilon held by the releases that have started (see `budget`), exactly."""
    return budget(0.0, charges, excluding=excluding).reserved


def reserved_epsilon(charges: Sequence[Charge], *, excluding: str = "") -> float:
    """`exact_reserved` as a float (kept for callers of the old name; the arithmetic is exact)."""
    return float(exact_reserved(charges, excluding=excluding or None))


def exact_left(total: float, charges: Sequence[Charge]) -> Fraction:
    """What a study can still spend, exactly: total - max(spent, reserved) (may be < 0 on a broken ledger)."""
    b = budget(total, charges)
    return b.total - b.reserved


def available(total: float, charges: Sequence[Charge]) -> float:
    """What a new release may spend, exactly (rounded down to a float): total - max(spent, reserved)."""
    return _below(budget(total, charges).available)


def check_charge(total: float, charges: list[Charge], release_id: str, epsilon: float, release_epsilon: float, *,
                 reserve: bool = True) -> float:
    """Dry-run a charge against a study's existing charges; return the epsilon to book, or raise if refused.

    Exact arithmetic: every epsilon is the decimal it prints as (0.1 is 1/10) and sums are
    fractions, so the ledger can never pass the study's total, not even by a rounding
    error, and the remainder it reports is exactly what can be spent. Rules:
    - the first charge of a release reserves the *whole* release (`release_epsilon`): it
      must fit, exactly, next to every other started release's reservation
      (`budget`), so a release is refused before anything is decrypted rather
      than half way through, even when two releases run at the same time. `reserve` False
      (a t-of-N key-share holder, whose budget check is the study's signed charge log, where
      a failed release holds nothing): no reservation is checked, only the spend;
    - a release's charges never exceed its declared `release_epsilon`. A strategy splits
      its epsilon in floats (e.g. eps/3 three times), which can overshoot the declared
      value by a few ulps: a charge within EPSILON_TOLERANCE (relative) of the remainder is
      booked at exactly the remainder (rounded down). The noise of that measurement was
      calibrated at a scale rounded *up* to a multiple of 2^-20 (`laplace_scale`), far more
      than the ulps, so the booked epsilon still bounds its privacy loss.
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InvalidInputError(f"a charge's epsilon must be > 0 and finite, got {epsilon}")
    if not (math.isfinite(release_epsilon) and release_epsilon >= epsilon * (1 - EPSILON_TOLERANCE)):
        raise InvalidInputError(
            f"release_epsilon must be finite and >= the measurement's epsilon {epsilon:g}, got {release_epsilon}"
        )
    others = budget(total, charges, excluding=release_id)
    exact_total, spent, reserved = others.total, others.spent, others.reserved
    mine = [c for c in charges if c.release_id == release_id]
    declared = exact_decimal(release_epsilon)
    if reserve and not mine and max(spent, reserved) + declared > exact_total:
        held = f" ({float(reserved):.12g} reserved by releases that started)" if reserved > spent else ""
        raise BudgetExhaustedError(
            f"release {release_id} needs epsilon {release_epsilon:.12g} but the study has "
            f"{epsilon_left(float(max(Fraction(0), exact_total - max(spent, reserved))), total)} left of {total:.12g}{held}; nothing "
            "was decrypted. Open a new study for more releases"
        )
    if mine and any(exact_decimal(c.release_epsilon) != declared for c in mine):
        raise InvalidInputError(
            f"release {release_id} was declared with epsilon {mine[0].release_epsilon:.12g}, not {release_epsilon:.12g}"
        )
    release_left = declared - exact_sum(c.epsilon for c in mine)
    want = exact_decimal(epsilon)
    if want > release_left:
        if release_left > 0 and want <= release_left * (1 + Fraction(EPSILON_TOLERANCE)):
            return _below(release_left)  # a float split's last ulps: book exactly what the release has left
        raise BudgetExhaustedError(
            f"charging {epsilon:.12g} would take release {release_id} past its declared epsilon "
            f"{release_epsilon:.12g} ({float(release_left):.12g} left in it); nothing was decrypted"
        )
    if spent + want > exact_total:
        raise BudgetExhaustedError(
            f"charging {epsilon:.12g} would spend {float(spent + want):.12g} of the study's total {total:.12g}; "
            "nothing was decrypted"
        )
    return float(epsilon)


