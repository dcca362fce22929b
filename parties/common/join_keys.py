"""Signatures on a join study's X25519 public keys: each owner signs its key with its contract-bound Ed25519 key."""

from __future__ import annotations

import hashlib

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from .contract import StudyContract
from .signing import SIGNATURE_SIZE, SignatureError, key_fingerprint

__all__ = ["join_key_digest", "sign_join_key", "verify_join_key"]

_TAG = b"dpagg/join-x25519/v1"


def join_key_digest(contract: StudyContract, owner_id: str, public_key: bytes) -> bytes:
    """SHA-256 over the study id, its contract hash, the owner and its X25519 public key (length-framed)."""
    h = hashlib.sha256()
    for part in (_TAG, contract.study_id.encode(), contract.contract_hash.encode(), owner_id.encode(),
                 bytes(public_key)):
        h.update(len(part).to_bytes(8, "big") + part)
    return h.digest()


def sign_join_key(signing_key: bytes, contract: StudyContract, owner_id: str, public_key: bytes) -> bytes:
    """The owner's Ed25519 signature on its X25519 key for this study (64 bytes)."""
    return Ed25519PrivateKey.from_private_bytes(signing_key).sign(join_key_digest(contract, owner_id, public_key))


def verify_join_key(contract: StudyContract, owner_id: str, public_key: bytes, signature: bytes) -> None:
    """Check `signature` under the key the contract lists for `owner_id` (SignatureError if it fails).

    An unsigned study lists no keys: there is nothing to check against (docs/join.md says so).
    """
    if not contract.signed:
        return
    registered = contract.owner_public_key(owner_id)
    if len(signature) != SIGNATURE_SIZE or not registered:
        raise SignatureError(f"owner {owner_id!r}'s join key for study {contract.study_id} carries no valid "
                             f"signature ({len(signature)} bytes): refusing to use it")
    try:
        Ed25519PublicKey.from_public_bytes(registered).verify(bytes(signature),
                                                              join_key_digest(contract, owner_id, public_key))
    except (InvalidSignature, ValueError) as exc:
        raise SignatureError(f"owner {owner_id!r}'s join key for study {contract.study_id} is not signed by the key "
                             f"the contract lists ({key_fingerprint(registered)}): the relay may have substituted "
                             "it; refusing to use it") from exc
