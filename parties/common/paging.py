"""Messages that grow with the domain, cut into pages so no gRPC message grows with it.

A domain of 2^23 bins released bin by bin has 8M partitions: its partition starts alone are
~30 MB of varints, the summary ~150 MB. gRPC refuses a message over the receiver's limit
(64 MiB, 16 MiB at the key holder), and a whole message is buffered before it is parsed, so
every list that grows with the domain travels in pages of at most `PAGE_VALUES` numbers
(about 1 MB):

- a partition_sums measurement's starts after the DecryptMeasurement / IssueShares header
  (`measurement_requests`, read back by `read_measurement_header`);
- the decrypted values of a measurement (`values_replies`, `read_values`);
- a released summary (`summary_pages`, `summary_from_pages`): a head with every field and the
  lengths of the long lists, then the lists in pages. A summary whose stored document is at
  most `INLINE_JSON_BYTES` (about 200,000 partitions) still travels whole in ReleaseStatus /
  GetRelease (`summary_is_inline`, decided without parsing it).

Every reader checks that the pages add up to the announced lengths (DATA_LOSS otherwise), so
a cut stream never reads as a smaller, valid-looking summary or measurement.
"""

from __future__ import annotations

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

__all__ = ["PAGE_VALUES", "INLINE_JSON_BYTES", "measurement_requests", "read_measurement_header", "values_replies",
           "read_values", "summary_is_inline", "summary_numbers", "summary_pages", "summary_from_pages"]

#: Numbers per page: at most ~10 bytes each as varints or doubles, so a page stays near 1 MB or less.
PAGE_VALUES = 1 << 16

#: A summary whose JSON document is at most this long travels whole in one reply (its message is no
#: longer than the JSON); larger ones only in pages.
INLINE_JSON_BYTES = 4 * 1024 * 1024


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

    Leaves `requests` at the first chunk. INVALID_ARGUMENT for a stream that does not start with a
    header, or whose pages do not add up to `starts_count` before the first chunk.
    """
    first = next(requests, None)
    if first is None or first.WhichOneof("part") != "header":
        raise InvalidInputError(f"{method} must start with a header message")
    header = decryption_pb2.DecryptMeasurementHeader()
    header.CopyFrom(first.header)  # small when the starts are paged; filled in below
    want = int(header.starts_count)
    if want < 0:
        raise InvalidInputError(f"starts_count must be >= 0, got {want}")
    if want:
        if header.measurement.kind != "partition_sums" or len(header.measurement.starts):
            raise InvalidInputError("starts_count is for a partition_sums measurement whose starts follow the "
                                    "header in pages (measurement.starts then empty)")
        if want > header.measurement.domain_size:
            raise InvalidInputError(f"starts_count {want} exceeds the domain size {header.measurement.domain_size}")
        got = header.measurement.starts
        while len(got) < want:
            msg = next(requests, None)
            if msg is None or msg.WhichOneof("part") != "starts":
                raise InvalidInputError(f"{method}: {want} partition starts announced, {len(got)} arrived before "
                                        f"{'the end' if msg is None else 'a ' + str(msg.WhichOneof('part'))}")
            page = msg.starts.values
            if len(got) + len(page) > want:
                raise InvalidInputError(f"{method}: more than the announced {want} partition starts")
            got.extend(page)
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


def summary_is_inline(summary_json: str) -> bool:
    """Whether a summary, by its stored JSON document, travels whole in one reply (ReleaseStatus, GetRelease)."""
    return len(summary_json) <= INLINE_JSON_BYTES


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
