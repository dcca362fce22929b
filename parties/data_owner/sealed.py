"""An owner seals its upload and commits to it (`parties.common.sealing` says why and how).

The computation server can then read the chunks only once every key holder has closed the
study's uploads, so no other owner's upload can depend on this one. Adds no noise, spends no
budget.
"""
from __future__ import annotations

from typing import Any, Sequence

from he_partition.he.threshold.c1 import c1_bytes, c1_of_vector, c1_stream_digest

from ..common.sealing import Commitment, commitment_statement, seal_chunk, seal_upload_key, sealed_key_shares
from ..common.signing import sign_submission, stream_digest
from .encrypted import EncryptedHistogram

__all__ = ["c1_parts_of", "seal_upload"]


def c1_parts_of(enc: EncryptedHistogram, context: Any) -> list[bytes]:
    """The c1 part of every chunk of `enc`, in chunk order (`threshold.c1.c1_bytes`)."""
    return [c1_bytes(c1_of_vector(context, c)) for c in enc.chunks]


def seal_upload(enc: EncryptedHistogram, signing_key: bytes, context: Any, *, owner_id: str,
                idempotency_key: str, c1_parts: Sequence[bytes] | None = None) -> tuple[tuple[bytes, ...], Commitment]:
    """The sealed chunks of `enc` and the owner's signed commitment (deterministic: a retry seals alike).

    `c1_parts`: the chunks' c1 parts when the caller has them already (`c1_parts_of`)."""
    place = dict(study_id=enc.study_id, owner_id=owner_id, idempotency_key=idempotency_key,
                 contract_hash=enc.contract_hash)
    key = seal_upload_key(signing_key, stream_digest(enc.chunks), **place)
    sealed = tuple(seal_chunk(key, i, c, **place) for i, c in enumerate(enc.chunks))
    digest = c1_stream_digest(c1_parts if c1_parts is not None else c1_parts_of(enc, context))
    shares = sealed_key_shares(key, enc.holder_seal_keys, threshold=enc.seal_threshold, **place)
    statement = commitment_statement(enc.study_id, owner_id, idempotency_key, enc.contract_hash, digest, shares)
    return sealed, Commitment(owner_id, idempotency_key, digest, shares, sign_submission(signing_key, statement))
