"""The small vector interface the algorithms run on, and its numpy oracle implementation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Protocol

import numpy as np
import numpy.typing as npt

from .errors import InvalidInputError

__all__ = ["ChunkedVector", "VectorBackend", "PlainBackend", "DEFAULT_SLOTS", "n_chunks", "split_chunks"]

FloatArray = npt.NDArray[np.float64]

#: Slots per ciphertext at the default CKKS ring degree N = 8192.
DEFAULT_SLOTS = 4096


@dataclass(frozen=True)
class ChunkedVector:
    """A length-`length` vector stored as consecutive chunks of `slots` values each.

    Chunks are opaque to the algorithms: numpy arrays in the oracle, CKKS ciphertexts in
    production. The last chunk is zero-padded.
    """

    length: int
    chunks: tuple[Any, ...]


def n_chunks(length: int, slots: int) -> int:
    return -(-length // slots)


def split_chunks(values: npt.ArrayLike, slots: int) -> list[FloatArray]:
    """Split a 1-D vector into zero-padded chunks of `slots` float values."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise InvalidInputError(f"expected a 1-D vector, got shape {arr.shape}")
    k = n_chunks(arr.size, slots)
    padded = np.zeros(k * slots, dtype=np.float64)
    padded[: arr.size] = arr
    return [padded[i * slots : (i + 1) * slots] for i in range(k)]


class VectorBackend(Protocol):
    """Only the homomorphic operations the strategies need.

    Every measurement in dpagg is a plaintext mask of the aggregated (prefix-encoded)
    histogram plus a noise vector, so no rotation (and no Galois key) is needed; see
    `he_partition.measurements` for why.
    """

    slots: int

    @property
    def can_decrypt(self) -> bool: ...

    def encrypt(self, values: npt.ArrayLike) -> ChunkedVector: ...

    def add(self, a: ChunkedVector, b: ChunkedVector) -> ChunkedVector: ...

    def sub(self, a: ChunkedVector, b: ChunkedVector) -> ChunkedVector: ...

    def mul_mask(self, a: ChunkedVector, mask: npt.ArrayLike) -> ChunkedVector: ...

    def add_noise(self, a: ChunkedVector, noise: npt.ArrayLike) -> ChunkedVector: ...

    def decrypt(self, a: ChunkedVector) -> FloatArray: ...

    def serialize_chunk(self, chunk: Any) -> bytes: ...

    def deserialize_chunk(self, data: bytes) -> Any: ...


def _check_same_length(a: ChunkedVector, b: ChunkedVector) -> None:
    if a.length != b.length:
        raise InvalidInputError(f"vector lengths differ: {a.length} != {b.length}")


def _mask_chunks(mask: npt.ArrayLike, length: int, slots: int) -> list[FloatArray]:
    m = np.asarray(mask, dtype=np.float64)
    if m.shape != (length,):
        raise InvalidInputError(f"mask must have shape ({length},), got {m.shape}")
    return split_chunks(m, slots)


class ChunkwiseArithmetic:
    """add, sub and add_noise chunk by chunk: the same for every backend whose chunks support + and -."""

    slots: int

    def encrypt(self, values: npt.ArrayLike) -> ChunkedVector:
        raise NotImplementedError

    def add(self, a: ChunkedVector, b: ChunkedVector) -> ChunkedVector:
        _check_same_length(a, b)
        return ChunkedVector(a.length, tuple(x + y for x, y in zip(a.chunks, b.chunks)))

    def sub(self, a: ChunkedVector, b: ChunkedVector) -> ChunkedVector:
        _check_same_length(a, b)
        return ChunkedVector(a.length, tuple(x - y for x, y in zip(a.chunks, b.chunks)))

    def add_noise(self, a: ChunkedVector, noise: npt.ArrayLike) -> ChunkedVector:
        """Encrypt `noise` freshly (in CKKS its encryption randomness also floods the result) and add it."""
        return self.add(a, self.encrypt(noise))


class PlainBackend(ChunkwiseArithmetic):
    """The numpy oracle: the same chunked layout and operations, without encryption."""

    def __init__(self, slots: int = DEFAULT_SLOTS) -> None:
        if slots < 1:
            raise InvalidInputError(f"slots must be >= 1, got {slots}")
        self.slots = slots

    @property
    def can_decrypt(self) -> bool:
        return True

    def encrypt(self, values: npt.ArrayLike) -> ChunkedVector:
        arr = np.asarray(values, dtype=np.float64)
        return ChunkedVector(arr.size, tuple(c.copy() for c in split_chunks(arr, self.slots)))

    def mul_mask(self, a: ChunkedVector, mask: npt.ArrayLike) -> ChunkedVector:
        masks = _mask_chunks(mask, a.length, self.slots)
        return ChunkedVector(a.length, tuple(x * m for x, m in zip(a.chunks, masks)))

    def decrypt(self, a: ChunkedVector) -> FloatArray:
        return np.concatenate(a.chunks)[: a.length] if a.chunks else np.zeros(0)

    def serialize_chunk(self, chunk: Any) -> bytes:
        return np.asarray(chunk, dtype="<f8").tobytes()

    def deserialize_chunk(self, data: bytes) -> Any:
        if len(data) != 8 * self.slots:
            raise InvalidInputError(f"a plain chunk must be {8 * self.slots} bytes, got {len(data)}")
        return np.frombuffer(data, dtype="<f8").copy()


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
