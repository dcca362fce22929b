"""What the key setup, the failover and the t-of-N close need of the server that relays to the key-share holders.

`ThresholdDecryption` is that server; the modules that work on its behalf name only these members, so they
import nothing of it (no import circle) and the members they rely on are listed in one place.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from ...decryption.client import DecryptResult
from ...decryption.keyshare.client import KeyShareClient
from .charge_log import StudyChargeLogs

__all__ = ["HolderRelay"]


class HolderRelay(Protocol):
    """The holders (`clients`, `names`, K = `k`, t = `threshold` once known), the thread pool and lock their calls
    share, the study's charge logs and the calls that gather the holders' answers."""

    names: list[str]
    clients: list[KeyShareClient]
    threshold: int | None
    charges: StudyChargeLogs
    failovers: dict[str, list[str]]
    _known_threshold: bool
    _template: Any  # a TenSEAL context: BFV parameters only
    _pool: ThreadPoolExecutor
    _lock: threading.Lock

    @property
    def k(self) -> int: ...

    def tofn(self) -> int | None: ...

    def _all(self, *args: Any, **kwargs: Any) -> Any: ...

    def _collect(self, *args: Any, **kwargs: Any) -> Any: ...

    def _outcomes(self, *args: Any, **kwargs: Any) -> Any: ...

    def _charge(self, *args: Any, **kwargs: Any) -> Any: ...

    def _decrypt_with(self, *args: Any, **kwargs: Any) -> DecryptResult: ...
