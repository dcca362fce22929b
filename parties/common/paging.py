"""Messages that grow with the domain, cut into pages so no gRPC message grows with it.

A domain of 2^23 bins released bin by bin has 8M partitions: its partition starts alone are
~30 MB of varints, the summary ~150 MB. gRPC refuses a message over the receiver's limit
(64 MiB, 16 MiB at the key holder), and a whole message is buffered before it is parsed, so
every list that grows with the domain travels in pages of at most `PAGE_VALUES` numbers
(about 1 MB):

- a partition_sums measurement's starts after the DecryptMeasurement / IssueShares header
  (`measurement_requests`, read back by `read_measurement_header`);
- the decrypted values of a measurement (`values_replies`, `read_values`);
- a released summary as its Arrow IPC files (`arrow_pages`, `summary_from_arrow_pages`: GetReleaseArrow,
  what the SDK reads): a head with the release's metadata and the files' sizes, then the files'
  bytes in pages of `PAGE_BYTES`, read from disk a page at a time (the server neither parses nor
  holds the summary to send it);
- a released summary as numbers (`summary_pages`, `summary_from_pages`: GetReleasePages, kept
  for older clients): a head with every field and the lengths of the long lists, then the lists
  in pages. A summary whose stored form is at most `INLINE_JSON_BYTES` (about 150,000 partitions
  as Arrow files) still travels whole in ReleaseStatus / GetRelease (`summary_is_inline`, decided
  without parsing it).

Every reader checks that the pages add up to the announced lengths (DATA_LOSS otherwise), so
a cut stream never reads as a smaller, valid-looking summary or measurement.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import grpc
import numpy as np
import numpy.typing as npt

from parties.wire.v1 import analyst_pb2, common_pb2, decryption_pb2
from he_partition.core.errors import InvalidInputError
from he_partition.core.measurements import Measurement, PartitionSums
from he_partition.core.summary import Summary

from .convert import measurement_from_proto, measurement_to_proto, summary_from_proto, summary_to_proto
from .errors import ServiceError
from .signing import OwnerSignature

__all__ = ["PAGE_VALUES", "PAGE_BYTES", "INLINE_JSON_BYTES", "MAX_ARROW_BYTES", "measurement_requests",
           "read_measurement_header", "values_replies", "read_values", "summary_is_inline", "summary_numbers",
           "summary_pages", "summary_from_pages", "arrow_pages", "summary_from_arrow_pages"]

#: Numbers per page: at most ~10 bytes each as varints or doubles, so a page stays near 1 MB or less.
PAGE_VALUES = 1 << 16

#: Bytes of a summary's Arrow files per GetReleaseArrow page.
PAGE_BYTES = 1 << 20

#: A summary whose stored form (Arrow files, or the JSON document of a release stored before them) is at most
#: this long travels whole in one reply (its message is no longer); larger ones only in pages.
INLINE_JSON_BYTES = 4 * 1024 * 1024

#: The most bytes of Arrow files a reader accepts for one summary (2^23 partitions bin by bin with a tree's
#: levels are ~0.6 GB): a head announcing more is refused before anything is allocated for it.
MAX_ARROW_BYTES = 4 << 30


def _pages(n: int) -> Iterator[slice]:
    for i in range(0, n, PAGE_VALUES):
        yield slice(i, min(n, i + PAGE_VALUES))


# --- measurements: the request header's partition starts -------------------------------------------

def measurement_requests(header: decryption_pb2.DecryptMeasurementHeader, measurement: Measurement,
                         chunks: Iterable[bytes] = ()) -> Iterator[decryption_pb2.DecryptMeasurementRequest]:
    """A DecryptMeasurement / IssueShares request stream: the header, the starts' pages when long, the chunks.

    `header.measurement` is filled here from `measurement`; starts longer than one page leave it
    empty and follow the header (`starts_count`).
    """
    starts = measurement.starts if isinstance(measurement, PartitionSums) else ()
    paged = len(starts) > PAGE_VALUES
    head = decryption_pb2.DecryptMeasurementHeader()
    head.CopyFrom(header)
    head.measurement.CopyFrom(measurement_to_proto(measurement, with_starts=not paged))
    if paged:
        head.starts_count = len(starts)
    yield decryption_pb2.DecryptMeasurementRequest(header=head)
    if paged:
        for sl in _pages(len(starts)):
            yield decryption_pb2.DecryptMeasurementRequest(
                starts=decryption_pb2.Int64Page(values=[int(s) for s in starts[sl]]))
    for c in chunks:
        yield decryption_pb2.DecryptMeasurementRequest(chunk=c)


def read_measurement_header(requests: Iterator[decryption_pb2.DecryptMeasurementRequest], method: str
                            ) -> tuple[decryption_pb2.DecryptMeasurementHeader, Measurement]:
    """The header of a DecryptMeasurement / IssueShares stream and its measurement, starts' pages read.

    Paged starts go into the measurement only (one int64 array), not into `header.measurement`.
    Leaves `requests` at the first chunk. INVALID_ARGUMENT for a stream that does not start with a
    header, or whose pages do not add up to `starts_count` before the first chunk.
    """
    first = next(requests, None)
    if first is None or first.WhichOneof("part") != "header":
        raise InvalidInputError(f"{method} must start with a header message")
    header = decryption_pb2.DecryptMeasurementHeader()
    header.CopyFrom(first.header)  # small when the starts are paged
    want = int(header.starts_count)
    if want < 0:
        raise InvalidInputError(f"starts_count must be >= 0, got {want}")
    if want:
        if header.measurement.kind != "partition_sums" or len(header.measurement.starts):
            raise InvalidInputError("starts_count is for a partition_sums measurement whose starts follow the "
                                    "header in pages (measurement.starts then empty)")
        if want > header.measurement.domain_size:
            raise InvalidInputError(f"starts_count {want} exceeds the domain size {header.measurement.domain_size}")
        starts = np.empty(want, dtype=np.int64)  # the pages go straight into one array (8 bytes a start)
        got = 0
        while got < want:
            msg = next(requests, None)
            if msg is None or msg.WhichOneof("part") != "starts":
                raise InvalidInputError(f"{method}: {want} partition starts announced, {got} arrived before "
                                        f"{'the end' if msg is None else 'a ' + str(msg.WhichOneof('part'))}")
            page = msg.starts.values
            if got + len(page) > want:
                raise InvalidInputError(f"{method}: more than the announced {want} partition starts")
            starts[got:got + len(page)] = page
            got += len(page)
        return header, measurement_from_proto(header.measurement, starts=starts)
    return header, measurement_from_proto(header.measurement)


# --- measurements: the decrypted values -------------------------------------------------------------

def values_replies(values: npt.NDArray[np.int64], **first: Any) -> Iterator[decryption_pb2.DecryptMeasurementResponse]:
    """A DecryptMeasurement reply stream: `first` (charge_id, epsilon_remaining, receipt) and value_count in
    the first message, the values in pages (one message when they fit one)."""
    n = len(values)
    opening = {"value_count": n, **{k: v for k, v in first.items() if v is not None}}
    for i, sl in enumerate(list(_pages(n)) or [slice(0, 0)]):  # no values: still the one opening message
        yield decryption_pb2.DecryptMeasurementResponse(values=values[sl].tolist(), **(opening if i == 0 else {}))


def read_values(replies: Iterable[decryption_pb2.DecryptMeasurementResponse], method: str
                ) -> tuple[decryption_pb2.DecryptMeasurementResponse, npt.NDArray[np.int64]]:
    """(first reply message, all values) of a DecryptMeasurement reply stream; DATA_LOSS when it is cut."""
    first: decryption_pb2.DecryptMeasurementResponse | None = None
    out: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
    got = 0
    for msg in replies:
        if first is None:
            first = msg
            out = np.empty(int(msg.value_count), dtype=np.int64)
        if got + len(msg.values) > len(out):
            raise ServiceError(grpc.StatusCode.DATA_LOSS, f"more values than the announced {len(out)}",
                               method=method)
        out[got:got + len(msg.values)] = msg.values
        got += len(msg.values)
    if first is None or got != len(out):
        raise ServiceError(grpc.StatusCode.DATA_LOSS, f"the reply ended after {got} of "
                           f"{0 if first is None else len(out)} values", method=method)
    return first, out


# --- released summaries -----------------------------------------------------------------------------

def summary_numbers(s: Summary) -> int:
    """How many numbers the summary's long lists hold (what its message size grows with)."""
    return 3 * s.n_partitions + sum(len(r.values) + len(r.starts) for r in s.released)


def summary_is_inline(stored: str | int) -> bool:
    """Whether a summary, by its stored JSON document or its stored size in bytes (`ReleaseRecord.
    stored_summary_bytes`), travels whole in one reply (ReleaseStatus, GetRelease)."""
    return (len(stored) if isinstance(stored, str) else stored) <= INLINE_JSON_BYTES


def summary_pages(s: Summary, *, release_id: str, study_id: str, owners: Sequence[str] = (), contract_hash: str = "",
                  created_at: str = "", owner_signatures: Sequence[OwnerSignature] = (),
                  check: Callable[[], None] | None = None) -> Iterator[analyst_pb2.ReleaseSummaryPage]:
    """The summary as GetReleasePages sends it: the head, then the partitions' pages, then each released
    measurement's pages. `check()` runs before each page (e.g. to stop for a client that left)."""
    head = summary_to_proto(s, release_id=release_id, study_id=study_id, owners=owners, contract_hash=contract_hash,
                            created_at=created_at, owner_signatures=owner_signatures, lists=False)
    yield analyst_pb2.ReleaseSummaryPage(head=analyst_pb2.ReleaseSummaryHead(
        summary=head, partitions=s.n_partitions, released_values=[len(r.values) for r in s.released],
        released_starts=[len(r.starts) for r in s.released]))
    for sl in _pages(s.n_partitions):
        if check is not None:
            check()
        yield analyst_pb2.ReleaseSummaryPage(partitions=analyst_pb2.PartitionsPage(
            starts=s.starts[sl], sums=s.sums[sl], sum_variance=s.sum_variance[sl]))
    for i, r in enumerate(s.released):
        n = max(len(r.values), len(r.starts))
        for sl in _pages(n):
            if check is not None:
                check()
            yield analyst_pb2.ReleaseSummaryPage(released=analyst_pb2.ReleasedPage(
                index=i, values=[int(v) for v in r.values[sl]], starts=[int(v) for v in r.starts[sl]]))


def summary_from_pages(pages: Iterable[analyst_pb2.ReleaseSummaryPage], method: str
                       ) -> tuple[common_pb2.ReleaseSummary, Summary]:
    """(the ReleaseSummary message without the partitions' lists, the Summary) from a GetReleasePages stream.

    DATA_LOSS when the pages do not add up to the head's lengths or come out of order.
    """
    it = iter(pages)
    first = next(it, None)
    if first is None or first.WhichOneof("part") != "head":
        raise ServiceError(grpc.StatusCode.DATA_LOSS, "the summary's pages do not start with its head", method=method)
    head = first.head
    n = int(head.partitions)
    want_values, want_starts = list(head.released_values), list(head.released_starts)
    if len(want_values) != len(head.summary.released) or len(want_starts) != len(head.summary.released):
        raise ServiceError(grpc.StatusCode.DATA_LOSS, "the summary's head lists other lengths than measurements",
                           method=method)
    whole = common_pb2.ReleaseSummary()  # the released measurements' lists are filled in as the pages arrive
    whole.CopyFrom(head.summary)
    # The partitions' lists as Python objects, built page by page; equal sums and variances share one object
    # (a variance takes a few distinct values in all; 8M partitions would otherwise hold 8M float objects).
    starts: list[int] = []
    sums: list[int] = []
    variance: list[float] = []
    same_sum: dict[int, int] = {}
    same_var: dict[float, float] = {}  # apart from the sums: 2.0 must not become the int 2
    at = 0
    for msg in it:
        part = msg.WhichOneof("part")
        if part == "partitions" and at == 0:
            p = msg.partitions
            if not len(p.starts) == len(p.sums) == len(p.sum_variance) or len(starts) + len(p.starts) > n:
                raise ServiceError(grpc.StatusCode.DATA_LOSS, "a page of partitions of unequal or too many lists",
                                   method=method)
            starts.extend(p.starts)
            sums.extend([same_sum.setdefault(v, v) for v in p.sums])
            variance.extend([same_var.setdefault(v, v) for v in p.sum_variance])
        elif part == "released" and 0 <= msg.released.index < len(want_values) and msg.released.index >= at:
            r = msg.released
            at = r.index
            into = whole.released[at]
            into.values.extend(r.values)
            into.starts.extend(r.starts)
            if len(into.values) > want_values[at] or len(into.starts) > want_starts[at]:
                raise ServiceError(grpc.StatusCode.DATA_LOSS, f"released measurement {at}: more values than "
                                   "announced", method=method)
        else:
            raise ServiceError(grpc.StatusCode.DATA_LOSS, f"a summary page out of order ({part})", method=method)
    if (len(starts) != n or [len(r.values) for r in whole.released] != want_values
            or [len(r.starts) for r in whole.released] != want_starts):
        raise ServiceError(grpc.StatusCode.DATA_LOSS, f"the summary's pages ended early ({len(starts)} of {n} "
                           "partitions)", method=method)
    same_sum.clear()
    same_var.clear()
    try:
        summary = summary_from_proto(whole, partitions=(starts, sums, variance))
    except (InvalidInputError, ValueError) as exc:
        raise ServiceError(grpc.StatusCode.DATA_LOSS, f"the summary's pages do not make a valid summary: {exc}",
                           method=method) from None
    return whole, summary


# --- released summaries as Arrow files --------------------------------------------------------------

def arrow_pages(release: common_pb2.ReleaseSummary, files: Sequence[tuple[str, Path | bytes]],
                check: Callable[[], None] | None = None) -> Iterator[analyst_pb2.ReleaseArrowPage]:
    """GetReleaseArrow's stream: the head (`release`: where it came from; the files' names and sizes), then the
    files' bytes in pages of PAGE_BYTES. A file given as a path is read a page at a time (nothing the size of
    the summary is held to send it). `check()` runs before each page (e.g. to stop for a client that left)."""
    sizes = [len(f) if isinstance(f, bytes) else f.stat().st_size for _, f in files]
    yield analyst_pb2.ReleaseArrowPage(head=analyst_pb2.ReleaseArrowHead(
        release=release, files=[analyst_pb2.ArrowFile(name=name, size=n) for (name, _), n in zip(files, sizes)]))
    pending = bytearray()  # what is left of the previous file, less than a page: it opens the next page
    for (_, f), size in zip(files, sizes):
        if isinstance(f, bytes):
            chunks: Iterable[bytes] = (f[i:i + PAGE_BYTES] for i in range(0, len(f), PAGE_BYTES))
        else:
            chunks = _file_chunks(f, size)
        for chunk in chunks:
            pending += chunk
            while len(pending) >= PAGE_BYTES:
                if check is not None:
                    check()
                yield analyst_pb2.ReleaseArrowPage(data=bytes(pending[:PAGE_BYTES]))
                del pending[:PAGE_BYTES]
    if pending:
        if check is not None:
            check()
        yield analyst_pb2.ReleaseArrowPage(data=bytes(pending))


def _file_chunks(path: Path, size: int) -> Iterator[bytes]:
    """A file's bytes a page at a time; exactly `size` of them (the size the head announced)."""
    left = size
    with path.open("rb") as fh:
        while left > 0:
            chunk = fh.read(min(PAGE_BYTES, left))
            if not chunk:
                raise ServiceError(grpc.StatusCode.DATA_LOSS, f"{path.name} ended {left} bytes early",
                                   method="Analyst/GetReleaseArrow")
            left -= len(chunk)
            yield chunk


def summary_from_arrow_pages(pages: Iterable[analyst_pb2.ReleaseArrowPage], method: str
                             ) -> tuple[common_pb2.ReleaseSummary, Summary]:
    """(where the release came from, the Summary) from a GetReleaseArrow stream.

    The pages are copied once, into one buffer of the announced size; the Summary reads its Arrow tables
    from that buffer without a further copy (and keeps them: its DataFrames use their columns). DATA_LOSS
    when the pages do not add up to the announced sizes or do not make a valid summary.
    """
    from he_partition.core.summary_arrow import PARTITIONS_FILE, RELEASED_FILE, read_summary

    it = iter(pages)
    first = next(it, None)
    if first is None or first.WhichOneof("part") != "head":
        raise ServiceError(grpc.StatusCode.DATA_LOSS, "the release's pages do not start with its head", method=method)
    head = first.head
    names = [f.name for f in head.files]
    sizes = [int(f.size) for f in head.files]
    if sorted(names) not in ([PARTITIONS_FILE], sorted([PARTITIONS_FILE, RELEASED_FILE])) or min(sizes) < 0:
        raise ServiceError(grpc.StatusCode.DATA_LOSS, f"the release's head lists files {names} of sizes {sizes}",
                           method=method)
    total = sum(sizes)
    if total > MAX_ARROW_BYTES:
        raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the release's files are {total:,} bytes, more "
                           f"than the {MAX_ARROW_BYTES:,} this reader accepts", method=method)
    buf = bytearray(total)
    got = 0
    for msg in it:
        if msg.WhichOneof("part") != "data" or got + len(msg.data) > total:
            raise ServiceError(grpc.StatusCode.DATA_LOSS, "a release page out of order or past the announced "
                               f"{total:,} bytes", method=method)
        buf[got:got + len(msg.data)] = msg.data
        got += len(msg.data)
    if got != total:
        raise ServiceError(grpc.StatusCode.DATA_LOSS, f"the release's pages ended after {got:,} of {total:,} bytes",
                           method=method)
    view, at, data = memoryview(buf), 0, {}
    for name, size in zip(names, sizes):
        data[name] = view[at:at + size]
        at += size
    try:
        summary = read_summary(data[PARTITIONS_FILE], data.get(RELEASED_FILE))
    except (InvalidInputError, ValueError) as exc:
        raise ServiceError(grpc.StatusCode.DATA_LOSS, f"the release's files do not make a valid summary: {exc}",
                           method=method) from None
    return head.release, summary
