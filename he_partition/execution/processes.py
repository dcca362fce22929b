"""The chunk work in local worker processes, one per core (the servers' default).

SEAL's bindings hold the GIL, so threads would not help. Workers are spawned, never forked
(the caller may be a gRPC server with live threads); each loads the public context once and
reads its chunks from the `ChunkSource` itself, so only bytes, integers and paths cross the
process boundary. Chunk i belongs to worker i % workers for the whole release.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
from multiprocessing.connection import Connection
from typing import Any, Iterator, Mapping, Sequence

from ..core.errors import InvalidInputError, WorkerLostError
from .heap import return_big_blocks_to_the_os
from .spawning import without_user_main
from .base import ChunkSource, ChunkWorker, IntArray, MakeHeld, owner_of, share_of

__all__ = ["ProcessExecutor", "MAX_RESTARTS"]

log = logging.getLogger("dpagg.execution")

#: A worker that dies is replaced at most this many times per call before the call fails.
MAX_RESTARTS = 3


class WorkerError(InvalidInputError):
    """A worker refused its task (bad chunk bytes, unknown key): the same refusal in-process would raise."""


def _serve(conn: Connection) -> None:
    """A worker's loop: load, noised (one reply per chunk, in the order sent), hold, call, sums, drop, stop."""
    return_big_blocks_to_the_os()  # a worker parses and writes ciphertext after ciphertext
    worker = ChunkWorker()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        op = msg[0]
        try:
            if op == "load":
                conn.send(("ok", worker.load(msg[1], msg[2], msg[3], msg[4])))
            elif op == "noised":
                for i, noise in msg[2]:
                    conn.send(("chunk", i, worker.noised(msg[1], i, noise)))
            elif op == "hold":
                worker.hold(msg[1], msg[2], msg[3])
                conn.send(("ok", None))
            elif op == "call":
                conn.send(("ok", worker.call(msg[1], msg[2], msg[3])))
            elif op == "sums":
                conn.send(("ok", worker.write_sums(msg[1], msg[2], msg[3], msg[4])))
            elif op == "drop":
                worker.drop(msg[1])
            elif op == "ping":  # ready: the HE library loaded, as for a first chunk
                from ..he import bfv  # noqa: F401

                conn.send(("ok", None))
            else:
                return
        except Exception as exc:  # reported to the coordinator, which raises it there
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class _Proc:
    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child,), daemon=True, name="dpagg-chunk-worker")
        with without_user_main():
            self.process.start()
        child.close()

    def stop(self, *, kill: bool = False) -> None:
        if kill:
            self.process.kill()
        else:
            try:
                self.conn.send(("stop",))
            except OSError:
                pass
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class ProcessExecutor:
    """`workers` spawned processes (0: one per core), kept from `start` (or first use) to `close`.

    A server starts them as it starts (`start`); every upload fold, release and direct query
    then runs on the same processes, and a worker that died is replaced when next used.
    """

    def __init__(self, workers: int = 0) -> None:
        if workers < 0:
            raise InvalidInputError(f"workers must be >= 0 (0: one per core), got {workers}")
        self.workers = workers or len(os.sched_getaffinity(0)) or 1
        self._ctx = mp.get_context("spawn")
        self._procs: list[_Proc | None] = [None] * self.workers
        self._loaded: dict[str, tuple[bytes, ChunkSource, int]] = {}
        self._held: dict[str, MakeHeld] = {}
        self._fresh: set[int] = set()  # started by `load`, not yet given the other keys
        self._starting: set[int] = set()  # started by `start`, importing
        self._lock = threading.Lock()
        self._closed = False  # set by `close` without the lock: a `start` in progress gives up

    def start(self) -> None:
        """Start every missing worker now and wait until each has loaded the HE library (idempotent).

        A server calls it once as it starts (in the background), so its workers have done
        their imports before the first upload fold or release, and every later use finds
        them running. A worker that dies while starting is started again when next used.
        `close` does not wait for the imports: it stops the workers half-started.
        """
        with self._lock:
            if self._closed:
                return
            new = [w for w in range(self.workers) if self._procs[w] is None]
            self._starting.update(new)
            try:
                for w in new:
                    self._procs[w] = _Proc(self._ctx)  # every worker imports at once
                for w in new:
                    try:
                        self._procs[w].conn.send(("ping",))  # type: ignore[union-attr]
                    except OSError:
                        self._forget(w)
                for w in new:
                    p = self._procs[w]
                    if p is None:
                        continue
                    try:
                        while not p.conn.poll(0.1):
                            if self._closed:
                                return
                        p.conn.recv()
                        for key in self._loaded:  # none when the server starts; kept right if called later
                            self._load_one(w, key)
                        for key in self._held:
                            self._hold_one(w, key)
                    except (EOFError, OSError):
                        log.warning("chunk worker %d died while starting; it is started again when next used", w)
                        self._forget(w)
            finally:
                if not self._closed:  # else `close` kills the ones still importing
                    self._starting.clear()

    def _forget(self, w: int) -> None:
        self._fresh.discard(w)
        p = self._procs[w]
        if p is not None:
            p.stop(kill=True)
            self._procs[w] = None

    def worker_pids(self) -> list[int | None]:
        """The live workers' process ids (tests kill one to show the retry)."""
        return [None if p is None else p.process.pid for p in self._procs]

    def _indices(self, w: int, n_chunks: int) -> list[int]:
        return [i for i in range(n_chunks) if owner_of(i, self.workers) == w]

    def _load_one(self, w: int, key: str) -> None:
        p = self._procs[w]
        assert p is not None
        self._send_load(p, w, key)
        self._load_reply(p, w)

    def _send_load(self, p: _Proc, w: int, key: str) -> None:
        context, source, n = self._loaded[key]
        idx = self._indices(w, n)
        p.conn.send(("load", key, context, share_of(source, idx), idx))

    @staticmethod
    def _load_reply(p: _Proc, w: int) -> None:
        reply = p.conn.recv()
        if reply[0] == "error":
            raise WorkerError(f"worker {w} could not load the aggregate: {reply[1]}")

    def _hold_one(self, w: int, key: str) -> None:
        p = self._procs[w]
        assert p is not None
        p.conn.send(("hold", key, *self._held[key](w)))
        reply = p.conn.recv()
        if reply[0] == "error":
            raise WorkerError(f"worker {w} could not build {key!r}: {reply[1]}")

    def _proc(self, w: int) -> _Proc:
        """Worker `w`, started (and given every loaded aggregate) if it is not running."""
        p = self._procs[w]
        if p is not None:
            return p
        for attempt in range(MAX_RESTARTS + 1):
            self._procs[w] = p = _Proc(self._ctx)
            try:
                for key in self._loaded:
                    self._load_one(w, key)
                for key in self._held:
                    self._hold_one(w, key)
                return p
            except (EOFError, OSError):
                log.warning("chunk worker %d died while loading (attempt %d); starting another", w, attempt + 1)
                p.stop(kill=True)
                self._procs[w] = None
        raise WorkerLostError(f"chunk worker {w} died {MAX_RESTARTS + 1} times while starting or loading its chunks "
                          "(see the server log): nothing was released")

    def _replace(self, w: int) -> _Proc:
        self._fresh.discard(w)
        p = self._procs[w]
        if p is not None:
            p.stop(kill=True)
            self._procs[w] = None
        log.warning("chunk worker %d died; starting another and re-sending the same values", w)
        return self._proc(w)

    def load(self, key: str, context: bytes, source: ChunkSource, n_chunks: int) -> None:
        with self._lock:
            self._loaded[key] = (context, source, n_chunks)
            for w in range(self.workers):
                if self._procs[w] is None:
                    self._procs[w] = _Proc(self._ctx)  # every fresh worker starts (imports) at once
                    self._fresh.add(w)
            # Every worker sums its share at the same time: send every load, then collect the replies.
            sent: list[int] = []
            try:
                for w in range(self.workers):
                    keys = list(self._loaded) if w in self._fresh else [key]
                    try:
                        for k in keys:
                            self._send_load(self._procs[w], w, k)  # type: ignore[arg-type]
                        sent.append(w)
                    except OSError:
                        self._replace(w)  # the replacement loads every key, this one included
                while sent:
                    w = sent[0]
                    try:
                        for _ in (list(self._loaded) if w in self._fresh else [key]):
                            self._load_reply(self._procs[w], w)  # type: ignore[arg-type]
                    except (EOFError, OSError):
                        sent.pop(0)
                        self._replace(w)
                        continue
                    sent.pop(0)
                    if w in self._fresh:
                        self._fresh.discard(w)
                        for k in self._held:
                            self._hold_one(w, k)
            finally:
                self._abandon(sent)

    def noised(self, key: str, noise: Mapping[int, IntArray]) -> Iterator[tuple[int, bytes]]:
        """Chunks in index order; worker w computes its chunks of `noise` in parallel with the others.

        A worker that dies is replaced (it re-aggregates its chunks from the source) and is
        sent the same noise for its chunks not yet streamed: only encryption and flooding
        randomness differ from the first attempt.
        """
        with self._lock:
            if key not in self._loaded:
                raise InvalidInputError(f"no aggregate loaded under {key!r}; load it before measuring")
            order = sorted(noise)
            pending: dict[int, list[int]] = {w: [] for w in range(self.workers)}
            for i in order:
                pending[owner_of(i, self.workers)].append(i)
            restarts = [0] * self.workers
            finished = False
            try:
                for w, idx in pending.items():
                    if idx:
                        self._send_noised(w, key, idx, noise, restarts)
                for i in order:
                    w = owner_of(i, self.workers)
                    data = self._receive(w, i, key, pending[w], noise, restarts)
                    pending[w].pop(0)
                    yield i, data
                finished = True
            finally:
                if not finished:  # replies may be in flight: those workers start afresh next time
                    for w, idx in pending.items():
                        p = self._procs[w]
                        if idx and p is not None:
                            p.stop(kill=True)
                            self._procs[w] = None

    def _send_noised(self, w: int, key: str, idx: list[int], noise: Mapping[int, IntArray],
                     restarts: list[int]) -> None:
        while True:
            try:
                self._proc(w).conn.send(("noised", key, [(i, noise[i]) for i in idx]))
                return
            except OSError:
                self._retry(w, restarts)

    def _receive(self, w: int, i: int, key: str, idx: list[int], noise: Mapping[int, IntArray],
                 restarts: list[int]) -> bytes:
        while True:
            p = self._proc(w)
            try:
                reply = p.conn.recv()
            except (EOFError, OSError):
                self._retry(w, restarts)
                self._send_noised(w, key, idx, noise, restarts)
                continue
            if reply[0] == "error":
                raise WorkerError(f"worker {w} refused chunk {i}: {reply[1]}")
            if reply[1] != i:
                raise RuntimeError(f"worker {w} answered chunk {reply[1]} where chunk {i} was due")
            data: bytes = reply[2]
            return data

    def _retry(self, w: int, restarts: list[int]) -> None:
        restarts[w] += 1
        if restarts[w] > MAX_RESTARTS:
            raise WorkerLostError(f"chunk worker {w} died {restarts[w]} times in one measurement (see the server log): "
                              "nothing was released")
        self._replace(w)

    def hold(self, key: str, make: MakeHeld) -> None:
        """Worker w builds and keeps `make(w)` (all workers in parallel); a replacement worker gets it again."""
        with self._lock:
            self._held.pop(key, None)
            for w in range(self.workers):
                self._proc(w)  # started first (with the other keys), so every worker builds this one in parallel
            self._held[key] = make
            started = []
            for w in range(self.workers):
                try:
                    self._procs[w].conn.send(("hold", key, *make(w)))  # type: ignore[union-attr]
                    started.append(w)
                except OSError:
                    self._replace(w)
            try:
                while started:
                    w = started[0]
                    p = self._procs[w]
                    assert p is not None
                    try:
                        reply = p.conn.recv()
                    except (EOFError, OSError):
                        started.pop(0)
                        self._replace(w)
                        continue
                    started.pop(0)
                    if reply[0] == "error":
                        raise WorkerError(f"worker {w} could not build {key!r}: {reply[1]}")
            finally:
                self._abandon(started)

    def call(self, key: str, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        """`method(*args[w])` on each worker's held object, in parallel; a dead worker is replaced and re-sent args[w]."""
        if len(args) != self.workers:
            raise InvalidInputError(f"{len(args)} argument tuples for {self.workers} workers")
        with self._lock:
            if key not in self._held:
                raise InvalidInputError(f"nothing is held under {key!r}; hold it before calling it")
            return self._round([("call", key, method, a) for a in args], f"refused {method}")

    def write_sums(self, context: bytes, source: ChunkSource, n_chunks: int, out_template: str, *,
                   wait: bool = True) -> bool:
        """Worker w sums and writes its chunks (`owner_of`), all workers in parallel; see `ChunkExecutor`."""
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            shares = [self._indices(w, n_chunks) for w in range(self.workers)]
            self._round([("sums", context, share_of(source, idx), idx, out_template) if idx else None
                         for idx in shares], "could not write its sums")
            return True
        finally:
            self._lock.release()

    def _round(self, messages: Sequence[tuple[Any, ...] | None], what: str) -> list[Any]:
        """Send worker w `messages[w]` (None: nothing), all at once; the replies in worker order.

        A worker that dies is replaced and sent its message again (each message may run twice).
        """
        restarts = [0] * self.workers
        out: list[Any] = []
        waiting: list[int] = []
        try:
            for w, msg in enumerate(messages):
                if msg is not None:
                    self._send(w, msg, restarts)
                    waiting.append(w)
            while waiting:
                w = waiting[0]
                try:
                    reply = self._proc(w).conn.recv()
                except (EOFError, OSError):
                    self._retry(w, restarts)
                    self._send(w, messages[w], restarts)  # type: ignore[arg-type]
                    continue
                waiting.pop(0)
                if reply[0] == "error":
                    raise WorkerError(f"worker {w} {what}: {reply[1]}")
                out.append(reply[1])
        finally:
            self._abandon(waiting)
        return out

    def _abandon(self, workers: list[int]) -> None:
        """Stop the workers whose replies are still due (after a failure): they start afresh when next used."""
        for w in workers:
            self._fresh.discard(w)
            p = self._procs[w]
            if p is not None:
                p.stop(kill=True)
                self._procs[w] = None

    def _send(self, w: int, msg: tuple[Any, ...], restarts: list[int]) -> None:
        while True:
            try:
                self._proc(w).conn.send(msg)
                return
            except OSError:
                self._retry(w, restarts)

    def drop(self, key: str) -> None:
        with self._lock:
            self._loaded.pop(key, None)
            self._held.pop(key, None)
            for p in self._procs:
                if p is not None:
                    try:
                        p.conn.send(("drop", key))
                    except OSError:
                        pass

    def close(self) -> None:
        self._closed = True  # a `start` waiting for imports returns, freeing the lock
        with self._lock:
            for w, p in enumerate(self._procs):
                if p is not None:
                    p.stop(kill=w in self._starting)  # a worker still importing would not read "stop" for seconds
                    self._procs[w] = None
            self._loaded.clear()
            self._held.clear()
            self._fresh.clear()
            self._starting.clear()
