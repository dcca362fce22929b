"""The well-formedness check of a join upload (he_partition.join.wellformed) spread over the executor's workers.

The check squares every indicator plane once and multiplies it by each round's polynomial: per
owner groups x (values + 1) squarings and relinearizations, which in one process took 14 s of a
16 x 16, 50,000-record join's release on 16 cores. Worker w takes the groups g with
g mod W == w, reads their ciphertexts itself (`UploadFiles`: from the store's chunk files, one
group at a time) and returns its share of each round's sum, unflooded; the coordinator adds the
shares up and floods each round's sum once (`wellformed.finish`). Additions are exact, so the
key holder decrypts the same values as from the serial `residues`: zero in every slot for an
honest upload.

Privacy: the shares never leave the computation server (its workers and its process); what
leaves is the flooded sum, as from `residues`. Nothing is drawn here but the flood.
"""

from __future__ import annotations

import secrets
from typing import Sequence

from ..execution.base import ChunkExecutor
from ..he.join_scheme import JoinScheme
from .wellformed import finish, partial_sums

__all__ = ["parallel_residues"]


class _CheckShare:
    """Worker w's groups of one owner's upload; `run` returns each round's partial sum, serialized (b"": none)."""

    def __init__(self, public: bytes, upload: Sequence[Sequence[bytes]], groups: list[int], seed: bytes,
                 owner_id: str) -> None:
        self._scheme = JoinScheme.from_public(public)
        self._upload, self._groups, self._seed, self._owner = upload, groups, seed, owner_id

    def run(self) -> list[bytes]:
        sums = partial_sums(self._scheme, ((g, self._upload[g]) for g in self._groups), self._seed, self._owner)
        return [b"" if s is None else self._scheme.serialize(s) for s in sums]


def parallel_residues(scheme: JoinScheme, public: bytes, upload: Sequence[Sequence[bytes]], seed: bytes,
                      owner_id: str, executor: ChunkExecutor) -> list[bytes]:
    """`wellformed.residues` of `upload` (group by group), its groups spread over `executor`'s workers, each loading
    the scheme from `public` (the bytes of `scheme`'s public key); the shares are added up with `scheme`."""
    workers = max(1, executor.workers)
    shares = [list(range(w, len(upload), workers)) for w in range(workers)]
    key = f"join-check-{secrets.token_hex(8)}"
    executor.hold(key, lambda w: (_CheckShare, (public, upload, shares[w], seed, owner_id)))
    try:
        parts = executor.call(key, "run", [()] * workers)
    finally:
        executor.drop(key)
    return finish(scheme, [[scheme._parse(c) if c else None for c in part] for part in parts])
