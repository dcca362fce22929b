"""Transport-neutral logic of the decryption server: contracts, the ledger, and decryption of noised measurements.

Size: over 500 lines on purpose: every path by which a value leaves the key holder (a release's
measurement, a direct range count, a join table) is here, next to the one rule they share (the
keyed draw before any data-dependent check), so a reviewer reads the whole boundary in one file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import os
import threading
import time
from contextlib import ExitStack, nullcontext
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from he_partition.core.accounting import exact_decimal
from he_partition.core.backend import ChunkedVector, n_chunks
from he_partition.he.bfv import BfvBackend, context_fingerprint
from he_partition.join import oprf
from he_partition.join.protocol import JOIN_STRATEGY
from he_partition.join.release import decrypt_values
from he_partition.he.join_scheme import MIN_NOISE_BUDGET_BITS as JOIN_MIN_BUDGET
from he_partition.he.join_scheme import JoinParams, JoinScheme
from he_partition.core.errors import DPAggError, InvalidInputError, PrecisionError, WorkerLostError
from he_partition.core.measurements import Measurement, PartitionSums, RangeCount, range_count_batch
from he_partition.core.noise import KeyedRandom, RandomSource
from he_partition.protocol import EPSILON_TOLERANCE, STRATEGY_MEASUREMENT_KINDS, Budget, DecryptionSide

from ..common.approval import ApprovalBook, StudyApproval
from ..common.contract import StudyContract, canonical_json, charged_epsilon, check_id, join_terms_of
from ..common.contract import scaled_charge as _scaled
from ..common.convert import measurement_json
from ..common.errors import FailedPreconditionError, NotFoundError, PermissionDeniedError
from ..common.signing import stream_digest
from ..common.util import new_id
from .client import JoinCellsResult
from ..common.sealing import Commitment, SealKeyPair
from .arrivals import ArrivalLog
from .commitments import CommitmentBook
from .join_checks import JoinCheckBook
from .keys import KeyMaterial, StudyKeyStore, load_or_create_join_keys
from .study_keys import KeyRef, StudyKeys
from .oprf import PAGE_ELEMENTS, EvaluationLog
from .keyshare.uploads import OwnerC1Parts, UploadC1Book
from .refusals import (FAILED_JOIN_CHECK, MAX_REFUSALS_PER_KEY, MAX_REFUSALS_PER_STUDY, RefusalGate,
                       refusal_after_charge)
from .workers import ChunkPipeline, DecryptPool, FloodedDecryption, PipelinedDecryption
from .ledger import Charge, DirectCharge, LedgerStore, available, check_charge, exact_reserved, exact_sum

__all__ = ["DecryptionHandler", "BudgetReport", "DecryptedMeasurement", "MAX_DIRECT_RANGES"]

log = logging.getLogger("dpagg.decryption")

#: The ledger row (release id) that books a join study's padding epsilon.
JOIN_PADDING_CHARGE = "join-padding"
#: The KeyedRandom stream of this server's draw for a measurement it has not answered before
#: (2: AES-256-CTR, `he_partition.core.noise.KeyedRandom`). Its ledger row records the stream
#: ("noise_stream"); a repeat of a request answered before under stream 1 (a row without the
#: field, from an older ledger) keeps stream 1, so a replay still gets that answer's draw.
NOISE_STREAM = 2


IntArray = npt.NDArray[np.int64]


#: Most ranges one direct-query batch may pay for (bounds the accounting work per call).
MAX_DIRECT_RANGES = 10_000

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
    chain_problem: str = ""
    available: float = 0.0

    @property
    def remaining(self) -> float:
        return max(0.0, self.total - self.spent)


@dataclass(frozen=True)
class DecryptedMeasurement:
    """Released integer values of one measurement and the ledger row that paid for them."""

    values: IntArray
    #: The ledger row that paid; for a direct range count, its batch's row (None when the
    #: batch fell on ground already paid for and no row was written).
    charge: Charge | None
    epsilon_remaining: float


class _LedgerBudget(Budget):
    """Adapter: `DecryptionSide` charges through `Budget.charge`; this writes the ledger row instead.

    `multiplier` converts the DP epsilon a measurement is calibrated at into the study's
    units: 1 for a plain DP study, 1 + L for a study with correlated records (the row's
    epsilon is then the Bayesian-DP charge, see `charged_epsilon`). DecryptionSide keeps
    charging `m.epsilon`; only this adapter scales it.
    """

    def __init__(self, ledger: LedgerStore, study_id: str, release_id: str, release_epsilon: float,
                 total: float, detail: str = "", multiplier: float = 1.0) -> None:
        super().__init__(total=total)
        self._ledger = ledger
        self._study_id = study_id
        self._release_id = release_id
        self._release_epsilon = release_epsilon
        self._detail = detail
        self._multiplier = multiplier
        self.last: Charge | None = None
        self.charged = False

    def charge(self, what: str, epsilon: float) -> None:
        """Write the ledger row for one measurement: `epsilon` times the noise multiplier.

        Privacy: spends epsilon x (1 + L) of the study's budget (L = 0: plain DP; otherwise
        the Bayesian-DP charge, seed 003) for a measurement whose sensitivity covers one
        person's c records (neighbouring relation: add/remove of one person). No noise is
        drawn here, so nobody knows noise from it.
        """
        self.last = self._ledger.charge(self._study_id, self._release_id, what,
                                        _scaled(epsilon, self._multiplier, self._release_epsilon),
                                        self._release_epsilon, self._detail)
        self.charged = True


class _AnsweredBefore(Budget):
    """Adapter for a request this ledger already charged: the same release, contract, measurement and ciphertext
    bytes (the row's detail is identical, noise stream included). It is answered again with the same draw, so its
    values are those of the first answer: nothing new is learned, and nothing is charged again. This is what lets
    a release ride out a key holder that charged, then died before its reply arrived (the computation server
    re-sends the very same bytes)."""

    def __init__(self, prior: Charge) -> None:
        super().__init__(total=math.inf)
        self.last: Charge | None = prior
        self.charged = False

    def charge(self, what: str, epsilon: float) -> None:
        """Spends no epsilon: the first answer's row (`last`) paid `epsilon` for these very values, at the
        measurement's sensitivity under add/remove of one person (the neighbouring relation). The answer is the
        same decryption plus the same keyed draw, which only this key holder knows, so nothing new is released."""
        self.charged = True


class _DirectClaim(Budget):
    """Adapter for direct range counts: paid in advance by `charge_direct_queries`; `charge`
    claims one paid range (once) instead of spending again."""

    def __init__(self, ledger: LedgerStore, study_id: str, request_id: str, m: RangeCount, detail: str) -> None:
        super().__init__(total=math.inf)
        self._ledger, self._study_id, self._request_id, self._m, self._detail = ledger, study_id, request_id, m, detail
        self.charged = False

    def charge(self, what: str, epsilon: float) -> None:
        """Claim the paid range once instead of spending again.

        Privacy: spends no epsilon here: the range's epsilon (sensitivity c, neighbouring
        relation add/remove of one person with at most c records) was charged by
        `charge_direct_queries`; a second claim is refused. No noise is drawn, so nobody
        knows noise from it.
        """
        self._ledger.claim_direct_decryption(self._study_id, self._request_id, self._m.lo, self._m.hi,
                                             self._m.epsilon, self._detail)
        self.charged = True


class DecryptionHandler:
    """The key holder's operations; the gRPC servicer only decodes requests and encodes replies.

    `require_signed` (set when the server runs with mutual TLS): studies must list every
    owner's signing key, so the computation server can refuse unsigned submissions.
    """

    def __init__(self, ledger: LedgerStore, keys: KeyMaterial, rng: RandomSource, *,
                 require_signed: bool = False, join_keys_dir: Path | None = None,
                 noise_key: bytes | None = None, arrivals: ArrivalLog | None = None,
                 decrypt_pool: DecryptPool | None = None, seal_key: SealKeyPair | None = None,
                 commitments_dir: Path | None = None, c1_dir: Path | None = None,
                 key_holders: int = 1, oprf_key: bytes | None = None,
                 evaluations: EvaluationLog | None = None, approvals: ApprovalBook | None = None,
                 refusal_cap: int = MAX_REFUSALS_PER_STUDY, key_refusal_cap: int = MAX_REFUSALS_PER_KEY,
                 study_keys: StudyKeyStore | None = None) -> None:
        self.ledger = ledger
        # The operator approval keys this holder pins and the approval it accepted for each study
        # (parties.common.approval): with pins, only studies the operator signed are opened or served.
        self.approvals = approvals if approvals is not None else ApprovalBook(())
        # The master secret of the join studies' OPRF keys (parties.decryption.oprf; never served) and the book of
        # the evaluations answered (each owner's quota). Without one (in-memory servers), a fresh one from the OS
        # (not from `rng`: a seeded server's draws stay what they were).
        self._oprf_key = oprf_key if oprf_key is not None else os.urandom(32)
        self.evaluations = evaluations if evaluations is not None else EvaluationLog()
        # The single key holder's X25519 seal key (owners seal their upload keys to it; None: studies are not
        # sealed) and its record of each sealed study's closed commitments.
        self.seal_key = seal_key
        self.commitments = CommitmentBook(seal_key, 0, 1, commitments_dir) if seal_key is not None else None
        # K: 1 for the single decryption server, the number of key-share holders at a holder. A study's
        # noise_tolerates must be below it (StudyContract.check_key_holders); unset, it is K - 1.
        self.key_holders = key_holders
        #: The noise_tolerates this holder fills in when the operator approved none (K - 1; t - 1 at a t-of-N holder).
        self.max_noise_tolerates = key_holders - 1
        #: The seal_threshold this holder writes into a new sealed study's contract: t at a holder of a t-of-N
        #: deployment (the owners split their upload keys t-of-N), 0 elsewhere (XOR across every holder).
        self.seal_threshold = 0
        # Local worker processes for a measurement's per-chunk decryption (parties.decryption.workers).
        self.decrypt_pool = decrypt_pool
        self.require_signed = require_signed
        self.keys = keys
        self.rng = rng
        # The secret that fixes this server's draw per request (`_request_noise`); without one
        # (tests, in-memory servers) it comes from `rng`, so a seeded server stays reproducible.
        self._noise_key = noise_key if noise_key is not None else b"".join(
            int(v).to_bytes(8, "big") for v in rng.integers(1 << 62, 4))
        self.arrivals = arrivals if arrivals is not None else ArrivalLog()
        # The key of this server's own flood on every chunk before its integrity check and decode
        # (`BfvBackend.holder_flooded`): derived from the noise key, handed to the local workers only.
        self._flood_key = hmac.new(self._noise_key, b"dpagg/holder-flood-key/v1", hashlib.sha256).digest()
        # Refusals after the charge, capped per study and per key (parties.decryption.refusals).
        self._study_keys: dict[str, str] = {}
        self.refusals = RefusalGate(self.arrivals, self._key_of, per_study=refusal_cap, per_key=key_refusal_cap)
        self.backend = BfvBackend(keys.secret_context)
        #: The key each study's contract names (a key per study, `study_keys`: each new study gets a fresh key
        #: from that store; None: key-share holders, in-memory tests, where every study is on `keys`). A study
        #: whose contract names `keys` (one opened before keys were per study) keeps it either way.
        self.keyring = StudyKeys(keys, self.backend, study_keys, self.join_scheme)
        #: The owners' signed c1 parts of each signed study, summed per chunk (kept under `c1_dir` across
        #: restarts): the only c1 this server decrypts a signed study's measurements with. It keeps public c1
        #: values per study and reads only the parameters (moduli, degree) of the context, which every key shares.
        self.uploads = UploadC1Book(keys.secret_context, c1_dir)
        self._decrypt_lock = threading.Lock()
        self._join_dir = join_keys_dir
        self._join: dict[int, JoinScheme] = {}
        self._join_lock = threading.Lock()
        #: Each join study's well-formedness check: this server's seed and each owner's outcome (join_checks).
        self.join_checks = JoinCheckBook()

    def close_uploads(self, study_id: str, contract_hash: str, commitments: list[Commitment]) -> list[bytes]:
        """Close a sealed study's uploads on `commitments` (`CommitmentBook.close`): the owners' upload keys."""
        contract = self.get_study(study_id)
        _check_contract_hash(contract, contract_hash, "nothing was closed")
        if self.commitments is None:
            raise FailedPreconditionError("this decryption server has no seal key: it closes no uploads")
        return self.commitments.close(contract, commitments)

    # -- join key -----------------------------------------------------------------
    def join_scheme(self, version: int = 1) -> JoinScheme:
        """The join key pair of scheme `version` (docs/join.md), created with the first join study of that version
        and kept next to the release key (one pair per version: a study keeps the version its contract names)."""
        with self._join_lock:
            if version not in self._join:
                if self._join_dir is None:  # an in-memory server (tests): the key lives as long as it
                    self._join[version] = JoinScheme.generate(JoinParams.for_version(version))
                else:
                    self._join[version] = load_or_create_join_keys(self._join_dir, version)
            return self._join[version]

    def public_key_for(self, study_id: str = "") -> tuple[bytes, str]:
        """(public key bytes, fingerprint): a study's key (its own, or the server key a study opened before keys
        were per study names), a join study's join key, or, without a study, the server key."""
        contract = self.get_study(study_id) if study_id else None
        if contract is not None and contract.is_join:
            data = self.join_scheme_for(contract).public_bytes()
            return data, contract.context_fingerprint
        if contract is not None:
            key = self.study_key(contract)
            return key.public_bytes, key.fingerprint
        return self.public_context, self.fingerprint

    # -- a key per study ----------------------------------------------------------
    @property
    def study_keys(self) -> StudyKeyStore | None:
        """The store of the studies' own keys (None: every study on the server key `keys`)."""
        return self.keyring.store

    @study_keys.setter
    def study_keys(self, store: StudyKeyStore | None) -> None:
        self.keyring.store = store

    def study_key(self, contract: StudyContract) -> KeyMaterial:
        """The key `contract` names (`StudyKeys.entry`): the study's own, or the server key `keys` (studies opened
        before keys were per study). FailedPreconditionError (nothing decrypted) when it was erased (the study
        ended), is missing or is another key; no other key is ever tried."""
        return self.keyring.entry(contract)[0]

    def backend_for(self, contract: StudyContract) -> BfvBackend:
        """The secret-key backend of `contract`'s key (`study_key`): the only one its chunks are checked and
        decrypted with."""
        return self.keyring.entry(contract)[1]

    def join_scheme_for(self, contract: StudyContract) -> JoinScheme:
        """The join key `contract` names (`StudyKeys.join`): the join study's own, or the key holder's join key of
        its scheme version (`join_scheme`: join studies opened before join keys were per study)."""
        return self.keyring.join(contract)

    def _worker_key(self, contract: StudyContract | None) -> KeyRef:
        return self.keyring.worker_key(contract)

    def end_if_spent(self, study_id: str) -> bool:
        """Erase the study's own key once the study has ended; True when it was erased now.

        A study ends when nothing more of it can be decrypted: its budget is spent to the last
        epsilon (no new charge fits) and every direct range count it paid for has been decrypted.
        Called after a measurement was answered or refused after its charge, so a server that stops
        between the last charge and its answer keeps the key until the computation server's re-send
        of that request (`_AnsweredBefore`) is answered. A repeat after that is refused (its values
        were returned once). The server key and the shared join keys (studies opened before keys
        were per study) are never erased here: other studies share them.
        """
        contract = self.get_study(study_id)
        if self.study_keys is None or contract.context_fingerprint == self.fingerprint:
            return False
        spent = exact_sum(c.epsilon for c in self.ledger.charges(study_id))
        if spent < exact_decimal(contract.epsilon) or self.ledger.unclaimed_direct(study_id) > 0:
            return False
        erased = self.keyring.erase(contract, f"its budget of epsilon {contract.epsilon:g} is spent")
        if erased:
            log.info("study %s ended (budget spent): its key is erased", study_id)
        return erased

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
                   owner_keys: Mapping[str, str] | None = None, correlation_leakage: float = 0.0,
                   correlation_source: str = "", max_organizations: int = 0,
                   holder_seal_keys: Sequence[str] = (),
                   noise_tolerates: int | None = None, key_fingerprint: str = "",
                   approval: StudyApproval | None = None) -> tuple[StudyContract, bool]:
        """Create (or idempotently find) a study bound to this server's public key (and the owners' signing keys).

        `key_fingerprint`: the key the study is opened under when not this server's (a key-share
        holder's own key for the study, `keyshare.service.KeyShareService.open_study`).
        `approval`: the operator's signature on these terms (parties.common.approval). A holder that pins
        approval keys refuses (PermissionDeniedError, nothing stored) a study without one, signed by a key it
        does not pin, or asking for other terms than the signed ones; the approval is kept with the study, and
        opening an existing study again with one approves it.

        `correlation_leakage` L > 0 makes `epsilon` a Bayesian-DP budget for correlated
        records (see StudyContract): every measurement then costs 1 + L times its DP epsilon.
        `noise_tolerates` T: None means K - 1 (`key_holders` - 1: 0 at the single decryption
        server); T >= K is refused (InvalidInputError naming noise_tolerates and K).
        """
        self.check_approval(approval, study_id=study_id, domain_size=domain_size, epsilon=epsilon,
                            expected_owners=list(expected_owners), strategy=strategy,
                            contribution_bound=contribution_bound, noise_parties=noise_parties,
                            strategy_params_json=strategy_params_json, domain_spec=domain_spec,
                            owner_keys=owner_keys, correlation_leakage=correlation_leakage,
                            correlation_source=correlation_source, max_organizations=max_organizations,
                            noise_tolerates=noise_tolerates)
        if self.require_signed and not owner_keys:
            raise InvalidInputError(
                "owner_keys is empty: every expected owner's Ed25519 public key must be part of the study so that "
                "uploads can be verified (owners print theirs with `dpagg keygen`; pass --owner-key ID=HEX). Only "
                "a server run with --insecure accepts unsigned studies"
            )
        join = strategy == JOIN_STRATEGY
        if join and not owner_keys:
            # Also on an --insecure server: without the owners' keys their X25519 join keys travel unauthenticated
            # through the computation server, which could substitute its own and learn the pseudonym key.
            raise InvalidInputError(
                "a join study must be signed: owner_keys is empty, so the owners could not tell each other's X25519 "
                "join key from one the computation server made up. Pass both owners' Ed25519 public keys "
                "(dpagg open-join --owner-keys-dir DIR or --owner-key ID=HEX), also on an --insecure server")
        if join:
            strategy_params_json = _oblivious_join_params(strategy_params_json)
        study_id = study_id or new_id("study")
        # A join's terms are checked before its key version is looked up, so bad terms never create a key.
        version = join_terms_of(strategy_params_json, domain_size).version if join else None
        # A study that exists keeps the key its contract names (an idempotent re-open compares the same terms); a
        # new one gets a fresh key (`keep` writes it once its terms are accepted below) when there is a key store.
        existing = self._existing_study(check_id("study_id", study_id)) if self.study_keys is not None else None
        fresh = self.keyring.fresh(study_id, version) if existing is None else None
        if existing is not None:
            fingerprint = existing.context_fingerprint
        elif fresh is not None:
            fingerprint, keep = fresh
        elif key_fingerprint:  # a key-share holder names the key it built for the study (a join's too)
            fingerprint = key_fingerprint
        else:
            fingerprint = (context_fingerprint(self.join_scheme(version).public_bytes()) if version is not None
                           else self.fingerprint)
        if not holder_seal_keys and self.seal_key is not None and owner_keys and not join:
            holder_seal_keys = (self.seal_key.public_hex,)  # the single key holder seals to itself
        contract = StudyContract.create(
            study_id=study_id,
            domain_size=domain_size,
            epsilon=epsilon,
            expected_owners=expected_owners,
            context_fingerprint=fingerprint,
            strategy=strategy or "auto",
            contribution_bound=contribution_bound or 1,
            noise_parties=noise_parties or 2,
            strategy_params=strategy_params_json or None,
            domain_spec=domain_spec,
            owner_keys=owner_keys,
            correlation_leakage=correlation_leakage,
            correlation_source=correlation_source,
            max_organizations=max_organizations or 1,
            # a join at key-share holders pins their seal keys: its shared OPRF key's form (parties.decryption.keyshare)
            holder_seal_keys=() if join and self.key_holders == 1 else tuple(holder_seal_keys),
            noise_tolerates=self.key_holders - 1 if noise_tolerates is None else noise_tolerates,
            seal_threshold=self._seal_threshold(study_id, bool(holder_seal_keys) and (not join or self.key_holders > 1)),
        )
        contract.check_key_holders(self.key_holders)
        if contract.sealed and self.commitments is not None:
            # the seal keys are the relay's to fill in (the approval does not cover them): this holder's own must be
            # at its place, or owners would seal their upload keys to whoever the relay named
            self.commitments.check_contract(contract)
        if join and contract.join_terms().padding_epsilon >= contract.epsilon:
            raise InvalidInputError(f"the join's padding epsilon {contract.join_terms().padding_epsilon:g} must be "
                                    f"below the study's epsilon {contract.epsilon:g} (the release spends the rest)")
        if fresh is None:
            created, existed = self.ledger.create_study(contract)
        else:
            with self.keyring.open_lock:  # one key per study id, even when two opens of a new id race
                if self._existing_study(contract.study_id) is None:
                    keep()
                created, existed = self.ledger.create_study(contract)
        if approval is not None and self.approvals.enforced:
            self.approvals.keep(created.study_id, approval)
        if join:
            self._charge_join_padding(created)
        return created, existed

    def check_approval(self, approval: StudyApproval | None, **requested: Any) -> None:
        """Refuse (PermissionDeniedError) open-study terms that no approval key this holder pins signed exactly
        (parties.common.approval); nothing when it pins none (an insecure test server)."""
        if not self.approvals.enforced:
            return
        if approval is None:
            raise PermissionDeniedError(
                "the study carries no operator approval: this key holder opens only studies signed by an "
                "approval key it pins (dpagg open-study ... --approval-key FILE); the study was not opened")
        approval.check_request(self.approvals.pinned, requested, default_tolerates=self.max_noise_tolerates)

    def _seal_threshold(self, study_id: str, sealed: bool) -> int:
        """The seal_threshold of a sealed study opened here: this holder's own (never the relay's), except that a
        study opened before keeps the split its owners sealed to."""
        if not sealed or not self.seal_threshold:
            return 0
        prior = self._existing_study(study_id)
        return self.seal_threshold if prior is None else prior.seal_threshold

    def _existing_study(self, study_id: str) -> StudyContract | None:
        try:
            return self.ledger.get_study(study_id)
        except NotFoundError:
            return None

    def _charge_join_padding(self, contract: StudyContract) -> None:
        """Book the padding epsilon of a join study once, when it opens.

        Privacy: the computation server sees |A ∩ B| + D, |A| + D + P_A and |B| + D + P_B, three
        discrete Laplace draws of scale 3/padding_epsilon (plus an offset) that only the owners
        know (he_partition.join.protocol.dummy_count, private_dummies); sensitivity 1 under the
        neighbouring relation add/remove of one shared customer. That view is
        padding_epsilon-DP (delta: padding_delta, at most 1e-6), so the study's budget pays it first.
        """
        if any(c.release_id == JOIN_PADDING_CHARGE for c in self.ledger.charges(contract.study_id)):
            return
        eps = contract.join_terms().padding_epsilon
        self.ledger.charge(contract.study_id, JOIN_PADDING_CHARGE, "join_padding", eps, eps,
                           canonical_json({"contract_hash": contract.contract_hash, "padding_epsilon": eps}))

    def evaluate_pseudonyms(self, *, study_id: str, owner_id: str, contract_hash: str, page: int,
                            elements: Sequence[bytes]) -> tuple[list[bytes], int, int]:
        """Evaluate one page of an owner's blinded identifiers under the study's OPRF key: (k B_i for each B_i,
        elements answered to this owner in the study so far, its quota).

        Refused (nothing evaluated): a study that is no join with oblivious pseudonyms, an owner the contract
        does not list, another contract hash, a page of more than PAGE_ELEMENTS or of invalid elements
        (INVALID_ARGUMENT), a page index answered before with other elements (FAILED_PRECONDITION), a page that
        takes the owner past its quota (RESOURCE_EXHAUSTED naming the quota). Every page answered is logged
        with the study (`EvaluationLog`); the identifiers stay hidden: each element is uniformly random."""
        contract = self.get_study(study_id)
        _check_contract_hash(contract, contract_hash, "nothing was evaluated")
        if not contract.is_join:
            raise FailedPreconditionError(f"study {study_id} is no join study: it has no pseudonyms to evaluate")
        terms = contract.join_terms()
        if not terms.oblivious:
            raise FailedPreconditionError(f"join study {study_id}'s pseudonyms are not oblivious (its contract "
                                          "predates them): its owners compute them alone; nothing was evaluated")
        if owner_id not in contract.expected_owners:
            raise FailedPreconditionError(f"owner {owner_id!r} is not one of join study {study_id}'s owners")
        if not 0 < len(elements) <= PAGE_ELEMENTS:
            raise InvalidInputError(f"a page holds 1 to {PAGE_ELEMENTS} blinded elements, got {len(elements)}")
        if any(len(e) != oprf.ELEMENT_BYTES for e in elements):
            raise InvalidInputError(f"every blinded element is {oprf.ELEMENT_BYTES} bytes (Curve25519 u-coordinates)")
        quota = terms.evaluation_quota(contract.expected_owners.index(owner_id))
        key = oprf.study_key(self._oprf_key, study_id, contract.contract_hash)
        # A big page is checked and evaluated in this server's own OPRF worker processes (oprf.OprfPool: local,
        # spawned by this process; the key reaches them through their pipes only), a small one here.
        oprf.check_elements(elements)  # invalid encodings are refused before anything is booked
        used = self.evaluations.admit(study_id, owner_id, int(page), len(elements),
                                      hashlib.sha256(b"".join(elements)).hexdigest(), quota)
        evaluated = oprf.blind_evaluate(key, elements)  # only for a page within the quota
        log.info("study %s: evaluated page %d of owner %s (%d elements; %d of its quota %d)", study_id, page,
                 owner_id, len(elements), used, quota)
        return evaluated, used, quota

    def join_check_seed(self, *, study_id: str, contract_hash: str) -> tuple[bytes, int]:
        """(seed, rounds) of a join study's well-formedness check: chosen here, once per study (join_checks)."""
        contract = self.get_study(study_id)
        _check_contract_hash(contract, contract_hash, "no seed was issued")
        return self.join_checks.seed(study_id, self.join_scheme_for(contract))

    def check_join_upload(self, *, study_id: str, contract_hash: str, owner_id: str, seed: bytes,
                          residues: Sequence[bytes]) -> bool:
        """Decrypt one owner's blinded check residues and record whether its upload is well formed.

        Privacy: an honest owner's residues are 0 in every slot (flooded): nothing about its records; a malformed
        upload shows where it deviated. Nothing is charged (he_partition.join.wellformed).
        """
        contract = self.get_study(study_id)
        _check_contract_hash(contract, contract_hash, "nothing was decrypted")
        contract.join_terms()  # a join study's: refused by name otherwise
        with self.refusals.admitted(study_id, contract.context_fingerprint):  # a failure counts toward the caps
            with self._decrypt_lock:
                ok = self.join_checks.judge(study_id, contract.expected_owners, owner_id, seed, residues,
                                            self.join_scheme_for(contract))
            if not ok:
                self.arrivals.record(study_id=study_id, release_id=f"join-check:{owner_id}", kind="join_check",
                                     chunks=len(residues), ciphertext_digest=stream_digest(residues).hex(),
                                     outcome="refused", reason=FAILED_JOIN_CHECK)
        log.info("study %s: owner %s's join upload %s the well-formedness check", study_id, owner_id,
                 "passed" if ok else "FAILED")
        return ok

    def join_measurement(self, contract: StudyContract, release_id: str, release_epsilon: float, contract_hash: str,
                         measurement: Measurement | None, count: int) -> Measurement:
        """The join measurement a request names, checked against the contract before anything is charged or
        decrypted (None: every cell at `release_epsilon`); `count` the values the request carries or asks for."""
        study_id = contract.study_id
        check_id("release_id", release_id)
        _check_contract_hash(contract, contract_hash, "nothing was decrypted")
        terms = contract.join_terms()
        n = terms.rows * terms.cols
        eps = float(release_epsilon)
        if not (math.isfinite(eps) and 0 < eps <= contract.epsilon * (1 + EPSILON_TOLERANCE)):
            raise InvalidInputError(f"release_epsilon {release_epsilon:g} must be > 0 and at most study "
                                    f"{study_id}'s total epsilon {contract.epsilon:g}")
        m = measurement or PartitionSums(n, eps, 1, starts=tuple(range(n)))
        allowed = ({PartitionSums.kind} if terms.release == "cells"
                   else set(STRATEGY_MEASUREMENT_KINDS.get(terms.release, ())))
        if m.kind not in allowed:
            raise FailedPreconditionError(f"measurement.kind {m.kind!r} is not used by join study {study_id}'s "
                                          f"release {terms.release!r} (it measures only {', '.join(sorted(allowed))}); "
                                          "nothing was decrypted")
        if m.domain_size != n:
            raise InvalidInputError(f"measurement.domain_size {m.domain_size}: join study {study_id}'s table has "
                                    f"{terms.rows} x {terms.cols} = {n} bins")
        if m.sensitivity < m.unit_sensitivity:
            raise InvalidInputError(f"measurement.sensitivity: {m.kind} sensitivity {m.sensitivity} is below "
                                    f"{m.unit_sensitivity} (one record per identifier): its noise would be too small")
        if count != m.count:
            raise InvalidInputError(f"this {m.kind} measurement has {m.count} values, {count} ciphertexts arrived")
        return m

    def decrypt_join_cells(self, *, study_id: str, release_id: str, release_epsilon: float, contract_hash: str,
                           cells: Sequence[bytes], measurement: Measurement | None = None) -> JoinCellsResult:
        """Check a join measurement and its ciphertexts, charge the ledger, decrypt slot 0 of each, add noise.

        `measurement`: what the ciphertexts measure over the flattened table (a measurement of
        the study's release strategy, he_partition.join.release); None: every cell
        (PartitionSums over single bins at `release_epsilon`).

        Privacy: `measurement.epsilon` is charged (the strategy's share of the release;
        sensitivity `measurement.sensitivity` under the neighbouring relation add/remove of
        one shared customer, who is in one cell: contribution bound 1). The values decrypted
        here already carry the computation server's draw of scale sensitivity/epsilon; with
        noise_parties == 2 this server adds its own independent draw of that scale, and
        only it knows that draw. The charge is committed before any value leaves.

        Only public facts are checked before the charge (the contract, the measurement's
        shape, the well-formedness record, the refusal caps, that each cell parses); the
        integrity check (noise budget, a function of the join key) runs after it: a
        refusal then is charged, recorded in `arrivals` with the one text of
        `refusal_after_charge`, and counts toward the caps (`RefusalGate`).
        """
        contract = self.get_study(study_id)
        eps = float(release_epsilon)
        m = self.join_measurement(contract, release_id, eps, contract_hash, measurement, len(cells))
        # Both owners' uploads must have passed the well-formedness check with this server's coefficients.
        self.join_checks.require_passed(study_id, contract.expected_owners)
        check_charge(contract.epsilon, self.ledger.charges(study_id), release_id, m.epsilon, eps)
        scheme = self.join_scheme_for(contract)
        parsed = [scheme.deserialize_released(c) for c in cells]
        digest = stream_digest(cells).hex()
        with self.refusals.admitted(study_id, contract.context_fingerprint):
            charge: Charge | None = None
            try:
                with self._decrypt_lock:
                    charge = self.ledger.charge(study_id, release_id, m.kind, m.epsilon, eps,
                                                decryption_detail(contract, m, digest))
                    # This server's draw is fixed by the request, as for every other measurement (`_request_noise`).
                    noise = self._request_noise(study_id, release_id, eps, m, digest)
                    # After the charge: every cell's budget read (no early exit), then the decryption.
                    intact = [scheme.noise_budget(ct) >= JOIN_MIN_BUDGET for ct in parsed]
                    if not all(intact):
                        raise PrecisionError(f"join ciphertext {intact.index(False)} has too little noise budget")
                    values = decrypt_values(scheme, parsed, m, noise, noise_parties=contract.noise_parties)
            except Exception as exc:
                if charge is None:
                    self.record_refusal(study_id, release_id, m.kind, cells, exc, digest=digest)
                    raise
                log.warning("study %s, join release %s: after the charge: %s: %s", study_id, release_id,
                            type(exc).__name__, exc)
                refusal = refusal_after_charge(study_id, self.refusals.per_study)
                self.record_refusal(study_id, release_id, m.kind, cells, refusal, digest=digest,
                                    charged=charge.epsilon)
                raise refusal from None
            self.arrivals.record(study_id=study_id, release_id=release_id, kind=m.kind, chunks=len(cells),
                                 ciphertext_digest=digest, outcome="answered", epsilon_charged=charge.epsilon)
        log.info("study %s, join release %s: decrypted %s (%d values), charged epsilon %.6g", study_id, release_id,
                 m.kind, len(cells), charge.epsilon)
        charges = self.ledger.charges(study_id)
        self._end_after_charge(study_id)
        return JoinCellsResult(values, contract.noise_parties * m.noise_variance, charge.epsilon,
                               max(0.0, contract.epsilon - math.fsum(c.epsilon for c in charges)))

    def charge_join(self, contract: StudyContract, release_id: str, release_epsilon: float, m: Measurement,
                    digest: str, *, reserve: bool = True) -> Charge:
        """Charge a join measurement whose values a key-share holder shares (`keyshare.join_release`).

        Privacy: spends `m.epsilon` (sensitivity `m.sensitivity`; neighbouring relation add/remove of one shared
        customer, contribution bound 1) against the study's budget, refused when it does not fit. Draws no noise,
        so nobody knows noise from it.
        `reserve` False (a t-of-N key): the signed charge log was the budget check; this ledger records. The
        ledger's charge checks the budget (`check_charge`, `reserve` as there)."""
        with self._decrypt_lock:
            charge: Charge = self.ledger.charge(contract.study_id, release_id, m.kind, m.epsilon,
                                                float(release_epsilon), decryption_detail(contract, m, digest),
                                                reserve=reserve)
        return charge

    def get_study(self, study_id: str) -> StudyContract:
        """The study's contract; refused (FailedPreconditionError) when this holder pins approval keys and holds
        no approval of the study by one of them, so nothing is closed, decrypted or evaluated for it."""
        contract = self.ledger.get_study(check_id("study_id", study_id))
        self.approvals.require(study_id)
        return contract

    def _key_of(self, study_id: str) -> str:
        """The fingerprint of the key `study_id`'s contract names (what the per-key refusal cap counts by)."""
        if study_id not in self._study_keys:
            try:
                self._study_keys[study_id] = self.ledger.get_study(study_id).context_fingerprint
            except DPAggError:
                return ""
        return self._study_keys[study_id]

    # -- decryption -------------------------------------------------------------
    def check_measurement(self, contract: StudyContract, m: Measurement, chunk_count: int, *, contract_hash: str,
                          release_id: str, release_epsilon: float, reserve: bool = True) -> None:
        """Refuse a measurement that does not fit the study's contract, before any ciphertext is read.

        Checked, in order: the sender's contract hash equals the study's (so both servers
        hold the same terms: noise parties, bound, owners, budget); the domain size; the
        kind is one the study's strategy uses; the sensitivity is at least the kind's
        minimum times the contribution bound; the release's epsilon is within the
        study's total; the charge (`charged_epsilon`: m.epsilon times 1 + L) fits the
        budget left (a dry run: the real check-and-charge is atomic in the ledger; `reserve` as
        in `check_charge`); one ciphertext chunk per `slots` bins.
        """
        _check_contract_hash(contract, contract_hash, "nothing was decrypted")
        if contract.is_join:
            raise FailedPreconditionError(f"study {contract.study_id} is a join study: its table is released with "
                                          "DecryptJoinCells, no other measurement is decrypted")
        if m.domain_size != contract.domain_size:
            raise InvalidInputError(
                f"measurement.domain_size {m.domain_size} differs from study {contract.study_id}'s domain size "
                f"{contract.domain_size}"
            )
        allowed = STRATEGY_MEASUREMENT_KINDS.get(contract.strategy, frozenset()) | {RangeCount.kind}
        if m.kind not in allowed:
            raise FailedPreconditionError(
                f"measurement.kind {m.kind!r} is not used by study {contract.study_id}'s strategy "
                f"{contract.strategy!r} (it measures only {', '.join(sorted(allowed)) or 'nothing this server knows'}); "
                "nothing was decrypted"
            )
        floor = m.unit_sensitivity * contract.person_bound
        if m.sensitivity < floor:
            raise InvalidInputError(
                f"measurement.sensitivity: {m.kind} sensitivity {m.sensitivity} is below {floor} (contribution bound "
                f"{contract.contribution_bound} x at most {contract.max_organizations} organization(s) per person): "
                "its noise would be too small"
            )
        if m.kind == RangeCount.kind:
            # Paid in advance (charge_direct_queries); decrypt_measurement claims the paid range.
            self._check_chunks(contract, m, chunk_count)
            return
        if not (math.isfinite(release_epsilon) and 0 < release_epsilon <= contract.epsilon * (1 + EPSILON_TOLERANCE)):
            raise InvalidInputError(
                f"release_epsilon {release_epsilon:g} must be > 0 and at most study {contract.study_id}'s total "
                f"epsilon {contract.epsilon:g}"
            )
        check_charge(contract.epsilon, self.ledger.charges(contract.study_id), release_id,
                     charged_epsilon(contract, m, float(release_epsilon)), float(release_epsilon), reserve=reserve)
        self._check_chunks(contract, m, chunk_count)

    def _check_chunks(self, contract: StudyContract, m: Measurement, chunk_count: int) -> None:
        expected = len(m.measured_chunks(self.backend.slots))
        if chunk_count != expected:
            raise InvalidInputError(
                f"chunk_count: this {contract.domain_size}-bin {m.kind} measurement has {expected} ciphertext chunks "
                f"of {self.backend.slots} slots holding measured slots (of "
                f"{n_chunks(contract.domain_size, self.backend.slots)}), header says {chunk_count}"
            )

    # -- the owners' signed c1 -------------------------------------------------------
    def accept_uploads(self, study_id: str, contract_hash: str, uploads: list[OwnerC1Parts]) -> int:
        """Verify the owners' signed c1 parts of a signed study and keep their per-chunk sum (`UploadC1Book.accept`).

        Refused: another contract than the study's, a join study (its cells are not the owners'
        upload chunks), an unsigned study, a missing, duplicate or unknown owner, a signature that
        does not verify. Charges and decrypts nothing.
        """
        contract = self.get_study(study_id)
        _check_contract_hash(contract, contract_hash, "the forwarded c1 parts were not kept")
        if contract.is_join:
            raise FailedPreconditionError(f"study {study_id} is a join study: its cells are decrypted as they come "
                                          "(DecryptJoinCells), no c1 parts are kept for it")
        chunks = self.uploads.accept(contract, uploads,
                                     self.commitments.closed(study_id) if self.commitments is not None else None)
        log.info("study %s: the signed c1 parts of %d owners (%d chunks) verified and kept", study_id, len(uploads),
                 chunks)
        return chunks

    def signed_c1(self, contract: StudyContract, m: Measurement) -> list[Any] | None:
        """The owners' aggregate c1 of each measured chunk of `m` (upload chunk `measured_chunks(slots)[j]`).

        None for an unsigned study (its chunks are decrypted as sent); FailedPreconditionError when
        nothing was forwarded for a signed one (nothing is charged or decrypted then).
        """
        if not contract.signed:
            return None
        return [self.uploads.expected(contract.study_id, i) for i in m.measured_chunks(self.backend.slots)]

    def decrypt_pipeline(self, chunk_count: int, contract: StudyContract | None = None) -> ChunkPipeline | None:
        """A pipeline through the local workers for a measurement of `chunk_count` (public) chunks of `contract`'s
        study (its key; None: the server key), or None: in-process (no pool, or too few chunks to pay for the
        round trips)."""
        pool = self.decrypt_pool
        if pool is None or not pool.uses_pool(chunk_count):
            return None
        return pool.pipeline(self._flood_key, self._worker_key(contract))

    def with_signed_c1(self, data: bytes, index: int, c1: Any) -> bytes:
        """Measurement chunk `index` (bytes) with c1 replaced by the owners' aggregate c1 `c1`: what is decrypted.

        The computation server chooses c0 only (its noise, pads and flood are there); whatever c1
        it sent is ignored, so a scaled or re-randomized ciphertext decrypts to noise and fails
        the integrity check, after the charge (`decrypt_measurement`).
        """
        return self.backend.with_c1(data, c1, chunk=index)

    def checked_chunk(self, data: bytes, index: int, contract: StudyContract | None = None) -> Any:
        """One received chunk (as decrypted: in a signed study with the owners' c1), parsed under `contract`'s key
        (None: the server key) and carrying this server's own flood (`BfvBackend.holder_flooded`); refused
        (InvalidInputError) only when the bytes are no chunk of this key's first level, a public fact. Its
        integrity check runs after the charge."""
        backend = self.backend if contract is None else self.backend_for(contract)
        return backend.deserialize_chunk(backend.holder_flooded(data, self._flood_key, chunk=index))

    def decrypt_measurement(self, *, study_id: str, release_id: str, release_epsilon: float, measurement: Measurement,
                            chunks: Sequence[bytes], contract_hash: str,
                            checked: Sequence[Any] | None = None,
                            signed: Sequence[bytes] | None = None,
                            pipeline: ChunkPipeline | None = None) -> DecryptedMeasurement:
        """Fix this server's draw, charge the ledger, then flood, check, decrypt, decode, add the draw and check again.

        Privacy: this server's discrete Laplace draw (scale sensitivity/epsilon per value,
        noise_parties == 2; only this server knows it) is fixed first, from its noise key
        and the request (`_request_noise`): the same request gets the same draw, another
        request an independent one. Then the ledger row for `charged_epsilon`
        (`measurement.epsilon`, times 1 + L in a study with correlated records, where it
        is a Bayesian-DP charge in the same units as `release_epsilon`) is committed (and
        refused with BudgetExhaustedError if it does not fit) before anything that depends
        on the secret key is read; a request identical to one already charged (same
        release, contract, measurement and bytes: the same row detail) is answered from
        that row, with the same draw and so the same values, and is not charged again
        (`_AnsweredBefore`). The decoded values are the measurement (sensitivity
        `measurement.sensitivity` under add/remove of one person with at most c records)
        plus the computation server's draw plus this server's.

        Before the charge only public facts are checked: the contract and the measurement's
        shape (`check_measurement`), the refusal caps (`RefusalGate`), and that the bytes are
        chunks of this key's first level. Every chunk carries this server's own flood
        (`checked_chunk`, `BfvBackend.holder_flooded`: uniform on +-2^108, keyed by the
        ciphertext, exact decoding kept) before its integrity check (noise budget) and its
        decode; in a signed study what is decrypted is each chunk's c0 with the owners'
        aggregate c1 (`with_signed_c1`: `signed` when the caller built them as the chunks
        arrived, `checked` their parsed, flooded form). After the charge, a chunk that
        fails the integrity check or noised values above 2^44 are refused with the one text
        of `refusal_after_charge` (whichever check refused; the epsilon stays spent), and
        such refusals are capped per study and per key. Every request that reaches this
        point is recorded in `arrivals`, answered or refused, with what it was charged; the
        ledger row also records what it paid for (`decryption_detail`).

        With the local worker pool (`pipeline`, made by `decrypt_pipeline`, or built here
        from the chunks when the pool takes a measurement of this many chunks), the workers
        parse, flood, check and decrypt each chunk as it arrives, but their values and check
        outcomes stay in this process and are read only after the charge committed.
        """
        digest = stream_digest(chunks).hex()  # of the chunks as sent: it keys the draw and names the request
        budget: Budget | None = None
        admitted = ExitStack()  # this request's hold on the refusal caps (`RefusalGate.admitted`)
        try:
            contract = self.get_study(study_id)
            check_id("release_id", release_id)
            self.check_measurement(contract, measurement, len(chunks), contract_hash=contract_hash,
                                   release_id=release_id, release_epsilon=float(release_epsilon))
            admitted.enter_context(self.refusals.admitted(study_id, contract.context_fingerprint))
            backend = self.backend_for(contract)  # the study's key, and no other
            pool = self.decrypt_pool
            if pipeline is None and pool is not None and pool.uses_pool(len(chunks)):
                # The workers parse, flood, check and decrypt each chunk (a caller that did not stream them).
                pipeline = pool.pipeline(self._flood_key, self._worker_key(contract))
                c1 = None if signed is not None else self.signed_c1(contract, measurement)
                for j, c in enumerate(signed if signed is not None else chunks):
                    pipeline.submit(c, None if c1 is None else c1[j])
            if pipeline is not None and pipeline.flood_key != self._flood_key:
                raise InvalidInputError("the chunk pipeline was not made by this decryption server "
                                        "(decrypt_pipeline): its chunks do not carry its flood")
            if pipeline is None and signed is None:  # a signed study: the owners' aggregate c1 in place of the one sent
                c1 = self.signed_c1(contract, measurement)
                signed = chunks if c1 is None else [self.with_signed_c1(c, j, c1[j]) for j, c in enumerate(chunks)]
            # Only the chunks holding measured slots travel; the others are pads the decryption needs not see.
            # `checked`: the same chunks already parsed and flooded as they arrived; with a pipeline, the
            # workers hold them (their index stands in for the chunk here) and only their parsing is awaited.
            if pipeline is not None:
                pipeline.arrived()
                sent: Iterator[Any] = iter(range(len(chunks)))
            elif checked is not None:
                sent = iter(checked)
            else:
                assert signed is not None
                sent = (self.checked_chunk(c, j, contract) for j, c in enumerate(signed))
            wanted = set(measurement.measured_chunks(backend.slots))
            vector = ChunkedVector(contract.domain_size, tuple(
                next(sent) if i in wanted else None for i in range(n_chunks(contract.domain_size, backend.slots))))
            stream = self._noise_stream(study_id, release_id, digest)
            spec = measurement_json(measurement)  # once: a 1M-value measurement's spec is ~8 MB of JSON
            detail = decryption_detail(contract, measurement, digest, noise_stream=stream, spec_json=spec)
            prior = None if isinstance(measurement, RangeCount) else next(
                (c for c in self.ledger.charges(study_id) if c.release_id == release_id and c.detail == detail), None)
            if isinstance(measurement, RangeCount):
                budget = _DirectClaim(self.ledger, study_id, release_id, measurement, detail)
            elif prior is not None:  # the very request answered (or refused after its charge) before
                budget = _AnsweredBefore(prior)
            else:
                budget = _LedgerBudget(self.ledger, study_id, release_id, float(release_epsilon), contract.epsilon,
                                       detail, contract.noise_multiplier)
            side = DecryptionSide(PipelinedDecryption(backend, pipeline) if pipeline is not None
                                  else FloodedDecryption(backend),
                                  self._request_noise(study_id, release_id, float(release_epsilon),
                                                      measurement, digest, stream=stream, spec_json=spec),
                                  budget, contract.noise_parties)
            del spec  # in the row's detail and the draw's key now; not held while the values are decoded
            # In-process: one user of the secret-key decryptor at a time; the workers have their own.
            with self._decrypt_lock if pipeline is None else nullcontext():
                started = time.monotonic()
                # The integrity check (after the flood), the decode and the magnitude check: after the charge.
                values = side.decrypt_measurement(measurement, vector)
                took = time.monotonic() - started
        except Exception as exc:
            try:
                if pipeline is not None:
                    pipeline.discard()
                charged = budget.last.epsilon if type(budget) is _LedgerBudget and budget.last is not None else 0.0
                if getattr(budget, "charged", False) and not isinstance(exc, WorkerLostError):
                    # After the charge: one text for whatever refused (a function of the secret key otherwise).
                    log.warning("study %s, release %s: after the charge: %s: %s", study_id, release_id,
                                type(exc).__name__, exc)
                    refusal = refusal_after_charge(study_id, self.refusals.per_study)
                    self.record_refusal(study_id, release_id, measurement.kind, chunks, refusal, digest=digest,
                                        charged=charged)
                    if charged:
                        self._end_after_charge(study_id)
                    raise refusal from None
                self.record_refusal(study_id, release_id, measurement.kind, chunks, exc, digest=digest,
                                    charged=charged)
                if charged:
                    self._end_after_charge(study_id)
            finally:
                admitted.close()  # after the refusal is recorded: the caps count it
            raise
        try:
            charges = self.ledger.charges(study_id)
            if isinstance(budget, (_LedgerBudget, _AnsweredBefore)):
                assert budget.last is not None  # DecryptionSide charges before it decrypts
                paid: Charge | None = budget.last
            else:
                paid = next((c for c in charges if c.release_id == release_id), None)
            self.arrivals.record(study_id=study_id, release_id=release_id, kind=measurement.kind, chunks=len(chunks),
                                 ciphertext_digest=digest, outcome="answered",
                                 epsilon_charged=paid.epsilon if isinstance(budget, _LedgerBudget) and paid else 0.0)
        finally:
            admitted.close()
        log.info("study %s, %s %s: decrypted %s (%d chunks, %d values) in %.3f s%s", study_id,
                 "direct query" if isinstance(measurement, RangeCount) else "release", release_id,
                 measurement.kind, len(chunks), len(values), took,
                 "" if paid is None else (f", answered again from charge #{paid.charge_id} (not charged again)"
                                          if isinstance(budget, _AnsweredBefore)
                                          else f", charged epsilon {paid.epsilon:.6g}"))
        self._end_after_charge(study_id)
        return DecryptedMeasurement(np.asarray(values, dtype=np.int64), paid,
                                    max(0.0, contract.epsilon - math.fsum(c.epsilon for c in charges)))

    def _end_after_charge(self, study_id: str) -> None:
        """`end_if_spent` after a measurement was paid for; a failure to erase is logged, never the caller's."""
        try:
            self.end_if_spent(study_id)
        except Exception as exc:  # noqa: BLE001 - the answer stands; the next answer of the study erases it
            log.error("study %s: its key could not be erased after its budget was spent: %s", study_id, exc)

    def record_refusal(self, study_id: str, release_id: str, kind: str, chunks: Sequence[bytes], exc: BaseException,
                       *, digest: str = "", charged: float = 0.0) -> None:
        """Record ciphertexts that reached this server and were refused (with what was charged) in `arrivals`."""
        self.arrivals.record(study_id=study_id, release_id=release_id, kind=kind, chunks=len(chunks),
                             ciphertext_digest=digest or stream_digest(chunks).hex(), outcome="refused",
                             epsilon_charged=charged, reason=f"{type(exc).__name__}: {exc}")
        log.warning("study %s, release %s: refused %s after %d chunk(s) arrived (epsilon charged %.6g): %s",
                    study_id, release_id, kind, len(chunks), charged, exc)

    def _noise_stream(self, study_id: str, release_id: str, digest: str) -> int:
        """The KeyedRandom stream for a request: the one its earlier answer used (1 if its row names none), else NOISE_STREAM."""
        for c in self.ledger.charges(study_id):
            if c.release_id != release_id or digest not in c.detail:
                continue
            try:
                d = json.loads(c.detail)
            except ValueError:
                continue
            if isinstance(d, dict) and d.get("ciphertext_digest") == digest:
                return int(d.get("noise_stream", 1))
        return NOISE_STREAM

    def _request_noise(self, study_id: str, release_id: str, release_epsilon: float, m: Measurement,
                       digest: str, *, stream: int = 1, spec_json: str | None = None) -> KeyedRandom:
        """The source of this server's draw for one request, fixed before anything data-dependent is read.

        Keyed by the noise key and (study, release, release epsilon, measurement, ciphertext
        digest): a repeated request (same bytes) gets the same draw, so repeating cannot
        average fresh draws; any other ciphertext or measurement gets an independent draw,
        so two answers never share this server's noise (a difference of two answers cannot
        cancel it). `stream` picks KeyedRandom's stream (`NOISE_STREAM` for measurements,
        `_noise_stream`; the join's cells keep stream 1). `spec_json`: canonical_json(m.to_dict())
        if the caller has it (the label is the same text either way). Draws no noise itself.
        """
        marker = f"measurement:{uuid.uuid4().hex}"
        head, tail = canonical_json({"study_id": study_id, "release_id": release_id,
                                     "release_epsilon": release_epsilon, "measurement": marker,
                                     "ciphertext_digest": digest}).split(f'"{marker}"', 1)
        spec = spec_json if spec_json is not None else measurement_json(m)
        # The label's bytes in one piece (the spec is ASCII: canonical JSON), not the text and then its bytes.
        label = b"".join((head.encode("utf-8"), spec.encode("ascii"), tail.encode("utf-8")))
        del spec
        return KeyedRandom(self._noise_key, label, stream=stream)

    def charge_direct_queries(self, *, study_id: str, request_id: str, contract_hash: str,
                              ranges: Sequence[tuple[int, int]], epsilon: float) -> DirectCharge:
        """Pay for a batch of direct range counts before any is decrypted (see `LedgerStore.charge_direct`).

        Privacy: each range [lo, hi) will be released as its count plus discrete Laplace
        noise of scale c / epsilon from each noise party, each of which alone knows its own
        draw (sensitivity c; neighbouring relation add/remove of one person with at most c
        records), and this server's view also holds the prefix
        [0, lo) behind a mask at PREFIX_MASK_EPSILON. The charge is the growth of the
        heaviest weighted overlap of all the study's answered pieces (seed 004), or, in a
        study with correlated records, every piece in full times the noise multiplier.
        Checked first: the contract hash, the ranges (within the domain, at most
        MAX_DIRECT_RANGES) and epsilon.
        """
        contract = self.get_study(study_id)
        check_id("request_id", request_id)
        _check_contract_hash(contract, contract_hash, "nothing was charged")
        if contract.is_join:
            raise FailedPreconditionError(f"study {study_id} is a join study: analysts query its released table; "
                                          "direct range counts are not available")
        pieces = [m.privacy_pieces() for m in range_count_batch(
            contract.domain_size, epsilon, contract.person_bound, ranges, max_ranges=MAX_DIRECT_RANGES)]
        detail = canonical_json({"contract_hash": contract.contract_hash, "ranges": len(pieces),
                                 "epsilon": float(epsilon)})
        return self.ledger.charge_direct(study_id, request_id, pieces, detail)

    def budget(self, study_id: str) -> BudgetReport:
        contract = self.get_study(check_id("study_id", study_id))
        charges = tuple(self.ledger.charges(study_id))
        spent = float(exact_sum(c.epsilon for c in charges))
        problem = ""
        verify = getattr(self.ledger, "verify_chain", None)
        if verify is not None:
            try:
                verify()
            except FailedPreconditionError as exc:
                problem = str(exc)
        return BudgetReport(study_id, contract.epsilon, spent, charges,
                            max(spent, float(exact_reserved(charges))), problem, available(contract.epsilon, charges))


def _oblivious_join_params(strategy_params_json: str) -> str:
    """A new join study's strategy_params with oblivious pseudonyms: "pseudonyms" set to "oprf" when absent, and
    the legacy "hmac" refused (an owner colluding with the computation server could test any guess)."""
    try:
        params = json.loads(strategy_params_json or "{}")
    except ValueError:
        return strategy_params_json  # the contract's own checks name the error
    if not isinstance(params, dict):
        return strategy_params_json
    if params.get("pseudonyms", "oprf") != "oprf":
        raise InvalidInputError(
            f"join pseudonyms {params['pseudonyms']!r}: new join studies use oblivious pseudonyms (\"oprf\"); HMAC "
            "pseudonyms under the owners' join key let an owner colluding with the computation server test any "
            "guessed identifier against the other owner's list (docs/join.md)")
    return json.dumps({**params, "pseudonyms": "oprf"})


def _check_contract_hash(contract: StudyContract, contract_hash: str, consequence: str) -> None:
    """Refuse a request computed under other terms than the study's contract (the hash binds every field)."""
    if not contract_hash:
        raise InvalidInputError(
            "contract_hash is required: send the hash of the study contract the measurement was computed under"
        )
    if contract_hash != contract.contract_hash:
        raise FailedPreconditionError(
            f"contract_hash {contract_hash[:16]} does not match study {contract.study_id}'s contract "
            f"{contract.contract_hash[:16]}: the computation server works on other terms; {consequence}"
        )


def decryption_detail(contract: StudyContract, m: Measurement, ciphertext_digest: str, *, noise_stream: int = 1,
                      spec_json: str | None = None) -> str:
    """What one ledger row pays for: contract hash, SHA-256 of the measurement spec, the ciphertext stream's digest.

    `ciphertext_digest`: `stream_digest(chunks).hex()`, computed once per request by the caller
    (it also keys this server's draw and the arrivals record). `noise_stream`: the KeyedRandom
    stream of that draw, written when it is not 1 (rows of older ledgers name none). `spec_json`:
    canonical_json(m.to_dict()) when the caller has it already.

    Kept small (hashes, not the ciphertexts or partition starts), so every decryption is
    recorded and can later be matched with the computation server's records.
    """
    spec = hashlib.sha256((spec_json if spec_json is not None else measurement_json(m)).encode("utf-8")).hexdigest()
    return canonical_json({"contract_hash": contract.contract_hash, "measurement_sha256": spec,
                           "ciphertext_digest": ciphertext_digest, "values": int(m.count),
                           "sensitivity": int(m.sensitivity),
                           # which KeyedRandom stream drew this server's noise (rows without it: stream 1)
                           **({"noise_stream": noise_stream} if noise_stream != 1 else {})})
