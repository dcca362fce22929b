"""A key-share holder's state: its key store, its side of the key setup, its share decisions.

A holder is a decryption server in key-share mode (`dpagg serve-decryption --key-share NAME
--holders N1,N2,...`). It keeps, in its own data directory:

- `keys/threshold_secret.bin` (mode 0600): its secret share s_i, written only once the setup's
  test decryption succeeded; never served;
- `keys/collective_key.bin` and `keys/collective.json`: the collective public key, the holder
  list, this holder's index and the collective key fingerprint (found again after a restart);
- its own noise key and its own SQLite ledger, as the single decryption server does.

A t-of-N key (`dpagg setup-key --threshold t`, t > N/2) keeps S_j, the holder's Shamir share of the
key (`he_partition.he.threshold.shamir`), in `threshold_secret.bin` instead, and `collective.json`
records t and every holder's identity keys (seal and signing: what charge signatures verify under).
Each share request then carries the study's signed charge log and the participant set its charge
fixed (`charges.ChargeBook`): the holder signs charges (`sign_charge`) and issues shares only
within that log, so no routing of requests to different holders overspends a budget.

The collective key fingerprint every contract carries is the SHA-256 of the public TenSEAL
context built around the collective key (`threshold.context.collective_context`, deterministic
bytes): what owners already check (`context_fingerprint` of the context they download), and it
binds the key. Once the key is active, studies, budgets and direct-query charges go through the
single decryption server's `DecryptionHandler` over this holder's ledger (its public "key
material" is the collective context); decryption goes through `issue_shares` only.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Sequence

import numpy as np

from he_partition.core.errors import InvalidInputError
from he_partition.core.backend import DEFAULT_PLAIN_MODULUS
from he_partition.core.measurements import Measurement, RangeCount
from he_partition.core.noise import CipherRandom, KeyedRandom
from he_partition.core.noise_shares import holder_noise_source, tolerant_share
from he_partition.he.bfv import context_fingerprint, generate_secret_context
from he_partition.he.bfv import load_context
from he_partition.he.threshold.context import collective_context_bytes
from he_partition.he.threshold.keys import HolderSecret
from he_partition.he.threshold.setup import HolderSetup
from he_partition.protocol import MAX_NOISE_SCALE

from ...common.approval import ApprovalBook
from ...common.contract import StudyContract, canonical_json, charged_epsilon
from ...common.errors import FailedPreconditionError
from ...common.util import write_file_atomic, write_private_file
from ..handler import NOISE_STREAM, DecryptionHandler, decryption_detail
from ..keys import KeyMaterial

from .holder import (MeasurementShares, ThresholdHolder, answered, chunks_digest, measurement_label,
                       measurement_shares)
from ...common.sealing import Commitment, SealKeyPair
from ..commitments import CommitmentBook
from .uploads import OwnerC1Parts, UploadC1Book
from ..ledger import Charge
from ..receipts import ReceiptSigner
from .charges import ChargeBook, ChargeEntry, ChargeRules, charge_request, load_log
from .resharing import HolderIdentity, deal_message, identities_digest, open_deal_message

__all__ = ["ActiveKey", "KeyShareService", "holder_index"]

log = logging.getLogger("dpagg.decryption.keyshare")

SECRET_FILE = "threshold_secret.bin"
PUBLIC_FILE = "collective_key.bin"
META_FILE = "collective.json"
#: The refusal of the full-key RPCs on a holder, and of joins in threshold mode.
JOINS_SINGLE_HOLDER = ("joins use a single key holder: the join scheme needs relinearization keys, whose "
                       "collective (two-round) protocol is not built (docs/threshold.md, section 8); run join "
                       "studies against a single decryption server")


def holder_index(name: str, holders: Sequence[str]) -> int:
    """This holder's index in the configured list (K >= 2 distinct names, `name` one of them)."""
    names = list(holders)
    if len(names) < 2 or len(set(names)) != len(names):
        raise InvalidInputError(f"--holders needs at least 2 distinct names, got {names}")
    if name not in names:
        raise InvalidInputError(f"--key-share {name!r} is not in --holders {','.join(names)}")
    return names.index(name)


@dataclass(frozen=True)
class ActiveKey:
    """An active collective key as one holder keeps it."""

    holders: tuple[str, ...]
    index: int
    public_key: bytes
    context: bytes
    fingerprint: str
    secret: HolderSecret


class KeyShareService:
    """One holder: setup state, the active key (from disk after a restart), the share decisions."""

    def __init__(self, name: str, holders: Sequence[str], data_dir: Path, noise_key: bytes, *,
                 require_signed: bool = False, operator_keys: Sequence[bytes] = ()) -> None:
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
        self.setup: HolderSetup | None = None
        self.active: ActiveKey | None = None
        self.holder: ThresholdHolder | None = None
        self.handler: DecryptionHandler | None = None
        self._lock = threading.Lock()
        # The X25519 key owners seal their upload keys to, and the sealed studies' closed commitment sets.
        self.seal = SealKeyPair.load_or_create(self.keys_dir)
        #: This holder's Ed25519 key (its receipt key): signs its receipts, t-of-N charges and dealt sub-shares.
        self.signer = ReceiptSigner.load_or_create(self.keys_dir)
        #: t of an active t-of-N key (None: N-of-N), every holder's identity keys, and this holder's charge book.
        self.threshold: int | None = None
        self.identities: dict[int, HolderIdentity] = {}
        self.charges: ChargeBook | None = None
        self._setup_identities: dict[int, HolderIdentity] = {}
        self.commitments = CommitmentBook(self.seal, self.index, len(self.holders), Path(data_dir) / "commitments")
        self._load()

    # -- key store ------------------------------------------------------------------------
    def _load(self) -> None:
        meta_path = self.keys_dir / META_FILE
        if not meta_path.exists():
            return
        meta = json.loads(meta_path.read_text())
        if tuple(meta["holders"]) != self.holders or int(meta["index"]) != self.index:
            raise InvalidInputError(f"the collective key in {self.keys_dir} is for holders {meta['holders']} "
                                    f"(this one index {meta['index']}), not the configured {list(self.holders)}")
        secret = HolderSecret.from_bytes(self.template, (self.keys_dir / SECRET_FILE).read_bytes())
        public = (self.keys_dir / PUBLIC_FILE).read_bytes()
        if meta.get("threshold"):
            self.threshold = int(meta["threshold"])
            self.identities = {int(h): HolderIdentity.from_bytes(bytes.fromhex(v), int(h))
                               for h, v in meta["identities"].items()}
        self._activate(public, secret)
        if self.active is None or self.active.fingerprint != meta["fingerprint"]:
            raise InvalidInputError(f"the collective key in {self.keys_dir} does not match its recorded fingerprint")

    def _activate(self, public_key: bytes, secret: HolderSecret) -> None:
        data = collective_context_bytes(public_key)
        ctx = load_context(data)
        fp = context_fingerprint(data)
        self.active = ActiveKey(self.holders, self.index, public_key, data, fp, secret)
        self.holder = ThresholdHolder(self.template, secret, len(self.holders), bytes.fromhex(fp), self.noise_key,
                                      self.ledger_path, uploads=UploadC1Book(self.template, self.c1_dir))
        self.handler = DecryptionHandler(self.holder.ledger, KeyMaterial(ctx, data), CipherRandom(),
                                         require_signed=self.require_signed, noise_key=self.noise_key,
                                         key_holders=len(self.holders), approvals=self.approvals)
        if self.threshold is not None:  # any t answer: the coalition the holders' noise tolerates is t - 1
            self.handler.max_noise_tolerates = self.threshold - 1
        if self.threshold is not None:
            rules = ChargeRules({h: i.signing for h, i in self.identities.items()}, self.threshold)
            self.charges = ChargeBook(self.index, self.signer._private, rules, self.keys_dir.parent / "charges.sqlite3")

    def _persist(self, setup: HolderSetup) -> None:
        assert setup.secret is not None
        self.keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private_file(self.keys_dir / SECRET_FILE, setup.secret.to_bytes())
        write_file_atomic(self.keys_dir / PUBLIC_FILE, setup.public_key)
        if setup.threshold is not None:
            self.threshold, self.identities = setup.threshold, dict(self._setup_identities)
        self._activate(setup.public_key, setup.secret)
        assert self.active is not None
        meta = {"holders": list(self.holders), "index": self.index, "fingerprint": self.active.fingerprint}
        if self.threshold is not None:
            meta.update(threshold=self.threshold, identities_sha256=identities_digest(self.identities),
                        identities={str(h): i.to_bytes().hex() for h, i in sorted(self.identities.items())})
        write_file_atomic(self.keys_dir / META_FILE, json.dumps(meta).encode())
        log.info("holder %s: collective key %s active", self.name, self.active.fingerprint[:16])

    def close(self) -> None:
        if self.holder is not None:
            self.holder.close()
        if self.charges is not None:
            self.charges.close()

    @property
    def identity(self) -> HolderIdentity:
        return HolderIdentity(self.seal.public, self.signer.public_key)

    def require_active(self) -> DecryptionHandler:
        """The study/budget handler over this holder's ledger; FAILED_PRECONDITION before the key setup."""
        if self.handler is None:
            raise FailedPreconditionError(f"key-share holder {self.name} has no collective key yet: run "
                                          "`dpagg setup-key --computation HOST:PORT` first")
        return self.handler

    # -- key setup ------------------------------------------------------------------------
    def key_setup(self, step: str, session: bytes, holders: Sequence[str], messages: dict[int, bytes],
                  ciphertext: bytes, values: Sequence[int], *, threshold: int = 0,
                  participants: Sequence[int] = ()) -> tuple[bytes, str, str]:
        """One setup step: (this holder's message, fingerprint, state). See `HolderSetup` for the rounds.

        t-of-N (`threshold` > 0 at commit_seed): "deal" takes every holder's identity keys (as each
        reported them) and returns this holder's sub-shares, each sealed to its recipient and signed;
        "receive" takes every dealer's message and keeps S_j; "test_share" is asked once per
        participant set that holds this holder."""
        with self._lock:
            if step == "status":  # the servicer adds this holder's seal key
                return b"", self.active.fingerprint if self.active else "", "active" if self.active else (
                    self.setup.state if self.setup else "none")
            if tuple(holders) != self.holders:
                raise InvalidInputError(f"the setup names holders {list(holders)}; holder {self.name} is configured "
                                        f"with {list(self.holders)}: setup refused")
            if self.active is not None:
                raise FailedPreconditionError(f"holder {self.name} already has an active collective key "
                                              f"{self.active.fingerprint[:16]}: it is not replaced")
            if step == "commit_seed":
                self.setup = HolderSetup(self.template, session, self.index, list(range(len(self.holders))),
                                         int(threshold) or None)
                return self.setup.commit_seed(), "", self.setup.state
            s = self.setup
            if s is None or not hmac.compare_digest(s.session, session):
                raise InvalidInputError(f"holder {self.name} has no setup session {session.hex()[:16]}: setup stopped")
            if step == "reveal_seed":
                return s.reveal_seed(messages), "", s.state
            if step == "commit_key":
                return s.commit_key(messages), "", s.state
            if step == "reveal_key":
                return s.reveal_key(messages), "", s.state
            if step == "build_key":
                s.build_key(messages)
                return s.fingerprint, context_fingerprint(collective_context_bytes(s.public_key)), s.state
            if step == "deal":
                idents = {h: HolderIdentity.from_bytes(m, h) for h, m in messages.items()}
                if idents.get(self.index) != self.identity:
                    raise InvalidInputError(f"the setup's identity list names other keys for holder {self.name} "
                                            "than its own: setup stopped (the relay swapped keys)")
                if sorted(idents) != list(range(len(self.holders))):
                    raise InvalidInputError(f"the setup's identity list covers holders {sorted(idents)}, not all "
                                            f"{len(self.holders)}: setup stopped")
                self._setup_identities = idents
                return deal_message(s.deal_subshares(), idents, session, self.index, self.signer._private), "", s.state
            if step == "receive":
                subs = {dealer: open_deal_message(self.template, m, session=session, dealer=dealer,
                                                  recipient=self.index, identities=self._setup_identities,
                                                  own_seal=self.seal) for dealer, m in messages.items()}
                s.receive_subshares(subs)
                return b"", "", s.state
            if step == "test_share":
                return s.test_share(ciphertext, [int(p) for p in participants] or None), "", s.state
            if step == "confirm":
                s.confirm([int(v) for v in values])
                self._persist(s)
                self.setup = None
                assert self.active is not None
                return b"", self.active.fingerprint, "active"
            raise InvalidInputError(f"unknown key setup step {step!r}")

    # -- studies and shares ---------------------------------------------------------------
    def check_contract(self, contract: StudyContract) -> None:
        """Refuse a contract that names another key than this holder's collective key (or a join), or whose
        noise_tolerates is not below the K holders."""
        assert self.active is not None
        if contract.is_join:
            raise FailedPreconditionError(JOINS_SINGLE_HOLDER)
        try:
            contract.check_key_holders(len(self.holders))
        except InvalidInputError as exc:
            raise FailedPreconditionError(f"study {contract.study_id}: {exc}; nothing was decrypted") from exc
        if not hmac.compare_digest(contract.context_fingerprint, self.active.fingerprint):
            raise FailedPreconditionError(f"study {contract.study_id} names key {contract.context_fingerprint[:16]}, "
                                          f"not holder {self.name}'s collective key {self.active.fingerprint[:16]}: "
                                          "nothing was decrypted")
        if contract.signed and not contract.sealed:
            raise FailedPreconditionError(f"study {contract.study_id} is signed but pins no key holder seal keys: "
                                          "key-share holders take only sealed uploads, committed before anyone could "
                                          "read another owner's (open the study through a current computation server)")
        if contract.sealed:
            self.commitments.check_contract(contract)
        if self.threshold is not None and contract.noise_parties == 2 and contract.noise_tolerates >= self.threshold:
            raise FailedPreconditionError(f"study {contract.study_id}: noise_tolerates {contract.noise_tolerates} must "
                                          f"be below t = {self.threshold}: any t holders answer a t-of-N request, and "
                                          "their shares must sum to a full draw; nothing was decrypted")

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
        return self.charges.sign(entry, load_log(log_json), Fraction(contract.epsilon))

    def close_uploads(self, study_id: str, contract_hash: str, commitments: list[Commitment]) -> list[bytes]:
        """Close `study_id`'s uploads on `commitments` (`CommitmentBook.close`): this holder's upload key shares."""
        handler = self.require_active()
        contract = handler.get_study(study_id)
        self.check_contract(contract)
        if not hmac.compare_digest(contract_hash, contract.contract_hash):
            raise FailedPreconditionError(f"the commitments name another contract than study {study_id}'s")
        shares = self.commitments.close(contract, commitments)
        log.info("holder %s, study %s: uploads closed on %d owners' commitments", self.name, study_id,
                 len(commitments))
        return shares

    def accept_uploads(self, study_id: str, contract_hash: str, uploads: list[OwnerC1Parts]) -> int:
        """Keep the expected c1 of every chunk of `study_id` from the owners' signed c1 parts (`UploadC1Book.accept`)."""
        handler = self.require_active()
        assert self.holder is not None and self.holder.uploads is not None
        contract = handler.get_study(study_id)
        self.check_contract(contract)
        if not hmac.compare_digest(contract_hash, contract.contract_hash):
            raise FailedPreconditionError(f"the forwarded uploads name another contract than study {study_id}'s")
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
        assert self.holder is not None and self.active is not None and self.holder.uploads is not None
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
        spec_json = canonical_json(measurement.to_dict())  # once: a 1M-bin partition's spec is megabytes
        k = len(self.holders)
        if self.threshold is not None:  # the charge in the signed log, before anything is computed for the set
            assert self.charges is not None
            request = charge_request(study_id, release_id, float(release_epsilon), spec_json)
            signed = self.charges.authorize(study_id, request, load_log(charge_log))
            if tuple(signed.entry.participants) != parts:
                raise FailedPreconditionError(f"the request names participants {list(parts)}; its charge fixed "
                                              f"{list(signed.entry.participants)}: nothing was decrypted")
            want = Fraction(charged_epsilon(contract, measurement, float(release_epsilon)))
            if signed.entry.epsilon != want:
                raise FailedPreconditionError(f"the request's charge spends {float(signed.entry.epsilon):.12g}; this "
                                              f"measurement costs {float(want):.12g}: nothing was decrypted")
            k = self.threshold  # the t participants' shares make the draw
        # c1 s_i (t-of-N: c1 lambda_j S_j) of every measured chunk (FailedPrecondition when no c1 parts were forwarded)
        bound = [self.holder.product(study_id, i, parts)[2] for i in chunk_index]
        digest = chunks_digest(bound, chunk_index)
        label = measurement_label(study_id, release_id, float(release_epsilon), spec_json, digest)
        if parts:
            label += b"|participants=" + ",".join(str(p) for p in parts).encode()
        with self.holder._lock:
            repeat = answered(self.holder, label)
        if not repeat:  # an identical request answered before was checked and charged then
            handler.check_measurement(contract, measurement, len(chunk_index), contract_hash=contract_hash,
                                      release_id=release_id, release_epsilon=float(release_epsilon))
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
                paid.append(handler.ledger.charge(study_id, release_id, measurement.kind,
                                                  charged_epsilon(contract, measurement, float(release_epsilon)),
                                                  float(release_epsilon), detail))

        used = measurement.measured_slots()
        measured = np.ones(measurement.domain_size, dtype=bool) if used is None else np.asarray(used, dtype=bool)
        result = measurement_shares(self.holder, label, study_id, chunk_index, noise, measured, slots, charge,
                                    participants=parts)
        log.info("holder %s, study %s, request %s: %s %s shares of %s (%d chunks)", self.name, study_id, release_id,
                 "re-issues identical" if result.repeated else "issued", len(chunk_index), measurement.kind,
                 len(chunk_index))
        return result, (paid[0] if paid else None)

