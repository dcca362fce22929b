"""The in-memory computation store: everything in dictionaries, for unit tests; lost at exit.

Same contract as the SQLite store (the ABC in `store.py`; tests/parties/test_stores.py runs both).
"""

from __future__ import annotations

import threading

from ..common.contract import StudyContract
from ..common.errors import NotFoundError
from ..common.util import utc_now
from .store import (ComputationStore, ReleaseRecord, Submission, UploadMeta,
                    _check_complete, _check_index, _study_conflict, owner_conflict)

__all__ = ["MemoryComputationStore"]


class MemoryComputationStore(ComputationStore):
    """Everything in dictionaries: for unit tests; lost at exit."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._studies: dict[str, StudyContract] = {}
        self._uploads: dict[tuple[str, str], UploadMeta] = {}
        self._upload_sigs: dict[tuple[str, str], bytes] = {}
        self._chunks: dict[tuple[str, str, str], dict[int, bytes]] = {}
        self._subs: dict[tuple[str, str], Submission] = {}
        self._releases: dict[str, ReleaseRecord] = {}
        self._direct: dict[tuple[str, str], str] = {}

    def put_study(self, contract: StudyContract) -> None:
        with self._lock:
            existing = self._studies.get(contract.study_id)
            if existing is not None and existing.contract_hash != contract.contract_hash:
                raise _study_conflict(existing)
            self._studies[contract.study_id] = contract

    def get_study(self, study_id: str) -> StudyContract | None:
        with self._lock:
            return self._studies.get(study_id)

    def start_upload(self, meta: UploadMeta, signature: bytes = b"") -> None:
        with self._lock:
            sub = self._subs.get((meta.study_id, meta.owner_id))
            if sub is not None:
                if sub.meta == meta:
                    return
                raise owner_conflict(sub)
            current = self._uploads.get((meta.study_id, meta.owner_id))
            if current == meta and self._upload_sigs.get((meta.study_id, meta.owner_id), b"") == bytes(signature):
                return
            if current is not None:
                self.discard_upload(current)
            self._uploads[(meta.study_id, meta.owner_id)] = meta
            self._upload_sigs[(meta.study_id, meta.owner_id)] = bytes(signature)
            self._chunks[(meta.study_id, meta.owner_id, meta.idempotency_key)] = {}

    def get_upload(self, study_id: str, owner_id: str) -> UploadMeta | None:
        with self._lock:
            return self._uploads.get((study_id, owner_id))

    def put_chunk(self, meta: UploadMeta, index: int, data: bytes) -> None:
        _check_index(meta, index)
        with self._lock:
            if self._uploads.get((meta.study_id, meta.owner_id)) != meta:
                raise NotFoundError(f"no open upload {meta.idempotency_key} for owner {meta.owner_id}; start it first")
            self._chunks[(meta.study_id, meta.owner_id, meta.idempotency_key)][index] = bytes(data)

    def replace_chunk(self, submission: Submission, index: int, data: bytes) -> None:
        _check_index(submission.meta, index)
        m = submission.meta
        with self._lock:
            self._chunks[(m.study_id, m.owner_id, m.idempotency_key)][index] = bytes(data)

    def received_chunks(self, meta: UploadMeta) -> dict[int, int]:
        with self._lock:
            held = self._chunks.get((meta.study_id, meta.owner_id, meta.idempotency_key), {})
            return {i: len(b) for i, b in held.items()}

    def commit_upload(self, meta: UploadMeta, signature: bytes = b"", ciphertext_digest: bytes = b"") -> Submission:
        with self._lock:
            sub = self._subs.get((meta.study_id, meta.owner_id))
            if sub is not None:
                if sub.meta == meta:
                    return sub
                raise owner_conflict(sub)
            if self._uploads.get((meta.study_id, meta.owner_id)) != meta:
                raise NotFoundError(f"no open upload {meta.idempotency_key} for owner {meta.owner_id}")
            held = self.received_chunks(meta)
            _check_complete(meta, held)
            sub = Submission(meta, sum(held.values()), utc_now(), bytes(signature), bytes(ciphertext_digest))
            self._subs[(meta.study_id, meta.owner_id)] = sub
            del self._uploads[(meta.study_id, meta.owner_id)]
            self._upload_sigs.pop((meta.study_id, meta.owner_id), None)
            return sub

    def discard_upload(self, meta: UploadMeta) -> None:
        with self._lock:
            sub = self._subs.get((meta.study_id, meta.owner_id))
            if sub is not None and sub.meta.idempotency_key == meta.idempotency_key:
                return
            if self._uploads.get((meta.study_id, meta.owner_id)) == meta:
                del self._uploads[(meta.study_id, meta.owner_id)]
                self._upload_sigs.pop((meta.study_id, meta.owner_id), None)
            self._chunks.pop((meta.study_id, meta.owner_id, meta.idempotency_key), None)

    def get_submission(self, study_id: str, owner_id: str) -> Submission | None:
        with self._lock:
            return self._subs.get((study_id, owner_id))

    def submissions(self, study_id: str) -> list[Submission]:
        with self._lock:
            return sorted((s for (st, _), s in self._subs.items() if st == study_id), key=lambda s: s.owner_id)

    def read_upload_chunk(self, meta: UploadMeta, index: int) -> bytes:
        _check_index(meta, index)
        with self._lock:
            held = self._chunks.get((meta.study_id, meta.owner_id, meta.idempotency_key), {})
            if index not in held:
                raise NotFoundError(f"chunk {index} of owner {meta.owner_id}'s upload {meta.idempotency_key} is not held")
            return held[index]

    def save_release(self, record: ReleaseRecord) -> None:
        with self._lock:
            self._releases[record.release_id] = record

    def get_release(self, release_id: str) -> ReleaseRecord | None:
        with self._lock:
            return self._releases.get(release_id)

    def list_releases(self, study_id: str = "") -> list[ReleaseRecord]:
        with self._lock:
            found = [r for r in self._releases.values() if not study_id or r.study_id == study_id]
        return sorted(found, key=lambda r: (r.started_at, r.release_id))

    def save_direct_answers(self, study_id: str, request_key: str, answers_json: str) -> None:
        with self._lock:
            self._direct.setdefault((study_id, request_key), answers_json)

    def direct_answers(self, study_id: str, request_key: str) -> str | None:
        with self._lock:
            return self._direct.get((study_id, request_key))
