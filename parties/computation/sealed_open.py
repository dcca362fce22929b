"""Opening a sealed study's chunks on the chunk workers: each opens, parses and rewrites its share of the files.

Once the key holders close a sealed study, every owner's chunk file is opened (AES with the
owner's upload key), its c1 part read (the c1 signature and the commitment are over them) and the
opened ciphertext written back. At 1M bins x 10 owners that is 1,280 chunks and about 4 CPU s in
the server process, on the release's path. With the local worker processes (`--executor
processes`, the default) worker w takes every W-th chunk of every owner: it reads the file by
path, opens and parses it, and writes the opened bytes under a staged name beside it; it returns
the c1 part and the staged name. The server process then checks each owner's c1 parts against
the owner's commitment and makes the staged files durable and current together
(`ComputationStore.replace_staged`). What a worker is given: the study's public context, the
chunk paths and the owners' upload keys, which the key holders released to this server for this
study at the close; the workers are this server's own local processes.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from he_partition.core.errors import InvalidInputError
from he_partition.he.bfv import load_context
from he_partition.he.threshold.c1 import c1_bytes, c1_of_vector

from ..common.sealing import is_sealed, open_chunk
from ..common.util import STAGED_SUFFIX  # a name the store's chunk listing skips

__all__ = ["OpenJob", "ChunkOpener", "opener_of"]


@dataclass(frozen=True)
class OpenJob:
    """One chunk to open: its file, its index, the owner's upload key and where it belongs (the seal's binding)."""

    path: str
    index: int
    key: bytes
    study_id: str
    owner_id: str
    idempotency_key: str
    contract_hash: str


class ChunkOpener:
    """A worker's opener for one study (held under a key of the executor while the study's chunks are opened)."""

    def __init__(self, context: bytes) -> None:
        self.context = load_context(context)

    def open(self, jobs: list[OpenJob]) -> list[tuple[bytes, str, str]]:
        """Per job, in order: (c1 part, staged file or "" when the chunk was opened before, error or "")."""
        out = []
        for j in jobs:
            path = Path(j.path)
            data = path.read_bytes()
            try:
                opened = open_chunk(j.key, j.index, data, study_id=j.study_id, owner_id=j.owner_id,
                                    idempotency_key=j.idempotency_key,
                                    contract_hash=j.contract_hash) if is_sealed(data) else data
                part = c1_bytes(c1_of_vector(self.context, opened))
            except InvalidInputError as exc:
                out.append((b"", "", str(exc)))
                continue
            staged = ""
            if opened is not data:
                target = path.with_name(f".{path.name}.{secrets.token_hex(4)}{STAGED_SUFFIX}")
                target.write_bytes(opened)
                staged = str(target)
            out.append((part, staged, ""))
        return out


def opener_of(context: bytes) -> Callable[[int], tuple[Callable[..., Any], tuple[Any, ...]]]:
    """The executor's `MakeHeld` for a study's opener: every worker builds one from the public context."""
    return lambda _w: (ChunkOpener, (context,))
