"""The key holder's local worker pool: per-chunk decryption over processes on the decryption server's own host.

Only local processes (`concurrent.futures.ProcessPoolExecutor`, spawn start method): no Ray,
no remote executor, no socket. Each worker loads the secret context itself, from the key
store's file on this host (`secret_path`, mode 0600) or, for an in-memory server (tests), from
the bytes handed to it through the spawn pipe; the secret key never crosses a network.

What stays in the coordinator (the handler's thread): the keyed noise draw, the one ledger
transaction, decoding and the magnitude check. Workers only decrypt the chunks they are given
(slot values mod t, centred), a deterministic function of the chunk bytes, so a worker that dies
is replaced and the whole measurement's chunks are decrypted again: the released values and the
ledger row are those of the first attempt (`tests/parties/test_decryption_workers.py`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import numpy.typing as npt

from he_partition.core.backend import ChunkedVector
from he_partition.core.errors import WorkerLostError
from he_partition.execution.spawning import without_user_main
from he_partition.core.errors import InvalidInputError
from he_partition.he.bfv import BfvBackend, load_context

__all__ = ["DecryptPool", "PooledDecryption"]

log = logging.getLogger("dpagg.decryption")

IntArray = npt.NDArray[np.int64]

#: Measurements with fewer chunks than this are decrypted in the handler's process (a round
#: trip to a worker costs more than decrypting one or two chunks, ~1.6 ms each).
MIN_POOLED_CHUNKS = 4

_BACKEND: BfvBackend | None = None
_DIE_MARKER: Path | None = None


def _init_worker(secret_path: str | None, secret_bytes: bytes | None, die_marker: str | None) -> None:
    """Load the secret context in this worker (from the local key file, or bytes from the spawn pipe)."""
    global _BACKEND, _DIE_MARKER
    data = Path(secret_path).read_bytes() if secret_path is not None else secret_bytes
    assert data is not None
    _BACKEND = BfvBackend(load_context(data))
    _DIE_MARKER = Path(die_marker) if die_marker is not None else None


def _ready() -> None:
    """A no-op: submitting it spawns every worker of a new pool."""


def _decrypt_chunk(data: bytes) -> IntArray:
    """Slot values of one (already integrity-checked) chunk, centred in (-t/2, t/2]."""
    if _DIE_MARKER is not None:
        try:
            _DIE_MARKER.unlink()  # fault injection for the retry test: exactly one worker dies, once
        except FileNotFoundError:
            pass
        else:
            os._exit(1)
    assert _BACKEND is not None
    chunk = _BACKEND.deserialize_chunk(data)
    return _BACKEND.decrypt(ChunkedVector(_BACKEND.slots, (chunk,)), verified=True)


class DecryptPool:
    """`workers` local processes decrypting chunks; started at first use, shut down by `close`.

    `workers` <= 1: no processes; `active` is False and the handler decrypts in-process.
    `retries`: how many times a measurement is resubmitted to a fresh pool after a worker died.
    `die_marker`: tests only: a file whose presence makes the first worker that sees it exit.
    """

    def __init__(self, workers: int, *, secret_path: Path | None = None, secret_bytes: bytes | None = None,
                 retries: int = 2, min_chunks: int = MIN_POOLED_CHUNKS, die_marker: Path | None = None) -> None:
        if workers < 0:
            raise InvalidInputError(f"decrypt workers must be >= 0 (0 or 1: in-process), got {workers}")
        if workers > 1 and (secret_path is None) == (secret_bytes is None):
            raise InvalidInputError("a decrypt pool needs exactly one of secret_path or secret_bytes")
        self.workers = workers
        self.min_chunks = min_chunks
        self._secret_path = str(secret_path) if secret_path is not None else None
        self._secret_bytes = secret_bytes
        self._retries = retries
        self._die_marker = str(die_marker) if die_marker is not None else None
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self.restarts = 0

    @property
    def active(self) -> bool:
        return self.workers > 1

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
                initargs=(self._secret_path, self._secret_bytes, self._die_marker))
        return self._executor

    def warm(self, chunk_count: int) -> None:
        """Start the workers (without waiting) if a measurement of `chunk_count` chunks will use them.

        Called when a request's header arrives, so the workers load the key while its chunks
        stream in; depends only on the public chunk count.
        """
        if not self.active or chunk_count < self.min_chunks:
            return
        with self._lock:
            if self._executor is None:
                with without_user_main():  # the workers start now: they must not run the caller's script
                    self._pool().submit(_ready)

    def decrypt_chunks(self, chunks: Sequence[bytes]) -> list[IntArray]:
        """Each chunk's slot values, in order; a dead worker: a fresh pool decrypts them all again."""
        with self._lock:
            for attempt in range(self._retries + 1):
                pool = self._pool()
                try:
                    size = max(1, len(chunks) // (4 * self.workers))
                    with without_user_main():  # workers start on demand inside map
                        return list(pool.map(_decrypt_chunk, chunks, chunksize=size))
                except BrokenProcessPool:
                    self._executor = None
                    # A broken pool's shutdown(wait=True) can wait forever on a surviving worker: end ours.
                    survivors = list((getattr(pool, "_processes", None) or {}).values())
                    pool.shutdown(wait=False, cancel_futures=True)
                    for proc in survivors:
                        proc.kill()
                        proc.join(10)
                    self.restarts += 1
                    log.warning("a decrypt worker died (attempt %d); decrypting the measurement again", attempt + 1)
            raise WorkerLostError(f"decrypt workers died {self._retries + 1} times (see the server log); nothing was "
                                  "released")

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=True, cancel_futures=True)
                self._executor = None


class PooledDecryption:
    """The backend view `DecryptionSide` decrypts through: everything from `backend`, except that
    `decrypt` sends the received chunk bytes (`sent`, in measured-chunk order) to the pool."""

    def __init__(self, backend: BfvBackend, pool: DecryptPool, sent: Sequence[bytes]) -> None:
        self._backend = backend
        self._pool = pool
        self._sent = sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def decrypt(self, a: ChunkedVector, *, verified: bool = False) -> IntArray:
        """As `BfvBackend.decrypt` (same values), with the chunks decrypted by the pool's workers."""
        if not verified:
            self._backend.verify(a)
        if sum(c is not None for c in a.chunks) != len(self._sent):
            raise InvalidInputError("the pooled decryption got another chunk list than the measurement's")
        done = iter(self._pool.decrypt_chunks(self._sent))
        slots = self._backend.slots
        parts = [np.zeros(slots, dtype=np.int64) if c is None else next(done) for c in a.chunks]
        return np.concatenate(parts)[: a.length] if parts else np.zeros(0, dtype=np.int64)
