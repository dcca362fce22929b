"""Folding commits into the running aggregate in the background, a burst of commits in one pass.

A commit asks for a fold and the owner's answer does not wait for it. A study's pass starts once
the study has been quiet for `settle` seconds (no commit, no release or direct count reading its
aggregate), or `max_delay` seconds after the first commit it waits for, whichever comes first;
each pass adds every committed owner not yet in the sum (`RunningAggregates.fold`). So ten owners
committing within a second of each other cost one pass, not ten: each pass reads the whole
previous sum again, which on a small host competes with the uploads still arriving.

While a release or a direct count reads a study's aggregate, no pass of that study starts (the
reader sums the owners missing from the aggregate itself, on the same workers); a reader waits for
a pass already running rather than summing the same owners beside it. One pass per study runs at
a time; commits that arrive during a pass are folded by the next.

Nothing here decides what is summed: a pass that fails or never runs (a crash, a stop) leaves
the previous aggregate, and the next pass or the release adds the owners missing from it.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

log = logging.getLogger("dpagg.computation")


class FoldQueue:
    """Coalesced background folds: `request` after a commit, `reading` around every read of the aggregate."""

    def __init__(self, fold: Callable[[str, Any], None], *, settle: float = 1.0, max_delay: float = 30.0) -> None:
        self._fold = fold
        self.settle, self.max_delay = settle, max_delay
        self._cond = threading.Condition()
        self._pending: dict[str, Any] = {}  # study -> the backend of its latest request
        self._first: dict[str, float] = {}  # study -> when its oldest unfolded request came
        self._active: dict[str, float] = {}  # study -> its latest commit or reader (start or end)
        self._threads: set[str] = set()  # studies with a pass thread alive (settling or folding)
        self._folding: set[str] = set()
        self._readers: dict[str, int] = {}
        self._closed = False

    def request(self, study_id: str, backend: Any) -> None:
        """Fold `study_id`'s committed owners once it has been quiet for `settle` seconds."""
        with self._cond:
            if self._closed:
                return
            now = time.monotonic()
            self._pending[study_id] = backend
            self._first.setdefault(study_id, now)
            self._active[study_id] = now
            if study_id not in self._threads:
                self._threads.add(study_id)
                threading.Thread(target=self._passes, args=(study_id,), name=f"fold-{study_id}", daemon=True).start()
            self._cond.notify_all()

    def _next(self, study_id: str) -> Any:
        """The backend of the next pass once it is due; None when nothing is left (the thread ends)."""
        with self._cond:
            while True:
                if self._closed or study_id not in self._pending:
                    self._threads.discard(study_id)
                    self._cond.notify_all()
                    return None
                due = min(self._active[study_id] + self.settle, self._first[study_id] + self.max_delay)
                wait = due - time.monotonic()
                if not self._readers.get(study_id) and wait <= 0:
                    self._first.pop(study_id, None)
                    self._folding.add(study_id)
                    return self._pending.pop(study_id)
                self._cond.wait(None if self._readers.get(study_id) else wait)

    def _passes(self, study_id: str) -> None:
        while (backend := self._next(study_id)) is not None:
            try:
                self._fold(study_id, backend)
            except Exception:  # noqa: BLE001 - the aggregate stays as it was; the release sums what is missing
                log.exception("study %s: a background fold failed; releases sum the owners missing from the "
                              "running aggregate themselves", study_id)
            finally:
                with self._cond:
                    self._folding.discard(study_id)
                    self._cond.notify_all()

    @contextmanager
    def reading(self, study_id: str) -> Iterator[None]:
        """Held while the aggregate of `study_id` is read: waits for a running pass, holds back new ones."""
        with self._cond:
            self._readers[study_id] = self._readers.get(study_id, 0) + 1
            self._active[study_id] = time.monotonic()
            self._cond.wait_for(lambda: study_id not in self._folding)
        try:
            yield
        finally:
            with self._cond:
                self._readers[study_id] -= 1
                if not self._readers[study_id]:
                    del self._readers[study_id]
                self._active[study_id] = time.monotonic()
                self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no pass runs and none is due (except behind a reader); False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._folding and all(self._readers.get(s) for s in self._pending), timeout)

    def close(self, timeout: float | None = None) -> None:
        """Start no more passes; wait up to `timeout` for a running one (the next start folds the rest)."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._folding, timeout)
