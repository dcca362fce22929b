"""Signed studies: the owners' c1 signatures as they arrive, and their c1 parts for the key holders.

Each owner signs the c1 parts of its upload chunks (`SubmitHeader.c1_signature`). The computation
server keeps that signature next to the upload (`C1Signatures`) and, before the first measurement
of a signed study (every study in threshold mode), forwards every included owner's parts with its
signature to the key holders: every key-share holder, or the single decryption server
(`owner_c1_parts`, `forward_uploads` of `ThresholdDecryption` and `DecryptionClient`). The key
holders take every measurement chunk's c1 from the sum of those parts, so this server adds its
noise (and, for the single decryption server, its flood) to c0 only (`BfvBackend.noise_in_c0`).
Nothing here is secret: c1 alone carries no plaintext.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from he_partition.he.threshold.c1 import c1_bytes, c1_of_vector

from ...common.contract import check_id
from ...common.errors import FailedPreconditionError
from ...common.util import write_file_atomic
from ...decryption.keyshare.uploads import OwnerC1Parts
from ..store import Submission

__all__ = ["C1Signatures", "owner_c1_parts"]


class C1Signatures:
    """Owner c1 signatures by (study, owner, upload key): files under `directory`, or memory only."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._mem: dict[tuple[str, str, str], bytes] = {}
        self._lock = threading.Lock()

    def _path(self, study_id: str, owner_id: str, key: str) -> Path | None:
        if self.directory is None:
            return None
        for name, value in (("study_id", study_id), ("owner_id", owner_id), ("idempotency_key", key)):
            check_id(name, value)
        return self.directory / study_id / f"{owner_id}.{key}.c1sig"

    def keep(self, study_id: str, owner_id: str, key: str, signature: bytes) -> None:
        """Keep an owner's c1 signature (the holders verify it; a wrong one only fails that study's releases)."""
        if not signature:
            return
        with self._lock:
            self._mem[(study_id, owner_id, key)] = bytes(signature)
            path = self._path(study_id, owner_id, key)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_file_atomic(path, bytes(signature))

    def get(self, study_id: str, owner_id: str, key: str) -> bytes:
        with self._lock:
            sig = self._mem.get((study_id, owner_id, key))
        path = self._path(study_id, owner_id, key)
        if sig is None and path is not None and path.exists():
            sig = path.read_bytes()
        if not sig:
            raise FailedPreconditionError(f"owner {owner_id!r} uploaded to study {study_id} without a c1 signature: "
                                          "the key holders decrypt only chunks whose c1 the owners signed; the "
                                          "owner must upload again with a current client")
        return sig


def owner_c1_parts(ctx: Any, sub: Submission, read_chunk: Callable[[Submission, int], bytes],
                   signature: bytes, parts: tuple[bytes, ...] | None = None) -> OwnerC1Parts:
    """One owner's c1 parts (read from its stored chunks, in index order, unless `parts` has them) with its c1
    signature."""
    if parts is None:
        parts = tuple(c1_bytes(c1_of_vector(ctx, read_chunk(sub, i))) for i in range(sub.meta.chunk_count))
    return OwnerC1Parts(sub.meta.owner_id, sub.meta.idempotency_key, parts, bytes(signature))
