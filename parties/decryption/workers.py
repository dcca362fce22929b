"""The key holder's local worker pool: each received chunk parsed, integrity-checked and decrypted once, in parallel.

Only local processes (`concurrent.futures.ProcessPoolExecutor`, spawn start method): no Ray,
no remote executor, no socket. Each worker loads the secret context itself, from the key
store's file on this host (`secret_path`, mode 0600) or, for an in-memory server (tests), from
the bytes handed to it through the spawn pipe; the secret key never crosses a network. A study
with its own key names it with each chunk (`KeyRef`: its key file, or its bytes in memory); the
worker loads it once and keeps a few.

The pipeline (`ChunkPipeline`): as each chunk of a DecryptMeasurement stream arrives, the
servicer hands its bytes (and, in a signed study, the owners' aggregate c1 of that chunk) to
the pool and keeps receiving. A worker parses the chunk once, puts the owners' c1 in place
(signed study), adds the key holder's own flood to c0 (`BfvBackend.holder_flooded`, keyed by
the handler's flood key, which reaches the worker with each chunk through its pipe), reads
the integrity check (noise budget) and decrypts it, and returns the chunk's slot values
(mod t, centred) with the check's outcome; it raises only for bytes that are no chunk of
this context (a public fact).

Privacy: what is decrypted when, and who sees it. Chunks are decrypted as they arrive, before
the ledger is charged, but only inside the key holder's own processes (the server process
and its local workers); the slot values wait in the server process (`ChunkPipeline`) and are
read only by `DecryptionSide.decrypt_measurement` after the charge commits. What stays in the
coordinator (the handler's thread), in its order: the keyed noise draw (fixed from the noise
key and the request before anything data-dependent is read), waiting for every chunk to be
parsed (`ChunkPipeline.arrived`: refusals of public facts only), the one ledger transaction,
then the integrity outcomes (`PipelinedDecryption.verify`), decoding, adding the draw and the
magnitude check. A refused charge discards the values and nothing is released; a failed
integrity check after the charge is a charged refusal. Nobody outside the key holder sees a
value or an integrity outcome before the charge.
Workers compute a deterministic function of the chunk bytes, so the released values are
byte-identical to the in-process path under the same noise key, and a worker that dies is
replaced and the measurement's chunks are decrypted again from their bytes: the released
values and the ledger row are those of the first attempt (`tests/parties/test_decryption_workers.py`).

A key-share holder runs its shares on the same pool, started `keyless` (no server key: each task
names the holder's key share, `parties.decryption.keyshare.share_workers`), through `submit_task`
and `run_again`.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import numpy.typing as npt

from he_partition.core.backend import ChunkedVector
from he_partition.core.errors import DPAggError, InvalidInputError, PrecisionError, WorkerLostError
from he_partition.execution.spawning import end_with_parent, usable_cores, without_user_main
from he_partition.he.bfv import MIN_NOISE_BUDGET_BITS, BfvBackend, load_context

__all__ = ["ChunkPipeline", "DecryptPool", "FloodedDecryption", "PipelinedDecryption", "default_decrypt_workers", "MIN_POOLED_CHUNKS",
           "maybe_die"]

log = logging.getLogger("dpagg.decryption")

IntArray = npt.NDArray[np.int64]
C1 = npt.NDArray[np.uint64]
#: A chunk as a worker returns it: (slot values, whether it passed the integrity check).
Checked = tuple[IntArray, bool]

#: Measurements with fewer chunks than this are parsed, checked and decrypted in the handler's
#: process (a round trip to a worker costs more than one or two chunks' ~2.3 ms of work).
MIN_POOLED_CHUNKS = 4
#: Most workers the default starts (`default_decrypt_workers`): past that the server process's
#: receiving, not decryption, bounds a measurement.
MAX_DEFAULT_WORKERS = 8

_BACKEND: BfvBackend | None = None
_DIE_MARKER: Path | None = None
#: A worker's loaded study keys (a key per study), by what they were loaded from (`_study_backend`).
_STUDY_BACKENDS: dict[str, BfvBackend] = {}
#: Most study keys one worker keeps loaded.
MAX_WORKER_KEYS = 8
#: What names a study's secret key to a worker: its file on this host, or (in-memory servers) its bytes; None:
#: the server key the worker started with.
KeyRef = str | bytes | None


def default_decrypt_workers() -> int:
    """The decryption server's default worker count: min(cores this process may use, 8); 0 (in-process) on one core."""
    cores = usable_cores()
    return min(cores, MAX_DEFAULT_WORKERS) if cores > 1 else 0


def _init_worker(secret_path: str | None, secret_bytes: bytes | None, die_marker: str | None,
                 preload: str | None = None) -> None:
    """Load the secret context in this worker (from the local key file, or bytes from the spawn pipe); neither
    (a keyless pool): no server key, each task names its key. `preload`: a module of the tasks to come, imported
    (and its `prepare()` run) now rather than at the first task."""
    global _BACKEND, _DIE_MARKER
    end_with_parent()
    if preload is not None:
        getattr(importlib.import_module(preload), "prepare", lambda: None)()
    data = Path(secret_path).read_bytes() if secret_path is not None else secret_bytes
    _BACKEND = BfvBackend(load_context(data)) if data is not None else None
    _DIE_MARKER = Path(die_marker) if die_marker is not None else None


def maybe_die() -> None:
    """Fault injection for the retry tests: exactly one worker (the first that finds the die marker) exits, once."""
    if _DIE_MARKER is not None:
        try:
            _DIE_MARKER.unlink()
        except FileNotFoundError:
            pass
        else:
            os._exit(1)


def _ready() -> None:
    """A no-op: submitting it spawns a worker of a new pool."""


def _study_backend(key: KeyRef) -> BfvBackend:
    """The backend of the key `key` names (loaded once per worker, a few kept), or the server key's."""
    if key is None:
        assert _BACKEND is not None
        return _BACKEND
    name = key if isinstance(key, str) else hashlib.sha256(key).hexdigest()
    backend = _STUDY_BACKENDS.pop(name, None)
    if backend is None:
        backend = BfvBackend(load_context(Path(key).read_bytes() if isinstance(key, str) else key))
    _STUDY_BACKENDS[name] = backend  # the newest last
    while len(_STUDY_BACKENDS) > MAX_WORKER_KEYS:
        _STUDY_BACKENDS.pop(next(iter(_STUDY_BACKENDS)))
    return backend


def _check_and_decrypt(data: bytes, index: int, c1: C1 | None, flood_key: bytes | None = None,
                       key: KeyRef = None) -> tuple[IntArray, bool]:
    """Chunk `index` of a measurement under the key `key` names (a study's own; None: the server key): parsed
    once, its c1 replaced by the owners' `c1` (signed study), flooded with the key holder's own noise
    (`flood_key`; None: not flooded, checked at the unflooded MIN_NOISE_BUDGET_BITS), decrypted. (Its slot
    values centred in (-t/2, t/2], whether it passed the integrity check); InvalidInputError raised when the
    bytes are not a chunk of this context."""
    maybe_die()
    backend = _study_backend(key)
    if c1 is not None:
        data = backend.with_c1(data, c1, chunk=index)
    if flood_key is not None:
        return backend.decrypt_flooded(backend.deserialize_chunk(backend.holder_flooded(data, flood_key, chunk=index)))
    chunk = backend.deserialize_chunk(data)
    passed = backend.noise_budget(chunk) >= MIN_NOISE_BUDGET_BITS
    return backend.decrypt(ChunkedVector(backend.slots, (chunk,)), verified=True), passed


class DecryptPool:
    """`workers` local processes checking and decrypting chunks; started by `start` (the server) or at first use,
    kept until `close`.

    `workers` <= 1: no processes; `active` is False and the handler decrypts in-process.
    `retries`: how many times a measurement is resubmitted to a fresh pool after a worker died.
    `die_marker`: tests only: a file whose presence makes the first worker that sees it exit.
    `keyless`: the workers load no server key (a key-share holder's pool: each task names its key share).
    `preload`: a module each worker imports as it starts (the module of its tasks).
    """

    def __init__(self, workers: int, *, secret_path: Path | None = None, secret_bytes: bytes | None = None,
                 retries: int = 2, min_chunks: int = MIN_POOLED_CHUNKS, die_marker: Path | None = None,
                 keyless: bool = False, preload: str | None = None) -> None:
        if workers < 0:
            raise InvalidInputError(f"decrypt workers must be >= 0 (0 or 1: in-process), got {workers}")
        if keyless and (secret_path is not None or secret_bytes is not None):
            raise InvalidInputError("a keyless pool takes no server key")
        if workers > 1 and not keyless and (secret_path is None) == (secret_bytes is None):
            raise InvalidInputError("a decrypt pool needs exactly one of secret_path or secret_bytes")
        self.workers = workers
        self.min_chunks = min_chunks
        self._secret_path = str(secret_path) if secret_path is not None else None
        self._secret_bytes = secret_bytes
        self._retries = retries
        self._die_marker = str(die_marker) if die_marker is not None else None
        self._preload = preload
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self.restarts = 0

    @property
    def active(self) -> bool:
        return self.workers > 1

    def uses_pool(self, chunk_count: int) -> bool:
        """Whether a measurement of `chunk_count` chunks (public) goes through the workers."""
        return self.active and chunk_count >= self.min_chunks

    def _pool(self) -> ProcessPoolExecutor:
        """The executor, created with all its workers spawned (caller holds `_lock`)."""
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
                initargs=(self._secret_path, self._secret_bytes, self._die_marker, self._preload))
            with without_user_main():  # the workers start now: they must not run the caller's script
                for _ in range(self.workers):  # each submit finds no idle worker and spawns one
                    self._executor.submit(_ready)
        return self._executor

    def start(self) -> None:
        """Spawn the workers now (without waiting for them to load the key); no-op when in-process."""
        if self.active:
            with self._lock:
                self._pool()

    def warm(self, chunk_count: int) -> None:
        """Start the workers (without waiting) if a measurement of `chunk_count` chunks will use them.

        Called when a request's header arrives, so the workers load the key while its chunks
        stream in (when the server did not start them already); depends only on the public chunk count.
        """
        if self.uses_pool(chunk_count):
            self.start()

    def pipeline(self, flood_key: bytes | None = None, key: KeyRef = None) -> ChunkPipeline:
        """A new measurement's pipeline under the key `key` names (a study's own; None: the server key): hand it
        each chunk as it arrives (`ChunkPipeline.submit`).

        `flood_key`: the key holder's flood key (`DecryptionHandler.decrypt_pipeline` passes it; None:
        chunks are not flooded, for callers that check unflooded chunks)."""
        return ChunkPipeline(self, flood_key, key)

    def _submit(self, data: bytes, index: int, c1: C1 | None, flood_key: bytes | None = None,
                key: KeyRef = None) -> tuple[ProcessPoolExecutor, Future[Checked]]:
        return self.submit_task(_check_and_decrypt, data, index, c1, flood_key, key)

    def submit_task(self, fn: Callable[..., Any], *args: Any) -> tuple[ProcessPoolExecutor, Future[Any]]:
        """`fn(*args)` on a worker (`fn` a module-level function): (the executor it went to, its future).

        A worker that died while earlier tasks were in work: the future holds BrokenProcessPool, and the caller
        runs its tasks again (`run_again`)."""
        with self._lock:
            pool = self._pool()
            try:
                return pool, pool.submit(fn, *args)
            except BrokenProcessPool as exc:  # a worker died while earlier chunks were in work
                lost: Future[Any] = Future()  # `ChunkPipeline.values` then decrypts every chunk again
                lost.set_exception(exc)
                return pool, lost

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        """Drop a broken executor (if it is still ours) and end its surviving workers (caller holds `_lock`)."""
        if self._executor is broken:
            self._executor = None
        # A broken pool's shutdown(wait=True) can wait forever on a surviving worker: end ours.
        survivors = list((getattr(broken, "_processes", None) or {}).values())
        broken.shutdown(wait=False, cancel_futures=True)
        for proc in survivors:
            proc.kill()
            proc.join(10)

    def _decrypt_again(self, sent: Sequence[tuple[bytes, C1 | None]], broken: ProcessPoolExecutor,
                       flood_key: bytes | None = None, key: KeyRef = None) -> list[Checked]:
        """After a worker died: every chunk of the measurement checked and decrypted again by a fresh pool, in order."""
        return self.run_again(_check_and_decrypt, [(d, i, c, flood_key, key) for i, (d, c) in enumerate(sent)],
                              broken)

    def run_again(self, fn: Callable[..., Any], rows: Sequence[tuple[Any, ...]],
                  broken: ProcessPoolExecutor) -> list[Any]:
        """After a worker died: `fn(*row)` of every row again, by a fresh pool, in order (up to `retries` pools, then
        WorkerLostError)."""
        with self._lock:
            self._replace(broken)
            for attempt in range(self._retries):
                self.restarts += 1
                log.warning("a decrypt worker died (attempt %d); computing the measurement's chunks again",
                            attempt + 1)
                pool = self._pool()
                try:
                    size = max(1, len(rows) // (4 * self.workers))
                    return list(pool.map(fn, *zip(*rows), chunksize=size)) if rows else []
                except BrokenProcessPool:
                    self._replace(pool)
            self.restarts += 1
            raise WorkerLostError(f"decrypt workers died {self._retries + 1} times (see the server log); nothing was "
                                  "released")

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=True, cancel_futures=True)
                self._executor = None


class ChunkPipeline:
    """One measurement's chunks in the key holder's workers: each parsed, checked and decrypted as it arrives.

    Privacy: the slot values and integrity outcomes the workers return stay in this object,
    in the key holder's process; `values` hands them to `PipelinedDecryption`, whose `verify`
    and `decrypt` the decryption side calls only after the ledger charge committed. Before
    the charge only `failed` and `arrived` are read, and they raise only for bytes that are
    no chunk (public). A refusal or a refused charge drops the object, and with it the values.
    """

    def __init__(self, pool: DecryptPool, flood_key: bytes | None = None, key: KeyRef = None) -> None:
        self._pool = pool
        self.flood_key = flood_key
        self._key = key
        self._sent: list[tuple[bytes, C1 | None]] = []
        self._futures: list[tuple[ProcessPoolExecutor, Future[Checked]]] = []
        self._seen = 0  # chunks before this one are known to have been parsed
        self._values: list[Checked] | None = None

    def __len__(self) -> int:
        return len(self._sent)

    def submit(self, data: bytes, c1: C1 | None = None) -> None:
        """Hand the next chunk (its bytes; in a signed study the owners' aggregate c1 it is decrypted with) to a worker."""
        self._futures.append(self._pool._submit(data, len(self._sent), c1, self.flood_key, self._key))
        self._sent.append((data, c1))

    def failed(self) -> DPAggError | None:
        """The refusal of the first chunk a worker already refused as no chunk of this context, if any
        (non-blocking; chunks still in work and a dead worker count as not failed). Lets the servicer refuse a
        stream before it ends; a failed integrity check is no refusal here (it is read after the charge)."""
        while self._seen < len(self._futures):
            future = self._futures[self._seen][1]
            if not future.done():
                return None
            exc = future.exception()
            if isinstance(exc, DPAggError):
                return exc
            if exc is not None:
                return None
            self._seen += 1
        return None

    def arrived(self) -> None:
        """Wait until every chunk is parsed and decrypted; raise only the refusal of bytes that are no chunk.

        What the handler waits for before the charge: the integrity outcomes stay unread.
        """
        self._checked()

    def values(self) -> list[IntArray]:
        """Every chunk's slot values, in order, once all workers answered; PrecisionError naming the first chunk
        that failed the integrity check. Called after the charge (`PipelinedDecryption`).

        A worker that died: all chunks are checked and decrypted again by a fresh pool
        (deterministic: the same values), up to the pool's retries, then WorkerLostError.
        """
        out = self._checked()
        for i, (_, passed) in enumerate(out):
            if not passed:
                raise PrecisionError(f"ciphertext chunk {i} failed the decryption integrity check (its noise budget "
                                     "is too small): it was made under another key or is corrupt")
        return [v for v, _ in out]

    def _checked(self) -> list[Checked]:
        """(values, passed) of every chunk, in order; refusals of bytes that are no chunk raised."""
        if self._values is None:
            out: list[Checked] = []
            for pool, future in self._futures:
                try:
                    out.append(future.result())
                except BrokenProcessPool:
                    self.discard()
                    out = self._pool._decrypt_again(self._sent, pool, self.flood_key, self._key)
                    break
                except DPAggError as exc:
                    self.discard()
                    raise exc.with_traceback(None) from None
            self._values = out
        return self._values

    def discard(self) -> None:
        """Cancel what the workers have not started; drop every value decrypted so far."""
        for _, future in self._futures:
            future.cancel()
        self._futures = []
        self._values = None


class PipelinedDecryption:
    """The backend view `DecryptionSide` decrypts through when a measurement's chunks went to the workers.

    Everything comes from `backend`, except: `verify` (called after the ledger charge) reads
    every chunk's integrity outcome from the workers and raises the first refusal; `decrypt`
    assembles the slot values the workers returned, zeros for unsent chunks.
    """

    def __init__(self, backend: BfvBackend, pipeline: ChunkPipeline) -> None:
        self._backend = backend
        self._pipeline = pipeline

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def verify(self, a: ChunkedVector) -> None:
        """Refuse (PrecisionError / InvalidInputError) unless every sent chunk passed the integrity check."""
        if sum(c is not None for c in a.chunks) != len(self._pipeline):
            raise InvalidInputError("the pooled decryption got another chunk list than the measurement's")
        self._pipeline.values()

    def decrypt(self, a: ChunkedVector, *, verified: bool = False) -> IntArray:
        """As `BfvBackend.decrypt` (same values), from the values the workers decrypted."""
        if not verified:
            self.verify(a)
        done = iter(self._pipeline.values())
        slots = self._backend.slots
        parts = [np.zeros(slots, dtype=np.int64) if c is None else next(done) for c in a.chunks]
        return np.concatenate(parts)[: a.length] if parts else np.zeros(0, dtype=np.int64)


class FloodedDecryption:
    """The backend view `DecryptionSide` decrypts through when the handler flooded the chunks itself (in-process).

    `verify` (called after the ledger charge) reads every chunk's integrity outcome with
    `BfvBackend.decrypt_flooded` (each chunk decrypted whatever its outcome: the work does not
    depend on it) and raises the first refusal; `decrypt` assembles those values.
    """

    def __init__(self, backend: BfvBackend) -> None:
        self._backend = backend
        self._done: list[Checked | None] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def verify(self, a: ChunkedVector) -> None:
        """PrecisionError naming the first chunk whose flooded noise budget is below FLOODED_MIN_BUDGET_BITS."""
        self._done = [None if c is None else self._backend.decrypt_flooded(c) for c in a.chunks]
        for i, d in enumerate(self._done):
            if d is not None and not d[1]:
                raise PrecisionError(f"ciphertext chunk {i} failed the decryption integrity check (its noise "
                                     "budget is too small): it was made under another key or is corrupt")

    def decrypt(self, a: ChunkedVector, *, verified: bool = False) -> IntArray:
        """As `BfvBackend.decrypt` of the flooded chunks (the same values for an honest chunk)."""
        if not verified or self._done is None:
            self.verify(a)
        assert self._done is not None
        slots = self._backend.slots
        parts = [np.zeros(slots, dtype=np.int64) if d is None else d[0] for d in self._done]
        return np.concatenate(parts)[: a.length] if parts else np.zeros(0, dtype=np.int64)
