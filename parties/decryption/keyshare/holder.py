"""One key-share holder's decision (n-of-n threshold decryption): contract, own ledger, one share.

A `ThresholdHolder` replaces the single decryption server's decision for one of K holders. It
holds its secret s_i (`he_partition.he.threshold.setup`), its own noise key and its own SQLite
ledger (the decryption server's `SqliteLedgerStore`, one file per holder, with a table of the
shares it issued in the same file). It decides alone, in this order, from its own state only:

1. the contract: the study is registered at this holder, the request's contract hash is the
   study's, the study's `context_fingerprint` is the fingerprint of the key this holder built
   for that study (`key_for`: a relay that swapped in its own key, or another study's, gets
   nothing), the measurement's kind is one the
   study's strategy uses, its sensitivity is at least the person bound, its epsilon within the
   release's and the release's within the study's;
2. one share per ciphertext: a request for a ciphertext digest it already answered gets the
   stored answer if it is the same request, a refusal if it is another (see `request_share`);
3. its own ledger, charged first (atomic check-and-charge, refused when the study's budget
   is spent: BudgetExhaustedError, nothing issued);
4. the share: h_i = c1 s_i + smudging + Delta * (its discrete Laplace share on the measured
   slots, its own uniform pad on every other slot: the combiner knows the CS's pads, so without
   the holders' pads it would read the unmeasured slots, which carry data), all from its noise
   key and the request, stored, then returned.

`request_share` decides for one ciphertext with its DP share on its leading slots (the library
form); `measurement_shares` for a whole measurement of a release or a direct query (the service
form, `parties.decryption.keyshare.servicer`): one charge per measurement, the DP share drawn on
the measured values and mapped to slots by the measurement's public map, one share per chunk.
With a worker pool (`pool`, `share_workers`) a measurement of MIN_POOLED_CHUNKS chunks or more has
its shares computed on the holder's local workers before the charge and held here until it commits.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import numpy.typing as npt

from he_partition.core.errors import InvalidInputError
from he_partition.core.noise import KeyedRandom, laplace_scale
from he_partition.core.noise_shares import holder_noise_source, tolerant_share
from he_partition.he.threshold.c1 import C1Part, c1_digest
from he_partition.he.threshold.decrypt import decryption_share, padded_noise, secret_product
from he_partition.he.threshold.keys import HolderSecret
from he_partition.he.threshold.shamir import participant_secret
from he_partition.he.threshold.wire import ciphertext_digest
from he_partition.protocol import STRATEGY_MEASUREMENT_KINDS

from ...common.contract import StudyContract, canonical_json, check_id
from ...common.errors import FailedPreconditionError
from ...common.util import utc_now
from ..handler import NOISE_STREAM
from .share_workers import ShareTask, noised_chunk_share, pooled_shares
from .uploads import UploadC1Book
from ..ledger import SqliteLedgerStore
from ..workers import DecryptPool, KeyRef

__all__ = ["MeasurementShares", "ShareRequest", "StudyKeys", "ThresholdHolder"]

#: Study id -> (this holder's share of the study's key, the key's fingerprint); FailedPreconditionError when the
#: holder holds no key for the study (`KeyShareService.key_of`).
StudyKeys = Callable[[str], "tuple[HolderSecret, bytes]"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS threshold_requests (
    label_digest TEXT PRIMARY KEY,
    label TEXT NOT NULL,
    chunks INTEGER NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS threshold_shares (
    ciphertext_digest TEXT PRIMARY KEY,
    request TEXT NOT NULL,
    share BLOB NOT NULL,
    created_at TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class ShareRequest:
    """What a holder is asked to decrypt: one ciphertext of one measurement of one release.

    `slots`: how many leading slots of the ciphertext hold measured values (they get the DP
    share; the rest, pads, get none). `key_fingerprint`: the collective key the requester says
    the ciphertext is under (32 bytes), checked against the contract and the holder's own key.
    """

    study_id: str
    contract_hash: str
    release_id: str
    release_epsilon: float
    kind: str
    epsilon: float
    sensitivity: int
    slots: int
    key_fingerprint: bytes
    ciphertext: bytes
    #: The chunk of the owners' uploads this ciphertext measures (its expected c1, `UploadC1Book`).
    chunk: int = 0

    def label(self, digest: bytes) -> bytes:
        """Canonical bytes of the request (everything but the ciphertext, which enters as its digest)."""
        return canonical_json({"study_id": self.study_id, "release_id": self.release_id,
                               "release_epsilon": self.release_epsilon, "kind": self.kind, "epsilon": self.epsilon,
                               "sensitivity": self.sensitivity, "slots": self.slots,
                               "ciphertext_digest": digest.hex()}).encode("utf-8")


#: How many chunks' c1 s_i a holder keeps in memory (about 200 MB at 3 primes); older ones are recomputed.
MAX_KEPT_PRODUCTS = 1024


class ThresholdHolder:
    """Holder `secret.holder` of `holders` key-share holders: decides alone whether to issue its share."""

    def __init__(self, ctx: Any, secret: HolderSecret | None, holders: int, key_fingerprint: bytes,
                 noise_key: bytes, ledger_path: Path | str, *, uploads: UploadC1Book | None = None,
                 keys: StudyKeys | None = None, index: int = 0, pool: DecryptPool | None = None,
                 key_files: Callable[[str], Path | None] | None = None) -> None:
        if len(noise_key) < 16:
            raise InvalidInputError(f"a holder's noise key needs at least 16 bytes, got {len(noise_key)}")
        if secret is not None and len(key_fingerprint) != 32:
            raise InvalidInputError(f"a collective key fingerprint has 32 bytes, got {len(key_fingerprint)}")
        if secret is None and keys is None:
            raise InvalidInputError("a holder needs a key share or a study key store")
        self.ctx, self.secret, self.holders = ctx, secret, int(holders)
        self.index = secret.holder if secret is not None else int(index)
        self.key_fingerprint = bytes(key_fingerprint)
        #: study id -> (this holder's share of the study's key, the key's fingerprint): a key per study. Without
        #: one, every study is under `secret` (the library form; a deployment's legacy collective key).
        self._keys = keys
        self._noise_key = bytes(noise_key)
        self.ledger = SqliteLedgerStore(ledger_path)
        self._db = sqlite3.connect(Path(ledger_path), isolation_level=None, check_same_thread=False, timeout=30.0)
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()
        #: The owners' signed c1 parts (the defence against a chosen ciphertext): with a
        #: book, every ciphertext must carry its chunk's aggregate c1 before anything is charged,
        #: and a measurement's shares are computed on those c1 (`product`).
        self.uploads = uploads
        #: (study, chunk, participants) -> (c1 s_i, primes, c1 digest) of the signed aggregate c1: secret, memory
        #: only (participants () for an N-of-N key).
        self._products: dict[tuple[str, int, tuple[int, ...]], tuple[npt.NDArray[np.uint64], list[int], bytes]] = {}
        #: t-of-N: participant set -> lambda_j S_j (`shamir.participant_secret`): secret, memory only.
        self._weighted: dict[tuple[bytes, tuple[int, ...]], HolderSecret] = {}
        #: (study, chunk) -> c1_digest of the signed aggregate c1 (public), for pooled measurements.
        self._bounds: dict[tuple[str, int], bytes] = {}
        #: The local workers computing a large measurement's shares (`share_workers.holder_pool`, closed by whoever
        #: made it); None: in-process.
        self.pool = pool
        #: Study id -> this holder's key share file in its key store (mode 0600), or None (no file: the workers
        #: get the share's bytes through their pipe).
        self._key_files = key_files

    def pooled(self, chunk_count: int) -> bool:
        """Whether a measurement of `chunk_count` chunks (public) has its shares computed on the workers."""
        return self.pool is not None and self.pool.uses_pool(chunk_count)

    def key_ref(self, study_id: str) -> KeyRef:
        """What names the study's key share to a worker: its key store file, else its bytes (in-memory holders)."""
        path = self._key_files(study_id) if self._key_files is not None else None
        return str(path) if path is not None else self.key_for(study_id)[0].to_bytes()

    def bound(self, study_id: str, chunk: int) -> bytes:
        """c1_digest of chunk `chunk`'s signed aggregate c1: what its shares are bound to (public; no c1 s_i made).
        FailedPreconditionError as `product` when no c1 parts were forwarded for the study."""
        got = self._bounds.get((study_id, int(chunk)))
        if got is None:
            if self.uploads is None:
                raise FailedPreconditionError("this holder keeps no owners' c1 parts: it cannot compute shares of a "
                                              "measurement")
            got = c1_digest(self.uploads.expected(study_id, int(chunk)))
            with self._lock:
                self._bounds[(study_id, int(chunk))] = got
        return got

    def key_for(self, study_id: str) -> tuple[HolderSecret, bytes]:
        """(this holder's share, the key fingerprint) of the key `study_id` is under (FailedPrecondition: none)."""
        if self._keys is not None:
            return self._keys(study_id)
        assert self.secret is not None
        return self.secret, self.key_fingerprint

    def _secret_for(self, study_id: str, participants: tuple[int, ...]) -> HolderSecret:
        """The study's s_i (N-of-N, `participants` empty), or lambda_j S_j for a t-of-N participant set (made once
        per key and set)."""
        secret, fp = self.key_for(study_id)
        if not participants:
            return secret
        with self._lock:
            got = self._weighted.get((fp, participants))
        if got is None:
            got = participant_secret(self.ctx, secret, participants)
            with self._lock:
                self._weighted[(fp, participants)] = got
        return got

    def product(self, study_id: str, chunk: int,
                participants: tuple[int, ...] = ()) -> tuple[npt.NDArray[np.uint64], list[int], bytes]:
        """(c1 s_i, the level's primes, c1_digest) for chunk `chunk` of `study_id`: c1 the owners' signed aggregate.

        The same for every measurement of the chunk (only the noise differs), so it is computed
        once (`secret_product`) and kept in this process's memory; never stored or sent. With a
        t-of-N key and a participant set, c1 lambda_j S_j for that set, computed and kept alike
        (every measurement of a release usually goes to the same set).
        FailedPreconditionError when no c1 parts were forwarded for the study.
        """
        key = (study_id, int(chunk), tuple(participants))
        got = self._products.get(key)
        if got is None:
            if self.uploads is None:
                raise FailedPreconditionError("this holder keeps no owners' c1 parts: it cannot compute shares of a "
                                              "measurement")
            expected: C1Part = self.uploads.expected(study_id, int(chunk))
            parms = [int(x) for x in self.ctx.seal_context().data.first_parms_id()]
            got = (secret_product(self.ctx, self._secret_for(study_id, tuple(participants)), parms, expected),
                   self.uploads.moduli, c1_digest(expected))
            self.keep_product(key, got)
        return got

    def keep_product(self, key: tuple[str, int, tuple[int, ...]],
                     got: tuple[npt.NDArray[np.uint64], list[int], bytes]) -> None:
        """Keep one chunk's (c1 s_i, primes, c1 digest) in memory, the oldest dropped past MAX_KEPT_PRODUCTS."""
        with self._lock:
            while len(self._products) >= MAX_KEPT_PRODUCTS:  # the oldest first (196 KB each at 3 primes)
                del self._products[next(iter(self._products))]
            self._products[key] = got

    def forget_products(self, study_id: str) -> None:
        """Drop the kept c1 s_i of `study_id` (new c1 parts were forwarded)."""
        with self._lock:
            for key in [k for k in self._products if k[0] == study_id]:
                del self._products[key]
            for bound in [k for k in self._bounds if k[0] == study_id]:
                del self._bounds[bound]

    def forget_key(self, fingerprint: bytes) -> None:
        """Drop the kept Lagrange-weighted shares of the key `fingerprint` (its study's key was erased)."""
        with self._lock:
            for key in [k for k in self._weighted if k[0] == fingerprint]:
                del self._weighted[key]

    def close(self) -> None:
        """Close the ledger (the pool is its owner's to close: `KeyShareService.close`)."""
        self.ledger.close()
        self._db.close()

    def register_study(self, contract: StudyContract) -> None:
        """Accept a study whose contract names this holder's collective key (by fingerprint) and whose
        noise_tolerates is below this deployment's K holders."""
        if not hmac.compare_digest(contract.context_fingerprint, self.key_for(contract.study_id)[1].hex()):
            raise FailedPreconditionError(f"study {contract.study_id} names key {contract.context_fingerprint[:16]}..., "
                                          "not this holder's collective key: not registered")
        try:
            contract.check_key_holders(self.holders)
        except InvalidInputError as exc:
            raise FailedPreconditionError(f"study {contract.study_id}: {exc}; not registered") from exc
        self.ledger.create_study(contract)

    def check_request(self, contract: StudyContract, req: ShareRequest) -> None:
        """Refuse a request that does not fit the study's contract, before the ledger or the ciphertext is touched."""
        check_id("release_id", req.release_id)
        if not hmac.compare_digest(req.contract_hash, contract.contract_hash):
            raise FailedPreconditionError(f"the request's contract hash differs from study {contract.study_id}'s: "
                                          "nothing was decrypted")
        fp = self.key_for(contract.study_id)[1]
        if not hmac.compare_digest(bytes(req.key_fingerprint), fp) or \
                not hmac.compare_digest(contract.context_fingerprint, fp.hex()):
            raise FailedPreconditionError("the request is not under this holder's collective key: nothing was decrypted")
        try:
            contract.check_key_holders(self.holders)
        except InvalidInputError as exc:
            raise FailedPreconditionError(f"study {contract.study_id}: {exc}; nothing was decrypted") from exc
        if contract.correlation_leakage:
            raise FailedPreconditionError(f"study {contract.study_id} has correlated records (L > 0): threshold holders "
                                          "do not decrypt such studies yet")
        kinds = STRATEGY_MEASUREMENT_KINDS.get(contract.strategy, frozenset())
        if req.kind not in kinds:
            raise FailedPreconditionError(f"measurement kind {req.kind!r} is not used by study {contract.study_id}'s "
                                          f"strategy {contract.strategy!r}: nothing was decrypted")
        if isinstance(req.sensitivity, bool) or not isinstance(req.sensitivity, int) or \
                req.sensitivity < contract.person_bound:
            raise InvalidInputError(f"measurement sensitivity must be an integer >= the study's person bound "
                                    f"{contract.person_bound}, got {req.sensitivity!r}")
        if not 0 < req.epsilon <= req.release_epsilon <= contract.epsilon:
            raise InvalidInputError(f"need 0 < measurement epsilon {req.epsilon} <= release epsilon "
                                    f"{req.release_epsilon} <= study epsilon {contract.epsilon}")
        if isinstance(req.slots, bool) or not isinstance(req.slots, int) or not 1 <= req.slots <= self._slot_count():
            raise InvalidInputError(f"measured slots must be in [1, {self._slot_count()}], got {req.slots!r}")

    def _slot_count(self) -> int:
        return int(self.ctx.seal_context().data.first_context_data().parms().poly_modulus_degree())

    def request_share(self, req: ShareRequest) -> bytes:
        """This holder's decryption share of `req.ciphertext` with its DP share, after its contract and ledger checks.

        Privacy: charges `req.epsilon` to this holder's own ledger before anything else is
        computed (BudgetExhaustedError, nothing issued, when it does not fit). The share adds
        this holder's `discrete_laplace_share` for K - T holders (T the contract's
        noise_tolerates) at scale laplace_scale(sensitivity, epsilon) on the measured slots:
        any K - T holders' shares sum to at least one discrete Laplace draw, so the combined
        values are epsilon-DP for L1 sensitivity `req.sensitivity` under add/remove of one
        person with at most c records (the neighbouring relation; c the contract's person
        bound) against the combiner with up to T holders; all K shares carry K/(K - T)
        draws' variance. Who knows the noise: only this holder knows its DP share and
        its smudging (both drawn from its own noise key, keyed by the request); the combiner sees
        only the sum of all K holders' and its own draw.

        One share per ciphertext. A request for a ciphertext digest this holder already
        answered is answered with the stored share bytes when it is the same request (the
        retry after a lost reply), and refused (FailedPreconditionError) when it is any other
        request. Why not a fresh share: two shares of one ciphertext with independent smudging
        and DP shares let the combiner average (or difference) them, shrinking this holder's
        noise -- the averaging attack; the identical bytes give it nothing it does not have,
        and a refusal of a different request for the same digest stops it from buying a
        second, independent DP share under another release id. Both noises are keyed by the
        request, so even a holder whose share table was rolled back with its ledger reissues
        the identical bytes, never a second independent share. A new ciphertext (a
        re-randomized one included) is a new request and is charged again: averaging across
        ciphertexts costs budget.
        """
        check_id("study_id", req.study_id)
        digest = ciphertext_digest(bytes(req.ciphertext))
        label = req.label(digest)
        with self._lock:
            contract = self.ledger.get_study(req.study_id)
            self.check_request(contract, req)
            if self.uploads is not None:  # before the ledger and before any share: a chosen c1 gets nothing
                self.uploads.check(req.study_id, [bytes(req.ciphertext)], [req.chunk])
            stored = self._db.execute("SELECT request, share FROM threshold_shares WHERE ciphertext_digest = ?",
                                      (digest.hex(),)).fetchone()
            if stored is not None:
                if stored[0] != label.decode("utf-8"):
                    raise FailedPreconditionError("a share was already issued for this ciphertext under another "
                                                  "request: one share per ciphertext, nothing was decrypted")
                return bytes(stored[1])
            self.ledger.charge(req.study_id, req.release_id, req.kind, float(req.epsilon), float(req.release_epsilon),
                               json.dumps({"holder": self.index, "ciphertext_digest": digest.hex()}))
            scale = laplace_scale(req.sensitivity, req.epsilon)
            # NB(1/(K - T)) per side: any K - T holders' shares sum to at least one full discrete Laplace draw
            noise = tolerant_share(scale, self.holders, contract.noise_tolerates, req.slots,
                                           holder_noise_source(self._noise_key, self.index, self.holders,
                                                               b"dp/" + label))
            # the slots past the measured ones get this holder's own pads: the combiner knows the CS's pads
            n = self._slot_count()
            plain_modulus = int(self.ctx.seal_context().data.first_context_data().parms().plain_modulus().value())
            slot_noise = padded_noise(np.concatenate([noise, np.zeros(n - req.slots, dtype=np.int64)]),
                                      np.arange(n) < req.slots,
                                      KeyedRandom(self._noise_key, b"dpagg/threshold/pads/v1" + label), plain_modulus)
            smudge = KeyedRandom(self._noise_key, b"dpagg/threshold/smudge/v1" + label)
            secret, fp = self.key_for(req.study_id)
            share = decryption_share(self.ctx, secret, fp, bytes(req.ciphertext),
                                     dp_noise=slot_noise, rng=smudge)
            self._db.execute("INSERT INTO threshold_shares (ciphertext_digest, request, share, created_at) "
                             "VALUES (?, ?, ?, ?)", (digest.hex(), label.decode("utf-8"), share, utc_now()))
            return share


@dataclass(frozen=True)
class MeasurementShares:
    """A holder's shares of one measurement's chunks (in order, computed as they are read: the charge is made)
    and whether they answer again an identical, already charged request."""

    shares: Iterator[bytes]
    repeated: bool


def measurement_label(study_id: str, release_id: str, release_epsilon: float, spec_json: str, digest: str) -> bytes:
    """The request label of one measurement: study, release, release epsilon, measurement, what is decrypted.

    `spec_json`: canonical_json(measurement.to_dict()), entering as its SHA-256 (the spec of a
    1M-bin partition is megabytes); `digest`: what the shares decrypt, `chunks_digest` of the
    signed c1 of the measured chunks. Keys every noise of the request (`measurement_shares`).
    """
    return canonical_json({"study_id": study_id, "release_id": release_id, "release_epsilon": release_epsilon,
                           "measurement_sha256": hashlib.sha256(spec_json.encode("utf-8")).hexdigest(),
                           "c1_digest": digest}).encode("utf-8")


def chunks_digest(c1_digests: list[bytes], chunk_index: list[int]) -> str:
    """SHA-256 (hex) over the measured chunks' indices and c1 digests: binds a measurement label to the uploads."""
    h = hashlib.sha256(b"dpagg/threshold/measured-chunks/v1" + len(chunk_index).to_bytes(8, "big"))
    for i, d in zip(chunk_index, c1_digests):
        h.update(int(i).to_bytes(8, "big") + d)
    return h.hexdigest()


def answered(holder: ThresholdHolder, label: bytes) -> bool:
    """True when this holder answered (and charged) the measurement request `label` before."""
    row = holder._db.execute("SELECT label FROM threshold_requests WHERE label_digest = ?",
                             (hashlib.sha256(label).hexdigest(),)).fetchone()
    return row is not None and row[0] == label.decode("utf-8")


def measurement_shares(holder: ThresholdHolder, label: bytes, study_id: str, chunk_index: list[int], noise: Any,
                       measured: Any, slots: int, charge: Any, *,
                       participants: tuple[int, ...] = ()) -> MeasurementShares:
    """This holder's shares of one measurement's chunks, charging `charge()` once before any share is computed.

    Each share is computed on the chunk's c1 as the owners signed it (`ThresholdHolder.product`:
    the sum of their forwarded c1 parts), never on a c1 the computation server sends: the
    request carries no ciphertext, so a chosen c1 cannot reach s_i (docs/threshold.md).
    Privacy: `charge()` books the measurement's epsilon in this holder's own ledger (the
    caller, `KeyShareService.issue_shares`, computed it as the single key holder does:
    sensitivity m.sensitivity, neighbouring relation add/remove of one person with at most c
    records) and raises when it does not fit: no share is then computed (the caller has computed
    every chunk's c1 s_i already, so nothing data-dependent fails after the charge). `noise` (zeros: no DP
    share) is the slot-domain image (the measurement's public map, `Measurement.noise_slots`)
    of this holder's `discrete_laplace_share` of the measurement's scale (for K - T holders, T
    the contract's noise_tolerates) on its values, so any K - T holders' draws add at least one
    discrete Laplace per released value, as the single key holder's draw does; it is drawn from the holder's noise key keyed by `label`, so only this holder
    knows it. Each chunk's share carries its slice of that noise on the `measured` slots, this
    holder's own uniform pad mod t on every other slot (`padded_noise`: the combiner knows the
    CS's pads, so without the holders' it would read the data there) and keyed smudging.
    An identical repeat of an answered request (the retry after a lost reply) gets the
    identical shares again -- every noise is keyed by the request -- and is not charged again.
    `participants` (t-of-N keys): the request's participant set; each share then carries
    c1 lambda_j S_j (this holder's Lagrange weight for the set) in place of c1 s_i.
    With the holder's pool (`ThresholdHolder.pooled`), every share is computed on its local
    workers first (the same bytes, `share_workers`) and held here; `charge()` then runs as
    above, and a refused charge drops them: nothing computed before the charge leaves.
    """
    held: list[bytes] | None = None
    if holder.pooled(len(chunk_index)):
        held = _pooled(holder, label, study_id, chunk_index, noise, measured, slots, participants)
    with holder._lock:
        repeated = answered(holder, label)  # an identical request answered before or meanwhile: charged then
        if not repeated:
            charge()
            holder._db.execute("INSERT INTO threshold_requests (label_digest, label, chunks, created_at) "
                               "VALUES (?, ?, ?, ?)",
                               (hashlib.sha256(label).hexdigest(), label.decode("utf-8"), len(chunk_index), utc_now()))
    if held is not None:
        return MeasurementShares(iter(held), repeated)
    return MeasurementShares(_shares(holder, label, study_id, chunk_index, noise, measured, slots, participants),
                             repeated)


def _chunk_noise(noise: Any, measured: Any, index: int, slots: int) -> tuple[npt.NDArray[np.int64],
                                                                           npt.NDArray[np.bool_]]:
    """Upload chunk `index`'s slice of the holder's slot noise and of the measured mask (zeros/False past the end)."""
    chunk_noise, chunk_mask = np.zeros(slots, dtype=np.int64), np.zeros(slots, dtype=bool)
    part = noise[index * slots:(index + 1) * slots]
    chunk_noise[:len(part)], chunk_mask[:len(part)] = part, measured[index * slots:(index + 1) * slots]
    return chunk_noise, chunk_mask


def _tasks(holder: ThresholdHolder, label: bytes, study_id: str, chunk_index: list[int], noise: Any, measured: Any,
           slots: int, participants: tuple[int, ...]) -> list[ShareTask]:
    """The workers' tasks of `measurement_shares` (one per chunk: the key share's reference, the chunk's kept
    c1 s_i or else its signed c1, the chunk's noise slice; see there for the noise)."""
    assert holder.uploads is not None
    request = hashlib.sha256(label).digest()
    key, fingerprint = holder.key_ref(study_id), holder.key_for(study_id)[1]
    tasks: list[ShareTask] = []
    for index in chunk_index:
        chunk_noise, chunk_mask = _chunk_noise(noise, measured, index, slots)
        kept = holder._products.get((study_id, int(index), tuple(participants)))
        product = kept[0] if kept is not None else None
        c1 = holder.uploads.expected(study_id, index) if product is None else None
        tasks.append((key, fingerprint, tuple(participants), holder.index, c1, product, holder.bound(study_id, index),
                      holder._noise_key, request, index, chunk_noise, chunk_mask, NOISE_STREAM))
    return tasks


def _pooled(holder: ThresholdHolder, label: bytes, study_id: str, chunk_index: list[int], noise: Any, measured: Any,
            slots: int, participants: tuple[int, ...]) -> list[bytes]:
    """`measurement_shares`' shares computed on the holder's workers (before the charge; held by the caller), each
    c1 s_i a worker computed kept for the chunk's next measurement (`ThresholdHolder.product`'s cache)."""
    assert holder.pool is not None and holder.uploads is not None
    answers = pooled_shares(holder.pool, _tasks(holder, label, study_id, chunk_index, noise, measured, slots,
                                                participants))
    for index, (_, made) in zip(chunk_index, answers):
        if made is not None:
            holder.keep_product((study_id, int(index), tuple(participants)),
                                (made, holder.uploads.moduli, holder.bound(study_id, index)))
    return [share for share, _ in answers]


def _shares(holder: ThresholdHolder, label: bytes, study_id: str, chunk_index: list[int], noise: Any, measured: Any,
            slots: int, participants: tuple[int, ...] = ()) -> Iterator[bytes]:
    """The shares of `measurement_shares`, one chunk at a time (the caller has charged; see there for the noise)."""
    # the label holds the measurement's spec hash; each chunk's sources are keyed by the label's SHA-256
    request = hashlib.sha256(label).digest()
    for index in chunk_index:
        chunk_noise, chunk_mask = _chunk_noise(noise, measured, index, slots)
        product, moduli, bound = holder.product(study_id, index, participants)  # with a set: only its t combine
        yield noised_chunk_share(holder.ctx, holder.index, holder.key_for(study_id)[1], product, moduli, bound,
                                 holder._noise_key, request, index, chunk_noise, chunk_mask, NOISE_STREAM)
