"""Read-only columns of numbers that behave like tuples: what a summary keeps per partition, 8 bytes a value.

A released summary has a start, a sum and a variance per partition, and its released measurements a
value (and a start) per partition again: at 2^24 partitions, as tuples of Python numbers, that is
about 3 GB in every process that holds one (36 bytes an int, 32 a float). `Column` holds them in one
read-only numpy array (8 bytes a value) and still reads as the tuple it replaces: `len`, indexing
(Python numbers), slicing (a tuple), iteration, truth, `==` against a tuple, a list or another
column (one bool), and `np.asarray(column)` without a copy.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence, overload

import numpy as np
import numpy.typing as npt

__all__ = ["Column", "int_column", "float_column"]

_BLOCK = 1 << 16


class Column(Sequence[Any]):
    """A read-only numpy vector of int64 or float64 that reads like a tuple of Python numbers."""

    __slots__ = ("_a",)

    def __init__(self, values: npt.NDArray[Any]) -> None:
        a = np.asarray(values)
        if a.ndim != 1:
            raise ValueError("a column is one-dimensional")
        if a.flags.writeable:  # a copy of its own: nobody can change it through the array it came from
            a = a.copy()
            a.setflags(write=False)
        self._a = a

    def __len__(self) -> int:
        return int(self._a.shape[0])

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[Any, ...]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return tuple(self._a[i].tolist())
        return self._a[i].item()

    def __iter__(self) -> Iterator[Any]:
        a = self._a
        for lo in range(0, len(a), _BLOCK):
            yield from a[lo:lo + _BLOCK].tolist()

    def __bool__(self) -> bool:
        return len(self) > 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Column):
            return bool(np.array_equal(self._a, other._a))
        if isinstance(other, (tuple, list)):
            return len(other) == len(self) and bool(np.array_equal(self._a, np.asarray(other, dtype=self._a.dtype)))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((len(self), self._a.dtype.str, self._a.tobytes()))

    def __array__(self, dtype: Any = None, copy: Any = None) -> npt.NDArray[Any]:
        return self._a if dtype is None or np.dtype(dtype) == self._a.dtype else self._a.astype(dtype)

    def __add__(self, other: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(self) + tuple(other)

    def __radd__(self, other: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(other) + tuple(self)

    def __repr__(self) -> str:
        return f"Column({self._a.dtype}, {len(self)} values)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Column, (np.array(self._a),))

    @property
    def array(self) -> npt.NDArray[Any]:
        """The values, read-only (no copy)."""
        return self._a


def _column(values: Any, dtype: type[np.generic]) -> Any:
    if isinstance(values, Column) and values.array.dtype == dtype:
        return values
    if isinstance(values, np.ndarray):
        a = values
    else:
        seq = values if isinstance(values, (tuple, list)) else tuple(values)
        if dtype is np.int64 and any(not isinstance(v, (int, np.integer)) for v in seq[:1]):
            return tuple(seq)  # not integers: left as given, the caller's checks name the problem
        try:
            a = np.asarray(seq, dtype=dtype) if len(seq) else np.zeros(0, dtype=dtype)
        except (OverflowError, ValueError, TypeError):
            return tuple(seq)  # past 64 bits (or not numbers): kept as the tuple it was
    if a.dtype != dtype:
        if dtype is np.int64 and not np.issubdtype(a.dtype, np.integer):
            return tuple(a.tolist())
        a = a.astype(dtype)
    return Column(a)


def int_column(values: Any) -> Any:
    """`values` as an int64 Column (a tuple stays a tuple if it does not fit in 64 bits)."""
    return _column(values, np.int64)


def float_column(values: Any) -> Any:
    """`values` as a float64 Column."""
    return _column(values, np.float64)
