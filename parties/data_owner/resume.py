"""An owner's encrypted upload kept on its own disk, so an interrupted submit resumes without re-encrypting.

Encryption is randomized: re-encrypting the same counts gives other ciphertexts, so a
re-run could not reuse the chunks the computation server already holds (in a signed
study the signature covers every chunk, and the server discards held chunks when the
signature changes). `UploadCache` keeps the ciphertext chunks of one upload (public-key
encryptions of this owner's own counts, written 0600 in a 0700 directory of the owner's
machine) together with a digest of the counts they encrypt, until the upload commits.
A re-run with the same counts reuses them and sends only the chunks the server lacks; a
re-run with different counts is refused (mixing two encryptions would count neither).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from he_partition.core.errors import InvalidInputError

from ..common.tls import write_private_file

__all__ = ["UploadCache", "counts_digest"]


def counts_digest(counts: np.ndarray, bound: int | None) -> str:
    """SHA-256 of the counts (as int64, little-endian) and the contribution bound: what the chunks encrypt."""
    h = hashlib.sha256(b"dpagg-counts-v1")
    h.update(np.ascontiguousarray(counts, dtype="<i8").tobytes())
    h.update(str(bound).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class CachedUpload:
    """What `UploadCache.load` returns: the chunks and what they were encrypted for."""

    digest: str
    contract_hash: str
    context_fingerprint: str
    domain_length: int
    chunks: tuple[bytes, ...]


class UploadCache:
    """Encrypted chunks of one upload (study, owner, idempotency key) under `directory`."""

    def __init__(self, directory: Path | str, *, study_id: str, owner_id: str, idempotency_key: str) -> None:
        self.dir = Path(directory).expanduser() / f"{study_id}.{owner_id}.{idempotency_key}.chunks"
        self.study_id, self.owner_id, self.key = study_id, owner_id, idempotency_key

    def load(self, digest: str, *, contract_hash: str, context_fingerprint: str) -> CachedUpload | None:
        """The saved upload if it encrypts these counts for this contract and key; None if nothing is saved.

        Raises InvalidInputError if the saved upload encrypts other counts (the data changed
        since the interrupted submit), naming the ways out.
        """
        meta_path = self.dir / "upload.json"
        if not meta_path.is_file():
            return None
        meta = json.loads(meta_path.read_text())
        if meta.get("contract_hash") != contract_hash or meta.get("context_fingerprint") != context_fingerprint:
            self.clear()  # encrypted for other terms or another key: useless, and the server refuses it anyway
            return None
        if meta.get("digest") != digest:
            raise InvalidInputError(
                f"the data differs from what the interrupted upload {self.key} of owner {self.owner_id} to study "
                f"{self.study_id} began with (its chunks are in {self.dir}); submit the original file to resume, "
                "or delete that directory and pass a new --idempotency-key to start over"
            )
        n = int(meta["chunk_count"])
        paths = [self.dir / f"chunk-{i:06d}.ct" for i in range(n)]
        if not all(p.is_file() for p in paths):
            self.clear()
            return None
        return CachedUpload(digest, contract_hash, context_fingerprint, int(meta["domain_length"]),
                            tuple(p.read_bytes() for p in paths))

    def save(self, digest: str, *, contract_hash: str, context_fingerprint: str, domain_length: int,
             chunks: tuple[bytes, ...]) -> None:
        """Write the chunks, then the metadata that makes them loadable (a crash in between leaves nothing usable)."""
        self.clear()
        self.dir.mkdir(parents=True, mode=0o700)
        for i, data in enumerate(chunks):
            write_private_file(self.dir / f"chunk-{i:06d}.ct", data)
        meta = {"digest": digest, "contract_hash": contract_hash, "context_fingerprint": context_fingerprint,
                "domain_length": domain_length, "chunk_count": len(chunks)}
        write_private_file(self.dir / "upload.json", json.dumps(meta).encode())

    def clear(self) -> None:
        """Forget the upload (after it committed, or when it is useless)."""
        shutil.rmtree(self.dir, ignore_errors=True)
