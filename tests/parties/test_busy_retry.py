"""A "server busy" refusal is retried for as long as the call's deadline allows, not a fixed number of times."""
from __future__ import annotations

import grpc
import pytest

from parties.common.client import call_with_retry
from parties.common.config import RetryPolicy
from parties.common.errors import ServiceError


class _Refused(grpc.RpcError):
    def __init__(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details


def _flaky(failures: int, details: str) -> tuple[list[int], object]:
    calls = [0]

    def fn() -> str:
        calls[0] += 1
        if calls[0] <= failures:
            raise _Refused(details)
        return "answer"

    return calls, fn


def test_busy_is_retried_until_the_deadline_not_five_times() -> None:
    """On the former code a heavy call holding the slots for ~1.5 s failed its neighbours after 5 tries (~3 s of
    backoff at most); now they keep trying while their deadline lasts."""
    now = [0.0]
    policy = RetryPolicy(attempts=5, initial_delay=0.2, max_delay=1.0)
    calls, fn = _flaky(12, "server busy: all 14 call slots are busy; retry in a moment")
    got = call_with_retry(fn, policy=policy, method="Analyst/ListReleases", budget=60.0,  # type: ignore[arg-type]
                          sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])
    assert got == "answer" and calls[0] == 13
    # past the deadline it gives up, with the server's words
    now[0] = 0.0
    calls, fn = _flaky(10_000, "server busy: all 14 call slots are busy; retry in a moment")
    with pytest.raises(ServiceError) as err:
        call_with_retry(fn, policy=policy, method="Analyst/ListReleases", budget=5.0,  # type: ignore[arg-type]
                        sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])
    assert "server busy" in err.value.details and now[0] <= 5.0 + 1e-9


def test_a_server_that_is_down_still_gets_the_policys_attempts_only() -> None:
    calls, fn = _flaky(100, "failed to connect to all addresses")
    with pytest.raises(ServiceError):
        call_with_retry(fn, policy=RetryPolicy(attempts=3, initial_delay=0.0), method="X/Y",  # type: ignore[arg-type]
                        budget=60.0, sleep=lambda s: None)
    assert calls[0] == 3
