"""Transport-neutral logic of the decryption server: contracts, the ledger, and decryption of noised measurements."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from he_partition.backend import ChunkedVector, n_chunks
from he_partition.ckks import CkksBackend
from he_partition.errors import InvalidInputError
from he_partition.measurements import Measurement, PartitionSums, PrefixDifferences
from he_partition.noise import RandomSource
from he_partition.protocol import Budget, DecryptionSide

from ..common.contract import StudyContract, check_id
from ..common.util import new_id
from .keys import KeyMaterial
from .ledger import Charge, LedgerStore

__all__ = ["DecryptionHandler", "BudgetReport", "DecryptedMeasurement", "minimum_sensitivity"]

IntArray = npt.NDArray[np.int64]


def minimum_sensitivity(m: Measurement, contribution_bound: int) -> int:
    """The smallest L1 sensitivity the decryption server accepts for a measurement.

    Under add/remove of one record: adjacent differences move by 2 (x[i] feeds d[i] and
    d[i+1]); disjoint partition sums by 1; unnormalised Haar coefficients by 1 + depth
    (the total and one detail per tree level). All times the contribution bound c. A
    smaller value would under-noise the release, so it is refused; unknown kinds are
    refused too (this server must learn their sensitivity first).
    """
    if m.kind == PrefixDifferences.kind:
        return 2 * contribution_bound
    if m.kind == PartitionSums.kind:
        return contribution_bound
    depth = getattr(m, "depth", None)
    if m.kind == "haar_coefficients" and isinstance(depth, int):
        return (1 + depth) * contribution_bound
    raise InvalidInputError(f"measurement kind {m.kind!r} is not supported by this decryption server")


@dataclass(frozen=True)
class BudgetReport:
    """A study's budget as the ledger sees it."""

    study_id: str
    total: float
    spent: float
    charges: tuple[Charge, ...]

    @property
    def remaining(self) -> float:
        return max(0.0, self.total - self.spent)


@dataclass(frozen=True)
class DecryptedMeasurement:
    """Released integer values of one measurement and the ledger row that paid for them."""

    values: IntArray
    charge: Charge
    epsilon_remaining: float


class _LedgerBudget(Budget):
    """Adapter: `DecryptionSide` charges through `Budget.charge`; this writes the ledger row instead."""

    def __init__(self, ledger: LedgerStore, study_id: str, release_id: str, release_epsilon: float,
                 total: float) -> None:
        super().__init__(total=total)
        self._ledger = ledger
        self._study_id = study_id
        self._release_id = release_id
        self._release_epsilon = release_epsilon
        self.last: Charge | None = None

    def charge(self, what: str, epsilon: float) -> None:
        self.last = self._ledger.charge(self._study_id, self._release_id, what, epsilon, self._release_epsilon)


class DecryptionHandler:
    """The key holder's operations; the gRPC servicer only decodes requests and encodes replies."""

    def __init__(self, ledger: LedgerStore, keys: KeyMaterial, rng: RandomSource) -> None:
        self.ledger = ledger
        self.keys = keys
        self.rng = rng
        self.backend = CkksBackend(keys.secret_context)
        self._decrypt_lock = threading.Lock()

    # -- public key ---------------------------------------------------------------
    @property
    def public_context(self) -> bytes:
        """Serialized public context: public key only (no secret, Galois or relinearization keys)."""
        return self.keys.public_bytes

    @property
    def fingerprint(self) -> str:
        return self.keys.fingerprint

    # -- studies -----------------------------------------------------------------
    def open_study(self, *, study_id: str = "", domain_size: int, epsilon: float, expected_owners: Iterable[str],
                   strategy: str = "", contribution_bound: int = 0, noise_parties: int = 0,
                   strategy_params_json: str = "", domain_spec: str = "") -> tuple[StudyContract, bool]:
        """Create (or idempotently find) a study bound to this server's public key."""
        contract = StudyContract.create(
            study_id=study_id or new_id("study"),
            domain_size=domain_size,
            epsilon=epsilon,
            expected_owners=expected_owners,
            context_fingerprint=self.fingerprint,
            strategy=strategy or "gap",
            contribution_bound=contribution_bound or 1,
            noise_parties=noise_parties or 2,
            strategy_params=strategy_params_json or None,
            domain_spec=domain_spec,
        )
        return self.ledger.create_study(contract)

    def get_study(self, study_id: str) -> StudyContract:
        return self.ledger.get_study(check_id("study_id", study_id))

    # -- decryption -------------------------------------------------------------
    def check_measurement(self, contract: StudyContract, m: Measurement, chunk_count: int) -> None:
        """Refuse a measurement that does not fit the study's terms before reading any ciphertext."""
        if m.domain_size != contract.domain_size:
            raise InvalidInputError(
                f"measurement is for {m.domain_size} bins but study {contract.study_id} has {contract.domain_size}"
            )
        floor = minimum_sensitivity(m, contract.contribution_bound)
        if m.sensitivity < floor:
            raise InvalidInputError(
                f"{m.kind} sensitivity {m.sensitivity} is below {floor} (contribution bound "
                f"{contract.contribution_bound}): its noise would be too small"
            )
        expected = n_chunks(contract.domain_size, self.backend.slots)
        if chunk_count != expected:
            raise InvalidInputError(
                f"a {contract.domain_size}-bin measurement has {expected} ciphertext chunks, header says {chunk_count}"
            )

    def decrypt_measurement(self, *, study_id: str, release_id: str, release_epsilon: float, measurement: Measurement,
                            chunks: Sequence[bytes]) -> DecryptedMeasurement:
        """Charge the ledger, then decrypt, round, decode and add this server's noise.

        Privacy: the ledger row for `measurement.epsilon` is committed (and refused with
        BudgetExhaustedError if it does not fit) before decryption. The decoded values
        are the measurement (sensitivity `measurement.sensitivity` under add/remove of
        one person with at most c records) plus the computation server's discrete
        Laplace draw; with noise_parties == 2 this server adds its own independent draw
        of scale sensitivity/epsilon, which only it knows. Decrypted slots are rounded to
        integers (refused if not near integers: a foreign key or corrupt ciphertext);
        nothing unrounded leaves. The budget is spent even when decoding then fails.
        """
        contract = self.get_study(study_id)
        check_id("release_id", release_id)
        self.check_measurement(contract, measurement, len(chunks))
        vector = ChunkedVector(contract.domain_size, tuple(self.backend.deserialize_chunk(c) for c in chunks))
        budget = _LedgerBudget(self.ledger, study_id, release_id, float(release_epsilon), contract.epsilon)
        side = DecryptionSide(self.backend, self.rng, budget, contract.noise_parties)
        with self._decrypt_lock:
            values = side.decrypt_measurement(measurement, vector)
        assert budget.last is not None  # DecryptionSide charges before it decrypts
        return DecryptedMeasurement(np.asarray(values, dtype=np.int64), budget.last,
                                    max(0.0, contract.epsilon - self.ledger.spent(study_id)))

    def budget(self, study_id: str) -> BudgetReport:
        contract = self.get_study(study_id)
        charges = tuple(self.ledger.charges(study_id))
        return BudgetReport(study_id, contract.epsilon, math.fsum(c.epsilon for c in charges), charges)
