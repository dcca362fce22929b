"""A t-of-N study's sealed uploads closed with any t key-share holders up, and the holders that missed it caught up.

With a t-of-N key the owners split each upload key t-of-N (`StudyContract.seal_threshold`,
`parties.common.key_split`). `UploadClosing.close` asks every holder that answers a status call
to close the study's uploads on the set of commitments (`CloseUploads`: each records the set for
good, then returns its shares), and combines each owner's key from t shares (more must agree);
fewer than t closes: refused, nothing opened. The set is kept (`closes/<study>.json`, written
before any holder is asked), so a holder that was down closes on the very same set before it
takes the owners' c1 parts: at the forward (`forward`) or at a later release (`catch_up`). Every
holder records one set per study, and every two sets of t > N/2 holders share one, so the CS
cannot close two different sets (docs/threshold.md, section 10). Nothing here is noise or budget.
"""
from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import grpc

from ...common.contract import StudyContract, check_id
from ...common.errors import FailedPreconditionError, ServiceError, reason_of
from ...common.sealing import Commitment, upload_key_from_threshold_shares
from ...common.util import write_file_atomic
from ...decryption.keyshare.uploads import OwnerC1Parts
from .relay import HolderRelay

__all__ = ["UploadClosing"]

log = logging.getLogger("dpagg.computation.threshold")


def _short(e: Exception) -> str:
    text = reason_of(e)[1]
    return text if len(text) <= 120 else text[:117] + "..."


class UploadClosing:
    """Per t-of-N study: the commitments its uploads closed on, the holders that closed, the holders that missed."""

    def __init__(self, holders: HolderRelay, directory: Path | None, failed: type[ServiceError]) -> None:
        #: The `ThresholdDecryption` whose holders close (its clients, names, pool and `_outcomes`).
        self.holders = holders
        self.failed = failed  # HolderFailedError: keeps a holder's status code and names it
        self.directory = directory
        self._sets: dict[str, list[Commitment]] = {}
        self._closed_at: dict[str, set[int]] = {}
        self._missed: dict[str, set[int]] = {}
        self._lock = threading.Lock()

    def up(self) -> dict[int, Any]:
        """Every holder's answer to a status call, asked in parallel without retries (holder index -> the answer, or
        the exception it failed with): who is up now."""
        h = self.holders
        got, failures = h._outcomes([h._pool.submit(
            lambda c: c.key_setup("status", b"", h.names, retry=False, timeout=10.0), c) for c in h.clients])
        out: dict[int, Any] = dict(got)
        for name, e in failures:
            out[h.names.index(name)] = e
        return out

    def close(self, contract: StudyContract, commitments: Sequence[Commitment],
              timeout: float | None = None) -> list[bytes]:
        """Each owner's upload key, from the shares of at least t holders that closed the uploads on `commitments`.

        HolderFailedError (the first failure's code) naming the holders missing when fewer than t closed; no
        upload is opened then. A holder down, or refusing, is only missing: it is closed on the same set later."""
        t = contract.seal_threshold
        self._keep(contract.study_id, list(commitments))  # before any holder is asked
        up = self.up()
        asked = sorted(i for i, a in up.items() if not isinstance(a, Exception))
        got, failures = self.holders._outcomes([self.holders._pool.submit(self._close_at, i, contract, timeout)
                                                for i in asked], asked)
        failures += [(self.holders.names[i], e) for i, e in sorted(up.items()) if isinstance(e, Exception)]
        with self._lock:
            self._missed[contract.study_id] = set(range(self.holders.k)) - set(got)
        reasons = "; ".join(f"{n}: {_short(e)}" for n, e in failures)
        if len(got) < t:
            code = reason_of(failures[0][1])[0] if failures else grpc.StatusCode.UNAVAILABLE
            raise self.failed(code, f"study {contract.study_id}'s upload keys are split {t}-of-{self.holders.k} and "
                                    f"only {len(got)} key-share holder(s) closed the uploads; missing: {reasons}; no "
                                    "upload was opened")
        if failures:
            log.warning("study %s: uploads closed at %d of %d holders; the others close on the same set when they "
                        "are back (%s)", contract.study_id, len(got), self.holders.k, reasons)
        return [upload_key_from_threshold_shares({i: got[i][n] for i in got}, t) for n in range(len(commitments))]

    def forward(self, contract: StudyContract, parts: list[OwnerC1Parts]) -> None:
        """Send the owners' c1 parts to every holder that is up, each closed first where it has not closed yet; at
        least t must take them (HolderFailedError UNAVAILABLE otherwise). The others are caught up later."""
        h = self.holders
        up = self.up()
        asked = sorted(i for i, a in up.items() if not isinstance(a, Exception))
        took, failures = h._outcomes([h._pool.submit(self._closed_then_send, i, contract, parts) for i in asked],
                                     asked)
        failures += [(h.names[i], e) for i, e in sorted(up.items()) if isinstance(e, Exception)]
        with self._lock:
            self._missed[contract.study_id] = set(range(h.k)) - set(took)
        if len(took) < (h.threshold or h.k):
            raise self.failed(grpc.StatusCode.UNAVAILABLE,
                              f"the t-of-N key needs {h.threshold} of {h.k} key-share holders and only "
                              f"{len(took)} took the owners' c1 parts; missing: "
                              + "; ".join(f"{n}: {_short(e)}" for n, e in failures))
        log.info("study %s: c1 parts of %d owners forwarded to %d of %d holders (%s)", contract.study_id,
                 len(parts), len(took), h.k, ", ".join(h.names[i] for i in sorted(took)))

    def catch_up(self, contract: StudyContract, uploads: Callable[[], list[OwnerC1Parts]]) -> None:
        """The holders that missed the study's close or its c1 forward and are up now: closed on the kept set, then
        sent the parts (built once, only when one of them is up). Those still down stay missed."""
        with self._lock:
            missed = sorted(self._missed.get(contract.study_id, ()))
        if not missed:
            return
        up = self.up()
        back = [i for i in missed if i in up and not isinstance(up[i], Exception)]
        if not back:
            return
        h = self.holders
        parts = uploads()
        got, failures = h._outcomes([h._pool.submit(self._closed_then_send, i, contract, parts) for i in back], back)
        with self._lock:
            self._missed[contract.study_id] = set(missed) - set(got)
        if got:
            log.info("study %s: holder(s) %s back: closed on the same %d owners' commitments and took their c1 parts",
                     contract.study_id, ", ".join(h.names[i] for i in sorted(got)), len(parts))
        if failures:
            log.warning("study %s: holder(s) still missing the close or the c1 parts: %s", contract.study_id,
                        "; ".join(f"{n}: {_short(e)}" for n, e in failures))

    def _close_at(self, i: int, contract: StudyContract, timeout: float | None = None) -> list[bytes]:
        """Holder i's shares of the kept set's upload keys (it records the set first); remembered as closed there."""
        commitments = self._set(contract.study_id)
        if commitments is None:
            raise FailedPreconditionError(f"study {contract.study_id}: this server kept no set of commitments to close "
                                          f"the uploads on at holder {self.holders.names[i]}")
        shares: list[bytes] = self.holders.clients[i].close_upload_shares(contract, commitments, timeout=timeout)
        with self._lock:
            self._closed_at.setdefault(contract.study_id, set()).add(i)
        return shares

    def _closed_then_send(self, i: int, contract: StudyContract, parts: list[OwnerC1Parts]) -> int:
        """A sealed t-of-N study: close at holder i first where it has not closed yet (a holder takes c1 parts only
        from owners of the set it closed), then send it the owners' c1 parts."""
        with self._lock:
            closed = i in self._closed_at.get(contract.study_id, set())
        if contract.seal_threshold and not closed and self._set(contract.study_id) is not None:
            self._close_at(i, contract)
        took: int = self.holders.clients[i].send_uploads(contract.study_id, contract.contract_hash, parts)
        return took

    def _path(self, study_id: str) -> Path | None:
        return None if self.directory is None else self.directory / f"{check_id('study_id', study_id)}.json"

    def _keep(self, study_id: str, commitments: list[Commitment]) -> None:
        with self._lock:
            self._sets[study_id] = commitments
        path = self._path(study_id)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_file_atomic(path, json.dumps([c.to_json() for c in commitments]).encode())

    def _set(self, study_id: str) -> list[Commitment] | None:
        """The commitments the study's uploads closed on (memory, else `closes/<study>.json`); None: not closed here."""
        with self._lock:
            got = self._sets.get(study_id)
        path = self._path(study_id)
        if got is None and path is not None and path.exists():
            got = [Commitment.from_json(d) for d in json.loads(path.read_text())]
            with self._lock:
                self._sets[study_id] = got
        return got
