"""The analyst handler answers RangeCounts in vectorised batches, still checking for a gone client between them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from he_partition import release
from he_partition.core.errors import InvalidInputError
from he_partition.core.summary import Summary
from parties.analyst import handler as analyst_handler
from parties.analyst.handler import AnalystHandler
from parties.common.limits import CallCancelledError
from parties.computation.store import ReleaseRecord, ReleaseState


class _Store:
    def __init__(self, summary: Summary) -> None:
        text = summary.to_json()
        self.record = ReleaseRecord(release_id="r1", study_id="s1", state=ReleaseState.DONE, epsilon=1.0,
                                    owners=("a",), contract_hash="h", started_at="t", summary_json=text,
                                    summary_cache=(text, summary))

    def get_release(self, release_id: str) -> ReleaseRecord:
        return self.record


def _handler(strategy: str) -> tuple[AnalystHandler, Summary]:
    x = np.random.default_rng(4).integers(0, 7, 600)
    summary = release([x], 0.9, strategy=strategy, rng=2)
    return AnalystHandler(_Store(summary)), summary  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", ["gap", "auto", "privelet"])
def test_batched_answers_equal_one_range_at_a_time(strategy: str) -> None:
    handler, summary = _handler(strategy)
    rng = np.random.default_rng(1)
    ranges = [(int(a), int(a) + int(w)) for a, w in zip(rng.integers(0, 500, 700), rng.integers(1, 100, 700))]
    got = handler.range_counts("r1", ranges)
    assert got == [summary.range_count(lo, hi) for lo, hi in ranges]
    with pytest.raises(InvalidInputError, match=r"range 3 \[7, 7\)"):
        handler.range_counts("r1", ranges[:3] + [(7, 7)] + ranges[3:])


def test_cancellation_is_checked_between_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    handler, _ = _handler("auto")
    calls: list[int] = []

    def cancelled_after_two() -> None:
        calls.append(1)
        if len(calls) > 2:
            raise CallCancelledError("the client is gone; work stopped")

    answered: list[int] = []
    real = Summary.range_counts

    def counting(self: Summary, ranges: Any, **kwargs: Any) -> Any:
        answered.append(len(ranges))
        return real(self, ranges, **kwargs)

    monkeypatch.setattr(analyst_handler, "raise_if_cancelled", cancelled_after_two)
    monkeypatch.setattr(analyst_handler, "CANCEL_CHECK_SECONDS", 0.0)
    monkeypatch.setattr(Summary, "range_counts", counting)
    ranges = [(0, 10)] * (5 * analyst_handler.RANGE_BATCH)
    with pytest.raises(CallCancelledError):
        handler.range_counts("r1", ranges)
    assert answered == [analyst_handler.RANGE_BATCH] * 2  # stopped before the third batch
