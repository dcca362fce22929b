"""The computation server's durable store: metadata in SQLite, ciphertext chunks as files.

A restart loses nothing: partial uploads can be resumed, committed submissions are counted
exactly once (one row per study and owner), released summaries stay queryable. Same contract as
the in-memory store (the ABC in `store.py`; tests/parties/test_stores.py runs both).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sqlite3
import threading
from pathlib import Path
from typing import Any, Iterable

from he_partition.core.errors import InvalidInputError
from he_partition.core.summary import Summary
from he_partition.core.summary_arrow import preload as preload_arrow, write_summary_files
from he_partition.execution.base import ChunkFiles, ChunkSource

from ..common.contract import StudyContract
from ..common.errors import NotFoundError
from ..common.signing import OwnerSignature
from ..common.util import STAGED_SUFFIX, ImmediateTransaction, sync_written_files, utc_now, write_file_atomic

from .store import (CHUNK_FILE, ComputationStore, ReleaseListing, ReleaseRecord, ReleaseState, Submission, UploadMeta,
                    _check_complete, _check_index, _listing, _study_conflict, owner_conflict)

__all__ = ["SqliteComputationStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS studies (
    study_id      TEXT PRIMARY KEY,
    contract_json TEXT NOT NULL,
    contract_hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS uploads (
    study_id            TEXT NOT NULL,
    owner_id            TEXT NOT NULL,
    idempotency_key     TEXT NOT NULL,
    chunk_count         INTEGER NOT NULL,
    domain_length       INTEGER NOT NULL,
    context_fingerprint TEXT NOT NULL,
    started_at          TEXT NOT NULL,
    signature           BLOB NOT NULL DEFAULT x'',
    PRIMARY KEY (study_id, owner_id)
);
CREATE TABLE IF NOT EXISTS submissions (
    study_id            TEXT NOT NULL,
    owner_id            TEXT NOT NULL,
    idempotency_key     TEXT NOT NULL,
    chunk_count         INTEGER NOT NULL,
    domain_length       INTEGER NOT NULL,
    context_fingerprint TEXT NOT NULL,
    bytes_total         INTEGER NOT NULL,
    committed_at        TEXT NOT NULL,
    signature           BLOB NOT NULL DEFAULT x'',
    ciphertext_digest   BLOB NOT NULL DEFAULT x'',
    PRIMARY KEY (study_id, owner_id)
);
CREATE TABLE IF NOT EXISTS releases (
    release_id    TEXT PRIMARY KEY,
    study_id      TEXT NOT NULL,
    state         TEXT NOT NULL,
    epsilon       REAL NOT NULL,
    owners_json   TEXT NOT NULL,
    contract_hash TEXT NOT NULL,
    started_at    TEXT NOT NULL,
    request_key   TEXT NOT NULL,
    finished_at   TEXT NOT NULL,
    error_code    TEXT NOT NULL,
    error_message TEXT NOT NULL,
    summary_json  TEXT NOT NULL,
    seconds       REAL NOT NULL,
    bytes_to_decryption INTEGER NOT NULL DEFAULT 0,
    signatures_json TEXT NOT NULL DEFAULT '[]',
    domain_size   INTEGER NOT NULL DEFAULT -1,
    partitions    INTEGER NOT NULL DEFAULT -1,
    summary_file  TEXT NOT NULL DEFAULT '',
    summary_size  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS releases_by_study ON releases(study_id);
CREATE TABLE IF NOT EXISTS direct_answers (
    study_id      TEXT NOT NULL,
    request_key   TEXT NOT NULL,
    answers_json  TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    PRIMARY KEY (study_id, request_key)
);
"""

_META_COLS = "study_id, owner_id, idempotency_key, chunk_count, domain_length, context_fingerprint"
_REL_COLS = ("release_id, study_id, state, epsilon, owners_json, contract_hash, started_at, request_key, "
             "finished_at, error_code, error_message, summary_json, seconds, bytes_to_decryption, signatures_json, "
             "summary_file, summary_size")

#: Columns added after the first schema: (table, column, definition) for opening older stores.
_ADDED_COLUMNS = (
    ("uploads", "signature", "BLOB NOT NULL DEFAULT x''"),
    ("submissions", "signature", "BLOB NOT NULL DEFAULT x''"),
    ("submissions", "ciphertext_digest", "BLOB NOT NULL DEFAULT x''"),
    ("releases", "signatures_json", "TEXT NOT NULL DEFAULT '[]'"),
    ("releases", "domain_size", "INTEGER NOT NULL DEFAULT -1"),
    ("releases", "partitions", "INTEGER NOT NULL DEFAULT -1"),
    ("releases", "summary_file", "TEXT NOT NULL DEFAULT ''"),
    ("releases", "summary_size", "INTEGER NOT NULL DEFAULT 0"),
)

#: Where a finished release's summary files are, under the data directory: `releases/<release id>/`.
RELEASES_DIR = "releases"


def _meta(row: tuple[object, ...]) -> UploadMeta:
    return UploadMeta(str(row[0]), str(row[1]), str(row[2]), int(row[3]), int(row[4]),  # type: ignore[call-overload]
                      str(row[5]))


def _submission_row(row: tuple[object, ...]) -> Submission:
    return Submission(_meta(row[:6]), int(row[6]), str(row[7]), bytes(row[8]), bytes(row[9]))  # type: ignore[call-overload]


def _release(row: tuple[object, ...], data_dir: Path) -> ReleaseRecord:
    """The record of a row; its summary directory, stored relative to the data directory, made absolute."""
    return ReleaseRecord(
        release_id=str(row[0]), study_id=str(row[1]), state=str(row[2]), epsilon=float(row[3]),  # type: ignore[arg-type]
        owners=tuple(json.loads(str(row[4]))), contract_hash=str(row[5]), started_at=str(row[6]),
        request_key=str(row[7]), finished_at=str(row[8]), error_code=str(row[9]), error_message=str(row[10]),
        summary_json=str(row[11]), seconds=float(row[12]),  # type: ignore[arg-type]
        bytes_to_decryption=int(row[13]),  # type: ignore[call-overload]
        signatures=tuple(OwnerSignature.from_dict(d) for d in json.loads(str(row[14]))),
        summary_file=str(data_dir / str(row[15])) if row[15] else "",
        summary_size=int(row[16]),  # type: ignore[call-overload]
    )


class SqliteComputationStore(ComputationStore):
    """Metadata in `data_dir/computation.sqlite3`, chunks in `data_dir/uploads/<study>/<owner>/<key>/`.

    Chunks are written to a temporary file and renamed (and fsynced when `durable`), so a
    crash never leaves half a chunk; an upload stream stages its chunks and syncs them a
    batch at a time (`stage_chunk`, `sync_chunks`: one flush per batch), and a chunk is
    listed as received only once it is durable. Committing is one SQLite transaction that inserts
    the submission row (primary key study+owner: one submission per owner, ever) and
    removes the partial-upload row. `read_only` opens an existing store for a separate
    analyst process.
    """

    DB_FILE = "computation.sqlite3"

    def __init__(self, data_dir: Path | str, *, durable: bool = True, read_only: bool = False) -> None:
        self.data_dir = Path(data_dir)
        self.durable = durable
        self.read_only = read_only
        self._lock = threading.RLock()
        #: The newest finished release as `save_release` got it, with its Summary object: reading it right
        #: after the release (its reply, its summary's pages) does not parse its stored document again
        #: (8M partitions: ~10 s and ~1.5 GB of Python objects). Finished releases never change.
        self._newest_done: ReleaseRecord | None = None
        db_path = self.data_dir / self.DB_FILE
        if read_only:
            if not db_path.exists():
                raise NotFoundError(f"{db_path} does not exist; point --data-dir at a computation server's data")
            self._db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, isolation_level=None,
                                       check_same_thread=False, timeout=30.0)
        else:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False, timeout=30.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL" if durable else "PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            preload_arrow()  # releases' summaries are written with pyarrow: its import is paid at the start
            for table, column, definition in _ADDED_COLUMNS:
                if column not in {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _tx(self) -> ImmediateTransaction:
        return ImmediateTransaction(self._db)

    def _dir(self, meta: UploadMeta) -> Path:
        return self.data_dir / "uploads" / meta.study_id / meta.owner_id / meta.idempotency_key

    # -- studies ---------------------------------------------------------------------
    def put_study(self, contract: StudyContract) -> None:
        with self._lock, self._tx():
            row = self._db.execute("SELECT contract_json FROM studies WHERE study_id = ?",
                                   (contract.study_id,)).fetchone()
            if row is not None:
                existing = StudyContract.from_json(row[0])
                if existing.contract_hash != contract.contract_hash:
                    raise _study_conflict(existing)
                return
            self._db.execute("INSERT INTO studies VALUES (?, ?, ?)",
                             (contract.study_id, contract.canonical_json(), contract.contract_hash))

    def get_study(self, study_id: str) -> StudyContract | None:
        with self._lock:
            row = self._db.execute("SELECT contract_json FROM studies WHERE study_id = ?", (study_id,)).fetchone()
        return None if row is None else StudyContract.from_json(row[0])

    # -- uploads -----------------------------------------------------------------------
    def _submission(self, study_id: str, owner_id: str) -> Submission | None:
        row = self._db.execute(f"SELECT {_META_COLS}, bytes_total, committed_at, signature, ciphertext_digest "
                               "FROM submissions WHERE study_id = ? AND owner_id = ?", (study_id, owner_id)).fetchone()
        return None if row is None else _submission_row(row)

    def _upload(self, study_id: str, owner_id: str) -> UploadMeta | None:
        row = self._db.execute(f"SELECT {_META_COLS} FROM uploads WHERE study_id = ? AND owner_id = ?",
                               (study_id, owner_id)).fetchone()
        return None if row is None else _meta(row)

    def start_upload(self, meta: UploadMeta, signature: bytes = b"") -> None:
        with self._lock:
            sub = self._submission(meta.study_id, meta.owner_id)
            if sub is not None:
                if sub.meta == meta:
                    return
                raise owner_conflict(sub)
            current = self._upload(meta.study_id, meta.owner_id)
            if current == meta:
                row = self._db.execute("SELECT signature FROM uploads WHERE study_id = ? AND owner_id = ?",
                                       (meta.study_id, meta.owner_id)).fetchone()
                if row is not None and bytes(row[0]) == bytes(signature):
                    return
            if current is not None:
                self.discard_upload(current)
            with self._tx():  # OR IGNORE: a parallel stream of the same upload (maybe in another process) began it
                self._db.execute(f"INSERT OR IGNORE INTO uploads ({_META_COLS}, started_at, signature) "
                                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                 (meta.study_id, meta.owner_id, meta.idempotency_key, meta.chunk_count,
                                  meta.domain_length, meta.context_fingerprint, utc_now(), bytes(signature)))
            self._dir(meta).mkdir(parents=True, exist_ok=True)

    def get_upload(self, study_id: str, owner_id: str) -> UploadMeta | None:
        with self._lock:
            return self._upload(study_id, owner_id)

    def put_chunk(self, meta: UploadMeta, index: int, data: bytes) -> None:
        _check_index(meta, index)
        with self._lock:
            if self._upload(meta.study_id, meta.owner_id) != meta:
                raise NotFoundError(f"no open upload {meta.idempotency_key} for owner {meta.owner_id}; start it first")
        # File I/O outside the lock: chunks of different owners are written in parallel.
        write_file_atomic(self._dir(meta) / CHUNK_FILE.format(index=index), bytes(data), fsync=self.durable)

    def stage_chunk(self, meta: UploadMeta, index: int, data: bytes) -> object:
        """The chunk under a name of its own (`.<index>.ct.<token>.part`), not fsynced: `received_chunks` skips it."""
        _check_index(meta, index)
        final = self._dir(meta) / CHUNK_FILE.format(index=index)
        staged = final.with_name(f".{final.name}.{secrets.token_hex(4)}{STAGED_SUFFIX}")
        staged.write_bytes(bytes(data))
        return (staged, final)

    def sync_chunks(self, meta: UploadMeta, staged: list[object]) -> None:
        """One flush for the whole batch: the staged files' data, then their renames (one directory fsync).

        A crash before the renames are durable leaves some or all of them staged (ignored,
        removed at commit or discard): a chunk is listed only once its bytes are on disk.
        """
        if not staged:
            return
        pairs: list[tuple[Path, Path]] = staged  # type: ignore[assignment]
        directory = self._dir(meta)
        self._check_open(meta, pairs)
        if self.durable:
            sync_written_files([s for s, _ in pairs], directory)
        with self._lock:  # as put_chunk: never into an upload that was committed or discarded meanwhile
            self._check_open(meta, pairs)
            for s, final in pairs:
                os.replace(s, final)
        if self.durable:
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _check_open(self, meta: UploadMeta, pairs: list[tuple[Path, Path]]) -> None:
        with self._lock:
            if self._upload(meta.study_id, meta.owner_id) != meta:
                for s, _ in pairs:
                    s.unlink(missing_ok=True)
                raise NotFoundError(f"no open upload {meta.idempotency_key} for owner {meta.owner_id}; start it first")

    def replace_chunk(self, submission: Submission, index: int, data: bytes) -> None:
        _check_index(submission.meta, index)
        write_file_atomic(self._dir(submission.meta) / CHUNK_FILE.format(index=index), bytes(data),
                          fsync=self.durable)

    def replace_chunks(self, submission: Submission, chunks: Iterable[tuple[int, bytes]]) -> None:
        """Each new chunk written under a staged name, all of them flushed at once, then renamed over the old ones,
        then the directory flushed: a crash leaves every chunk either as it was or as it was replaced, never a file
        half written (opening a sealed study's 1,280 chunks took 7 s of fsyncs, one per file)."""
        directory = self._dir(submission.meta)
        pairs: list[tuple[Path, Path]] = []
        try:
            for index, data in chunks:
                _check_index(submission.meta, index)
                final = directory / CHUNK_FILE.format(index=index)
                staged = final.with_name(f".{final.name}.{secrets.token_hex(4)}{STAGED_SUFFIX}")
                staged.write_bytes(bytes(data))
                pairs.append((staged, final))
        except BaseException:
            for staged, _ in pairs:
                staged.unlink(missing_ok=True)
            raise
        self._install(directory, pairs)

    def replace_staged(self, submission: Submission, staged: list[tuple[str, int]]) -> None:
        directory = self._dir(submission.meta)
        pairs = []
        for name, index in staged:
            _check_index(submission.meta, index)
            path = Path(name)
            if path.parent != directory or not path.name.startswith(f".{CHUNK_FILE.format(index=index)}."):
                raise InvalidInputError(f"{name} is not a staged chunk {index} of owner {submission.owner_id}")
            pairs.append((path, directory / CHUNK_FILE.format(index=index)))
        self._install(directory, pairs)

    def _install(self, directory: Path, pairs: list[tuple[Path, Path]]) -> None:
        """Staged files' data flushed at once, then renamed over their chunks, then the directory flushed: a crash
        leaves each chunk as it was or as replaced, never half written."""
        try:
            if self.durable and pairs:
                sync_written_files([s for s, _ in pairs], directory)
            for staged, final in pairs:
                os.replace(staged, final)
        except BaseException:
            for staged, _ in pairs:
                staged.unlink(missing_ok=True)
            raise
        if self.durable and pairs:
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def received_chunks(self, meta: UploadMeta) -> dict[int, int]:
        d = self._dir(meta)
        if not d.is_dir():
            return {}
        out: dict[int, int] = {}
        for p in d.iterdir():
            if p.suffix == ".ct" and p.stem.isdigit():
                out[int(p.stem)] = p.stat().st_size
        return out

    def commit_upload(self, meta: UploadMeta, signature: bytes = b"", ciphertext_digest: bytes = b"") -> Submission:
        return self.commit_upload_once(meta, signature, ciphertext_digest)[0]

    def commit_upload_once(self, meta: UploadMeta, signature: bytes = b"",
                           ciphertext_digest: bytes = b"") -> tuple[Submission, bool]:
        """Commit in one BEGIN IMMEDIATE transaction: the check for an existing submission and the insert hold
        SQLite's write lock together, so of several streams of one upload (threads, or processes sharing the
        data directory) exactly one commits and sees True; the others get the same submission and False."""
        with self._lock:
            with self._tx():
                sub = self._submission(meta.study_id, meta.owner_id)
                if sub is not None:
                    if sub.meta == meta:
                        return sub, False
                    raise owner_conflict(sub)
                if self._upload(meta.study_id, meta.owner_id) != meta:
                    raise NotFoundError(f"no open upload {meta.idempotency_key} for owner {meta.owner_id}")
                held = self.received_chunks(meta)
                _check_complete(meta, held)
                sub = Submission(meta, sum(held.values()), utc_now(), bytes(signature), bytes(ciphertext_digest))
                self._db.execute(
                    f"INSERT INTO submissions ({_META_COLS}, bytes_total, committed_at, signature, ciphertext_digest) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (meta.study_id, meta.owner_id, meta.idempotency_key, meta.chunk_count, meta.domain_length,
                     meta.context_fingerprint, sub.bytes_total, sub.committed_at, sub.signature,
                     sub.ciphertext_digest))
                self._db.execute("DELETE FROM uploads WHERE study_id = ? AND owner_id = ?",
                                 (meta.study_id, meta.owner_id))
            for leftover in self._dir(meta).glob(f".*{STAGED_SUFFIX}"):  # staged by a stream that broke off
                leftover.unlink(missing_ok=True)
            return sub, True

    def discard_upload(self, meta: UploadMeta) -> None:
        with self._lock:
            sub = self._submission(meta.study_id, meta.owner_id)
            if sub is not None and sub.meta.idempotency_key == meta.idempotency_key:
                return  # never delete a committed submission's chunks
            with self._tx():
                self._db.execute("DELETE FROM uploads WHERE study_id = ? AND owner_id = ? AND idempotency_key = ?",
                                 (meta.study_id, meta.owner_id, meta.idempotency_key))
            shutil.rmtree(self._dir(meta), ignore_errors=True)

    def get_submission(self, study_id: str, owner_id: str) -> Submission | None:
        with self._lock:
            return self._submission(study_id, owner_id)

    def submissions(self, study_id: str) -> list[Submission]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_META_COLS}, bytes_total, committed_at, signature, ciphertext_digest "
                                    "FROM submissions WHERE study_id = ? ORDER BY owner_id", (study_id,)).fetchall()
        return [_submission_row(r) for r in rows]

    def aggregates_root(self) -> Path | None:
        return None if self.read_only else self.data_dir / "aggregates"

    def chunk_template(self, submission: Submission) -> str:
        return str(self._dir(submission.meta) / CHUNK_FILE)

    def chunk_source(self, submissions: list[Submission]) -> ChunkSource:
        """The submissions' chunk files, read by path where the executor's workers run."""
        return ChunkFiles(tuple(self.chunk_template(s) for s in submissions))

    def read_upload_chunk(self, meta: UploadMeta, index: int) -> bytes:
        _check_index(meta, index)
        path = self._dir(meta) / CHUNK_FILE.format(index=index)
        try:
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise NotFoundError(f"chunk {index} of owner {meta.owner_id}'s upload {meta.idempotency_key} is missing "
                                f"from {path.parent}; resend it, or the data directory was altered") from exc

    # -- releases --------------------------------------------------------------------
    def save_release(self, record: ReleaseRecord) -> None:
        r = record
        # What a listing shows, kept beside the summary so a listing never reads or parses it.
        meta = _listing(r) if r.state == ReleaseState.DONE and r.summary_ref else None
        with self._lock, self._tx():
            self._db.execute(
                f"INSERT OR REPLACE INTO releases ({_REL_COLS}, domain_size, partitions) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (r.release_id, r.study_id, r.state, r.epsilon, json.dumps(list(r.owners)), r.contract_hash,
                 r.started_at, r.request_key, r.finished_at, r.error_code, r.error_message, r.summary_json,
                 r.seconds, r.bytes_to_decryption, json.dumps([sig.to_dict() for sig in r.signatures]),
                 self._relative(r.summary_file), r.summary_size,
                 meta.domain_size if meta else -1, meta.partitions if meta else -1))
            if r.state == ReleaseState.DONE and r.summary_cache is not None:
                self._newest_done = r

    def release_listing(self, study_id: str = "") -> list[ReleaseListing]:
        """Metadata columns only (a release saved before they existed is read once and backfilled)."""
        where = "state = ?" + (" AND study_id = ?" if study_id else "")
        args: tuple[str, ...] = (ReleaseState.DONE, study_id) if study_id else (ReleaseState.DONE,)
        with self._lock:
            rows = self._db.execute(f"SELECT release_id, study_id, epsilon, finished_at, domain_size, partitions "
                                    f"FROM releases WHERE {where} ORDER BY started_at DESC, release_id DESC",
                                    args).fetchall()
        out = []
        for rid, sid, eps, finished, size, parts in rows:
            if int(size) < 0 or int(parts) < 0:  # written before the columns existed: parse once, keep
                rec = self.get_release(str(rid))
                assert rec is not None
                item = _listing(rec)
                with self._lock, self._tx():
                    self._db.execute("UPDATE releases SET domain_size = ?, partitions = ? WHERE release_id = ?",
                                     (item.domain_size, item.partitions, item.release_id))
                out.append(item)
            else:
                out.append(ReleaseListing(str(rid), str(sid), float(eps), str(finished), int(size), int(parts)))
        return out

    def summary_fields(self, release_id: str, summary: Summary) -> dict[str, Any]:
        """Write the summary as Arrow files under `releases/<release_id>/` (atomically, fsynced when durable), in
        record batches: neither a JSON text nor a second copy of the summary is built."""
        path = self.data_dir.absolute() / RELEASES_DIR / release_id
        size = write_summary_files(summary, path, durable=self.durable)
        ref = str(path)
        return {"summary_file": ref, "summary_size": size, "summary_cache": (ref, summary)}

    def _relative(self, summary_file: str) -> str:
        if not summary_file:
            return ""
        return str(Path(summary_file).absolute().relative_to(self.data_dir.absolute()))

    def get_release(self, release_id: str) -> ReleaseRecord | None:
        with self._lock:
            newest = self._newest_done
            if newest is not None and newest.release_id == release_id:
                return newest
            row = self._db.execute(f"SELECT {_REL_COLS} FROM releases WHERE release_id = ?",
                                   (release_id,)).fetchone()
        return None if row is None else _release(row, self.data_dir)

    def list_releases(self, study_id: str = "") -> list[ReleaseRecord]:
        with self._lock:
            if study_id:
                rows = self._db.execute(f"SELECT {_REL_COLS} FROM releases WHERE study_id = ? ORDER BY started_at, release_id",
                                        (study_id,)).fetchall()
            else:
                rows = self._db.execute(f"SELECT {_REL_COLS} FROM releases ORDER BY started_at, release_id").fetchall()
        return [_release(r, self.data_dir) for r in rows]

    def save_direct_answers(self, study_id: str, request_key: str, answers_json: str) -> None:
        with self._lock, self._tx():
            self._db.execute("INSERT OR IGNORE INTO direct_answers (study_id, request_key, answers_json, created_at) "
                             "VALUES (?, ?, ?, ?)", (study_id, request_key, answers_json, utc_now()))

    def direct_answers(self, study_id: str, request_key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT answers_json FROM direct_answers WHERE study_id = ? AND request_key = ?",
                                   (study_id, request_key)).fetchone()
        return None if row is None else str(row[0])
