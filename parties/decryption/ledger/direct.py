"""Pricing of direct range-count queries on the ledger: the pieces, the overlap charge, idempotent repeats."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from he_partition.core.accounting import (
    RangeQuery,
    epsilon_left,
    exact_decimal,
    overlap_graph_max_clique,
)
from he_partition.core.errors import BudgetExhaustedError, InvalidInputError

from ...common.contract import StudyContract
from ...common.errors import AlreadyExistsError, FailedPreconditionError
from .budget import DIRECT_KIND, Charge, budget

__all__ = ["DirectCharge", "DirectPiece", "direct_increment"]


@dataclass(frozen=True)
class DirectPiece:
    """One noisy range count the decryption server's view of a direct query reveals.

    `role` "count" is the answer itself (at the analyst's epsilon); "prefix_mask" is the
    masked prefix [0, lo) in front of it (at `PREFIX_MASK_EPSILON`; see
    `he_partition.core.measurements.RangeCount`). `position` is the query's index in its request.
    """

    request_id: str
    position: int
    role: str
    query: RangeQuery


@dataclass(frozen=True)
class DirectCharge:
    """What a batch of direct range counts cost.

    `epsilon`: the charge written for it (0.0 when its pieces fell on ground the study had
    already paid for; then no ledger row exists); `spent_direct`: the charge of all the
    study's direct pieces so far; `remaining`: what the next request is checked against after
    it (total - max(spent, reserved));
    `already_charged`: True when the request id was charged before (an idempotent retry).
    """

    request_id: str
    epsilon: float
    spent_direct: float
    remaining: float
    charge: Charge | None
    already_charged: bool = False


def direct_increment(contract: StudyContract, old: Sequence[RangeQuery],
                     new: Sequence[RangeQuery]) -> tuple[Fraction, Fraction]:
    """(charge of `new` given `old`, charge of old + new), exact, in the study's epsilon units.

    Privacy map (seed 004): a record at bin x is seen by every piece whose range contains
    x, so answering a set of pieces is max_x sum_{piece contains x} eps_piece -DP under
    add/remove of one person with at most c records (each piece is calibrated to
    sensitivity c): the maximum weighted clique of the overlap graph. The increment of a
    batch is how much that maximum grows. For a study with correlated records
    (noise multiplier 1 + L > 1, Bayesian DP) disjoint ranges still leak through the
    correlation, so parallel composition does not apply: each piece is charged in full,
    times the multiplier.
    """
    if contract.correlated:
        multiplier = exact_decimal(contract.noise_multiplier)
        inc = multiplier * sum((exact_decimal(q.epsilon) for q in new), Fraction(0))
        before = multiplier * sum((exact_decimal(q.epsilon) for q in old), Fraction(0))
        return inc, before + inc
    before = overlap_graph_max_clique(old).epsilon_exact if old else Fraction(0)
    after = overlap_graph_max_clique(list(old) + list(new)).epsilon_exact
    return after - before, after


def _same_pieces(stored: Sequence[DirectPiece], new: Sequence[DirectPiece]) -> bool:
    def key(p: DirectPiece) -> tuple[int, str, tuple[int, ...], tuple[int, ...], Fraction]:
        return (p.position, p.role, p.query.lo, p.query.hi, exact_decimal(p.query.epsilon))

    return sorted(map(key, stored)) == sorted(map(key, new))


def _check_direct_fits(contract: StudyContract, charges: list[Charge], request_id: str, increment: float,
                       spent_direct: Fraction) -> None:
    b = budget(contract.epsilon, charges)
    if b.reserved + exact_decimal(increment) > b.total:
        raise BudgetExhaustedError(
            f"direct queries {request_id} would add epsilon {increment:g} (direct-query charge "
            f"{float(spent_direct) - increment:g} -> {float(spent_direct):g}, the heaviest overlap of all answered "
            f"ranges) but study {contract.study_id} has {epsilon_left(float(b.available), contract.epsilon)} left of "
            f"{contract.epsilon:g}; nothing was charged or decrypted. Ask fewer or non-overlapping ranges, or a "
            "smaller epsilon"
        )


def _price_direct(contract: StudyContract, request_id: str, new: list[DirectPiece], stored: list[DirectPiece],
                  charges: list[Charge]) -> tuple[DirectCharge | None, Fraction, Fraction]:
    """(the earlier result for a repeated request id, or None; the increment; the charge after), checked to fit."""
    previous = [p for p in stored if p.request_id == request_id]
    if previous:
        return _repeat(contract, request_id, previous, new, stored, charges), Fraction(0), Fraction(0)
    inc, after = direct_increment(contract, [p.query for p in stored], [p.query for p in new])
    if inc > 0:
        _check_direct_fits(contract, charges, request_id, float(inc), after)
    return None, inc, after


def _direct_result(contract: StudyContract, request_id: str, inc: Fraction, after: Fraction, charges: list[Charge],
                   charge: Charge | None) -> DirectCharge:
    b = budget(contract.epsilon, [*charges, *([charge] if charge else [])])
    return DirectCharge(request_id, float(inc), float(after), float(b.available), charge)


def _pieces_of(request_id: str, queries: Sequence[Sequence[RangeQuery]]) -> list[DirectPiece]:
    if not queries:
        raise InvalidInputError("a direct-query request needs at least one range")
    out = []
    for i, pieces in enumerate(queries):
        for j, q in enumerate(pieces):
            if q.ndim != 1:
                raise InvalidInputError(f"direct queries are 1-D ranges, query {i} has {q.ndim} dimensions")
            out.append(DirectPiece(request_id, i, "count" if j == 0 else "prefix_mask", q))
    return out


def _unclaimed(pieces: Sequence[DirectPiece], claimed: set[int], lo: int, hi: int, epsilon: float) -> int:
    for p in pieces:
        if p.role == "count" and p.position not in claimed and p.query.lo == (lo,) and p.query.hi == (hi,) \
                and exact_decimal(p.query.epsilon) == exact_decimal(epsilon):
            return p.position
    raise FailedPreconditionError(
        f"no paid, not yet decrypted range [{lo}, {hi}) at epsilon {epsilon:g} in direct-query request; charge it "
        "first (ChargeDirectQueries) — each paid range is decrypted once; nothing was decrypted"
    )


def _repeat(contract: StudyContract, request_id: str, previous: list[DirectPiece], new: list[DirectPiece],
            stored: list[DirectPiece], charges: list[Charge]) -> DirectCharge:
    """The answer to charging a request id a second time (idempotent for the same queries)."""
    if not _same_pieces(previous, new):
        raise AlreadyExistsError(
            f"direct-query request {request_id} was already charged for other ranges; use a new request id"
        )
    charge = next((c for c in charges if c.release_id == request_id and c.kind == DIRECT_KIND), None)
    after = direct_increment(contract, [], [p.query for p in stored])[1]
    b = budget(contract.epsilon, charges)
    return DirectCharge(request_id, charge.epsilon if charge else 0.0, float(after),
                        float(b.available), charge, already_charged=True)


