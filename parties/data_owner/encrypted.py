"""What an owner's encryption produces for one study: the ciphertext chunks and the terms they were made for."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EncryptedHistogram"]


@dataclass(frozen=True)
class EncryptedHistogram:
    """A histogram encrypted for one study: serialized ciphertext chunks of the prefix-encoded counts."""

    study_id: str
    domain_length: int
    context_fingerprint: str
    chunks: tuple[bytes, ...]
    #: Hash of the contract the histogram was encrypted for (sent and signed with the upload).
    contract_hash: str = ""
    #: True when the contract lists owner keys: the upload must be signed.
    signed: bool = False
    #: The key holders' seal keys when the contract pins them: the upload is then sealed and committed.
    holder_seal_keys: tuple[str, ...] = ()
    #: The contract's seal_threshold: 0 splits the upload key by XOR across the holders, t > 0 t-of-N (Shamir).
    seal_threshold: int = 0

    @property
    def nbytes(self) -> int:
        return sum(len(c) for c in self.chunks)
