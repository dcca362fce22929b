"""The small vector interface the algorithms run on, and its numpy oracle implementation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol, Sequence

import numpy as np
import numpy.typing as npt

from .errors import InvalidInputError

__all__ = ["ChunkedVector", "VectorBackend", "PlainBackend", "DEFAULT_SLOTS", "DEFAULT_PLAIN_MODULUS", "n_chunks",
           "split_chunks", "centre"]

IntArray = npt.NDArray[np.int64]

#: Slots per ciphertext at the default BFV ring degree N = 8192.
DEFAULT_SLOTS = 8192

#: The default BFV plain modulus (the 49-bit batching prime for N = 8192, see
#: `he_partition.he.bfv.BfvParams`). All slot arithmetic is exact modulo this prime.
DEFAULT_PLAIN_MODULUS = 562949952847873


@dataclass(frozen=True)
class ChunkedVector:
    """A length-`length` vector stored as consecutive chunks of `slots` values each.

    Chunks are opaque to the algorithms: numpy arrays in the oracle, BFV ciphertexts in
    production. The last chunk is zero-padded.
    """

    length: int
    chunks: tuple[Any, ...]


def n_chunks(length: int, slots: int) -> int:
    return -(-length // slots)


def split_chunks(values: npt.ArrayLike, slots: int) -> list[IntArray]:
    """Split a 1-D integer vector into zero-padded chunks of `slots` values."""
    arr = np.asarray(values, dtype=np.int64)
    if arr.ndim != 1:
        raise InvalidInputError(f"expected a 1-D vector, got shape {arr.shape}")
    k = n_chunks(arr.size, slots)
    padded = np.zeros(k * slots, dtype=np.int64)
    padded[: arr.size] = arr
    return [padded[i * slots : (i + 1) * slots] for i in range(k)]


def centre(values: npt.ArrayLike, modulus: int) -> IntArray:
    """Representatives of `values` modulo `modulus` in (-modulus/2, modulus/2]."""
    v = np.mod(np.asarray(values, dtype=np.int64), np.int64(modulus))
    return np.where(v > modulus // 2, v - modulus, v).astype(np.int64)


class VectorBackend(Protocol):
    """Only the homomorphic operations the strategies need: encrypt, add, add fresh noise, decrypt.

    Slot arithmetic is exact modulo `plain_modulus`. No measurement multiplies data by a
    plaintext (a product leaves data-dependent residue in the key holder's view, see
    `he_partition.core.measurements`), and none rotates, so no Galois or relinearization key
    exists.
    """

    slots: int
    plain_modulus: int

    @property
    def can_decrypt(self) -> bool: ...

    def encrypt(self, values: npt.ArrayLike) -> ChunkedVector: ...

    def add(self, a: ChunkedVector, b: ChunkedVector) -> ChunkedVector: ...

    def sub(self, a: ChunkedVector, b: ChunkedVector) -> ChunkedVector: ...

    def add_noise(self, a: ChunkedVector, noise: npt.ArrayLike,
                  keep: Sequence[int] | None = None) -> ChunkedVector: ...

    def noised_chunks(self, a: ChunkedVector, noise: npt.ArrayLike,
                      keep: Sequence[int] | None = None) -> Iterator[tuple[int, Any]]: ...

    def verify(self, a: ChunkedVector) -> None:
        """Refuse (PrecisionError) a ciphertext made under another key or corrupted, before anything is charged."""
        ...

    def decrypt(self, a: ChunkedVector, *, verified: bool = False) -> IntArray: ...

    def serialize_chunk(self, chunk: Any) -> bytes: ...

    def deserialize_chunk(self, data: bytes) -> Any: ...


def _check_same_length(a: ChunkedVector, b: ChunkedVector) -> None:
    if a.length != b.length:
        raise InvalidInputError(f"vector lengths differ: {a.length} != {b.length}")


class ChunkwiseArithmetic:
    """add, sub and add_noise chunk by chunk: the same for every backend whose chunks support + and -."""

    slots: int
    plain_modulus: int

    def encrypt(self, values: npt.ArrayLike) -> ChunkedVector:
        raise NotImplementedError

    def add(self, a: ChunkedVector, b: ChunkedVector) -> ChunkedVector:
        _check_same_length(a, b)
        return ChunkedVector(a.length, tuple(x + y for x, y in zip(a.chunks, b.chunks)))

    def sub(self, a: ChunkedVector, b: ChunkedVector) -> ChunkedVector:
        _check_same_length(a, b)
        return ChunkedVector(a.length, tuple(x - y for x, y in zip(a.chunks, b.chunks)))

    def add_noise(self, a: ChunkedVector, noise: npt.ArrayLike,
                  keep: Sequence[int] | None = None) -> ChunkedVector:
        """Add a fresh encryption of `noise` to the chunks listed in `keep` (all when None); the others become None.

        A None chunk is not sent to the decryption side (it holds no measured slot); `decrypt`
        reads it as zeros.
        """
        done = dict(self.noised_chunks(a, noise, keep))
        return ChunkedVector(a.length, tuple(done.get(i) for i in range(len(a.chunks))))

    def noised_chunks(self, a: ChunkedVector, noise: npt.ArrayLike,
                      keep: Sequence[int] | None = None) -> Iterator[tuple[int, Any]]:
        """`add_noise` one chunk at a time, lazily: (index, chunk) for each kept chunk, in order.

        Lets the computation server stream a measurement to the decryption server while it
        still encrypts the next chunks.
        """
        noise_chunks = split_chunks(noise, self.slots)
        if len(noise_chunks) != len(a.chunks):
            raise InvalidInputError(f"noise has {len(noise_chunks)} chunks, the vector {len(a.chunks)}")
        for i in (range(len(a.chunks)) if keep is None else sorted(set(keep))):
            yield i, self._noised_chunk(a.chunks[i], noise_chunks[i])

    def _noised_chunk(self, chunk: Any, noise: IntArray) -> Any:
        return chunk + self.encrypt(noise).chunks[0]


class _ModularChunk:
    """A numpy chunk whose + and - reduce modulo the plain modulus, like a BFV ciphertext's slots."""

    __slots__ = ("values", "modulus")

    def __init__(self, values: IntArray, modulus: int) -> None:
        self.values = np.mod(values, np.int64(modulus))
        self.modulus = modulus

    def __add__(self, other: "_ModularChunk") -> "_ModularChunk":
        return _ModularChunk(self.values + other.values, self.modulus)

    def __sub__(self, other: "_ModularChunk") -> "_ModularChunk":
        return _ModularChunk(self.values - other.values, self.modulus)


class PlainBackend(ChunkwiseArithmetic):
    """The numpy oracle: the same chunked layout and exact modular slot arithmetic, without encryption."""

    def __init__(self, slots: int = DEFAULT_SLOTS, plain_modulus: int = DEFAULT_PLAIN_MODULUS) -> None:
        if slots < 1:
            raise InvalidInputError(f"slots must be >= 1, got {slots}")
        if not 2 < plain_modulus < 2**62:
            raise InvalidInputError(f"plain_modulus must be in (2, 2^62), got {plain_modulus}")
        self.slots = slots
        self.plain_modulus = plain_modulus

    @property
    def can_decrypt(self) -> bool:
        return True

    def verify(self, a: ChunkedVector) -> None:
        """Nothing to check: plain chunks carry no noise."""

    def encrypt(self, values: npt.ArrayLike) -> ChunkedVector:
        arr = np.asarray(values)
        if arr.dtype.kind == "f" and (not np.all(np.isfinite(arr)) or np.any(arr != np.rint(arr))):
            raise InvalidInputError("slots hold integers: got NaN, infinite or fractional values")
        ints = arr.astype(np.int64)
        return ChunkedVector(ints.size, tuple(_ModularChunk(c, self.plain_modulus)
                                              for c in split_chunks(ints, self.slots)))

    def decrypt(self, a: ChunkedVector, *, verified: bool = False) -> IntArray:
        if not a.chunks:
            return np.zeros(0, dtype=np.int64)
        parts = [np.zeros(self.slots, dtype=np.int64) if c is None else c.values for c in a.chunks]
        return centre(np.concatenate(parts)[: a.length], self.plain_modulus)

    def serialize_chunk(self, chunk: Any) -> bytes:
        return np.asarray(chunk.values, dtype="<i8").tobytes()

    def deserialize_chunk(self, data: bytes) -> Any:
        if len(data) != 8 * self.slots:
            raise InvalidInputError(f"a plain chunk must be {8 * self.slots} bytes, got {len(data)}")
        return _ModularChunk(np.frombuffer(data, dtype="<i8").copy(), self.plain_modulus)


def sum_vectors(backend: VectorBackend, vectors: Iterable[ChunkedVector]) -> ChunkedVector:
    """Aggregate the owners' encrypted vectors (the data is their sum), one at a time.

    Accepts any iterable so that callers can stream owners: only the running total and
    one owner's vector are alive at once.
    """
    total: ChunkedVector | None = None
    for v in vectors:
        total = v if total is None else backend.add(total, v)
    if total is None:
        raise InvalidInputError("at least one vector is needed to aggregate")
    return total
