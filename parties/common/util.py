"""Small helpers the roles share: timestamps, ids, a thread-safe noise source, private files."""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime as _dt
import fcntl
import os
import secrets
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import numpy.typing as npt

from he_partition.core.noise import CipherRandom, RandomSource, SeededRandom

#: The suffix of a file written under a staged name before it is made durable and renamed into place: the
#: computation store's chunk listing skips such names (`store_sqlite`), and the sealed opening stages under it too.
STAGED_SUFFIX = ".part"

__all__ = ["ReadOnDemand", "lock_data_dir", "utc_now", "new_id", "LockedRandom", "noise_source", "write_private_file", "write_file_atomic",
           "sync_written_files", "ImmediateTransaction"]


def utc_now() -> str:
    """Current time, RFC 3339 UTC with microseconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def new_id(prefix: str) -> str:
    """A fresh random id such as 'rel-3f9c2a7b1d0e4c55' (64 random bits)."""
    return f"{prefix}-{secrets.token_hex(8)}"


class LockedRandom:
    """Serializes draws from one RandomSource across server threads (SeededRandom is not thread-safe)."""

    def __init__(self, source: RandomSource) -> None:
        self._source = source
        self._lock = threading.Lock()

    def integers(self, high: npt.NDArray[np.int64] | int, size: int) -> npt.NDArray[np.int64]:
        with self._lock:
            return self._source.integers(high, size)


def noise_source(seed: int | None) -> RandomSource:
    """The server's noise source: AES-256-CTR under a fresh OS key, or (tests only) a seeded, predictable stream.

    `CipherRandom` is thread-safe by itself; the seeded stream is serialized by `LockedRandom`.
    """
    return CipherRandom() if seed is None else LockedRandom(SeededRandom(seed))


def write_file_atomic(path: Path, data: bytes, *, mode: int = 0o644, fsync: bool = True) -> None:
    """Write `data` to `path` via a temporary file and rename, so readers never see a partial file."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sync_written_files(paths: list[Path], directory: Path) -> None:
    """Make files written without fsync, and `directory`'s entries, durable: one syncfs, else one fsync each.

    For a batch of new files nobody names yet (a new generation directory): writing them
    all and syncing once costs one journal commit instead of one per file (128 files of
    368 KB: 0.06 s against 0.33 s on this machine's ext4). Linux's syncfs(2) flushes the
    whole filesystem holding `directory`; elsewhere, or if it fails, every file and the
    directory are fsynced one by one.
    """
    fd = os.open(directory, os.O_RDONLY)
    try:
        if _syncfs is not None and _syncfs(fd) == 0:
            return
        for path in paths:
            f = os.open(path, os.O_RDONLY)
            try:
                os.fsync(f)
            finally:
                os.close(f)
        os.fsync(fd)
    finally:
        os.close(fd)


def _load_syncfs() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


_syncfs = _load_syncfs()


def write_private_file(path: Path, data: bytes) -> None:
    """Write a secret: mode 0600 from creation on (never briefly world-readable), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_file_atomic(path, data, mode=0o600)
    os.chmod(path, 0o600)  # the umask can only remove bits; make the mode exact


class ImmediateTransaction:
    """`with ImmediateTransaction(db):` runs the block in BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error).

    The write lock is taken before anything is read, so concurrent writers (threads or
    processes) serialise: two budget checks can never both pass on the same remainder.
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self._db.execute("COMMIT")
        elif self._db.in_transaction:
            self._db.execute("ROLLBACK")


def lock_data_dir(directory: Path, what: str) -> "Callable[[], None]":
    """Take an exclusive lock on `directory` for one server process; returns the function that releases it.

    Two servers on one data directory would split keys, ledgers and stores between them
    without noticing. The lock (flock on `directory/.lock`) is released when the server
    stops, and by the kernel when its process dies, even by SIGKILL.
    """
    from .errors import FailedPreconditionError

    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise FailedPreconditionError(
            f"data directory {directory} is in use by another {what} (pid {holder}); stop it first, or give this "
            "server its own --data-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)

    def release() -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    return release


class ReadOnDemand(Sequence[bytes]):
    """`count` chunks, chunk i read by `read(first + i)` only when it is asked for: an upload (or a group of it)
    kept in a store or in files, passed on or verified one chunk in memory at a time."""

    def __init__(self, read: Callable[[int], bytes], count: int, first: int = 0) -> None:
        self._read, self._count, self._first = read, count, first

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._count))]
        if not 0 <= i < self._count:
            raise IndexError(i)
        return self._read(self._first + i)
