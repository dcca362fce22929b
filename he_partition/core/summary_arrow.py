"""A released summary as Arrow IPC files: the columnar binary form the servers store and serve, pandas and polars read.

A summary is two Arrow IPC files (the random-access "file" format, Feather v2), each readable on its own by
`pyarrow.ipc.open_file`, `pandas.read_feather` or `polars.read_ipc`, memory-mapped without a copy:

- `partitions.arrow`: one row per partition, columns `start` (int64, its first bin), `sum` (int64, its released
  noisy sum) and `sum_variance` (float64, the variance of that sum's noise). The schema's metadata key
  `dpagg.summary` holds every other field as JSON (the head: domain size, epsilon, strategy, noise parties,
  contribution bound, epsilon spent, params, estimator, and each released measurement's kind, variance,
  epsilon and lengths), so the file alone is the whole summary when nothing else was released.
- `released.arrow`: one row per released value of the other measurements (least-squares and wavelet
  strategies), in release order: `measurement` (int32, its index in `Summary.released`), `value` (int64)
  and `start` (int64, the partition start of a partition_sums value; null for a Haar coefficient).
  Empty (no rows) for a summary with no such measurement.

Rows are written in record batches of at most `BATCH_ROWS`, each built from its slice of the summary, so
writing holds one batch's arrays at a time (not a copy of every list); a column of at most `BATCH_ROWS`
rows is one contiguous buffer that numpy and pandas use without a copy.

The round trip is exact: `read_summary(*summary_buffers(s)) == s` and equals `Summary.from_json(s.to_json())`
(integers as int64, which every released value fits; floats as IEEE doubles, as JSON's shortest repr).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from .errors import InvalidInputError
from .columns import Column
from .summary import SUMMARY_FORMAT, ReleasedValues, Summary

__all__ = ["ARROW_FORMAT", "PARTITIONS_FILE", "RELEASED_FILE", "SUMMARY_FILES", "BATCH_ROWS", "HEAD_KEY",
           "SummaryTables", "summary_tables", "summary_buffers", "write_summary_files", "read_summary",
           "read_summary_files", "preload"]

ARROW_FORMAT = "dpagg.summary.arrow.v1"
PARTITIONS_FILE = "partitions.arrow"
RELEASED_FILE = "released.arrow"
#: The files of one summary, in the order they are stored and sent.
SUMMARY_FILES = (PARTITIONS_FILE, RELEASED_FILE)
#: Rows per record batch (about 24 MB of partitions): a summary of up to 2^20 partitions is one batch.
BATCH_ROWS = 1 << 20
#: The schema metadata key of partitions.arrow that holds the head (every field but the long lists).
HEAD_KEY = b"dpagg.summary"

_INT64 = (-(1 << 63), (1 << 63) - 1)


def _pa() -> Any:
    import pyarrow  # imported on first use: `import dpagg` and the core stay light
    import pyarrow.ipc  # noqa: F401

    return pyarrow


def preload() -> None:
    """Import pyarrow now: once per process it costs 0.1-0.2 s, which a server pays at its start rather than in
    its first release."""
    _pa()


def _schemas(head: dict[str, Any]) -> tuple[Any, Any]:
    pa = _pa()
    partitions = pa.schema([("start", pa.int64()), ("sum", pa.int64()), ("sum_variance", pa.float64())],
                           metadata={HEAD_KEY: json.dumps(head, separators=(",", ":")).encode()})
    released = pa.schema([("measurement", pa.int32()), ("value", pa.int64()), ("start", pa.int64())])
    return partitions, released


def _head(s: Summary) -> dict[str, Any]:
    """Every field of `Summary.to_dict` but the long lists (not built: 8M partitions would be 200 MB of lists),
    with the lengths of the lists the files hold."""
    d: dict[str, Any] = {"format": ARROW_FORMAT, "summary_format": SUMMARY_FORMAT, "domain_size": s.domain_size,
                         "epsilon": s.epsilon, "strategy": s.strategy, "noise_parties": s.noise_parties,
                         "contribution_bound": s.contribution_bound, "partitions": s.n_partitions,
                         "epsilon_spent": [[k, v] for k, v in s.epsilon_spent], "params": s.params}
    if s.estimator != "partition":
        d["estimator"] = s.estimator
    d["released"] = [{"kind": r.kind, "variance": r.variance, "epsilon": r.epsilon, "values": len(r.values),
                      "starts": len(r.starts)} for r in s.released]
    return d


def _from_numpy(arr: npt.NDArray[Any], arrow_type: Any) -> Any:
    """An Arrow array over a numpy array's buffer (no copy). `pa.array` is avoided on purpose: it imports pandas
    (a quarter of a second) to ask whether its argument is a pandas object."""
    pa = _pa()
    arr = np.ascontiguousarray(arr)
    return pa.Array.from_buffers(arrow_type, len(arr), [None, pa.py_buffer(arr)])


def _ints(values: Sequence[int], what: str) -> Any:
    try:
        arr = np.asarray(values, dtype=np.int64)
    except (OverflowError, TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} must be integers in int64 [{_INT64[0]}, {_INT64[1]}]: {exc}") from None
    return _from_numpy(arr, _pa().int64())


def _numpy(column: Any, dtype: type[np.generic]) -> npt.NDArray[Any]:
    """A column's values as numpy: a read-only view of its buffer when it is one chunk, else the chunks joined.
    For columns without nulls (`to_numpy` is avoided: it imports pandas)."""
    chunks = column.chunks if hasattr(column, "chunks") else [column]
    size = np.dtype(dtype).itemsize
    views = [np.frombuffer(c.buffers()[1], dtype=dtype, count=len(c), offset=c.offset * size)
             for c in chunks if len(c)]
    if not views:
        return np.zeros(0, dtype=dtype)
    return views[0] if len(views) == 1 else np.concatenate(views)


def _partition_batches(s: Summary, schema: Any) -> Iterator[Any]:
    pa = _pa()
    for i in range(0, s.n_partitions, BATCH_ROWS):
        sl = slice(i, i + BATCH_ROWS)
        yield pa.record_batch([_ints(s.starts[sl], "partition starts"), _ints(s.sums[sl], "partition sums"),
                               _from_numpy(np.asarray(s.sum_variance[sl], dtype=np.float64), pa.float64())],
                              schema=schema)


def _released_batches(s: Summary, schema: Any) -> Iterator[Any]:
    pa = _pa()
    for m, r in enumerate(s.released):
        for i in range(0, len(r.values), BATCH_ROWS):
            sl = slice(i, i + BATCH_ROWS)
            values = _ints(r.values[sl], "released values")
            starts = _ints(r.starts[sl], "released starts") if r.starts else pa.nulls(len(values), pa.int64())
            yield pa.record_batch([_from_numpy(np.full(len(values), m, dtype=np.int32), pa.int32()), values, starts],
                                  schema=schema)


@dataclass(frozen=True)
class SummaryTables:
    """A summary's two Arrow tables (see the module docstring): `partitions` carries the head in its schema."""

    partitions: Any
    released: Any

    def to_summary(self) -> Summary:
        return read_summary(self.partitions, self.released)


def summary_tables(s: Summary) -> SummaryTables:
    """The summary as Arrow tables, in memory (`write_summary_files` writes them batch by batch instead)."""
    pa = _pa()
    ps, rs = _schemas(_head(s))
    return SummaryTables(pa.Table.from_batches(list(_partition_batches(s, ps)), schema=ps),
                         pa.Table.from_batches(list(_released_batches(s, rs)), schema=rs))


def _write(sink: Any, schema: Any, batches: Iterator[Any]) -> None:
    pa = _pa()
    with pa.ipc.new_file(sink, schema) as writer:
        for b in batches:
            writer.write_batch(b)


def summary_buffers(s: Summary) -> tuple[bytes, bytes]:
    """The bytes of partitions.arrow and released.arrow, in memory (for a summary stored before the Arrow files)."""
    pa = _pa()
    ps, rs = _schemas(_head(s))
    out = []
    for schema, batches in ((ps, _partition_batches(s, ps)), (rs, _released_batches(s, rs))):
        sink = pa.BufferOutputStream()
        _write(sink, schema, batches)
        out.append(sink.getvalue().to_pybytes())
    return out[0], out[1]


def write_summary_files(s: Summary, directory: Path | str, *, durable: bool = True) -> int:
    """Write the summary's files into `directory` atomically: into a temporary directory beside it, each file
    flushed (and fsynced when `durable`), then renamed into place. An existing `directory` (the same release
    written before a crash) is replaced whole. Returns the files' total size in bytes."""
    pa = _pa()
    final = Path(directory)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    final.parent.mkdir(parents=True, exist_ok=True)
    if tmp.exists():
        _remove(tmp)
    tmp.mkdir()
    ps, rs = _schemas(_head(s))
    size = 0
    for name, schema, batches in ((PARTITIONS_FILE, ps, _partition_batches(s, ps)),
                                  (RELEASED_FILE, rs, _released_batches(s, rs))):
        path = tmp / name
        with pa.OSFile(str(path), "wb") as sink:
            _write(sink, schema, batches)
        if durable:
            _fsync(path)
        size += path.stat().st_size
    if durable:
        _fsync(tmp)
    if final.exists():
        _remove(final)
    os.replace(tmp, final)
    if durable:
        _fsync(final.parent)
    return size


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(directory: Path) -> None:
    for p in directory.iterdir():
        p.unlink()
    directory.rmdir()


def _open_table(source: Any, what: str) -> Any:
    """A table from a pyarrow Table, a path (memory-mapped) or bytes-like data (read without a copy)."""
    pa = _pa()
    if isinstance(source, pa.Table):
        return source
    try:
        if isinstance(source, (str, Path)):
            return pa.ipc.open_file(pa.memory_map(str(source), "r")).read_all()
        return pa.ipc.open_file(pa.py_buffer(source)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise InvalidInputError(f"{what} is not an Arrow IPC file: {exc}") from None


def _column(table: Any, name: str, kind: str, what: str) -> Any:
    pa = _pa()
    want = {"int64": pa.int64(), "int32": pa.int32(), "float64": pa.float64()}[kind]
    if name not in table.column_names or table.schema.field(name).type != want:
        raise InvalidInputError(f"{what} needs a {kind} column {name!r}; it has {table.schema}")
    column = table.column(name)
    if name != "start" and column.null_count:
        raise InvalidInputError(f"{what}: column {name!r} has {column.null_count} nulls")
    return column


def _to_ints(col: Any) -> Column:
    """The column's values as a read-only Column over the Arrow buffer (no copy where the data is one chunk)."""
    return Column(_numpy(col, np.int64))


def _to_floats(col: Any) -> Column:
    return Column(_numpy(col, np.float64))


def read_summary(partitions: Any, released: Any = None) -> Summary:
    """The Summary of partitions.arrow and released.arrow, each a pyarrow Table, a path or bytes-like data.

    `released` may be left out for a summary whose head lists no released measurement. InvalidInputError
    for anything that is not such a file or whose lengths disagree with its head.
    """
    p = _open_table(partitions, PARTITIONS_FILE)
    raw = (p.schema.metadata or {}).get(HEAD_KEY)
    if raw is None:
        raise InvalidInputError(f"{PARTITIONS_FILE} carries no {HEAD_KEY.decode()} head in its schema metadata")
    try:
        head = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"the summary's head is not JSON: {exc}") from None
    if not isinstance(head, dict) or head.get("format") != ARROW_FORMAT:
        found = head.get("format") if isinstance(head, dict) else None
        raise InvalidInputError(f"not a {ARROW_FORMAT} file (format={found!r})")
    if int(head.get("partitions", -1)) != p.num_rows:
        raise InvalidInputError(f"{PARTITIONS_FILE} has {p.num_rows} rows, its head announces "
                                f"{head.get('partitions')}")
    specs = head.get("released", [])
    if not isinstance(specs, list):
        raise InvalidInputError("the summary's head lists its released measurements as a list")
    if specs and released is None:
        raise InvalidInputError(f"the summary's head lists {len(specs)} released measurements: {RELEASED_FILE} is "
                                "needed")
    r = _open_table(released, RELEASED_FILE) if specs else None
    try:
        summary = Summary(
            domain_size=int(head["domain_size"]), epsilon=float(head["epsilon"]), strategy=str(head["strategy"]),
            noise_parties=int(head["noise_parties"]), contribution_bound=int(head.get("contribution_bound", 1)),
            starts=_to_ints(_column(p, "start", "int64", PARTITIONS_FILE)),
            sums=_to_ints(_column(p, "sum", "int64", PARTITIONS_FILE)),
            sum_variance=_to_floats(_column(p, "sum_variance", "float64", PARTITIONS_FILE)),
            epsilon_spent=tuple((str(k), float(v)) for k, v in head.get("epsilon_spent", [])),
            params=dict(head.get("params", {})), estimator=str(head.get("estimator", "partition")),
            released=_released(r, specs) if r is not None else ())
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInputError(f"malformed summary head: {exc}") from exc
    # The tables stay with the summary: its DataFrames use their buffers (`Summary.to_pandas`) without a copy.
    object.__setattr__(summary, "_arrow", SummaryTables(p, r))
    return summary


def _released(r: Any, specs: list[dict[str, Any]]) -> tuple[ReleasedValues, ...]:
    index = _numpy(_column(r, "measurement", "int32", RELEASED_FILE), np.int32)
    values = _column(r, "value", "int64", RELEASED_FILE)
    starts = _column(r, "start", "int64", RELEASED_FILE)
    want = np.repeat(np.arange(len(specs), dtype=np.int32), [int(sp["values"]) for sp in specs])
    if len(index) != len(want) or not np.array_equal(index, want):
        raise InvalidInputError(f"{RELEASED_FILE}'s rows do not match the measurements its head announces")
    out = []
    at = 0
    for sp in specs:
        n, n_starts = int(sp["values"]), int(sp["starts"])
        if n_starts not in (0, n) or (starts.slice(at, n).null_count != (n if n_starts == 0 else 0)):
            raise InvalidInputError(f"{RELEASED_FILE}: measurement starts disagree with the head")
        out.append(ReleasedValues(kind=str(sp["kind"]), values=_to_ints(values.slice(at, n)),
                                  variance=float(sp["variance"]), epsilon=float(sp["epsilon"]),
                                  starts=_to_ints(starts.slice(at, n)) if n_starts else ()))
        at += n
    return tuple(out)


def read_summary_files(directory: Path | str) -> Summary:
    """The summary stored in `directory` by `write_summary_files` (files memory-mapped, not read into a copy)."""
    d = Path(directory)
    if not (d / PARTITIONS_FILE).is_file():
        raise InvalidInputError(f"{d} holds no {PARTITIONS_FILE}")
    return read_summary(d / PARTITIONS_FILE, d / RELEASED_FILE)
