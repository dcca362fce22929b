"""The well-formedness check of the join uploads (he_partition.join.wellformed) spread over the executor's workers.

The check weighs every indicator plane by each round's polynomials and squares each group's
weighted sum once per round (`wellformed`); the squaring of every plane before it took 14 s of
a 16 x 16, 50,000-record join's release in one process on 16 cores. Worker w takes every W-th
of both owners' (owner, group) pairs (one round for both owners, so the workers stay busy and
each loads the scheme once), reads their ciphertexts itself (`UploadFiles`: from the store's
chunk files, one group at a time) and returns its share of each owner's round sums, unflooded;
the coordinator adds each owner's shares up and floods each round's sum once
(`wellformed.finish`). Additions are exact, so the key holder decrypts the same values as from
the serial `residues`: zero in every slot for an honest upload.

Privacy: the shares never leave the computation server (its workers and its process); what
leaves is the flooded sum, as from `residues`. Nothing is drawn here but the flood.
"""

from __future__ import annotations

import secrets
from typing import Mapping, Sequence

from ..execution.base import ChunkExecutor
from ..he.join_scheme import JoinScheme
from .wellformed import finish, partial_sums

__all__ = ["parallel_residues"]


class _CheckShare:
    """Worker w's (owner, group) pairs of the owners' uploads; `run` returns, per owner, each round's partial sum,
    serialized (b"": none)."""

    def __init__(self, public: bytes, uploads: Mapping[str, Sequence[Sequence[bytes]]], pairs: list[tuple[str, int]],
                 seed: bytes) -> None:
        self._scheme = JoinScheme.from_public(public)
        self._uploads, self._pairs, self._seed = uploads, pairs, seed

    def run(self) -> dict[str, list[bytes]]:
        out = {}
        for owner, upload in self._uploads.items():
            groups = [g for o, g in self._pairs if o == owner]
            sums = partial_sums(self._scheme, ((g, upload[g]) for g in groups), self._seed, owner)
            out[owner] = [b"" if s is None else self._scheme.serialize(s) for s in sums]
        return out


def parallel_residues(scheme: JoinScheme, public: bytes, uploads: Mapping[str, Sequence[Sequence[bytes]]],
                      seed: bytes, executor: ChunkExecutor) -> dict[str, list[bytes]]:
    """`wellformed.residues` of each owner's upload (group by group), all owners' groups spread over `executor`'s
    workers in one round (each worker loads the scheme from `public`, the bytes of `scheme`'s public key, once);
    each owner's shares are added up with `scheme`."""
    workers = max(1, executor.workers)
    pairs = [(owner, g) for owner, upload in uploads.items() for g in range(len(upload))]
    shares = [pairs[w::workers] for w in range(workers)]
    key = f"join-check-{secrets.token_hex(8)}"
    executor.hold(key, lambda w: (_CheckShare, (public, dict(uploads), shares[w], seed)))
    try:
        parts = executor.call(key, "run", [()] * workers)
    finally:
        executor.drop(key)
    return {owner: finish(scheme, [[scheme._parse(c) if c else None for c in part[owner]] for part in parts])
            for owner in uploads}
