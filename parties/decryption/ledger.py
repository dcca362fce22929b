"""The decryption server's study contracts and append-only privacy-budget ledger (SQLite or in memory)."""

from __future__ import annotations

import hashlib

import abc
import math
import sqlite3
import threading
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Sequence

from he_partition.core.accounting import RangeQuery, exact_decimal, overlap_graph_max_clique
from he_partition.core.errors import BudgetExhaustedError, InvalidInputError
from he_partition.protocol import EPSILON_TOLERANCE

from ..common.contract import StudyContract, check_id
from ..common.errors import AlreadyExistsError, FailedPreconditionError, NotFoundError
from ..common.util import ImmediateTransaction, utc_now

__all__ = ["Charge", "LedgerStore", "SqliteLedgerStore", "MemoryLedgerStore", "check_charge", "reserved_epsilon",
           "DirectPiece", "DirectCharge", "direct_increment", "DIRECT_KIND"]

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


def reserved_epsilon(charges: list[Charge], *, excluding: str = "") -> float:
    """Epsilon held by the releases that have started: each one's declared epsilon (or what it spent, if more).

    A release reserves its whole declared epsilon with its first charge and keeps it,
    finished or not (a release that fails part way does not give it back), so releases
    that interleave can never together promise more than the study's total.
    """
    by_release: dict[str, list[Charge]] = {}
    for c in charges:
        if c.release_id != excluding:
            by_release.setdefault(c.release_id, []).append(c)
    return math.fsum(max(cs[0].release_epsilon, math.fsum(c.epsilon for c in cs)) for cs in by_release.values())


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


def available(total: float, charges: Sequence[Charge]) -> float:
    """What a new release may spend, exactly (rounded down to a float): total - max(spent, reserved)."""
    return _below(max(Fraction(0), exact_left(total, charges)))


def exact_left(total: float, charges: Sequence[Charge]) -> Fraction:
    """What a study can still spend, exactly: total - max(spent, reserved) in decimal arithmetic."""
    return exact_decimal(total) - max(exact_sum(c.epsilon for c in charges), exact_reserved(charges))


def exact_reserved(charges: Sequence[Charge], *, excluding: str | None = None) -> Fraction:
    """`reserved_epsilon` in exact arithmetic."""
    by_release: dict[str, list[Charge]] = {}
    for c in charges:
        if c.release_id != excluding:
            by_release.setdefault(c.release_id, []).append(c)
    return sum((max(exact_decimal(cs[0].release_epsilon), exact_sum(c.epsilon for c in cs))
                for cs in by_release.values()), Fraction(0))


def check_charge(total: float, charges: list[Charge], release_id: str, epsilon: float, release_epsilon: float) -> float:
    """Dry-run a charge against a study's existing charges; return the epsilon to book, or raise if refused.

    Exact arithmetic: every epsilon is the decimal it prints as (0.1 is 1/10) and sums are
    fractions, so the ledger can never pass the study's total, not even by a rounding
    error, and the remainder it reports is exactly what can be spent. Rules:
    - the first charge of a release reserves the *whole* release (`release_epsilon`): it
      must fit, exactly, next to every other started release's reservation
      (`reserved_epsilon`), so a release is refused before anything is decrypted rather
      than half way through, even when two releases run at the same time;
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
    exact_total = exact_decimal(total)
    spent = exact_sum(c.epsilon for c in charges)
    mine = [c for c in charges if c.release_id == release_id]
    reserved = exact_reserved(charges, excluding=release_id)
    declared = exact_decimal(release_epsilon)
    if not mine and max(spent, reserved) + declared > exact_total:
        held = f" ({float(reserved):.12g} reserved by releases that started)" if reserved > spent else ""
        raise BudgetExhaustedError(
            f"release {release_id} needs epsilon {release_epsilon:.12g} but the study has "
            f"{float(max(Fraction(0), exact_total - max(spent, reserved))):.12g} left of {total:.12g}{held}; nothing "
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
    study's direct pieces so far; `remaining`: the study's budget left after it;
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
    key = lambda p: (p.position, p.role, p.query.lo, p.query.hi, exact_decimal(p.query.epsilon))  # noqa: E731
    return sorted(map(key, stored)) == sorted(map(key, new))


def _check_direct_fits(contract: StudyContract, charges: list[Charge], request_id: str, increment: float,
                       spent_direct: Fraction) -> None:
    held = float(exact_decimal(contract.epsilon) - exact_left(contract.epsilon, charges))
    if exact_decimal(contract.epsilon) - exact_left(contract.epsilon, charges) + exact_decimal(increment) \
            > exact_decimal(contract.epsilon):
        raise BudgetExhaustedError(
            f"direct queries {request_id} would add epsilon {increment:g} (direct-query charge "
            f"{float(spent_direct) - increment:g} -> {float(spent_direct):g}, the heaviest overlap of all answered "
            f"ranges) but study {contract.study_id} has {max(0.0, contract.epsilon - held):g} left of "
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
    spent = exact_sum(c.epsilon for c in [*charges, *([charge] if charge else [])])
    left = exact_decimal(contract.epsilon) - spent
    return DirectCharge(request_id, float(inc), float(after), float(max(Fraction(0), left)), charge)


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


class LedgerStore(abc.ABC):
    """Study contracts and the append-only charge ledger of one decryption server.

    `charge` checks and appends in one atomic step; rows are never updated or deleted.
    """

    @abc.abstractmethod
    def create_study(self, contract: StudyContract) -> tuple[StudyContract, bool]:
        """Store a new contract; an identical existing one is returned with True (idempotent),
        a different one under the same id raises AlreadyExistsError."""

    @abc.abstractmethod
    def get_study(self, study_id: str) -> StudyContract:
        """The contract, or NotFoundError."""

    @abc.abstractmethod
    def list_studies(self) -> list[StudyContract]:
        """Every contract, oldest first."""

    @abc.abstractmethod
    def charge(self, study_id: str, release_id: str, kind: str, epsilon: float, release_epsilon: float,
               detail: str = "") -> Charge:
        """Check (`check_charge`) and append one charge atomically; durable when it returns.

        This is where budget is spent: `epsilon` of the study's total (sequential
        composition over every charge of the study). Callers charge before they decrypt,
        and record in `detail` what the charge pays for (one row per decryption).

        Privacy: the charged measurement's sensitivity and neighbouring relation
        (add/remove of one person with at most c records) are the caller's to check; no
        noise is drawn here, so nobody knows noise from it.
        """

    @abc.abstractmethod
    def charges(self, study_id: str) -> list[Charge]:
        """A study's charges, oldest first (NotFoundError for an unknown study)."""

    @abc.abstractmethod
    def charge_direct(self, study_id: str, request_id: str, queries: Sequence[Sequence[RangeQuery]],
                      detail: str = "") -> DirectCharge:
        """Pay for a batch of direct range counts, atomically, before any of them is decrypted.

        `queries[i]` are the pieces of query i (its count first, then its prefix mask; see
        `RangeCount.privacy_pieces`). The charge is `direct_increment` over every direct
        piece the study has answered; it must fit the budget left next to the releases'
        reservations (BudgetExhaustedError otherwise, and nothing is written). The pieces
        and, when the increment is > 0, one `DIRECT_KIND` charge row are committed
        together. Charging the same request id again with the same queries returns the
        first result (`already_charged`); other queries under that id: AlreadyExistsError.

        Privacy: each piece is a range count at its epsilon, sensitivity c under the
        neighbouring relation add/remove of one person with at most c records; no noise is
        drawn here, so nobody knows noise from it.
        """

    @abc.abstractmethod
    def claim_direct_decryption(self, study_id: str, request_id: str, lo: int, hi: int, epsilon: float,
                                detail: str = "") -> int:
        """Mark one paid range of a request as decrypted and return its position.

        Each paid range is decrypted at most once: a replayed or unpaid measurement raises
        FailedPreconditionError. Durable when it returns (before the value is decrypted).
        """

    @abc.abstractmethod
    def direct_pieces(self, study_id: str) -> list[DirectPiece]:
        """Every direct piece the study has paid for, oldest first."""

    def spent(self, study_id: str) -> float:
        return math.fsum(c.epsilon for c in self.charges(study_id))

    def reserved(self, study_id: str) -> float:
        """Epsilon held by started releases (see `reserved_epsilon`); >= `spent`."""
        charges = self.charges(study_id)
        return max(math.fsum(c.epsilon for c in charges), reserved_epsilon(charges))

    def check_consistency(self) -> list[str]:
        """Replay every study's charges through `check_charge`, oldest first; return what fails (empty: consistent).

        A consistent ledger never spent more than a study's total nor more than a release
        declared, and every row describes a positive charge. Run after a crash or restore.
        """
        problems: list[str] = []
        for contract in self.list_studies():
            seen: list[Charge] = []
            for c in self.charges(contract.study_id):
                try:
                    check_charge(contract.epsilon, seen, c.release_id, c.epsilon, c.release_epsilon)
                except (BudgetExhaustedError, InvalidInputError) as exc:
                    problems.append(f"study {contract.study_id} charge #{c.charge_id}: {exc}")
                seen.append(c)
            problems += self._check_direct(contract)
        return problems

    def _check_direct(self, contract: StudyContract) -> list[str]:
        """The direct-query rows must add up to the charge of the stored pieces."""
        pieces = [p.query for p in self.direct_pieces(contract.study_id)]
        paid = math.fsum(c.epsilon for c in self.charges(contract.study_id) if c.kind == DIRECT_KIND)
        owed = float(direct_increment(contract, [], pieces)[1]) if pieces else 0.0
        if not math.isclose(paid, owed, rel_tol=1e-9, abs_tol=1e-12):
            return [f"study {contract.study_id}: direct-query charges add up to {paid!r}, but the answered ranges "
                    f"cost {owed!r}"]
        return []

    def close(self) -> None:
        """Release resources (no-op by default)."""


def _same_terms(a: StudyContract, b: StudyContract) -> bool:
    """Equal terms, whatever canonical encoding (contract version) each was written in."""
    return a.contract_hash == replace(b, version=a.version).contract_hash


def _conflict(existing: StudyContract) -> AlreadyExistsError:
    return AlreadyExistsError(
        f"study {existing.study_id} already exists with different terms (contract {existing.contract_hash[:16]}); "
        "choose another study id"
    )


class MemoryLedgerStore(LedgerStore):
    """In-memory ledger for unit tests; same contract as the SQLite one, lost at exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._studies: dict[str, StudyContract] = {}
        self._charges: list[Charge] = []
        self._direct: dict[str, list[DirectPiece]] = {}
        self._claimed: dict[tuple[str, str], set[int]] = {}

    def create_study(self, contract: StudyContract) -> tuple[StudyContract, bool]:
        with self._lock:
            existing = self._studies.get(contract.study_id)
            if existing is not None:
                if not _same_terms(existing, contract):
                    raise _conflict(existing)
                return existing, True
            self._studies[contract.study_id] = contract
            return contract, False

    def get_study(self, study_id: str) -> StudyContract:
        with self._lock:
            c = self._studies.get(study_id)
        if c is None:
            raise NotFoundError(f"unknown study {study_id!r}; open it first (dpagg open-study)")
        return c

    def list_studies(self) -> list[StudyContract]:
        with self._lock:
            return list(self._studies.values())

    def charge(self, study_id: str, release_id: str, kind: str, epsilon: float, release_epsilon: float,
               detail: str = "") -> Charge:
        """Book `epsilon` for one measurement of a release, atomically (see `LedgerStore.charge`).

        Privacy: spends `epsilon` of the study's budget; the measurement's sensitivity and
        neighbouring relation (add/remove of one person with at most c records) are checked
        by the caller (`DecryptionHandler.check_measurement`); no noise is drawn here, so
        nobody knows noise from it. Nothing is written when the charge does not fit.
        """
        check_id("release_id", release_id)
        with self._lock:
            contract = self._studies.get(study_id)
            if contract is None:
                raise NotFoundError(f"unknown study {study_id!r}; open it first (dpagg open-study)")
            mine = [c for c in self._charges if c.study_id == study_id]
            booked = check_charge(contract.epsilon, mine, release_id, float(epsilon), float(release_epsilon))
            c = Charge(len(self._charges) + 1, study_id, release_id, kind, booked, float(release_epsilon),
                       utc_now(), detail)
            self._charges.append(c)
            return c

    def charges(self, study_id: str) -> list[Charge]:
        self.get_study(study_id)
        with self._lock:
            return [c for c in self._charges if c.study_id == study_id]

    def charge_direct(self, study_id: str, request_id: str, queries: Sequence[Sequence[RangeQuery]],
                      detail: str = "") -> DirectCharge:
        """Pay for a batch of direct range counts atomically (see `LedgerStore.charge_direct`).

        Privacy: spends the growth of the heaviest weighted overlap (epsilon per piece,
        seed 004); each piece is a range count of sensitivity c under the neighbouring
        relation add/remove of one person with at most c records. No noise is drawn here,
        so nobody knows noise from it. Nothing is written when the charge does not fit.
        """
        check_id("request_id", request_id)
        new = _pieces_of(request_id, queries)
        contract = self.get_study(study_id)
        with self._lock:
            stored = self._direct.setdefault(study_id, [])
            mine = [c for c in self._charges if c.study_id == study_id]
            repeat, inc, after = _price_direct(contract, request_id, new, stored, mine)
            if repeat is not None:
                return repeat
            charge = None
            if inc > 0:
                charge = Charge(len(self._charges) + 1, study_id, request_id, DIRECT_KIND, _above(inc), _above(inc),
                                utc_now(), detail)
                self._charges.append(charge)
            stored.extend(new)
            return _direct_result(contract, request_id, inc, after, mine, charge)

    def claim_direct_decryption(self, study_id: str, request_id: str, lo: int, hi: int, epsilon: float,
                                detail: str = "") -> int:
        self.get_study(study_id)
        with self._lock:
            pieces = [p for p in self._direct.get(study_id, []) if p.request_id == request_id]
            claimed = self._claimed.setdefault((study_id, request_id), set())
            position = _unclaimed(pieces, claimed, lo, hi, epsilon)
            claimed.add(position)
            return position

    def direct_pieces(self, study_id: str) -> list[DirectPiece]:
        self.get_study(study_id)
        with self._lock:
            return list(self._direct.get(study_id, []))


def _repeat(contract: StudyContract, request_id: str, previous: list[DirectPiece], new: list[DirectPiece],
            stored: list[DirectPiece], charges: list[Charge]) -> DirectCharge:
    """The answer to charging a request id a second time (idempotent for the same queries)."""
    if not _same_pieces(previous, new):
        raise AlreadyExistsError(
            f"direct-query request {request_id} was already charged for other ranges; use a new request id"
        )
    charge = next((c for c in charges if c.release_id == request_id and c.kind == DIRECT_KIND), None)
    after = direct_increment(contract, [], [p.query for p in stored])[1]
    spent = math.fsum(c.epsilon for c in charges)
    return DirectCharge(request_id, charge.epsilon if charge else 0.0, float(after),
                        max(0.0, contract.epsilon - spent), charge, already_charged=True)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS studies (
    study_id      TEXT PRIMARY KEY,
    contract_json TEXT NOT NULL,
    contract_hash TEXT NOT NULL,
    created_at    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS charges (
    charge_id       INTEGER PRIMARY KEY AUTOINCREMENT,
    study_id        TEXT NOT NULL REFERENCES studies(study_id),
    release_id      TEXT NOT NULL,
    kind            TEXT NOT NULL,
    epsilon         REAL NOT NULL CHECK (epsilon > 0),
    release_epsilon REAL NOT NULL,
    created_at      TEXT NOT NULL,
    detail          TEXT NOT NULL DEFAULT '',
    chain           TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS charges_by_study ON charges(study_id);
CREATE TABLE IF NOT EXISTS direct_pieces (
    piece_id    INTEGER PRIMARY KEY AUTOINCREMENT,
    study_id    TEXT NOT NULL REFERENCES studies(study_id),
    request_id  TEXT NOT NULL,
    position    INTEGER NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('count', 'prefix_mask')),
    lo          INTEGER NOT NULL,
    hi          INTEGER NOT NULL CHECK (hi > lo),
    epsilon     REAL NOT NULL CHECK (epsilon > 0),
    created_at  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS direct_pieces_by_study ON direct_pieces(study_id);
CREATE TABLE IF NOT EXISTS direct_decryptions (
    study_id    TEXT NOT NULL REFERENCES studies(study_id),
    request_id  TEXT NOT NULL,
    position    INTEGER NOT NULL,
    created_at  TEXT NOT NULL,
    detail      TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (study_id, request_id, position)
);
"""


def _immutable(table: str, why: str) -> str:
    return "".join(f"CREATE TRIGGER IF NOT EXISTS {table}_no_{op.lower()} BEFORE {op} ON {table}\n"
                   f"BEGIN SELECT RAISE(ABORT, '{why}'); END;\n" for op in ("UPDATE", "DELETE"))


def _no_reuse(table: str, key: str) -> str:
    # INSERT OR REPLACE deletes the old row without firing a DELETE trigger: refuse the reuse itself.
    return (f"CREATE TRIGGER IF NOT EXISTS {table}_no_reuse BEFORE INSERT ON {table}\n"
            f"WHEN EXISTS (SELECT 1 FROM {table} WHERE {key}) "
            f"BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only: {table} row exists'); END;\n")


# The ledger is append-only: a charge (and every direct-query row), once written, can be
# neither changed nor removed; contracts are immutable.
_SCHEMA += "".join(_immutable(t, "the privacy ledger is append-only")
                   for t in ("charges", "direct_pieces", "direct_decryptions"))
_SCHEMA += _immutable("studies", "study contracts are immutable")
_SCHEMA += _no_reuse("charges", "charge_id = NEW.charge_id")
_SCHEMA += _no_reuse("direct_pieces", "piece_id = NEW.piece_id")
_SCHEMA += _no_reuse("direct_decryptions", "study_id = NEW.study_id AND request_id = NEW.request_id "
                                           "AND position = NEW.position")
_SCHEMA += _no_reuse("studies", "study_id = NEW.study_id")


def chain_hash(previous: str, row: Sequence[object]) -> str:
    """The hash chain over charge rows: SHA-256 of the previous row's hash and this row's fields."""
    fields = [previous, *(repr(v) if isinstance(v, float) else str(v) for v in row)]
    return hashlib.sha256("\x1f".join(fields).encode()).hexdigest()


class LedgerTamperedError(FailedPreconditionError):
    """The ledger's hash chain does not verify: a charge row was changed, removed or replaced."""


class SqliteLedgerStore(LedgerStore):
    """The production ledger: one SQLite file, WAL journal, synchronous=FULL.

    Each charge runs in a `BEGIN IMMEDIATE` transaction (the write lock is taken before
    the budget is read), so two threads or processes can never both fit a charge into
    the same remaining budget; the row is committed to disk before `charge` returns, so
    it precedes any decrypted value leaving the server.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)
        cols = {r[1] for r in self._db.execute("PRAGMA table_info(charges)")}
        if "detail" not in cols:  # a ledger written before decryptions were described
            self._db.execute("ALTER TABLE charges ADD COLUMN detail TEXT NOT NULL DEFAULT ''")
        if "chain" not in cols:  # a ledger written before the hash chain: its rows form an unchained prefix
            self._db.execute("ALTER TABLE charges ADD COLUMN chain TEXT NOT NULL DEFAULT ''")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def create_study(self, contract: StudyContract) -> tuple[StudyContract, bool]:
        with self._lock:
            with self._transaction():
                row = self._db.execute("SELECT contract_json FROM studies WHERE study_id = ?",
                                       (contract.study_id,)).fetchone()
                if row is None:
                    self._db.execute(
                        "INSERT INTO studies (study_id, contract_json, contract_hash, created_at) VALUES (?, ?, ?, ?)",
                        (contract.study_id, contract.canonical_json(), contract.contract_hash, utc_now()),
                    )
                    return contract, False
            existing = StudyContract.from_json(row[0])
            if not _same_terms(existing, contract):
                raise _conflict(existing)
            return existing, True

    def _get(self, study_id: str) -> StudyContract:
        row = self._db.execute("SELECT contract_json FROM studies WHERE study_id = ?", (study_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"unknown study {study_id!r}; open it first (dpagg open-study)")
        return StudyContract.from_json(row[0])

    def get_study(self, study_id: str) -> StudyContract:
        with self._lock:
            return self._get(study_id)

    def list_studies(self) -> list[StudyContract]:
        with self._lock:
            rows = self._db.execute("SELECT contract_json FROM studies ORDER BY rowid").fetchall()
        return [StudyContract.from_json(r[0]) for r in rows]

    def _charges(self, study_id: str) -> list[Charge]:
        rows = self._db.execute(
            "SELECT charge_id, study_id, release_id, kind, epsilon, release_epsilon, created_at, detail FROM charges "
            "WHERE study_id = ? ORDER BY charge_id", (study_id,)).fetchall()
        return [Charge(int(r[0]), r[1], r[2], r[3], float(r[4]), float(r[5]), r[6], r[7]) for r in rows]

    def charge(self, study_id: str, release_id: str, kind: str, epsilon: float, release_epsilon: float,
               detail: str = "") -> Charge:
        """Book `epsilon` for one measurement of a release, atomically (see `LedgerStore.charge`).

        Privacy: spends `epsilon` of the study's budget; the measurement's sensitivity and
        neighbouring relation (add/remove of one person with at most c records) are checked
        by the caller (`DecryptionHandler.check_measurement`); no noise is drawn here, so
        nobody knows noise from it. Nothing is written when the charge does not fit.
        """
        check_id("release_id", release_id)
        with self._lock, self._transaction():
            contract = self._get(study_id)
            booked = check_charge(contract.epsilon, self._charges(study_id), release_id, float(epsilon),
                                  float(release_epsilon))
            return self._insert_charge(study_id, release_id, kind, booked, float(release_epsilon), detail)

    def _insert_charge(self, study_id: str, release_id: str, kind: str, epsilon: float, release_epsilon: float,
                       detail: str) -> Charge:
        """Append one charge row, chained to the previous one (inside the caller's transaction, after its
        budget check). Refuses to write on a ledger whose chain does not verify."""
        last = self._verify_chain()
        created = utc_now()
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'charges'").fetchone()
        charge_id = max(int(row[0]) if row else 0, last[0]) + 1
        fields = (charge_id, study_id, release_id, kind, epsilon, release_epsilon, created, detail)
        self._db.execute(
            "INSERT INTO charges (charge_id, study_id, release_id, kind, epsilon, release_epsilon, created_at, "
            "detail, chain) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (*fields, chain_hash(last[1], fields)))
        return Charge(charge_id, study_id, release_id, kind, epsilon, release_epsilon, created, detail)

    def _verify_chain(self) -> tuple[int, str]:
        """Recompute the hash chain over every charge row; (last id, last hash), or LedgerTamperedError."""
        previous, last_id, chained = "", 0, False
        for r in self._db.execute("SELECT charge_id, study_id, release_id, kind, epsilon, release_epsilon, "
                                  "created_at, detail, chain FROM charges ORDER BY charge_id"):
            fields = (int(r[0]), r[1], r[2], r[3], float(r[4]), float(r[5]), r[6], r[7])
            want = chain_hash(previous, fields)
            if r[8] == "" and not chained:  # rows written before the chain existed: hashed, not checked
                previous = want
            elif r[8] != want:
                raise LedgerTamperedError(
                    f"the ledger's hash chain breaks at charge {r[0]} (study {r[1]}): a charge row was changed, "
                    f"removed or replaced in {self.path}. Decryption is stopped; restore the ledger from a backup "
                    "and check it with `dpagg budget --verify`"
                )
            else:
                chained, previous = True, want
            last_id = fields[0]
        return last_id, previous

    def verify_chain(self) -> int:
        """Check the whole hash chain; returns the number of charge rows (LedgerTamperedError if broken)."""
        with self._lock:
            self._verify_chain()
            return int(self._db.execute("SELECT COUNT(*) FROM charges").fetchone()[0])

    def charges(self, study_id: str) -> list[Charge]:
        with self._lock:
            self._get(study_id)
            return self._charges(study_id)

    def _direct_pieces(self, study_id: str, request_id: str | None = None) -> list[DirectPiece]:
        sql = "SELECT request_id, position, role, lo, hi, epsilon FROM direct_pieces WHERE study_id = ?"
        args: tuple[str, ...] = (study_id,)
        if request_id is not None:
            sql += " AND request_id = ?"
            args += (request_id,)
        rows = self._db.execute(sql + " ORDER BY piece_id", args).fetchall()
        return [DirectPiece(r[0], int(r[1]), r[2], RangeQuery((int(r[3]),), (int(r[4]),), float(r[5]))) for r in rows]

    def _transaction(self) -> ImmediateTransaction:
        return ImmediateTransaction(self._db)

    def charge_direct(self, study_id: str, request_id: str, queries: Sequence[Sequence[RangeQuery]],
                      detail: str = "") -> DirectCharge:
        """Pay for a batch of direct range counts atomically (see `LedgerStore.charge_direct`).

        Privacy: spends the growth of the heaviest weighted overlap (epsilon per piece,
        seed 004); each piece is a range count of sensitivity c under the neighbouring
        relation add/remove of one person with at most c records. No noise is drawn here,
        so nobody knows noise from it. Nothing is written when the charge does not fit.
        """
        check_id("request_id", request_id)
        new = _pieces_of(request_id, queries)
        with self._lock, self._transaction():
            contract = self._get(study_id)
            stored = self._direct_pieces(study_id)
            charges = self._charges(study_id)
            repeat, inc, after = _price_direct(contract, request_id, new, stored, charges)
            if repeat is not None:
                return repeat
            charge = self._insert_charge(study_id, request_id, DIRECT_KIND, _above(inc), _above(inc), detail) \
                if inc > 0 else None
            created = utc_now()
            self._db.executemany(
                "INSERT INTO direct_pieces (study_id, request_id, position, role, lo, hi, epsilon, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(study_id, p.request_id, p.position, p.role, p.query.lo[0], p.query.hi[0], float(p.query.epsilon),
                  created) for p in new])
            return _direct_result(contract, request_id, inc, after, charges, charge)

    def claim_direct_decryption(self, study_id: str, request_id: str, lo: int, hi: int, epsilon: float,
                                detail: str = "") -> int:
        with self._lock, self._transaction():
            self._get(study_id)
            pieces = self._direct_pieces(study_id, request_id)
            claimed = {int(r[0]) for r in self._db.execute(
                "SELECT position FROM direct_decryptions WHERE study_id = ? AND request_id = ?",
                (study_id, request_id))}
            position = _unclaimed(pieces, claimed, lo, hi, epsilon)
            self._db.execute(
                "INSERT INTO direct_decryptions (study_id, request_id, position, created_at, detail) "
                "VALUES (?, ?, ?, ?, ?)", (study_id, request_id, position, utc_now(), detail))
            return position

    def direct_pieces(self, study_id: str) -> list[DirectPiece]:
        with self._lock:
            self._get(study_id)
            return self._direct_pieces(study_id)

    def check_consistency(self) -> list[str]:
        """SQLite's own integrity and foreign-key checks, then the budget replay of `LedgerStore`."""
        with self._lock:
            problems = [f"sqlite integrity: {r[0]}" for r in self._db.execute("PRAGMA integrity_check")
                        if r[0] != "ok"]
            problems += [f"sqlite foreign key: {tuple(r)}" for r in self._db.execute("PRAGMA foreign_key_check")]
            try:
                self._verify_chain()
            except LedgerTamperedError as exc:
                problems.append(str(exc))
        return problems + super().check_consistency()



def backup_ledger(source: Path | str, destination: Path | str) -> int:
    """Copy a ledger file consistently while its server runs (SQLite's online backup), then verify the copy.

    Returns the number of charge rows in the copy; raises LedgerTamperedError if its hash
    chain does not verify and InvalidInputError if `source` is not a ledger. The copy is a
    single self-contained file (no WAL) holding contracts and charges, no key material.
    """
    src_path, dst_path = Path(source), Path(destination)
    if not src_path.is_file():
        raise InvalidInputError(f"no ledger at {src_path} (the decryption server's DATA_DIR/ledger.sqlite3)")
    if dst_path.exists():
        raise InvalidInputError(f"{dst_path} exists; choose a new backup file name")
    dst_path.parent.mkdir(parents=True, exist_ok=True)
    src = sqlite3.connect(f"file:{src_path}?mode=ro", uri=True, timeout=30.0)
    dst = sqlite3.connect(dst_path)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return verify_ledger_file(dst_path)


def verify_ledger_file(path: Path | str) -> int:
    """Check a ledger file's (or a backup's) hash chain; the number of charge rows, or LedgerTamperedError."""
    if not Path(path).is_file():
        raise InvalidInputError(f"no ledger file at {path}")
    store = SqliteLedgerStore(path)
    try:
        return store.verify_chain()
    finally:
        store.close()
