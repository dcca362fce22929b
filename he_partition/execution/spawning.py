"""Start worker processes without running the caller's script again.

Python's "spawn" start method imports the parent's `__main__` in every child (by path, or by
module name under `python -m`), so a user's script that builds an in-process study without an
`if __name__ == "__main__":` guard would run again in each worker: studies opened six more
times, then workers dying. Our workers need nothing from `__main__` (their targets and every
message are library types), so while a process starts, `__main__` is a bare stand-in and the
child imports nothing of the caller's. Adds no noise, spends no budget.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import sys
import threading
import types
from contextlib import contextmanager
from typing import Iterator

__all__ = ["end_with_parent", "usable_cores", "without_user_main"]

_LOCK = threading.Lock()


@contextmanager
def without_user_main() -> Iterator[None]:
    """While starting spawned processes: `sys.modules["__main__"]` is a module with no file and no spec."""
    with _LOCK:
        main = sys.modules.get("__main__")
        stand_in = types.ModuleType("__main__")
        stand_in.__spec__ = None
        sys.modules["__main__"] = stand_in
        try:
            yield
        finally:
            if main is not None:
                sys.modules["__main__"] = main


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; the machine's count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _exit_with_parent() -> None:
    parent = multiprocessing.parent_process()
    if parent is not None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(0)


def end_with_parent() -> None:
    """In a spawned worker: end it as soon as the process that spawned it ends (a watcher thread on the parent's
    sentinel), so a SIGKILLed parent leaves no worker behind, waiting forever for work or holding a key."""
    threading.Thread(target=_exit_with_parent, name="exit-with-parent", daemon=True).start()
