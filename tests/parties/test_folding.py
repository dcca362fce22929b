"""The background fold queue: a burst of commits is folded in a few passes, and no pass runs beside a reader.

A recording function stands in for `ComputationHandler.fold_committed` (what a pass sums is
tested through the real servers in test_running_aggregate); here the order of passes, readers
and requests is what is tested.
"""

from __future__ import annotations

import threading
import time

from parties.computation.folding import FoldQueue


class Passes:
    """Records each pass; the first pass of a study blocks until `go` is set."""

    def __init__(self) -> None:
        self.done: list[tuple[str, object]] = []
        self.started = threading.Event()
        self.go = threading.Event()

    def __call__(self, study_id: str, backend: object) -> None:
        self.started.set()
        assert self.go.wait(30)
        self.done.append((study_id, backend))


def test_commits_during_a_pass_are_folded_together_by_one_more_pass() -> None:
    passes = Passes()
    q = FoldQueue(passes, settle=0.0)
    q.request("s1", "b0")
    assert passes.started.wait(10)
    for i in range(1, 10):  # nine commits while the first pass runs
        q.request("s1", f"b{i}")
    passes.go.set()
    assert q.wait_idle(10)
    assert passes.done == [("s1", "b0"), ("s1", "b9")]  # two passes for ten commits, the latest backend


def test_a_burst_of_commits_within_the_settle_time_is_one_pass() -> None:
    passes = Passes()
    passes.go.set()
    q = FoldQueue(passes, settle=1.0)
    for i in range(10):  # ten commits well within the settle time
        q.request("s1", f"b{i}")
    assert not passes.started.is_set()  # still settling
    assert q.wait_idle(10)
    assert passes.done == [("s1", "b9")]


def test_a_steady_stream_of_commits_is_folded_after_max_delay() -> None:
    passes = Passes()
    passes.go.set()
    q = FoldQueue(passes, settle=0.3, max_delay=0.5)
    end = time.monotonic() + 1.2
    while time.monotonic() < end:  # never quiet for 0.3 s
        q.request("s1", "b")
        time.sleep(0.05)
    assert passes.done  # folded while commits still came
    assert q.wait_idle(10)


def test_a_reader_waits_for_the_running_pass_and_holds_back_new_ones() -> None:
    passes = Passes()
    q = FoldQueue(passes, settle=0.0)
    q.request("s1", "b")
    assert passes.started.wait(10)
    entered = threading.Event()

    def read() -> None:
        with q.reading("s1"):
            entered.set()
            time.sleep(0.2)
            q.request("s1", "later")  # a commit while the release reads: no pass beside it
            time.sleep(0.2)
            assert passes.done == [("s1", "b")]

    reader = threading.Thread(target=read)
    reader.start()
    assert not entered.wait(0.3)  # the running pass holds the reader back
    passes.go.set()
    assert entered.wait(10)
    reader.join(10)
    assert q.wait_idle(10)
    assert passes.done == [("s1", "b"), ("s1", "later")]  # run once the reader ended


def test_studies_fold_independently_and_a_closed_queue_starts_nothing() -> None:
    passes = Passes()
    passes.go.set()
    q = FoldQueue(passes, settle=0.0)
    with q.reading("s1"):
        q.request("s1", "x")
        q.request("s2", "y")
        assert q.wait_idle(10)  # s2 folded; s1 waits behind its reader
        assert passes.done == [("s2", "y")]
    assert q.wait_idle(10)
    assert passes.done == [("s2", "y"), ("s1", "x")]
    q.close(5)
    q.request("s1", "z")
    assert q.wait_idle(1) and passes.done == [("s2", "y"), ("s1", "x")]


def test_a_failing_pass_is_logged_and_the_next_request_folds_again() -> None:
    calls: list[str] = []

    def fold(study_id: str, backend: object) -> None:
        calls.append(str(backend))
        if backend == "bad":
            raise RuntimeError("disk full")

    q = FoldQueue(fold, settle=0.0)
    q.request("s1", "bad")
    assert q.wait_idle(10)
    q.request("s1", "good")
    assert q.wait_idle(10)
    assert calls == ["bad", "good"]
