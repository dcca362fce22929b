"""The chunk work on a Ray cluster: one actor per worker, each holding the public context and its chunks' sums.

Ray is optional (`pip install 'dpagg[ray]'`) and imported only here. Without an address,
`ray.init` starts a private local Ray bound to 127.0.0.1 with the dashboard off; with one
(`HOST:PORT` of a running cluster, or `ray://HOST:PORT` for Ray Client) it joins that
cluster. Anyone who reaches a Ray cluster can run code on it and read what its workers
hold, and the noise vectors sent to the actors are DP secrets: run the cluster on a private
network, bound to the addresses you configure, with RAY_USE_TLS and certificates from the
deployment's CA (docs/scaling.md).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Iterator, Mapping, Sequence

from ..core.errors import InvalidInputError
from .base import ChunkSource, ChunkWorker, IntArray, MakeHeld, owner_of, share_of

__all__ = ["RayExecutor", "MAX_RESTARTS"]

log = logging.getLogger("dpagg.execution")

#: A dead actor is replaced at most this many times per call before the call fails.
MAX_RESTARTS = 3


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise InvalidInputError("the Ray executor needs Ray: pip install 'dpagg[ray]'") from exc
    return ray


class RayExecutor:
    """`workers` Ray actors (0: one per CPU the cluster reports), created at first load and kept across releases.

    `resources`: custom Ray resources each actor asks for (e.g. {"node_a": 1}) to pin actors
    to nodes. `node_ip`: the address this driver's Ray processes bind to (loopback unless
    the cluster spans hosts).
    """

    def __init__(self, workers: int = 0, *, address: str = "", resources: list[dict[str, float]] | None = None,
                 node_ip: str = "127.0.0.1") -> None:
        ray = _ray()
        if workers < 0:
            raise InvalidInputError(f"workers must be >= 0 (0: one per cluster CPU), got {workers}")
        if os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true"):
            log.warning("Ray runs WITHOUT TLS (RAY_USE_TLS is not set): the noise sent to the chunk actors crosses "
                        "the network in the clear; see docs/scaling.md, 'Security of the cluster'")
        if not ray.is_initialized():
            if address.startswith("ray://"):  # Ray Client: the driver runs on the cluster's head
                ray.init(address=address, log_to_driver=False)
            elif address:
                ray.init(address=address, _node_ip_address=node_ip, log_to_driver=False)
            else:
                ray.init(address="local", include_dashboard=False, _node_ip_address=node_ip, log_to_driver=False)
        self._owns_ray = not address
        self.workers = workers or int(ray.cluster_resources().get("CPU", 1)) or 1
        self._resources = resources or [{}] * self.workers
        if len(self._resources) != self.workers:
            raise InvalidInputError(f"resources lists {len(self._resources)} actors but workers is {self.workers}")
        self._actor_class = ray.remote(num_cpus=1, max_restarts=0)(ChunkWorker)
        self._actors: list[Any] = [None] * self.workers
        self._loaded: dict[str, tuple[bytes, ChunkSource, int]] = {}
        self._held: dict[str, MakeHeld] = {}
        self._lock = threading.Lock()

    def actors(self) -> list[Any]:
        """The live actor handles (tests kill one to show the retry)."""
        return list(self._actors)

    def _load_refs(self, w: int, keys: list[str]) -> list[Any]:
        actor = self._actors[w]
        refs = []
        for key in keys:
            context, source, n = self._loaded[key]
            idx = [i for i in range(n) if owner_of(i, self.workers) == w]
            refs.append(actor.load.remote(key, context, share_of(source, idx), idx))
        return refs

    def _start(self, w: int) -> None:
        """A fresh actor for slot `w`, given every loaded aggregate."""
        ray = _ray()
        for attempt in range(MAX_RESTARTS + 1):
            self._actors[w] = self._actor_class.options(resources=self._resources[w] or None).remote()
            try:
                ray.get(self._load_refs(w, list(self._loaded)))
                ray.get([self._actors[w].hold.remote(key, *make(w)) for key, make in self._held.items()])
                return
            except ray.exceptions.RayActorError:
                log.warning("chunk actor %d died while loading (attempt %d); starting another", w, attempt + 1)
        raise RuntimeError(f"chunk actor {w} died {MAX_RESTARTS + 1} times while loading its chunks")

    def start(self) -> None:
        """Create every missing actor now (they are kept until `close`)."""
        with self._lock:
            for w in range(self.workers):
                if self._actors[w] is None:
                    self._start(w)

    def load(self, key: str, context: bytes, source: ChunkSource, n_chunks: int) -> None:
        ray = _ray()
        with self._lock:
            self._loaded[key] = (context, source, n_chunks)
            context_ref = ray.put(context)  # shipped once to the object store, not once per actor
            self._loaded[key] = (context_ref, source, n_chunks)
            refs: dict[int, Any] = {}
            for w in range(self.workers):
                if self._actors[w] is None:
                    self._start(w)
                else:
                    refs[w] = self._load_refs(w, [key])[0]
            for w, ref in refs.items():
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    self._start(w)

    def noised(self, key: str, noise: Mapping[int, IntArray]) -> Iterator[tuple[int, bytes]]:
        """Chunks in index order; a dead actor is replaced and re-sent the same noise for its chunks not yet streamed."""
        ray = _ray()
        with self._lock:
            if key not in self._loaded:
                raise InvalidInputError(f"no aggregate loaded under {key!r}; load it before measuring")
            refs = {i: self._actors[owner_of(i, self.workers)].noised.remote(key, i, noise[i]) for i in sorted(noise)}
            restarts = [0] * self.workers
            for i in sorted(noise):
                w = owner_of(i, self.workers)
                while True:
                    try:
                        data: bytes = ray.get(refs[i])
                        break
                    except ray.exceptions.RayActorError:
                        restarts[w] += 1
                        if restarts[w] > MAX_RESTARTS:
                            raise RuntimeError(f"chunk actor {w} died {restarts[w]} times in one measurement") from None
                        log.warning("chunk actor %d died; starting another and re-sending the same values", w)
                        self._start(w)
                        for j in refs:
                            if j >= i and owner_of(j, self.workers) == w:
                                refs[j] = self._actors[w].noised.remote(key, j, noise[j])
                yield i, data

    def hold(self, key: str, make: MakeHeld) -> None:
        """Actor w builds and keeps `make(w)` (all in parallel); a replacement actor gets it again."""
        ray = _ray()
        with self._lock:
            self._held.pop(key, None)
            for w in range(self.workers):
                if self._actors[w] is None:
                    self._start(w)  # started first (with the other keys), so every actor builds this one in parallel
            self._held[key] = make
            refs = {w: self._actors[w].hold.remote(key, *make(w)) for w in range(self.workers)}
            for w, ref in refs.items():
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    self._start(w)

    def call(self, key: str, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        """`method(*args[w])` on each actor's held object, in parallel; a dead actor is replaced and re-sent args[w]."""
        ray = _ray()
        if len(args) != self.workers:
            raise InvalidInputError(f"{len(args)} argument tuples for {self.workers} workers")
        with self._lock:
            if key not in self._held:
                raise InvalidInputError(f"nothing is held under {key!r}; hold it before calling it")
            refs = [self._actors[w].call.remote(key, method, args[w]) for w in range(self.workers)]
            out = []
            for w in range(self.workers):
                for _attempt in range(MAX_RESTARTS + 1):
                    try:
                        out.append(ray.get(refs[w]))
                        break
                    except ray.exceptions.RayActorError:
                        log.warning("chunk actor %d died; starting another and re-sending the same values", w)
                        self._start(w)
                        refs[w] = self._actors[w].call.remote(key, method, args[w])
                else:
                    raise RuntimeError(f"chunk actor {w} died {MAX_RESTARTS + 1} times in one call")
            return out

    def write_sums(self, context: bytes, source: ChunkSource, n_chunks: int, out_template: str, *,
                   wait: bool = True) -> bool:
        """In this process: an actor may run on a machine that can read the chunk files but not write here."""
        ChunkWorker().write_sums(context, source, range(n_chunks), out_template)
        return True

    def drop(self, key: str) -> None:
        with self._lock:
            self._loaded.pop(key, None)
            self._held.pop(key, None)
            for a in self._actors:
                if a is not None:
                    a.drop.remote(key)

    def close(self) -> None:
        ray = _ray()
        with self._lock:
            for a in self._actors:
                if a is not None:
                    ray.kill(a)
            self._actors = [None] * self.workers
            self._loaded.clear()
            self._held.clear()
            if self._owns_ray and ray.is_initialized():
                ray.shutdown()
