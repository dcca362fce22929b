"""The executor interface, where workers read chunks from, and the worker-side state every executor shares."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import numpy as np
import numpy.typing as npt

from ..core.backend import VectorBackend
from ..core.errors import InvalidInputError

__all__ = ["ChunkSource", "ChunkFiles", "ChunkBytes", "SimulatedOwners", "ChunkWorker", "ChunkExecutor",
           "split_noise", "share_of", "MakeHeld"]

IntArray = npt.NDArray[np.int64]
#: Worker w's held object, as (module-level build function, its arguments); called again for a replacement.
MakeHeld = Callable[[int], tuple[Callable[..., Any], tuple[Any, ...]]]

class ChunkSource(Protocol):
    """The owners' stored ciphertext chunks, readable wherever a worker runs (it must pickle)."""

    def read(self, index: int) -> list[bytes]:
        """Chunk `index` of every owner, in the order the aggregate sums them."""
        ...


@dataclass(frozen=True)
class ChunkFiles:
    """Chunks on storage every worker can read: owner o's chunk i is `templates[o].format(index=i)`."""

    templates: tuple[str, ...]

    def read(self, index: int) -> list[bytes]:
        return [Path(t.format(index=index)).read_bytes() for t in self.templates]


@dataclass(frozen=True)
class ChunkBytes:
    """Chunks held in memory (in-memory stores, tests): `owners[o][i]` is owner o's chunk i."""

    owners: tuple[tuple[bytes, ...], ...]

    def read(self, index: int) -> list[bytes]:
        return [o[index] for o in self.owners]


#: Prefix of the context bytes a computation server sends its workers for a study whose key holders
#: take c1 from the owners' signed c1 parts: the workers then add the noise to c0 only
#: (`BfvBackend.noise_in_c0`), keeping the owners' aggregate c1. NOISE_IN_C0: no flood (threshold
#: mode: the key-share holders never see c0); NOISE_IN_C0_FLOODED: flooded in c0 too (the single key
#: holder decrypts the whole polynomial). Travels with the context, so every executor honours it unchanged.
NOISE_IN_C0 = b"dpagg/noise-in-c0/v1\n"
NOISE_IN_C0_FLOODED = b"dpagg/noise-in-c0-flooded/v1\n"


def noise_in_c0_context(context: bytes, *, flood: bool = False) -> bytes:
    """`context` marked for workers that add the noise to c0 only (and, with `flood`, flood c0)."""
    return (NOISE_IN_C0_FLOODED if flood else NOISE_IN_C0) + context


@dataclass(frozen=True)
class SimulatedOwners:
    """Data owners played where the chunk work runs: the library's `release(..., executor=...)` and its benchmark.

    One process plays every party there and holds the histograms anyway; the services never
    use this source (an owner encrypts on its own machine and uploads ciphertexts). Row r of
    `encoded[o]` is owner o's encoded histogram (`owner_encoding`: prefix sums, zero-padded
    like `split_chunks`) for chunk `indices[r]`. The worker that sums chunk i encrypts each
    owner's row under the study's public key, as that owner's `encrypt_histogram` would
    (same plaintext, a fresh encryption), so the owners' encryptions run on every worker at
    once, as they would on the owners' own machines. `context` is the public context
    (`read` needs it; a worker uses its own loaded backend). Holds no noise.
    """

    context: bytes
    indices: tuple[int, ...]
    encoded: tuple[IntArray, ...]

    @classmethod
    def of(cls, context: bytes, encoded: Sequence[IntArray], slots: int) -> "SimulatedOwners":
        """Every chunk of the owners' encoded histograms (each a 1-D vector of the domain's length)."""
        from ..core.backend import n_chunks

        k = n_chunks(int(encoded[0].size), slots)
        rows = []
        for e in encoded:
            padded = np.zeros(k * slots, dtype=np.int64)
            padded[: e.size] = e
            rows.append(padded.reshape(k, slots))
        return cls(context, tuple(range(k)), tuple(rows))

    def only(self, indices: Sequence[int]) -> "SimulatedOwners":
        """The rows of chunks `indices` only (what one worker needs; the others never cross its pipe)."""
        pos = self._positions()
        at = np.asarray([pos[int(i)] for i in indices], dtype=np.int64)
        return SimulatedOwners(self.context, tuple(int(i) for i in indices), tuple(e[at] for e in self.encoded))

    def _positions(self) -> dict[int, int]:
        return {i: r for r, i in enumerate(self.indices)}

    def ciphertexts(self, index: int, backend: VectorBackend) -> list[Any]:
        """Chunk `index` of every owner, freshly encrypted under `backend` (a public BFV backend)."""
        row = self._positions()[int(index)]
        return [backend.encrypt(e[row]).chunks[0] for e in self.encoded]

    def read(self, index: int) -> list[bytes]:
        backend = _bfv_backend(self.context)
        return [backend.serialize_chunk(c) for c in self.ciphertexts(index, backend)]


def share_of(source: ChunkSource, indices: Sequence[int]) -> ChunkSource:
    """What one worker needs of `source` to sum chunks `indices` (stored chunks travel as paths or bytes)."""
    return source.only(indices) if isinstance(source, SimulatedOwners) else source


def _owner_chunks(source: ChunkSource, backend: VectorBackend, index: int) -> list[Any]:
    """Chunk `index` of every owner as ciphertexts: read and parsed, or (simulated owners) encrypted here."""
    if isinstance(source, SimulatedOwners):
        return source.ciphertexts(index, backend)
    return [backend.deserialize_chunk(data) for data in source.read(index)]


def _bfv_backend(context: bytes) -> VectorBackend:
    from ..he.bfv import BfvBackend, load_context  # a worker loads TenSEAL only when it gets a context

    flood = context.startswith(NOISE_IN_C0_FLOODED)
    c0_only = flood or context.startswith(NOISE_IN_C0)
    if c0_only:
        context = context[len(NOISE_IN_C0_FLOODED if flood else NOISE_IN_C0):]
    ctx = load_context(context)
    if ctx.is_private():
        raise InvalidInputError("a chunk worker was sent a context holding a secret key; it takes public ones only")
    backend = BfvBackend(ctx)
    backend.noise_in_c0 = c0_only
    backend.flood_in_c0 = flood
    return backend


def _sum_owners(source: ChunkSource, backend: VectorBackend, index: int) -> Any:
    total = None
    for c in _owner_chunks(source, backend, index):
        total = c if total is None else total + c
    if total is None:
        raise InvalidInputError("at least one owner's chunks are needed to aggregate")
    return total


class ChunkWorker:
    """One worker's state: the public backend (loaded once per key) and, per release, the sum of its chunks.

    Holds no randomness that decides privacy: `noised` adds exactly the slot values it is
    given (the caller's draws and pads) under a fresh encryption, then floods (OS CSPRNG).
    """

    def __init__(self, backend: VectorBackend | None = None) -> None:
        self._backend = backend
        self._fingerprint = ""
        self._parts: dict[str, dict[int, Any]] = {}
        self._held: dict[str, Any] = {}
        self._backends: dict[str, VectorBackend] = {}

    def backend(self, context: bytes) -> VectorBackend:
        if self._backend is not None and not context:
            return self._backend
        fp = hashlib.sha256(context).hexdigest()
        if self._backend is None or fp != self._fingerprint:
            self._backend, self._fingerprint = _bfv_backend(context), fp
        return self._backend

    def load(self, key: str, context: bytes, source: ChunkSource, indices: Sequence[int]) -> int:
        """Sum every owner's chunk for each index in `indices` and keep the sums under `key`; returns the count."""
        backend = self.backend(context)
        parts = {int(i): _sum_owners(source, backend, i) for i in indices}
        self._parts[key] = parts
        self._backends[key] = backend  # its noise mode (the context's marker) stays with the aggregate
        return len(parts)

    def write_sums(self, context: bytes, source: ChunkSource, indices: Sequence[int], out_template: str) -> int:
        """Sum every owner's chunk for each index in `indices` and write the sum of chunk i, serialized, to
        `out_template.format(index=i)` (not synced: the caller makes the whole set durable); returns the count."""
        backend = self.backend(context)
        for i in indices:
            Path(out_template.format(index=int(i))).write_bytes(backend.serialize_chunk(_sum_owners(source, backend, i)))
        return len(indices)

    def noised(self, key: str, index: int, noise: IntArray) -> bytes:
        """Chunk `index` of the aggregate + a fresh encryption of `noise`, flooded, serialized.

        Privacy: adds the caller's draws (discrete Laplace eta of scale sensitivity/epsilon
        on measured slots, uniform pads mod t elsewhere: the measurement's epsilon-DP; the
        neighbouring relation is add/remove of one person with contribution bound c) plus flooding; draws nothing
        that decides privacy itself, and only the computation side (coordinator and its
        workers) knows the noise. Spends nothing: the decryption side charges epsilon.
        """
        backend = self._backends.get(key, self._backend)
        if backend is None or key not in self._parts:
            raise InvalidInputError(f"no aggregate loaded under {key!r}; load it before measuring")
        chunk = self._parts[key][int(index)]
        (_, noised), = backend.noised_chunks(_single(backend, chunk), noise, keep=[0])
        return backend.serialize_chunk(noised)

    def hold(self, key: str, build: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Keep `build(*args)` under `key` (other chunk work, e.g. a join block's cell totals, built once per release).

        `build` is a module-level function (it travels by name) and `args` plain bytes and integers.
        """
        self._held[key] = build(*args)

    def call(self, key: str, method: str, args: tuple[Any, ...]) -> Any:
        """`method(*args)` of the object held under `key`."""
        if key not in self._held:
            raise InvalidInputError(f"nothing is held under {key!r}; hold it before calling it")
        return getattr(self._held[key], method)(*args)

    def drop(self, key: str) -> None:
        self._parts.pop(key, None)
        self._held.pop(key, None)
        self._backends.pop(key, None)


def _single(backend: VectorBackend, chunk: Any) -> Any:
    from ..core.backend import ChunkedVector

    return ChunkedVector(backend.slots, (chunk,))


class ChunkExecutor(Protocol):
    """The computation server's chunk work, wherever it runs.

    `load` aggregates the owners' chunks (each worker its share of the chunk indices) and
    keeps the sums for the release `key`; `noised` streams (index, serialized ciphertext)
    for the chunks in `noise` (chunk index -> that chunk's slot noise, fixed by the caller
    before fan-out: see `split_noise`), in increasing index order, each being the
    aggregate + its noise under fresh encryption and flooding. A worker that dies is
    replaced, re-loaded and re-sent the same noise.

    `hold` and `call` run other stateful chunk work (the join's cell totals): worker w
    keeps `build(*args)` for `(build, args) = make(w)` (make runs here, so a worker gets
    only the bytes its share needs), and `call(key, method, args)` runs
    `method(*args[w])` on worker w's object, all workers in parallel, returning the
    results in worker order. Every value that decides privacy is in `args`, fixed by the
    caller; a worker that dies is replaced, given `make(w)` again and re-sent the same args.

    Workers live from `start` (or their first use) to `close`: one set serves every
    release, direct query and upload fold of a server.
    """

    workers: int

    def start(self) -> None:
        """Start the workers now (a server does as it starts); they are kept until `close`. Idempotent."""
        ...

    def load(self, key: str, context: bytes, source: ChunkSource, n_chunks: int) -> None: ...

    def write_sums(self, context: bytes, source: ChunkSource, n_chunks: int, out_template: str, *,
                   wait: bool = True) -> bool:
        """Sum the owners' chunks of `source` and write the sum of chunk i to `out_template.format(index=i)`,
        each worker its share, not synced (a server's running aggregate: the caller syncs the set).

        With `wait` False, returns False at once, writing nothing, while the workers are busy
        (a release streaming): the caller then sums in its own process. A dead worker is
        replaced and its share written again.
        """
        ...

    def noised(self, key: str, noise: Mapping[int, IntArray]) -> Iterator[tuple[int, bytes]]: ...

    def hold(self, key: str, make: "MakeHeld") -> None: ...

    def call(self, key: str, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]: ...

    def drop(self, key: str) -> None: ...

    def close(self) -> None: ...


def split_noise(noise: IntArray, slots: int, keep: Sequence[int]) -> dict[int, IntArray]:
    """The caller's slot noise cut into the chunks listed in `keep` (zero-padded like the data)."""
    from ..core.backend import split_chunks

    chunks = split_chunks(noise, slots)
    return {int(i): chunks[int(i)] for i in sorted(set(keep))}


def owner_of(index: int, workers: int) -> int:
    """Chunk `index` is worker `index % workers`'s: strided, so a stream in index order keeps every worker busy."""
    return index % workers
