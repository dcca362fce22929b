"""An owner waiting for the other owner polls soon, then backs off to its poll interval."""
from __future__ import annotations

import pytest

from he_partition.core.errors import DPAggError
from parties.data_owner import join


def test_the_owner_polls_after_50_ms_then_doubles_up_to_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(join.time, "sleep", pauses.append)  # record the pauses instead of waiting them
    polls = iter(range(8))
    assert join._wait("not yet", lambda: next(polls), lambda n: n == 7, timeout=60.0, interval=0.5) == 7
    assert pauses == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5]


def test_an_interval_below_the_first_pause_is_kept_and_a_timeout_names_what_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(join.time, "sleep", pauses.append)
    polls = iter(range(3))
    assert join._wait("not yet", lambda: next(polls), lambda n: n == 2, timeout=60.0, interval=0.01) == 2
    assert pauses == [0.01, 0.01]
    with pytest.raises(DPAggError, match="the other owner has not posted its join key within 0 s"):
        join._wait("the other owner has not posted its join key", lambda: 0, lambda n: False, timeout=0.0,
                   interval=0.5)
