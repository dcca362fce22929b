"""The computation server's state: what it stores (records) and the contract every store keeps (the ABC).

A store holds study contracts, uploads and submissions (ciphertext chunks), releases and keyed
direct answers. Two implementations keep the same contract, checked by one shared test
(tests/parties/test_stores.py): `store_sqlite.SqliteComputationStore` (the server's: metadata in
SQLite, chunks as files, so a restart loses nothing) and `store_memory.MemoryComputationStore`
(dictionaries, for unit tests). The checks and errors both share are here too.
"""

from __future__ import annotations

import abc
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, cast
from pathlib import Path

from he_partition.core.errors import InvalidInputError
from he_partition.core.summary import Summary
from he_partition.execution.base import ChunkBytes, ChunkSource

from ..common.contract import StudyContract, check_id
from ..common.errors import AlreadyExistsError, FailedPreconditionError
from ..common.signing import OwnerSignature

__all__ = [
    "UploadMeta",
    "Submission",
    "ReleaseRecord",
    "ReleaseState",
    "ComputationStore",
    "owner_conflict",
]

#: A stored ciphertext chunk's file name in its upload's directory (workers read it by path).
CHUNK_FILE = "{index:07d}.ct"


@dataclass(frozen=True)
class UploadMeta:
    """What an upload's header promised; fixed for the life of its idempotency key."""

    study_id: str
    owner_id: str
    idempotency_key: str
    chunk_count: int
    domain_length: int
    context_fingerprint: str

    def __post_init__(self) -> None:
        check_id("study_id", self.study_id)
        check_id("owner_id", self.owner_id)
        check_id("idempotency_key", self.idempotency_key)
        if self.chunk_count < 1:
            raise InvalidInputError(f"chunk_count must be >= 1, got {self.chunk_count}")


@dataclass(frozen=True)
class Submission:
    """A committed upload: it counts in every later release of the study, exactly once.

    `signature` is the owner's Ed25519 signature of the upload and `ciphertext_digest` the
    `StreamHasher` digest of its chunks, as verified at commit (both empty in an unsigned study).
    """

    meta: UploadMeta
    bytes_total: int
    committed_at: str
    signature: bytes = b""
    ciphertext_digest: bytes = b""

    @property
    def owner_signature(self) -> OwnerSignature | None:
        if not self.signature:
            return None
        return OwnerSignature(self.meta.owner_id, self.meta.idempotency_key, self.ciphertext_digest, self.signature)

    @property
    def owner_id(self) -> str:
        return self.meta.owner_id

    @property
    def idempotency_key(self) -> str:
        return self.meta.idempotency_key


class ReleaseState:
    RUNNING = "RUNNING"
    DONE = "DONE"
    FAILED = "FAILED"


@dataclass(frozen=True)
class ReleaseProgress:
    """How far a running release has got: counts of work done, never an estimate.

    `phase` "aggregating" (the submissions are summed) or "measuring"; `measurements_done`
    the strategy's measurements decrypted so far (a strategy chooses its later measurements
    from released values, so their number is not known ahead); for the measurement in
    flight its `measurement_kind`, the chunks handed to the decryption service's stream
    (`chunks_sent`) of those it sends (`chunks_total`, the chunks with a measured slot), and
    `measurement_seconds` since it started. Public facts of the request only (no values).
    """

    phase: str = "aggregating"
    measurements_done: int = 0
    measurement_kind: str = ""
    chunks_sent: int = 0
    chunks_total: int = 0
    measurement_seconds: float = 0.0


@dataclass(frozen=True)
class ReleaseRecord:
    """One release of a study; when DONE its summary is stored (`summary_file`, or `summary_json` for a release
    stored before the Arrow files and by the in-memory store), the error fields when FAILED."""

    release_id: str
    study_id: str
    state: str
    epsilon: float
    owners: tuple[str, ...]
    contract_hash: str
    started_at: str
    request_key: str = ""
    finished_at: str = ""
    error_code: str = ""
    error_message: str = ""
    summary_json: str = ""
    seconds: float = 0.0
    bytes_to_decryption: int = 0
    #: The signature of every owner whose submission is in the release (signed studies).
    signatures: tuple[OwnerSignature, ...] = ()
    #: The directory of the summary's Arrow files (he_partition.core.summary_arrow), and their total size in
    #: bytes: what the SQLite store keeps in place of `summary_json`.
    summary_file: str = ""
    summary_size: int = 0
    #: (summary_file or summary_json, its Summary) when the record was made from the Summary itself: answering
    #: the release then does not read the stored summary again.
    summary_cache: tuple[str, Summary] | None = field(default=None, compare=False, repr=False)

    @property
    def summary_ref(self) -> str:
        """Where the summary is: its Arrow directory, else its JSON text ("" before DONE)."""
        return self.summary_file or self.summary_json

    @property
    def stored_summary_bytes(self) -> int:
        """The stored summary's size (its Arrow files', or its JSON text's): what its one-message reply grows with."""
        return self.summary_size if self.summary_file else len(self.summary_json)

    @property
    def summary(self) -> Summary | None:
        cache = self.summary_cache
        if cache is not None and cache[0] is self.summary_ref:
            return cache[1]
        if self.summary_file:
            from he_partition.core.summary_arrow import read_summary_files

            return read_summary_files(self.summary_file)
        return Summary.from_json(self.summary_json) if self.summary_json else None


@dataclass(frozen=True)
class ReleaseListing:
    """What a list of finished releases shows: metadata only, never the summary itself."""

    release_id: str
    study_id: str
    epsilon: float
    finished_at: str
    domain_size: int
    partitions: int


def _listing(r: ReleaseRecord) -> ReleaseListing:
    summary = r.summary
    assert summary is not None
    return ReleaseListing(r.release_id, r.study_id, r.epsilon, r.finished_at, summary.domain_size,
                          summary.n_partitions)


class ComputationStore(abc.ABC):
    """State of one computation server. Every method is atomic on its own."""

    # -- studies ---------------------------------------------------------------------
    @abc.abstractmethod
    def put_study(self, contract: StudyContract) -> None:
        """Remember a contract (idempotent); a different contract under the same id raises AlreadyExistsError."""

    @abc.abstractmethod
    def get_study(self, study_id: str) -> StudyContract | None:
        """The contract, or None if this server has never seen the study."""

    # -- uploads -----------------------------------------------------------------------
    @abc.abstractmethod
    def start_upload(self, meta: UploadMeta, signature: bytes = b"") -> None:
        """Begin (or keep, if `meta` and `signature` are the same) the owner's partial upload.

        A partial upload of the same owner under another key, with other terms or with
        another signature (a re-encryption: the chunks held would not match it) is
        discarded first. Raises AlreadyExistsError if the owner already committed.
        """

    @abc.abstractmethod
    def get_upload(self, study_id: str, owner_id: str) -> UploadMeta | None:
        """The owner's current partial (uncommitted) upload, if any."""

    @abc.abstractmethod
    def put_chunk(self, meta: UploadMeta, index: int, data: bytes) -> None:
        """Store one validated chunk of a started upload, durably (rewriting the same index is harmless)."""

    def stage_chunk(self, meta: UploadMeta, index: int, data: bytes) -> object:
        """Write one validated chunk of a started upload without making it durable; returns its handle.

        A staged chunk is not held: `received_chunks` does not list it (so no status or reply
        acknowledges it) until `sync_chunks` has made it durable, and a crash before that
        forgets it. An upload stream stages its chunks and syncs them in batches: one flush
        to storage per batch, not one per chunk. Here (no storage to flush) the chunk waits
        in the handle and `sync_chunks` puts it.
        """
        _check_index(meta, index)
        return (index, bytes(data))

    def sync_chunks(self, meta: UploadMeta, staged: list[object]) -> None:
        """Make the `staged` chunks of `meta` durable and held, all together (NotFoundError if the upload closed)."""
        for handle in staged:
            index, data = cast("tuple[int, bytes]", handle)
            self.put_chunk(meta, index, data)

    @abc.abstractmethod
    def replace_chunk(self, submission: Submission, index: int, data: bytes) -> None:
        """Rewrite one chunk of a committed submission (a sealed chunk by its opened form; atomic per chunk)."""

    def replace_chunks(self, submission: Submission, chunks: Iterable[tuple[int, bytes]]) -> None:
        """`replace_chunk` for each (index, bytes) of `chunks`, all or none (an error while `chunks` is read replaces
        nothing); a store on disk makes them durable together (one flush for all) rather than one by one."""
        for index, data in list(chunks):
            self.replace_chunk(submission, index, data)

    def replace_staged(self, submission: Submission, staged: list[tuple[str, int]]) -> None:
        """Make chunk files that were written beside a submission's chunks (staged, not yet durable) its chunks
        `index`, all together (a store on disk only; the chunk workers wrote them)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no chunk files")

    @abc.abstractmethod
    def received_chunks(self, meta: UploadMeta) -> dict[int, int]:
        """Index -> size in bytes of every chunk held for this upload (partial or committed)."""

    @abc.abstractmethod
    def commit_upload(self, meta: UploadMeta, signature: bytes = b"", ciphertext_digest: bytes = b"") -> Submission:
        """Turn a complete upload into the owner's submission (FailedPreconditionError if chunks are missing).

        The caller has verified `signature` over the chunks (`ciphertext_digest`); both are kept.
        """

    def commit_upload_once(self, meta: UploadMeta, signature: bytes = b"",
                           ciphertext_digest: bytes = b"") -> tuple[Submission, bool]:
        """`commit_upload`, and whether THIS call committed (False: another stream of the same upload already had).

        An owner may send one upload over several streams, which may end together (in one process or in
        several sharing the store): exactly one of them sees True and folds and forwards the upload. A store
        shared by processes overrides this with one transaction; this default serves one process's store.
        """
        with self._commit_lock:
            before = self.get_submission(meta.study_id, meta.owner_id)
            sub = self.commit_upload(meta, signature, ciphertext_digest)
            return sub, before is None

    _commit_lock = threading.Lock()

    @abc.abstractmethod
    def discard_upload(self, meta: UploadMeta) -> None:
        """Forget a partial upload and its chunks (never a committed one)."""

    @abc.abstractmethod
    def get_submission(self, study_id: str, owner_id: str) -> Submission | None:
        """The owner's committed submission, if any."""

    @abc.abstractmethod
    def submissions(self, study_id: str) -> list[Submission]:
        """Committed submissions of a study, sorted by owner id."""

    @abc.abstractmethod
    def read_upload_chunk(self, meta: UploadMeta, index: int) -> bytes:
        """One stored ciphertext chunk of an upload (partial or committed); NotFoundError if not held."""

    def read_chunk(self, submission: Submission, index: int) -> bytes:
        """One ciphertext chunk of a committed submission."""
        return self.read_upload_chunk(submission.meta, index)

    def aggregates_root(self) -> Path | None:
        """Where running aggregates live (parties.computation.running); None: this store keeps none."""
        return None

    def chunk_template(self, submission: Submission) -> str:
        """The path template (`{index}`) of a submission's chunk files; only stores with `aggregates_root`."""
        raise NotImplementedError("this store keeps chunks in memory, not in files")

    def chunk_source(self, submissions: list[Submission]) -> ChunkSource:
        """The submissions' chunks as the release's executor reads them (here: copied into memory)."""
        return ChunkBytes(tuple(tuple(self.read_chunk(s, i) for i in range(s.meta.chunk_count)) for s in submissions))

    # -- releases --------------------------------------------------------------------
    def summary_fields(self, release_id: str, summary: Summary) -> dict[str, Any]:
        """Store a DONE release's summary; the ReleaseRecord fields that refer to it (with `summary_cache`). Here
        (the in-memory store) its JSON text; the SQLite store writes Arrow files."""
        text = summary.to_json()
        return {"summary_json": text, "summary_cache": (text, summary)}

    @abc.abstractmethod
    def save_release(self, record: ReleaseRecord) -> None:
        """Insert or replace a release record."""

    @abc.abstractmethod
    def get_release(self, release_id: str) -> ReleaseRecord | None:
        """A release, or None."""

    @abc.abstractmethod
    def list_releases(self, study_id: str = "") -> list[ReleaseRecord]:
        """Releases (of one study, or all), oldest first."""

    def release_listing(self, study_id: str = "") -> list[ReleaseListing]:
        """The finished (DONE) releases, of one study or all, newest first: metadata, no summary read."""
        done = [_listing(r) for r in self.list_releases(study_id) if r.state == ReleaseState.DONE]
        return list(reversed(done))

    def release_by_request_key(self, study_id: str, request_key: str) -> ReleaseRecord | None:
        if not request_key:
            return None
        for r in self.list_releases(study_id):
            if r.request_key == request_key:
                return r
        return None

    # -- direct range counts ------------------------------------------------------------
    @abc.abstractmethod
    def save_direct_answers(self, study_id: str, request_key: str, answers_json: str) -> None:
        """Keep the answers of a keyed direct-query batch (first write wins), for retries."""

    @abc.abstractmethod
    def direct_answers(self, study_id: str, request_key: str) -> str | None:
        """The stored answers of a keyed batch, or None."""

    def close(self) -> None:
        """Release resources (no-op by default)."""


def _check_complete(meta: UploadMeta, held: dict[int, int]) -> None:
    missing = [i for i in range(meta.chunk_count) if i not in held]
    if missing:
        shown = ", ".join(str(i) for i in missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise FailedPreconditionError(
            f"upload {meta.idempotency_key} of owner {meta.owner_id} lacks {len(missing)} of {meta.chunk_count} "
            f"chunks ({shown}); send them with the same idempotency key"
        )


def _check_index(meta: UploadMeta, index: int) -> None:
    if not 0 <= index < meta.chunk_count:
        raise InvalidInputError(f"chunk index {index} is outside [0, {meta.chunk_count})")


def owner_conflict(existing: Submission) -> AlreadyExistsError:
    """The error for a second submission of an owner under another idempotency key (ALREADY_EXISTS)."""
    return AlreadyExistsError(
        f"owner {existing.owner_id} already submitted to study {existing.meta.study_id} under idempotency key "
        f"{existing.idempotency_key}; a study counts one submission per owner. Retry with that key, or open a "
        "new study"
    )


def _study_conflict(existing: StudyContract) -> AlreadyExistsError:
    return AlreadyExistsError(
        f"study {existing.study_id} is already known here with different terms (contract "
        f"{existing.contract_hash[:16]})"
    )
