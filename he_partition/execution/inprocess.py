"""The chunk work in the calling process: the reference executor (tests, one-core hosts)."""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

from ..core.backend import VectorBackend
from .base import ChunkSource, ChunkWorker, IntArray, MakeHeld

__all__ = ["InProcessExecutor"]


class InProcessExecutor:
    """One `ChunkWorker` in this process; `backend` (optional) saves re-loading a context the caller holds."""

    workers = 1

    def __init__(self, backend: VectorBackend | None = None) -> None:
        self._worker = ChunkWorker(backend)
        self._has_backend = backend is not None

    def start(self) -> None:
        """Nothing to start: the work runs in this process."""

    def load(self, key: str, context: bytes, source: ChunkSource, n_chunks: int) -> None:
        self._worker.load(key, b"" if self._has_backend else context, source, range(n_chunks))

    def write_sums(self, context: bytes, source: ChunkSource, n_chunks: int, out_template: str, *,
                   wait: bool = True) -> bool:
        self._worker.write_sums(b"" if self._has_backend else context, source, range(n_chunks), out_template)
        return True

    def noised(self, key: str, noise: Mapping[int, IntArray]) -> Iterator[tuple[int, bytes]]:
        """Each chunk of `noise`, in index order, computed only when the consumer asks for it."""
        for i in sorted(noise):
            yield i, self._worker.noised(key, i, noise[i])

    def hold(self, key: str, make: MakeHeld) -> None:
        self._worker.hold(key, *make(0))

    def call(self, key: str, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        return [self._worker.call(key, method, a) for a in args]

    def drop(self, key: str) -> None:
        self._worker.drop(key)

    def close(self) -> None:
        self._worker = ChunkWorker()
