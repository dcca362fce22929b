"""A data owner's upload at the computation server: the header's checks, the chunk stream, the commit.

`open_upload` checks an upload header against the study and gives back an `UploadSession`, which
validates and stores each chunk and commits once every chunk is in (and, in a signed study, the
owner's signature verifies). `ComputationHandler.open_upload` / `upload_status` call these.

Disk: an upload starts storing only if the data directory's free space holds all of it, the
remaining bytes promised to the other uploads in flight and `DISK_RESERVE_BYTES` (`_DiskClaims`);
otherwise it is refused RESOURCE_EXHAUSTED before a chunk is written, naming the sizes.
"""

from __future__ import annotations

import logging
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from he_partition.core.backend import n_chunks
from he_partition.core.errors import InvalidInputError

from ..common.contract import StudyContract, check_id
from ..common.errors import FailedPreconditionError, PermissionDeniedError, QuotaExhaustedError
from ..common.sealing import Commitment, is_sealed
from ..common.signing import SIGNATURE_SIZE, SignatureError, StreamHasher, submission_digest, verify_submission
from .join import JoinCoordinator, JoinUploadBackend
from .sealed_uploads import SealedUploads, check_commitment
from .store import ComputationStore, UploadMeta, owner_conflict
from .threshold.c1_forward import C1Signatures

__all__ = ["UploadSession", "UploadOutcome", "UploadState", "open_upload", "upload_status", "DiskFullError",
           "DISK_RESERVE_BYTES", "UploadHost", "receive_upload"]

log = logging.getLogger("dpagg.computation")


class FoldRequests(Protocol):
    """Who folds a committed upload into the study's running aggregate (`FoldQueue`, or the coordinator of an
    ingest process)."""

    def request(self, study_id: str, backend: Any) -> None: ...


class UploadHost(Protocol):
    """What an upload needs of the server that takes it (`ComputationHandler` is one, an ingest process's
    `FrontUploads` another): its stores and studies, the study's key, and whom to tell when an owner commits."""

    @property
    def store(self) -> ComputationStore: ...

    @property
    def folds(self) -> FoldRequests: ...

    @property
    def joins(self) -> JoinCoordinator: ...

    @property
    def sealed(self) -> SealedUploads: ...

    @property
    def c1_signatures(self) -> C1Signatures: ...

    def study(self, study_id: str) -> StudyContract: ...

    def backend_for(self, contract: StudyContract) -> Any: ...

    def public_context(self, study_id: str = "") -> bytes: ...

    def forward_when_complete(self, study_id: str) -> None: ...


#: An upload stream makes its chunks durable a batch at a time, one flush to storage per batch: after this
#: many chunks or bytes, and always before it reports what it holds (an unsynced chunk is never acknowledged).
SYNC_EVERY_CHUNKS = 64
SYNC_EVERY_BYTES = 8 << 20

#: Free space the computation server keeps on its data directory beyond the uploads in flight (bytes): room
#: for a running aggregate's next generation, a release's files, the SQLite journal and the logs.
DISK_RESERVE_BYTES = 512 << 20

MB = 1_000_000


class DiskFullError(QuotaExhaustedError):
    """The computation server's disk cannot hold an upload (RESOURCE_EXHAUSTED); nothing of it was stored."""


class _DiskClaims:
    """Bytes promised to the uploads in flight, per data directory. An upload claims its size (chunks x the size
    of its first chunk) before it writes anything, and gives the claim back when its last stream ends: an
    owner's parallel streams of one upload share one claim."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims: dict[Any, tuple[Path, int]] = {}
        self._streams: dict[Any, int] = {}

    def claim(self, key: Any, directory: Path, need: int, what: str) -> None:
        with self._lock:
            if key in self._claims:
                self._streams[key] += 1
                return
            free = shutil.disk_usage(directory).free
            promised = sum(n for d, n in self._claims.values() if d == directory)
            if free - promised - need < DISK_RESERVE_BYTES:
                raise DiskFullError(
                    f"the computation server's disk has {free / MB:,.0f} MB free; {what} needs up to "
                    f"{need / MB:,.0f} MB, {promised / MB:,.0f} MB are promised to uploads in flight and "
                    f"{DISK_RESERVE_BYTES / MB:,.0f} MB are kept free. Nothing of it was stored; once the operator "
                    "has freed space, run the same submit again to resume")
            self._claims[key] = (directory, need)
            self._streams[key] = 1

    def release(self, key: Any) -> None:
        with self._lock:
            left = self._streams.get(key, 0) - 1
            if left > 0:
                self._streams[key] = left
                return
            self._streams.pop(key, None)
            self._claims.pop(key, None)


_DISK = _DiskClaims()


class UploadState:
    NONE = "NONE"
    PARTIAL = "PARTIAL"
    COMMITTED = "COMMITTED"
    CONFLICT = "CONFLICT"


@dataclass(frozen=True)
class UploadOutcome:
    """Where an upload stands after a stream (or for UploadStatus)."""

    state: str
    received: tuple[int, ...]
    chunk_count: int
    bytes_received: int = 0
    duplicate: bool = False

    @property
    def committed(self) -> bool:
        return self.state == UploadState.COMMITTED


class UploadSession:
    """One SubmitHistogram stream: validates every chunk before storing it; `finish` commits when complete.

    In a signed study the upload counts only once the owner's signature verifies over
    every stored chunk (in index order) together with the study id, owner id,
    idempotency key and contract hash; otherwise the whole upload is discarded.
    """

    def __init__(self, handler: UploadHost, meta: UploadMeta, backend: Any, duplicate: bool,
                 contract: StudyContract | None = None, signature: bytes = b"", sealed: bool = False) -> None:
        self._h = handler
        #: The chunks are sealed (`parties.common.sealing`): checked for their form only, opened at the close.
        self.sealed = sealed
        self.meta = meta
        self._backend = backend
        self.duplicate = duplicate
        self.contract = contract
        self.signature = bytes(signature)
        self.bytes_this_stream = 0
        self._started = False
        self._staged: list[object] = []  # written, not yet durable: `sync` makes them held
        self._staged_bytes = 0
        self._upload_key = (meta.study_id, meta.owner_id, meta.idempotency_key)
        self._claimed = False

    def add(self, index: int, data: bytes) -> None:
        """Validate (deserialize under the study's public key) and store one chunk.

        An invalid chunk discards the whole partial upload, so nothing from a bad upload
        is ever stored or counted. Chunks of an already committed upload are ignored.
        """
        if self.duplicate:
            return
        if not 0 <= index < self.meta.chunk_count:
            self.abort()
            raise InvalidInputError(f"chunk index {index} is outside [0, {self.meta.chunk_count})")
        try:
            if self.sealed:
                if not is_sealed(data):
                    raise InvalidInputError("study uploads are sealed, this chunk is not")
            else:
                self._backend.deserialize_chunk(data)
        except InvalidInputError as exc:
            self.abort()
            raise InvalidInputError(
                f"chunk {index} of owner {self.meta.owner_id}'s upload is not a valid ciphertext for study "
                f"{self.meta.study_id} ({exc}); the upload was discarded, nothing is stored. Re-encrypt with the "
                "study's public context and upload again"
            ) from exc
        if not self._started:
            directory = getattr(self._h.store, "data_dir", None)
            if isinstance(directory, Path) and directory.exists():  # a store on disk (not the in-memory one)
                _DISK.claim(self._upload_key, directory, len(data) * self.meta.chunk_count,
                            f"owner {self.meta.owner_id}'s upload of {self.meta.chunk_count} chunk(s)")
                self._claimed = True
            # Begin (or resume) the partial upload. A different signature under the same key
            # (a re-encryption) discards the chunks held so far, which it would not match.
            self._h.store.start_upload(self.meta, self.signature)
            self._started = True
        self._staged.append(self._h.store.stage_chunk(self.meta, index, data))
        self._staged_bytes += len(data)
        self.bytes_this_stream += len(data)
        if len(self._staged) >= SYNC_EVERY_CHUNKS or self._staged_bytes >= SYNC_EVERY_BYTES:
            self.sync()

    def sync(self) -> None:
        """Make the chunks staged so far durable (one flush for the batch); from then on they count as received."""
        staged, self._staged, self._staged_bytes = self._staged, [], 0
        self._h.store.sync_chunks(self.meta, staged)

    def _release_disk(self) -> None:
        if self._claimed:
            self._claimed = False
            _DISK.release(self._upload_key)

    def close(self) -> None:
        """The stream ended early (the owner went away): keep the chunks that arrived, so a resume skips them."""
        self._release_disk()
        try:
            self.sync()
        except Exception as exc:  # noqa: BLE001 - the stream's own error is the one to report
            log.warning("study %s: owner %s's last chunks were not kept (%s); a resume sends them again",
                        self.meta.study_id, self.meta.owner_id, exc)

    def abort(self) -> None:
        self._release_disk()
        self._staged, self._staged_bytes = [], 0
        self._h.store.discard_upload(self.meta)

    def _verify(self) -> bytes:
        """Recompute the stream digest from the stored chunks and verify the owner's signature (signed studies).

        Returns the ciphertext digest ("" for an unsigned study). On failure the upload
        is discarded and SignatureError (UNAUTHENTICATED) raised: nothing counts.
        """
        contract = self.contract
        if contract is None or not contract.signed:
            return b""
        public = contract.owner_public_key(self.meta.owner_id)
        assert public is not None  # open_upload checked that the owner is expected
        hasher = StreamHasher()
        for i in range(self.meta.chunk_count):
            hasher.update(self._h.store.read_upload_chunk(self.meta, i))
        digest = submission_digest(self.meta.study_id, self.meta.owner_id, self.meta.idempotency_key,
                                   contract.contract_hash, hasher)
        try:
            verify_submission(public, digest, self.signature, owner_id=self.meta.owner_id)
        except SignatureError:
            self.abort()
            raise
        return hasher.digest()

    def finish(self) -> UploadOutcome:
        """Commit if every chunk has arrived (and, in a signed study, the signature verifies); else report what is held.

        An owner may send one upload over several streams at once: each stream makes its own chunks durable
        before it looks, so the one that ends last sees every chunk and commits. Two that end together may both
        find the upload complete: the store's `commit_upload_once` lets exactly one of them commit (one SQLite
        transaction, across processes too), and only that one requests the fold and the forward."""
        self._release_disk()
        self.sync()  # what the reply lists is on disk
        held = self._h.store.received_chunks(self.meta)
        if not self.duplicate and len(held) == self.meta.chunk_count:
            ciphertext_digest = self._verify()
            _, first = self._h.store.commit_upload_once(self.meta, self.signature if ciphertext_digest else b"",
                                                        ciphertext_digest)
            if first:  # another stream of this upload may have committed it already: fold and forward once
                self._h.folds.request(self.meta.study_id, self._backend)
                log.info("study %s: committed owner %s (%d chunks, %d bytes)", self.meta.study_id,
                         self.meta.owner_id, len(held), sum(held.values()))
                self._h.forward_when_complete(self.meta.study_id)
        state = UploadState.COMMITTED if self.duplicate or len(held) == self.meta.chunk_count else UploadState.PARTIAL
        return UploadOutcome(state, tuple(sorted(held)), self.meta.chunk_count, sum(held.values()), self.duplicate)


def open_upload(h: UploadHost, *, study_id: str, owner_id: str, idempotency_key: str, domain_length: int,
                context_fingerprint: str, chunk_count: int, contract_hash: str = "",
                signature: bytes = b"", c1_signature: bytes = b"",
                commitment: tuple[bytes, tuple[bytes, ...], bytes] | None = None) -> UploadSession:
    """Check an upload header against the study; nothing is stored unless every check passes.

    `contract_hash` must be the study's (the owner encrypted for these terms). In a
    signed study `signature` must be a 64-byte Ed25519 signature; it is verified over
    the stored chunks when the upload completes (`UploadSession.finish`).
    """
    check_id("owner_id", owner_id)
    check_id("idempotency_key", idempotency_key)
    contract = h.study(study_id)
    if owner_id not in contract.expected_owners:
        raise PermissionDeniedError(
            f"owner {owner_id!r} is not expected by study {study_id} (expected: "
            f"{', '.join(contract.expected_owners)}); check --owner, or ask the operator to open a study "
            "that includes you"
        )
    if not contract_hash:
        raise InvalidInputError("contract_hash is required in the upload header: send the hash of the study "
                                "contract you encrypted for")
    if contract_hash != contract.contract_hash:
        raise FailedPreconditionError(
            f"contract_hash {contract_hash[:16]} does not match study {study_id}'s contract "
            f"{contract.contract_hash[:16]}: fetch the study again (its terms differ from what you hold)"
        )
    if contract.signed and len(signature) != SIGNATURE_SIZE:
        raise SignatureError(
            f"study {study_id} requires signed uploads but the header carries "
            f"{'no' if not signature else f'a {len(signature)}-byte'} signature: sign the upload with owner "
            f"{owner_id}'s Ed25519 key (DataOwnerClient(signing_key=...), `dpagg submit --signing-key`)"
        )
    if domain_length != contract.domain_size:
        raise InvalidInputError(
            f"histogram has {domain_length} bins but study {study_id} has domain size {contract.domain_size}; "
            f"bin your data with the study's domain{f' ({contract.domain_spec})' if contract.domain_spec else ''}"
        )
    if context_fingerprint != contract.context_fingerprint:
        raise InvalidInputError(
            f"the histogram was encrypted under public key {context_fingerprint[:16] or '(none)'} but study "
            f"{study_id} uses key {contract.context_fingerprint[:16]}; fetch the decryption server's public "
            "context again and re-encrypt"
        )
    backend: Any
    if contract.is_join:
        h.joins.require_placement(contract, owner_id)
        backend = JoinUploadBackend(h.joins.scheme(contract, h.public_context))
        expected = h.joins.expected_chunks(contract, owner_id, backend.slots)
        what = f"owner {owner_id}'s indicator planes for join study {study_id}"
    else:
        backend = h.backend_for(contract)
        expected = n_chunks(contract.domain_size, backend.slots)
        what = f"a {contract.domain_size}-bin histogram"
    if chunk_count != expected:
        raise InvalidInputError(
            f"{what} is {expected} ciphertext chunks of {backend.slots} slots, header says {chunk_count}"
        )
    meta = UploadMeta(study_id, owner_id, idempotency_key, int(chunk_count), int(domain_length),
                      context_fingerprint)
    existing = h.store.get_submission(study_id, owner_id)
    if existing is not None and existing.meta == meta:
        return UploadSession(h, meta, backend, duplicate=True, contract=contract)
    if existing is not None:
        raise owner_conflict(existing)  # one submission per owner, ever
    sig = bytes(signature) if contract.signed else b""
    if contract.seals_uploads:  # the chunks are sealed: keep the owner's commitment, checked, before any chunk
        h.sealed.refuse_late(contract, owner_id)
        digest, shares, commit_sig = commitment or (b"", (), b"")
        owner_commitment = Commitment(owner_id, idempotency_key, bytes(digest), tuple(shares), bytes(commit_sig))
        check_commitment(contract, owner_commitment)
        h.sealed.keep(study_id, owner_commitment)
    if contract.signed and c1_signature:  # forwarded to the key holders with the owner's c1 parts
        h.c1_signatures.keep(study_id, owner_id, idempotency_key, c1_signature)
    # Nothing is stored yet: the upload starts with its first valid chunk (UploadSession.add).
    return UploadSession(h, meta, backend, duplicate=False, contract=contract, signature=sig,
                         sealed=contract.seals_uploads)


def receive_upload(open_session: Callable[..., UploadSession], header: Any, chunks: Iterable[Any]) -> UploadOutcome:
    """One SubmitHistogram stream after its header: the session `open_session(**the header's fields)` opens takes
    every chunk message of `chunks`, then finishes. Anything but a chunk discards the upload; a broken stream keeps
    the chunks that arrived (nothing after a discard)."""
    h = header
    session = open_session(study_id=h.study_id, owner_id=h.owner_id, idempotency_key=h.idempotency_key,
                           domain_length=int(h.domain_length), context_fingerprint=h.context_fingerprint,
                           chunk_count=int(h.chunk_count), contract_hash=h.contract_hash, signature=bytes(h.signature),
                           c1_signature=bytes(h.c1_signature),
                           commitment=(bytes(h.c1_parts_digest), tuple(bytes(x) for x in h.key_shares),
                                       bytes(h.commitment_signature)))
    try:
        for msg in chunks:
            if msg.WhichOneof("part") != "chunk":
                session.abort()
                raise InvalidInputError("only ciphertext chunks may follow the upload header; upload discarded")
            session.add(int(msg.chunk.index), msg.chunk.data)
    except BaseException:
        session.close()
        raise
    return session.finish()


def upload_status(h: UploadHost, study_id: str, owner_id: str, idempotency_key: str) -> UploadOutcome:
    check_id("owner_id", owner_id)
    check_id("idempotency_key", idempotency_key)
    h.study(study_id)
    sub = h.store.get_submission(study_id, owner_id)
    if sub is not None:
        state = UploadState.COMMITTED if sub.idempotency_key == idempotency_key else UploadState.CONFLICT
        held = h.store.received_chunks(sub.meta) if state == UploadState.COMMITTED else {}
        return UploadOutcome(state, tuple(sorted(held)), sub.meta.chunk_count, sum(held.values()))
    up = h.store.get_upload(study_id, owner_id)
    if up is None or up.idempotency_key != idempotency_key:
        return UploadOutcome(UploadState.NONE, (), 0)
    held = h.store.received_chunks(up)
    return UploadOutcome(UploadState.PARTIAL, tuple(sorted(held)), up.chunk_count, sum(held.values()))
