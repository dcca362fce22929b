"""A key-share holder's state: its key store, its side of each study's key setup, its share decisions.

A holder is a decryption server in key-share mode (`dpagg serve-decryption --key-share NAME
--holders N1,N2,...`). It keeps, in its own data directory, its key store (`study_keys`: the
deployment `dpagg setup-key` fixed, each study's own key share, a legacy collective key), its own
noise key and its own SQLite ledger, as the single decryption server does.

A key per study (`study_setup`, run before the CS opens the study): `OpenStudy` of a new study is
refused unless this holder built its key, whose fingerprint the holder writes into the contract;
every later request is checked against the key built FOR THAT STUDY (`check_contract`, `key_of`),
so a key share recovered in one study opens that study only.

Once the deployment is fixed, studies, budgets and direct-query charges go through the single
decryption server's `DecryptionHandler` over this holder's ledger; decryption: `issue_shares` only.
With a t-of-N deployment each share request carries the study's signed charge log and the
participant set its charge fixed (`charges.ChargeBook`): the holder signs charges (`sign_charge`)
and issues shares only within that log.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from fractions import Fraction
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from he_partition.core.errors import InvalidInputError
from he_partition.core.backend import DEFAULT_PLAIN_MODULUS
from he_partition.core.measurements import Measurement, RangeCount
from he_partition.core.noise import CipherRandom, KeyedRandom
from he_partition.core.noise_shares import holder_noise_source, tolerant_share
from he_partition.he.bfv import generate_secret_context
from he_partition.he.bfv import load_context
from he_partition.he.threshold.keys import HolderSecret
from he_partition.protocol import MAX_NOISE_SCALE

from ...common.approval import ApprovalBook, StudyApproval
from ...common.contract import StudyContract, charged_epsilon, check_id
from ...common.convert import measurement_json
from ...common.errors import FailedPreconditionError, NotFoundError
from ..handler import NOISE_STREAM, DecryptionHandler, decryption_detail
from ..keys import KeyMaterial

from .holder import (MeasurementShares, ThresholdHolder, answered, chunks_digest, measurement_label,
                       measurement_shares)
from ...common.sealing import Commitment, SealKeyPair
from ..commitments import CommitmentBook
from .uploads import OwnerC1Parts, UploadC1Book
from ..ledger import Charge
from .share_workers import holder_pool
from ..receipts import ReceiptSigner
from .charges import ChargeBook, ChargeEntry, ChargeRules, charge_epsilon, charge_request, load_log, log_epsilon
from .resharing import HolderIdentity
from .study_keys import ActiveKey, StudyKeyStore
from .study_setup import StudySetups
from .pseudonyms import SharedPseudonyms, holder_part
from .join_release import HolderJoins
from ..oprf import EVALUATIONS_FILE, EvaluationLog

__all__ = ["ActiveKey", "KeyShareService", "holder_index"]

log = logging.getLogger("dpagg.decryption.keyshare")

#: The refusal of the single key holder's join RPCs on a holder.
JOINS_SINGLE_HOLDER = ("that is the single key holder's join RPC: key-share holders check a join among themselves "
                       "and share values they compute from the owners' planes (JoinCheck, JoinShares; "
                       "docs/threshold.md, section 8)")


def holder_index(name: str, holders: Sequence[str]) -> int:
    """This holder's index in the configured list (K >= 2 distinct names, `name` one of them)."""
    names = list(holders)
    if len(names) < 2 or len(set(names)) != len(names):
        raise InvalidInputError(f"--holders needs at least 2 distinct names, got {names}")
    if name not in names:
        raise InvalidInputError(f"--key-share {name!r} is not in --holders {','.join(names)}")
    return names.index(name)


class KeyShareService:
    """One holder: its deployment, each study's key (from disk after a restart), the share decisions."""

    def __init__(self, name: str, holders: Sequence[str], data_dir: Path, noise_key: bytes, *,
                 require_signed: bool = False, operator_keys: Sequence[bytes] = (), decrypt_workers: int = 0) -> None:
        self.name, self.holders = name, tuple(holders)
        #: The operator approval keys this holder pins and the approvals it accepted (parties.common.approval).
        self.approvals = ApprovalBook(operator_keys, Path(data_dir) / "approvals")
        self.index = holder_index(name, self.holders)
        self.keys_dir = Path(data_dir) / "keys"
        self.ledger_path = Path(data_dir) / "ledger.sqlite3"
        self.c1_dir = Path(data_dir) / "c1"  # the owners' expected aggregate c1 per study (keyshare.uploads)
        self.noise_key = noise_key
        self.require_signed = require_signed
        self.template = generate_secret_context()  # BFV parameters only; its own keys are never used
        self.store = StudyKeyStore(self.keys_dir, self.template, self.holders, self.index, name)
        #: The running setups of study keys, by study id (one each; a new session for a study replaces it).
        self.study_setups = StudySetups(self)
        #: The legacy collective key (set up before keys were made per study), or None.
        self.active: ActiveKey | None = None
        #: True once `dpagg setup-key` fixed the deployment (t and the holders' identities), or a legacy key exists.
        self.deployed = False
        self.holder: ThresholdHolder | None = None
        self.handler: DecryptionHandler | None = None
        self._lock = threading.Lock()
        # The X25519 key owners seal their upload keys to, and the sealed studies' closed commitment sets.
        self.seal = SealKeyPair.load_or_create(self.keys_dir)
        #: This holder's Ed25519 key (its receipt key): signs its receipts, t-of-N charges and dealt sub-shares.
        self.signer = ReceiptSigner.load_or_create(self.keys_dir)
        #: t of a t-of-N deployment (None: N-of-N), every holder's identity keys, and this holder's charge book.
        self.threshold: int | None = None
        self.identities: dict[int, HolderIdentity] = {}
        self.charges: ChargeBook | None = None
        self.commitments = CommitmentBook(self.seal, self.index, len(self.holders), Path(data_dir) / "commitments")
        #: The local workers computing a large measurement's shares (`share_workers`; 0 or 1: in-process). Each
        #: reads the study's key share from this holder's key store file itself.
        self.pool = holder_pool(decrypt_workers)
        #: The book and log of the join pages this holder answered with its share of a study's OPRF key.
        self.evaluations = EvaluationLog(Path(data_dir) / EVALUATIONS_FILE)
        #: The join studies' signed planes, their check and value shares at this holder (`join_release`).
        self.joins = HolderJoins(self, Path(data_dir) / "join_planes")
        self._load()

    # -- key store ------------------------------------------------------------------------
    def _load(self) -> None:
        source = self.store.deployment()
        if source is None:
            return
        if source.get("threshold"):
            self.threshold = int(source["threshold"])
        self.identities = {int(h): HolderIdentity.from_bytes(bytes.fromhex(v), int(h))
                           for h, v in source.get("identities", {}).items()}
        self.active = self.store.legacy()
        self.activate_deployment()
        self._retire_ended()

    def activate_deployment(self) -> None:
        """The deployment is fixed: the study/budget handler and the share decisions over this holder's ledger."""
        self.deployed = True
        if self.active is not None:  # the legacy key's context: what GetPublicContext served without a study
            material = KeyMaterial(load_context(self.active.context), self.active.context)
        else:  # BFV parameters only: every study names its own key (`open_study`)
            material = KeyMaterial(self.template, b"")
        legacy = self.active
        self.holder = ThresholdHolder(self.template, legacy.secret if legacy else None, len(self.holders),
                                      bytes.fromhex(legacy.fingerprint) if legacy else b"", self.noise_key,
                                      self.ledger_path, uploads=UploadC1Book(self.template, self.c1_dir),
                                      keys=self._secret_of, index=self.index, pool=self.pool,
                                      key_files=self._key_file)
        self.handler = DecryptionHandler(self.holder.ledger, material, CipherRandom(),
                                         require_signed=self.require_signed, noise_key=self.noise_key,
                                         key_holders=len(self.holders), approvals=self.approvals)
        if self.threshold is not None:  # any t answer: the coalition the holders' noise tolerates is t - 1
            self.handler.max_noise_tolerates = self.threshold - 1
        self.handler.seal_threshold = self.seal_threshold()  # owners split their upload keys so any t close
        if self.threshold is not None:
            rules = ChargeRules({h: i.signing for h, i in self.identities.items()}, self.threshold)
            self.charges = ChargeBook(self.index, self.signer._private, rules, self.keys_dir.parent / "charges.sqlite3")

    def seal_threshold(self) -> int:
        """t of this deployment's t-of-N key when t < N: the owners' upload keys are split t-of-N (any t holders
        close a study's uploads); 0 (XOR across every holder) for N-of-N."""
        t = self.threshold
        return t if t is not None and t < len(self.holders) else 0

    def study_key(self, study_id: str) -> ActiveKey | None:
        """This holder's key of `study_id` (`StudyKeyStore.study`); None when it has none."""
        return self.store.study(study_id)

    def key_of(self, contract: StudyContract) -> ActiveKey:
        """The key this holder built for the study (or, for a study opened before keys were made per study, the
        legacy key its contract names); FailedPreconditionError when it holds none (never set up here, or
        erased when the study ended)."""
        key = self.study_key(contract.study_id)
        if key is None and self.active is not None and hmac.compare_digest(contract.context_fingerprint,
                                                                          self.active.fingerprint):
            key = self.active
        if key is None:
            raise FailedPreconditionError(f"holder {self.name} holds no key for study {contract.study_id} (never set "
                                          "up here, or erased when the study ended): nothing was decrypted")
        return key

    def _key_file(self, study_id: str) -> Path | None:
        """The key store file (mode 0600) of this holder's share of `study_id`'s key: the study's own, or the legacy
        key's for a study opened under it."""
        key = self.key_of(self.require_active().get_study(study_id))
        return self.store.secret_file(key.study_id)

    def _secret_of(self, study_id: str) -> tuple[HolderSecret, bytes]:
        handler = self.require_active()
        key = self.key_of(handler.get_study(study_id))
        return key.secret, bytes.fromhex(key.fingerprint)

    def erase_study_key(self, study_id: str) -> bool:
        """Erase this holder's share of `study_id`'s key (files and every copy in memory); True when there was one."""
        existed, key = self.store.erase_study(study_id)
        self.joins.forget(study_id)  # a join's planes and the values computed from them
        if self.holder is not None:
            self.holder.forget_products(study_id)
            if key is not None:
                self.holder.forget_key(bytes.fromhex(key.fingerprint))
        if existed:
            log.info("holder %s: study %s ended, its key share erased", self.name, study_id)
        return existed

    def study_ended(self, contract: StudyContract) -> bool:
        """True when the study's whole budget is spent: this holder's ledger (N-of-N), the study's signed
        charge log (t-of-N) books exactly what the log may spend (its epsilon, less a join's padding)."""
        handler = self.require_active()
        if self.charges is not None:
            return Fraction(self.charges.view(contract.study_id)["spent"]) >= log_epsilon(contract)
        return Fraction(handler.budget(contract.study_id).spent) >= Fraction(contract.epsilon)

    def retire_if_ended(self, study_id: str) -> bool:
        """Erase the study's key share once the study ended (`study_ended`); True when it was erased now.

        Retention: a study's key share lives from its open-study setup until its budget is fully
        spent; then no further measurement can be charged, so nothing can be decrypted under it."""
        handler = self.require_active()
        try:
            contract = handler.get_study(study_id)
        except NotFoundError:
            return False
        if self.study_key(study_id) is None or not self.study_ended(contract):
            return False
        return self.erase_study_key(study_id)

    def _retire_ended(self) -> None:
        """At start: erase the key shares of studies that ended while the holder ran (or before)."""
        for study_id in self.store.study_ids():
            try:
                self.retire_if_ended(study_id)
            except (InvalidInputError, FailedPreconditionError) as exc:  # a stray folder: say so, keep it
                log.warning("holder %s: study key folder %s not checked: %s", self.name, study_id, exc)

    def close(self) -> None:
        self.pool.close()
        self.joins.close()
        self.evaluations.close()
        if self.holder is not None:
            self.holder.close()
        if self.charges is not None:
            self.charges.close()

    @property
    def identity(self) -> HolderIdentity:
        return HolderIdentity(self.seal.public, self.signer.public_key)

    def require_active(self) -> DecryptionHandler:
        """The study/budget handler over this holder's ledger; FAILED_PRECONDITION before the deployment is fixed."""
        if self.handler is None:
            raise FailedPreconditionError(f"key-share holder {self.name} is not deployed yet: run "
                                          "`dpagg setup-key --computation HOST:PORT` first")
        return self.handler

    # -- studies --------------------------------------------------------------------------
    def open_study(self, **terms: object) -> tuple[StudyContract, bool]:
        """Open a study under the key this holder built for it (its setup ran first); an existing study is found
        again as it was. A new study without its own key here is refused: no study shares a key."""
        handler = self.require_active()
        study_id = check_id("study_id", terms.get("study_id") or "")
        # the operator's approval first: nothing of this holder's (its keys, its ledger) answers an unapproved study
        approval = terms.get("approval")
        handler.check_approval(approval if isinstance(approval, StudyApproval) else None,
                               **{k: v for k, v in terms.items() if k != "approval"})
        try:
            existing = handler.ledger.get_study(study_id)
        except NotFoundError:
            existing = None
        key = self.study_key(study_id)
        if existing is not None:
            fingerprint = existing.context_fingerprint
        elif key is None:
            raise FailedPreconditionError(f"holder {self.name} has no key for study {study_id}: each study gets its "
                                          "own key, set up when the computation server opens it; the study was not "
                                          "opened")
        else:
            join = terms.get("strategy") == "join"
            if join != bool(key.join_version):
                raise FailedPreconditionError(f"holder {self.name}'s key for study {study_id} is "
                                              f"{'a join key' if key.join_version else 'no join key'}, but the study "
                                              f"{'is' if join else 'is not'} a join: the study was not opened")
            fingerprint = key.fingerprint
        return handler.open_study(**terms, key_fingerprint=fingerprint)  # type: ignore[arg-type]

    def public_context(self, study_id: str) -> tuple[bytes, str]:
        """(collective public context, fingerprint) of `study_id`'s key; without a study, the legacy key's."""
        if study_id:
            key = self.key_of(self.require_active().get_study(study_id))
        elif self.active is not None:
            key = self.active
        else:
            raise FailedPreconditionError(f"key-share holder {self.name} holds a key per study: name the study "
                                          "whose public context you want")
        return key.context, key.fingerprint

    # -- key setup ------------------------------------------------------------------------
    def key_setup(self, step: str, session: bytes, holders: Sequence[str], messages: dict[int, bytes],
                  ciphertext: bytes, values: Sequence[int], *, threshold: int = 0,
                  participants: Sequence[int] = (), join_version: int = 0) -> tuple[bytes, str, str]:
        """One setup step: (this holder's message, fingerprint, state). See `HolderSetup` for the rounds.

        "status": this holder's state ("deployed" once `setup-key` fixed the deployment); "deploy"
        (`setup-key`): fixes t (`threshold`, 0 for N-of-N) and every holder's identity keys
        (`messages`, as each reported them), once; returns their digest. Every other step belongs
        to the setup of the study the session names (`setup.session_study`), run at open-study:
        refused before the deployment, for a study already opened, and with another t than the
        deployment's. With a t-of-N deployment, "deal" seals this holder's sub-shares to the
        deployment's identity keys (the relay's list must equal them) and signs them; "receive"
        takes every dealer's message and keeps S_j; "test_share" is asked once per participant
        set that holds this holder. "confirm" files the key under the study (mode 0600)."""
        with self._lock:
            if step == "status":  # the servicer adds this holder's seal key
                return (b"", self.active.fingerprint if self.active else "",
                        "deployed" if self.deployed else "none")
            if tuple(holders) != self.holders:
                raise InvalidInputError(f"the setup names holders {list(holders)}; holder {self.name} is configured "
                                        f"with {list(self.holders)}: setup refused")
            if step == "deploy":
                idents = {h: HolderIdentity.from_bytes(m, h) for h, m in messages.items()}
                digest, already = self.study_setups.deploy(int(threshold), idents)
                return b"", digest, "already deployed" if already else "deployed"
            return self.study_setups.step(step, session, messages, ciphertext, values, threshold=threshold,
                                          participants=participants, join_version=join_version)

    # -- join pseudonyms (`pseudonyms.evaluate_page` answers a page) -------------------------
    def shared_pseudonyms(self) -> SharedPseudonyms:
        """This holder's part of the join studies' shared OPRF keys over its own book (`pseudonyms.holder_part`)."""
        return holder_part(self.index, len(self.holders), self.threshold or len(self.holders), self.name,
                           self.keys_dir, self.seal, {h: i.seal for h, i in self.identities.items()},
                           self.evaluations)

    # -- studies and shares ---------------------------------------------------------------
    def check_contract(self, contract: StudyContract) -> None:
        """Refuse a contract that names another key than the one this holder built for the study (a join's: of the
        join's scheme version), or whose noise_tolerates is not below the K holders."""
        try:
            contract.check_key_holders(len(self.holders))
        except InvalidInputError as exc:
            raise FailedPreconditionError(f"study {contract.study_id}: {exc}; nothing was decrypted") from exc
        key = self.key_of(contract)
        if not hmac.compare_digest(contract.context_fingerprint, key.fingerprint):
            raise FailedPreconditionError(f"study {contract.study_id} names key {contract.context_fingerprint[:16]}, "
                                          f"not the key {key.fingerprint[:16]} holder {self.name} built for it: "
                                          "nothing was decrypted")
        if (contract.join_terms().version if contract.is_join else 0) != key.join_version:
            raise FailedPreconditionError(f"study {contract.study_id} and holder {self.name}'s key for it differ in "
                                          "kind (a join's scheme version against the key's): nothing was decrypted")
        if contract.signed and not contract.sealed:
            raise FailedPreconditionError(f"study {contract.study_id} is signed but pins no key holder seal keys: "
                                          "key-share holders take only sealed uploads, committed before anyone could "
                                          "read another owner's (open the study through a current computation server)")
        if contract.sealed:
            self.commitments.check_contract(contract)
            if contract.seal_threshold not in (0, self.seal_threshold()):
                raise FailedPreconditionError(
                    f"study {contract.study_id} splits the owners' upload keys {contract.seal_threshold}-of-"
                    f"{len(self.holders)}; holder {self.name} holds a "
                    f"{self.seal_threshold() or len(self.holders)}-of-{len(self.holders)} key share: refused")
        if self.threshold is not None and contract.noise_parties == 2 and contract.noise_tolerates >= self.threshold:
            raise FailedPreconditionError(f"study {contract.study_id}: noise_tolerates {contract.noise_tolerates} must "
                                          f"be below t = {self.threshold}: any t holders answer a t-of-N request, and "
                                          "their shares must sum to a full draw; nothing was decrypted")

    def named_study(self, study_id: str, contract_hash: str, who: str) -> StudyContract:
        """The study's contract as this holder keeps it (`check_contract`), refused (FAILED_PRECONDITION) when the
        request names another contract hash (`who`: what names it, in the refusal)."""
        contract: StudyContract = self.require_active().get_study(study_id)
        self.check_contract(contract)
        if not hmac.compare_digest(contract_hash, contract.contract_hash):
            raise FailedPreconditionError(f"{who} another contract than study {study_id}'s")
        return contract

    def sign_charge(self, study_id: str, entry_json: str, log_json: str) -> bytes:
        """This holder's signature on one charge of a t-of-N study's charge log (`charges.ChargeBook.sign`).

        Privacy: signs a spend of `entry.epsilon` against the study's budget (the contract's
        epsilon) only when the whole log plus the entry fits it; the epsilon is that of a
        measurement of L1 sensitivity c under add/remove of one person with at most c records
        (checked again against the measurement before any share, `issue_shares`). Draws no noise."""
        handler = self.require_active()
        if self.charges is None:
            raise FailedPreconditionError(f"key-share holder {self.name} holds an N-of-N key share: it charges its own "
                                          "ledger and signs no charge log")
        contract = handler.get_study(study_id)
        self.check_contract(contract)
        try:
            entry = ChargeEntry.from_dict(json.loads(entry_json))
        except ValueError as exc:
            raise InvalidInputError(f"the charge entry is not JSON: {exc}") from exc
        if entry.study_id != study_id:
            raise InvalidInputError(f"the charge entry is for study {entry.study_id!r}, the request for {study_id!r}")
        return self.charges.sign(entry, load_log(log_json), log_epsilon(contract))

    def close_uploads(self, study_id: str, contract_hash: str, commitments: list[Commitment]) -> list[bytes]:
        """Close `study_id`'s uploads on `commitments` (`CommitmentBook.close`): this holder's upload key shares."""
        contract = self.named_study(study_id, contract_hash, "the commitments name")
        shares = self.commitments.close(contract, commitments)
        log.info("holder %s, study %s: uploads closed on %d owners' commitments", self.name, study_id,
                 len(commitments))
        return shares

    def accept_uploads(self, study_id: str, contract_hash: str, uploads: list[OwnerC1Parts]) -> int:
        """Keep the expected c1 of every chunk of `study_id` from the owners' signed c1 parts (`UploadC1Book.accept`)."""
        assert self.holder is not None and self.holder.uploads is not None
        contract = self.named_study(study_id, contract_hash, "the forwarded uploads name")
        chunks = self.holder.uploads.accept(contract, uploads, self.commitments.closed(study_id))
        self.holder.forget_products(study_id)
        log.info("holder %s, study %s: the signed c1 parts of %d owners (%d chunks) verified and kept", self.name,
                 study_id, len(uploads), chunks)
        return chunks

    def issue_shares(self, *, study_id: str, release_id: str, release_epsilon: float, measurement: Measurement,
                     contract_hash: str, chunk_count: int, charge_log: str = "",
                     participants: Sequence[int] = ()) -> tuple[MeasurementShares, Charge | None]:
        """Check the measurement as the single key holder does, charge this holder's ledger, issue one share per chunk.

        The request names the measurement only: each share is computed on the measured chunk's
        c1 as the owners signed it (forwarded once per study, `accept_uploads`), so nothing the
        computation server chooses reaches s_i; `chunk_count` must be the measurement's count
        of measured chunks.
        Privacy: charges `charged_epsilon(contract, measurement)` (epsilon of a measurement of L1
        sensitivity `measurement.sensitivity` under the neighbouring relation add/remove of one
        person with at most c records, times 1 + L) to this holder's own ledger before any share leaves, or claims
        a paid direct range; the DP noise is this holder's `discrete_laplace_share` of the
        measurement's scale for K - T holders (T the contract's noise_tolerates) on each
        measured value: any K - T holders' shares sum to at least one discrete Laplace draw
        (the single key holder's draw), so the values stay epsilon-DP against the combiner
        with up to T holders; all K sum to K/(K - T) draws' variance. Drawn first from its own
        noise key keyed by the request, so only this holder knows it; the combiner sees only the sum.
        t-of-N key: the request's charge must be in the study's signed `charge_log` with this holder
        among its `participants` (`ChargeBook.authorize`), at exactly this measurement's charged
        epsilon; the DP share is drawn for the t participants (any t - T of them sum to a full draw),
        keyed by the request and the participant set; the share uses this holder's Lagrange-weighted
        key share for that set (`shamir.participant_secret`), so only those t shares combine.
        """
        handler = self.require_active()
        assert self.holder is not None and self.holder.uploads is not None
        contract = handler.get_study(study_id)
        self.check_contract(contract)
        parts = tuple(sorted(int(p) for p in participants))
        if self.threshold is None and (charge_log or parts):
            raise InvalidInputError(f"key-share holder {self.name} holds an N-of-N key share: a request names no "
                                    "charge log or participants")
        slots = handler.backend.slots
        chunk_index = [int(i) for i in measurement.measured_chunks(slots)]
        if int(chunk_count) != len(chunk_index):
            raise InvalidInputError(f"the request announces {chunk_count} chunks; measurement {measurement.kind} "
                                    f"measures {len(chunk_index)}: nothing was charged or decrypted")
        spec_json = measurement_json(measurement)  # once: a 1M-bin partition's spec is megabytes
        k = len(self.holders)
        if self.threshold is not None:  # the charge in the signed log, before anything is computed for the set
            assert self.charges is not None
            request = charge_request(study_id, release_id, float(release_epsilon), spec_json)
            signed = self.charges.authorize(study_id, request, load_log(charge_log))
            if tuple(signed.entry.participants) != parts:
                raise FailedPreconditionError(f"the request names participants {list(parts)}; its charge fixed "
                                              f"{list(signed.entry.participants)}: nothing was decrypted")
            want = charge_epsilon(charged_epsilon(contract, measurement, float(release_epsilon)))
            if signed.entry.epsilon != want:
                raise FailedPreconditionError(f"the request's charge spends {float(signed.entry.epsilon):.12g}; this "
                                              f"measurement costs {float(want):.12g}: nothing was decrypted")
            k = self.threshold  # the t participants' shares make the draw
        # c1 s_i (t-of-N: c1 lambda_j S_j) of every measured chunk (FailedPrecondition when no c1 parts were forwarded)
        # (pooled: only the signed c1's public digests here; the workers compute c1 s_i with the shares, before the
        # charge, in `measurement_shares`)
        pooled = self.holder.pooled(len(chunk_index))
        bound = [self.holder.bound(study_id, i) if pooled else self.holder.product(study_id, i, parts)[2]
                 for i in chunk_index]
        digest = chunks_digest(bound, chunk_index)
        label = measurement_label(study_id, release_id, float(release_epsilon), spec_json, digest)
        if parts:
            label += b"|participants=" + ",".join(str(p) for p in parts).encode()
        with self.holder._lock:
            repeat = answered(self.holder, label)
        if not repeat:  # an identical request answered before was checked and charged then
            handler.check_measurement(contract, measurement, len(chunk_index), contract_hash=contract_hash,
                                      release_id=release_id, release_epsilon=float(release_epsilon),
                                      reserve=self.threshold is None)  # t-of-N: the signed log is the budget check
        if measurement.scale > MAX_NOISE_SCALE:
            raise InvalidInputError(f"measurement epsilon {measurement.epsilon:.6g} is too small for sensitivity "
                                    f"{measurement.sensitivity}: nothing was charged or decrypted")
        noise = np.zeros(measurement.domain_size, dtype=np.int64)
        d = np.zeros(measurement.count, dtype=np.int64)
        if contract.noise_parties == 2:  # the share is drawn before anything is charged or decrypted
            # NB(1/(K - T)) per side: any K - T holders' shares sum to at least one full discrete Laplace draw
            d = tolerant_share(measurement.scale, k, contract.noise_tolerates, measurement.count,
                               holder_noise_source(self.noise_key, self.index, len(self.holders), b"dp/" + label))
        prefix = isinstance(measurement, RangeCount) and measurement.lo > 0
        if prefix:
            # The combiner sees the prefix slot P[lo-1] + mu, and mu is its own mask: this holder's uniform pad r on
            # both slots (the slot map is a running sum) hides the prefix from any coalition missing one holder,
            # and cancels in the released count P[hi-1] - P[lo-1]. A one-time pad, no DP noise, nothing charged.
            pad = KeyedRandom(self.noise_key, b"dpagg/threshold/prefix-pad/v1" + hashlib.sha256(label).digest(),
                              stream=NOISE_STREAM).integers(DEFAULT_PLAIN_MODULUS, 1)
            d = np.concatenate([np.asarray(pad, dtype=np.int64), d])
        if contract.noise_parties == 2 or prefix:
            noise = np.asarray(measurement.noise_slots(d, DEFAULT_PLAIN_MODULUS), dtype=np.int64)
        detail = decryption_detail(contract, measurement, digest, spec_json=spec_json)
        paid: list[Charge] = []

        def charge() -> None:
            """Book this measurement in this holder's ledger (or claim its paid direct range).

            Privacy: spends charged_epsilon (epsilon x (1 + L)) for sensitivity
            `measurement.sensitivity`, neighbouring relation add/remove of one person with at
            most c records; a direct range was paid by ChargeDirectQueries. Draws no noise, so
            nobody knows noise from it.
            """
            if isinstance(measurement, RangeCount) and self.threshold is not None:
                return  # t-of-N: the range's own charge in the signed log paid it (each range in full)
            if isinstance(measurement, RangeCount):
                handler.ledger.claim_direct_decryption(study_id, release_id, measurement.lo, measurement.hi,
                                                       measurement.epsilon, detail)
            else:
                # t-of-N: the signed log (checked above, by every signer) is the budget check, and a failed
                # release holds nothing there: this ledger records what this holder answered, reserving nothing
                paid.append(handler.ledger.charge(study_id, release_id, measurement.kind,
                                                  charged_epsilon(contract, measurement, float(release_epsilon)),
                                                  float(release_epsilon), detail, reserve=self.threshold is None))

        used = measurement.measured_slots()
        measured = np.ones(measurement.domain_size, dtype=bool) if used is None else np.asarray(used, dtype=bool)
        result = measurement_shares(self.holder, label, study_id, chunk_index, noise, measured, slots, charge,
                                    participants=parts)
        if not isinstance(measurement, RangeCount):  # paid direct ranges may follow a batch that spent the rest
            result = MeasurementShares(self._then_retire(study_id, result.shares), result.repeated)
        log.info("holder %s, study %s, request %s: %s %s shares of %s (%d chunks)", self.name, study_id, release_id,
                 "re-issues identical" if result.repeated else "issued", len(chunk_index), measurement.kind,
                 len(chunk_index))
        return result, (paid[0] if paid else None)

    def _then_retire(self, study_id: str, shares: Iterator[bytes]) -> Iterator[bytes]:
        """`shares`, then the study's key share erased when this measurement ended the study (`retire_if_ended`).
        An erasure that fails is logged (the shares are out; the next start erases it)."""
        yield from shares
        try:
            self.retire_if_ended(study_id)
        except OSError as exc:
            log.warning("holder %s: study %s ended but its key share was not erased: %s", self.name, study_id, exc)
