"""The computation server's forward of the owners' signed c1 parts, once per study and set of uploads.

Shared by the single decryption server's client (`DecryptionClient.forward_uploads`) and the
threshold combiner (`ThresholdDecryption.forward_uploads`): both send each included owner's c1
parts with its signature (`Decryption.ForwardUploads`) so that the key holders decrypt or compute
shares on the owners' aggregate c1 only. `UploadForwarding` remembers what was delivered, runs a
forward in the background when asked, and makes the study's next measurement wait for it.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from ..common.contract import StudyContract
    from .keyshare.uploads import OwnerC1Parts

__all__ = ["UploadForwarding"]

log = logging.getLogger("dpagg.decryption.forwarding")


class UploadForwarding:
    """`send(contract, parts)` once per study and set of included (owner, upload key)s; see the module docstring."""

    def __init__(self, send: Callable[["StudyContract", list["OwnerC1Parts"]], None]) -> None:
        self._send = send
        self._forwarded: dict[str, tuple[tuple[str, str], ...]] = {}  # study -> the (owner, upload key)s forwarded
        #: study -> (the (owner, upload key)s, their forward under way)
        self._forwarding: dict[str, tuple[tuple[tuple[str, str], ...], Future[None]]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)

    def forward(self, contract: "StudyContract", uploads: Callable[[], list["OwnerC1Parts"]],
                included: Sequence[tuple[str, str]], *, background: bool = False) -> None:
        """Send the included owners' signed c1 parts, unless these very uploads were delivered already.

        `uploads()` builds them only when they must travel. With `background` the forward runs
        while the caller goes on; `wait` (the study's next measurement) waits for it first, so a
        key holder that refuses it (a signature that does not verify, an owner missing) stops the
        release before anything is decrypted.
        """
        key = tuple(sorted(included))
        with self._lock:
            if self._forwarded.get(contract.study_id) == key:
                return
            pending = self._forwarding.get(contract.study_id)
        if pending is not None and pending[0] == key and not (pending[1].done() and pending[1].exception()):
            if not background:  # the same uploads already on their way (e.g. sent when the last owner committed)
                self.wait(contract.study_id)
            return
        if pending is not None:  # another set of uploads on its way, or a failed forward: settled, then sent anew
            try:
                self.wait(contract.study_id)
            except Exception as failed:  # sent again below; a key holder that still refuses refuses again
                log.warning("study %s: an earlier forward of c1 parts failed (%s); forwarding again",
                            contract.study_id, failed)
            with self._lock:
                if self._forwarded.get(contract.study_id) == key:
                    return

        def run() -> None:
            self._send(contract, uploads())
            with self._lock:
                self._forwarded[contract.study_id] = key

        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="c1-forward")
            self._forwarding[contract.study_id] = (key, self._executor.submit(run))
        if not background:
            self.wait(contract.study_id)

    def wait(self, study_id: str) -> None:
        """Wait for a running forward of `study_id`'s c1 parts; its failure (a key holder refused them) is raised here."""
        with self._lock:
            pending = self._forwarding.get(study_id)
        if pending is None:
            return
        try:
            pending[1].result()
        finally:
            with self._lock:
                if self._forwarding.get(study_id) is pending:
                    del self._forwarding[study_id]
