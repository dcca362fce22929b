"""Test helper: play the computation server of a sealed study towards a key holder (close, then forward c1)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from he_partition.he.threshold.c1 import c1_stream_digest
from parties.common.contract import StudyContract
from parties.common.sealing import Commitment, commitment_statement, seal_upload_key, sealed_key_shares
from parties.common.signing import sign_submission
from parties.decryption.keyshare.uploads import OwnerC1Parts


def commitment_of(contract: StudyContract, private: bytes, parts: OwnerC1Parts) -> Commitment:
    """The commitment an owner's client makes for its c1 parts (signed with the owner's key)."""
    place = dict(study_id=contract.study_id, owner_id=parts.owner_id, idempotency_key=parts.idempotency_key,
                 contract_hash=contract.contract_hash)
    digest = c1_stream_digest(parts.parts)
    shares = sealed_key_shares(seal_upload_key(private, digest, **place), contract.holder_seal_keys,
                               threshold=contract.seal_threshold, **place)
    statement = commitment_statement(contract.study_id, parts.owner_id, parts.idempotency_key,
                                     contract.contract_hash, digest, shares)
    return Commitment(parts.owner_id, parts.idempotency_key, digest, shares, sign_submission(private, statement))


def close_and_send(holder: Any, contract: StudyContract, parts: Sequence[OwnerC1Parts],
                   owner_keys: Mapping[str, bytes]) -> int:
    """Close a sealed study's uploads at `holder` on these owners' commitments, then forward their c1 parts."""
    if contract.sealed:
        holder.close_upload_shares(contract, [commitment_of(contract, owner_keys[p.owner_id], p) for p in parts])
    n: int = holder.send_uploads(contract.study_id, contract.contract_hash, list(parts))
    return n
