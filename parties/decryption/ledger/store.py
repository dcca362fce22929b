"""The ledger store interface (study contracts + append-only charges) and its in-memory implementation."""

from __future__ import annotations

import abc
import math
import threading
from collections.abc import Sequence
from dataclasses import replace

from he_partition.core.accounting import RangeQuery
from he_partition.core.errors import BudgetExhaustedError, InvalidInputError

from ...common.contract import StudyContract, check_id
from ...common.errors import AlreadyExistsError, NotFoundError
from ...common.util import utc_now
from .budget import DIRECT_KIND, Charge, _above, budget, check_charge
from .direct import (
    DirectCharge,
    DirectPiece,
    _direct_result,
    _pieces_of,
    _price_direct,
    _unclaimed,
    direct_increment,
)

__all__ = ["LedgerStore", "MemoryLedgerStore"]


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
               detail: str = "", *, reserve: bool = True) -> Charge:
        """Check (`check_charge`, `reserve` as there) and append one charge atomically; durable when it returns.

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

    def unclaimed_direct(self, study_id: str) -> int:
        """How many paid direct range counts of the study were not decrypted yet (each is decrypted once)."""
        raise NotImplementedError

    def spent(self, study_id: str) -> float:
        """Epsilon the study's charges add up to (exact sum, as a float)."""
        return float(budget(0.0, self.charges(study_id)).spent)

    def reserved(self, study_id: str) -> float:
        """Epsilon held by started releases (see `budget`); >= `spent`."""
        return float(budget(0.0, self.charges(study_id)).reserved)

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
               detail: str = "", *, reserve: bool = True) -> Charge:
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
            booked = check_charge(contract.epsilon, mine, release_id, float(epsilon), float(release_epsilon),
                                  reserve=reserve)
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

    def unclaimed_direct(self, study_id: str) -> int:
        self.get_study(study_id)
        with self._lock:
            paid = sum(p.role == "count" for p in self._direct.get(study_id, []))
            return paid - sum(len(v) for (s, _), v in self._claimed.items() if s == study_id)


