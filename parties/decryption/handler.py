"""Transport-neutral logic of the decryption server: contracts, the ledger, and decryption of noised measurements."""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from he_partition.backend import ChunkedVector, n_chunks
from he_partition.ckks import CkksBackend
from he_partition.errors import InvalidInputError
from he_partition.measurements import Measurement, PartitionSums, PrefixDifferences
from he_partition.noise import RandomSource
from he_partition.protocol import EPSILON_TOLERANCE, Budget, DecryptionSide

from ..common.contract import StudyContract, canonical_json, check_id
from ..common.errors import FailedPreconditionError
from ..common.signing import stream_digest
from ..common.util import new_id
from .keys import KeyMaterial
from .ledger import Charge, LedgerStore, check_charge, reserved_epsilon

__all__ = ["DecryptionHandler", "BudgetReport", "DecryptedMeasurement", "minimum_sensitivity", "STRATEGY_KINDS"]

IntArray = npt.NDArray[np.int64]


#: The measurement kinds each strategy of he_partition asks for. The decryption server
#: decrypts only these for a study (a strategy missing here gets nothing decrypted: add it
#: once its measurements are known). The core does not export this map yet.
STRATEGY_KINDS: dict[str, frozenset[str]] = {
    "gap": frozenset({"prefix_differences", "partition_sums"}),
    "hier": frozenset({"partition_sums"}),
    "auto": frozenset({"partition_sums"}),
    "dawa": frozenset({"partition_sums"}),
    "privelet": frozenset({"haar_coefficients"}),
}


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
    """A study's budget as the ledger sees it.

    `reserved`: epsilon held by the releases that started (each one's declared epsilon,
    kept even if it failed part way); a new release must fit in `total - reserved`.
    `remaining` is what has not been spent yet (`total - spent`).
    """

    study_id: str
    total: float
    spent: float
    charges: tuple[Charge, ...]
    reserved: float = 0.0

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
                 total: float, detail: str = "") -> None:
        super().__init__(total=total)
        self._ledger = ledger
        self._study_id = study_id
        self._release_id = release_id
        self._release_epsilon = release_epsilon
        self._detail = detail
        self.last: Charge | None = None

    def charge(self, what: str, epsilon: float) -> None:
        self.last = self._ledger.charge(self._study_id, self._release_id, what, epsilon, self._release_epsilon,
                                        self._detail)


class DecryptionHandler:
    """The key holder's operations; the gRPC servicer only decodes requests and encodes replies.

    `require_signed` (set when the server runs with mutual TLS): studies must list every
    owner's signing key, so the computation server can refuse unsigned submissions.
    """

    def __init__(self, ledger: LedgerStore, keys: KeyMaterial, rng: RandomSource, *,
                 require_signed: bool = False) -> None:
        self.ledger = ledger
        self.require_signed = require_signed
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
                   strategy_params_json: str = "", domain_spec: str = "",
                   owner_keys: Mapping[str, str] | None = None) -> tuple[StudyContract, bool]:
        """Create (or idempotently find) a study bound to this server's public key (and the owners' signing keys)."""
        if self.require_signed and not owner_keys:
            raise InvalidInputError(
                "owner_keys is empty: every expected owner's Ed25519 public key must be part of the study so that "
                "uploads can be verified (owners print theirs with `dpagg keygen`; pass --owner-key ID=HEX). Only "
                "a server run with --insecure accepts unsigned studies"
            )
        contract = StudyContract.create(
            study_id=study_id or new_id("study"),
            domain_size=domain_size,
            epsilon=epsilon,
            expected_owners=expected_owners,
            context_fingerprint=self.fingerprint,
            strategy=strategy or "auto",
            contribution_bound=contribution_bound or 1,
            noise_parties=noise_parties or 2,
            strategy_params=strategy_params_json or None,
            domain_spec=domain_spec,
            owner_keys=owner_keys,
        )
        return self.ledger.create_study(contract)

    def get_study(self, study_id: str) -> StudyContract:
        return self.ledger.get_study(check_id("study_id", study_id))

    # -- decryption -------------------------------------------------------------
    def check_measurement(self, contract: StudyContract, m: Measurement, chunk_count: int, *, contract_hash: str,
                          release_id: str, release_epsilon: float) -> None:
        """Refuse a measurement that does not fit the study's contract, before any ciphertext is read.

        Checked, in order: the sender's contract hash equals the study's (so both servers
        hold the same terms: noise parties, bound, owners, budget); the domain size; the
        kind is one the study's strategy uses; the sensitivity is at least the kind's
        minimum times the contribution bound; the release's epsilon is within the
        study's total; the charge fits the budget left (a dry run: the real check-and-
        charge is atomic in the ledger); one ciphertext chunk per `slots` bins.
        """
        if not contract_hash:
            raise InvalidInputError(
                "contract_hash is required: send the hash of the study contract the measurement was computed under"
            )
        if contract_hash != contract.contract_hash:
            raise FailedPreconditionError(
                f"contract_hash {contract_hash[:16]} does not match study {contract.study_id}'s contract "
                f"{contract.contract_hash[:16]}: the computation server works on other terms; nothing was decrypted"
            )
        if m.domain_size != contract.domain_size:
            raise InvalidInputError(
                f"measurement.domain_size {m.domain_size} differs from study {contract.study_id}'s domain size "
                f"{contract.domain_size}"
            )
        allowed = STRATEGY_KINDS.get(contract.strategy, frozenset())
        if m.kind not in allowed:
            raise FailedPreconditionError(
                f"measurement.kind {m.kind!r} is not used by study {contract.study_id}'s strategy "
                f"{contract.strategy!r} (it measures only {', '.join(sorted(allowed)) or 'nothing this server knows'}); "
                "nothing was decrypted"
            )
        floor = minimum_sensitivity(m, contract.contribution_bound)
        if m.sensitivity < floor:
            raise InvalidInputError(
                f"measurement.sensitivity: {m.kind} sensitivity {m.sensitivity} is below {floor} (contribution bound "
                f"{contract.contribution_bound}): its noise would be too small"
            )
        if not (math.isfinite(release_epsilon) and 0 < release_epsilon <= contract.epsilon * (1 + EPSILON_TOLERANCE)):
            raise InvalidInputError(
                f"release_epsilon {release_epsilon:g} must be > 0 and at most study {contract.study_id}'s total "
                f"epsilon {contract.epsilon:g}"
            )
        check_charge(contract.epsilon, self.ledger.charges(contract.study_id), release_id, float(m.epsilon),
                     float(release_epsilon))
        expected = n_chunks(contract.domain_size, self.backend.slots)
        if chunk_count != expected:
            raise InvalidInputError(
                f"chunk_count: a {contract.domain_size}-bin measurement has {expected} ciphertext chunks of "
                f"{self.backend.slots} slots, header says {chunk_count}"
            )

    def decrypt_measurement(self, *, study_id: str, release_id: str, release_epsilon: float, measurement: Measurement,
                            chunks: Sequence[bytes], contract_hash: str) -> DecryptedMeasurement:
        """Charge the ledger, then decrypt, round, decode and add this server's noise.

        Privacy: the ledger row for `measurement.epsilon` is committed (and refused with
        BudgetExhaustedError if it does not fit) before decryption. The decoded values
        are the measurement (sensitivity `measurement.sensitivity` under add/remove of
        one person with at most c records) plus the computation server's discrete
        Laplace draw; with noise_parties == 2 this server adds its own independent draw
        of scale sensitivity/epsilon, which only it knows. Decrypted slots are rounded to
        integers (refused if not near integers: a foreign key or corrupt ciphertext);
        nothing unrounded leaves. The budget is spent even when decoding then fails. The
        ledger row also records what it paid for (`decryption_detail`).
        """
        contract = self.get_study(study_id)
        check_id("release_id", release_id)
        self.check_measurement(contract, measurement, len(chunks), contract_hash=contract_hash,
                               release_id=release_id, release_epsilon=float(release_epsilon))
        vector = ChunkedVector(contract.domain_size, tuple(self.backend.deserialize_chunk(c) for c in chunks))
        budget = _LedgerBudget(self.ledger, study_id, release_id, float(release_epsilon), contract.epsilon,
                               decryption_detail(contract, measurement, chunks))
        side = DecryptionSide(self.backend, self.rng, budget, contract.noise_parties)
        with self._decrypt_lock:
            values = side.decrypt_measurement(measurement, vector)
        assert budget.last is not None  # DecryptionSide charges before it decrypts
        return DecryptedMeasurement(np.asarray(values, dtype=np.int64), budget.last,
                                    max(0.0, contract.epsilon - self.ledger.spent(study_id)))

    def budget(self, study_id: str) -> BudgetReport:
        contract = self.get_study(check_id("study_id", study_id))
        charges = tuple(self.ledger.charges(study_id))
        spent = math.fsum(c.epsilon for c in charges)
        return BudgetReport(study_id, contract.epsilon, spent, charges, max(spent, reserved_epsilon(list(charges))))


def decryption_detail(contract: StudyContract, m: Measurement, chunks: Sequence[bytes]) -> str:
    """What one ledger row pays for: contract hash, SHA-256 of the measurement spec and of the ciphertext stream.

    Kept small (hashes, not the ciphertexts or partition starts), so every decryption is
    recorded and can later be matched with the computation server's records.
    """
    spec = hashlib.sha256(canonical_json(m.to_dict()).encode("utf-8")).hexdigest()
    return canonical_json({"contract_hash": contract.contract_hash, "measurement_sha256": spec,
                           "ciphertext_digest": stream_digest(chunks).hex(), "values": int(m.count),
                           "sensitivity": int(m.sensitivity)})
