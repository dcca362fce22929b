"""Transport-neutral analyst queries over the released summaries a computation server stores."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from he_partition.core.errors import InvalidInputError
from he_partition.core.measurements import check_range
from he_partition.core.summary import RangeCount, Summary
from he_partition.core.summary_arrow import SUMMARY_FILES, summary_buffers

from ..common.limits import raise_if_cancelled
from ..common.contract import check_id
from ..common.errors import FailedPreconditionError, NotFoundError
from ..common.paging import summary_is_inline, summary_numbers
from ..computation.store import ComputationStore, ReleaseListing, ReleaseRecord, ReleaseState

__all__ = ["AnalystHandler", "MAX_RANGES"]

#: How often a long answer checks that its client is still there.
CANCEL_CHECK_SECONDS = 0.05

#: Parsed summaries kept for queries hold at most this many numbers together (about 1 GB of Python objects):
#: a summary of 2^23 partitions alone is ~25M numbers. The newest one is always kept.
CACHE_NUMBERS = 30_000_000

#: Ranges answered per `Summary.range_counts` call between two cancellation checks.
RANGE_BATCH = 256

#: Most ranges one RangeCounts call may ask (bounds the work and the reply size).
MAX_RANGES = 100_000


class AnalystHandler:
    """Post-processing only: nothing here touches ciphertexts or spends budget.

    Released summaries are immutable once DONE, so parsed summaries are cached.
    """

    def __init__(self, store: ComputationStore, cache_size: int = 64, cache_numbers: int = CACHE_NUMBERS) -> None:
        self.store = store
        #: release id -> (its record without the summary text, the parsed summary, whether it fits one message)
        self._cache: OrderedDict[str, tuple[ReleaseRecord, Summary, bool]] = OrderedDict()
        self._cache_size = cache_size
        self._cache_numbers = cache_numbers
        self._lock = threading.Lock()

    def list_releases(self, study_id: str = "") -> list[ReleaseListing]:
        """Finished releases, newest first: metadata only (no summary is read or parsed to list it)."""
        if study_id:
            check_id("study_id", study_id)
        return self.store.release_listing(study_id)

    def _record(self, release_id: str) -> ReleaseRecord:
        """A finished release's stored record (its summary not parsed): NOT_FOUND / FAILED_PRECONDITION otherwise."""
        rec = self.store.get_release(release_id)
        if rec is None:
            raise NotFoundError(f"unknown release {release_id!r}; list the releases with `dpagg query --list`")
        if rec.state != ReleaseState.DONE:
            why = f": {rec.error_message}" if rec.state == ReleaseState.FAILED else "; wait for it to finish"
            raise FailedPreconditionError(f"release {release_id} is {rec.state}{why}")
        return rec

    def fits_one_message(self, release_id: str) -> bool:
        """Whether the release's summary travels whole in one reply (decided without parsing it)."""
        check_id("release_id", release_id)
        with self._lock:
            cached = self._cache.get(release_id)
        if cached is not None:
            return cached[2]
        return summary_is_inline(self._record(release_id).stored_summary_bytes)

    def release(self, release_id: str) -> tuple[ReleaseRecord, Summary]:
        """A DONE release's record and parsed summary. A cached release is answered from memory: the stored
        record (whose summary text is ~38 MB at 2^20 bins, read under the store's lock) is read once, not on every
        call. The cached record carries no summary text (use the returned Summary)."""
        check_id("release_id", release_id)
        with self._lock:
            cached = self._cache.get(release_id)
            if cached is not None:
                self._cache.move_to_end(release_id)
                return cached[0], cached[1]
        rec = self._record(release_id)
        summary = rec.summary
        assert summary is not None
        entry = (replace(rec, summary_json="", summary_cache=None), summary,
                 summary_is_inline(rec.stored_summary_bytes))
        with self._lock:
            self._cache[release_id] = entry
            while len(self._cache) > self._cache_size or (
                    len(self._cache) > 1 and sum(summary_numbers(e[1]) for e in self._cache.values())
                    > self._cache_numbers):
                self._cache.popitem(last=False)
        return entry[0], entry[1]

    def arrow_files(self, release_id: str) -> tuple[ReleaseRecord, list[tuple[str, Path | bytes]]]:
        """A DONE release's record and its summary's Arrow files: the stored files' paths (nothing is read or
        parsed here), or for a release stored as JSON before them, the files made from its summary in memory."""
        check_id("release_id", release_id)
        with self._lock:
            cached = self._cache.get(release_id)
        rec = cached[0] if cached is not None else self._record(release_id)  # a cached release: no store read
        if rec.summary_file:
            paths = {name: Path(rec.summary_file) / name for name in SUMMARY_FILES}
            if missing := [name for name, path in paths.items() if not path.is_file()]:
                raise NotFoundError(f"release {release_id}'s summary files {missing} are missing from "
                                    f"{rec.summary_file}: the computation server's data directory was altered")
            return rec, [(name, path) for name, path in paths.items()]
        rec, summary = self.release(release_id)
        return rec, list(zip(SUMMARY_FILES, summary_buffers(summary)))

    def range_counts(self, release_id: str, ranges: Sequence[tuple[int, int]]) -> list[RangeCount]:
        """Estimated counts over [lo, hi) with the standard error of their DP noise (no budget spent)."""
        if not ranges:  # as DirectRangeCounts: an empty batch is a mistake, not an empty answer
            raise InvalidInputError("ranges is empty: ask at least one range [lo, hi)")
        if len(ranges) > MAX_RANGES:
            raise InvalidInputError(f"at most {MAX_RANGES} ranges per call, got {len(ranges)}; split the batch")
        _, summary = self.release(release_id)
        for i, (lo, hi) in enumerate(ranges):
            check_range(lo, hi, summary.domain_size, f"range {i}")
        out: list[RangeCount] = []
        check_at = 0.0
        for start in range(0, len(ranges), RANGE_BATCH):
            if time.monotonic() >= check_at:  # by elapsed time, not by count: a slow batch cannot outrun it
                raise_if_cancelled()  # the client gave up (deadline, cancel): stop working for nobody
                check_at = time.monotonic() + CANCEL_CHECK_SECONDS
            # One vectorised call per batch (least-squares and wavelet summaries answer a batch in about the
            # time of one range), small enough that the cancellation checks stay frequent.
            out.extend(summary.range_counts(list(ranges[start:start + RANGE_BATCH])))
        return out
