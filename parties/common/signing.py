"""Ed25519 signatures on data-owner submissions: who uploaded which ciphertexts, for which study.

A data owner signs one 32-byte digest that binds together everything that makes its
upload what it is: the study id, its own owner id, the idempotency key of the upload, the
hash of the study's privacy contract, and a running SHA-256 over the ciphertext chunks as
they are streamed (`StreamHasher`). The encoding is domain-separated and every field is
length-prefixed, so no two different submissions share a digest and no field can be
shifted into its neighbour ("ab" + "c" != "a" + "bc"); chunk boundaries and order are
hashed too. The computation server recomputes the digest from what it received and
verifies the signature with the owner's public key from the contract before storing
anything; it keeps the signature so a release can show whose data it contains. A
signature cannot be replayed under another study, owner, idempotency key or contract.

Keys are raw 32-byte Ed25519 keys (RFC 8032); private key files are PKCS#8 PEM, 0600.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from he_partition.core.errors import DPAggError, InvalidInputError

from .tls import write_private_file

__all__ = [
    "SignatureError",
    "StreamHasher",
    "DIGEST_SIZE",
    "KEY_SIZE",
    "SIGNATURE_SIZE",
    "generate_signing_key",
    "public_key_of",
    "key_fingerprint",
    "save_private_key",
    "load_private_key",
    "stream_digest",
    "submission_digest",
    "sign_submission",
    "verify_submission",
    "sign_upload",
    "verify_upload",
    "OwnerSignature",
]

DIGEST_SIZE = 32
KEY_SIZE = 32
SIGNATURE_SIZE = 64

_SUBMISSION_TAG = b"dpagg/submission-digest/v1"
_STREAM_TAG = b"dpagg/ciphertext-stream/v1"


class SignatureError(DPAggError):
    """A submission's signature is missing, malformed, or does not match (refuse the upload)."""


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def _text_field(name: str, value: object) -> bytes:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{name} must be a non-empty string, got {value!r}")
    return value.encode("utf-8")


def _bytes_field(name: str, value: object, size: int | None = None) -> bytes:
    if isinstance(value, str):
        try:
            value = bytes.fromhex(value)
        except ValueError as exc:
            raise InvalidInputError(f"{name} given as text must be hex, got {value[:80]!r}") from exc
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidInputError(f"{name} must be bytes (or hex text), got {type(value).__name__}")
    out = bytes(value)
    if not out:
        raise InvalidInputError(f"{name} must not be empty")
    if size is not None and len(out) != size:
        raise InvalidInputError(f"{name} must be {size} bytes, got {len(out)}")
    return out


def generate_signing_key() -> tuple[bytes, bytes]:
    """A fresh Ed25519 key pair as raw bytes: (private 32 bytes, public 32 bytes).

    Keep the private key with the data owner (`save_private_key`); the public key goes
    into the study's contract next to the owner's id.
    """
    key = Ed25519PrivateKey.generate()
    return _raw_private(key), _raw_public(key.public_key())


def _raw_private(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _private(key: bytes) -> Ed25519PrivateKey:
    raw = _bytes_field("private key", key, KEY_SIZE)
    return Ed25519PrivateKey.from_private_bytes(raw)


def public_key_of(private: bytes) -> bytes:
    """The raw public key belonging to a raw private key."""
    return _raw_public(_private(private).public_key())


def key_fingerprint(public: bytes) -> str:
    """A short, printable name for a public key (first 16 hex digits of its SHA-256)."""
    return hashlib.sha256(_bytes_field("public key", public, KEY_SIZE)).hexdigest()[:16]


def save_private_key(path: Path | str, key: bytes) -> Path:
    """Write a raw Ed25519 private key to `path` as unencrypted PKCS#8 PEM, mode 0600."""
    pem = _private(key).private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())
    return write_private_file(path, pem)


def load_private_key(path: Path | str) -> bytes:
    """Read a key written by `save_private_key`; returns the raw 32-byte private key."""
    p = Path(path)
    try:
        key = serialization.load_pem_private_key(p.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise InvalidInputError(f"{p} is not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise InvalidInputError(f"{p} holds a {type(key).__name__}, not an Ed25519 signing key")
    return _raw_private(key)


class StreamHasher:
    """Running SHA-256 over a stream of ciphertext chunks, fed as they arrive (constant memory).

    Each chunk is hashed with its length in front, and the final digest also covers the
    number of chunks and bytes, so splitting, merging, reordering, dropping or appending
    chunks all change the digest. Sender and receiver feed the same serialized chunks in
    chunk-index order: a server that accepts chunks out of order or over several resumed
    streams re-reads the stored chunks in index order when it commits the upload.
    """

    def __init__(self) -> None:
        self._h = hashlib.sha256(_frame(_STREAM_TAG))
        self.chunks = 0
        self.total_bytes = 0

    def update(self, chunk: bytes) -> None:
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise InvalidInputError(f"a ciphertext chunk must be bytes, got {type(chunk).__name__}")
        data = bytes(chunk)
        self._h.update(_frame(data))
        self.chunks += 1
        self.total_bytes += len(data)

    def digest(self) -> bytes:
        """The 32-byte stream digest so far (the hasher can keep going afterwards)."""
        h = self._h.copy()
        h.update(b"end" + self.chunks.to_bytes(8, "big") + self.total_bytes.to_bytes(8, "big"))
        return h.digest()


def stream_digest(chunks: Iterable[bytes]) -> bytes:
    """`StreamHasher` digest of a whole sequence of chunks."""
    h = StreamHasher()
    for c in chunks:
        h.update(c)
    return h.digest()


def submission_digest(
    study_id: str,
    owner_id: str,
    idempotency_key: str,
    contract_hash: bytes | str,
    ciphertext_digest: bytes | StreamHasher,
) -> bytes:
    """The 32-byte digest a data owner signs for one upload.

    SHA-256 over a domain tag and the named, length-prefixed fields: study id, owner id,
    idempotency key (UTF-8 text), contract hash (bytes, or hex text), and the
    `StreamHasher` digest of the serialized ciphertext chunks (or the hasher itself).
    """
    if isinstance(ciphertext_digest, StreamHasher):
        if ciphertext_digest.chunks == 0:
            raise InvalidInputError("the ciphertext stream is empty: a submission needs at least one chunk")
        ciphertext_digest = ciphertext_digest.digest()
    fields = (
        (b"study_id", _text_field("study_id", study_id)),
        (b"owner_id", _text_field("owner_id", owner_id)),
        (b"idempotency_key", _text_field("idempotency_key", idempotency_key)),
        (b"contract_hash", _bytes_field("contract_hash", contract_hash)),
        (b"ciphertext_digest", _bytes_field("ciphertext_digest", ciphertext_digest, DIGEST_SIZE)),
    )
    h = hashlib.sha256(_frame(_SUBMISSION_TAG))
    for name, value in fields:
        h.update(_frame(name))
        h.update(_frame(value))
    return h.digest()


def sign_submission(private: bytes, digest: bytes) -> bytes:
    """The data owner's 64-byte Ed25519 signature on a `submission_digest`."""
    return _private(private).sign(_bytes_field("digest", digest, DIGEST_SIZE))


def verify_submission(public: bytes, digest: bytes, signature: bytes, *, owner_id: str | None = None) -> None:
    """Check `signature` on `digest` under the owner's raw public key; raise SignatureError if it fails.

    `digest` must be recomputed by the verifier from what it actually received (never
    taken from the request). `owner_id` only makes the error message name the owner.
    """
    who = f"owner {owner_id!r}" if owner_id else "the owner"
    try:
        pub_raw = _bytes_field("public key", public, KEY_SIZE)
        dig = _bytes_field("digest", digest, DIGEST_SIZE)
    except InvalidInputError as exc:
        raise SignatureError(f"cannot verify the submission of {who}: {exc}") from exc
    if not isinstance(signature, (bytes, bytearray, memoryview)) or len(bytes(signature)) != SIGNATURE_SIZE:
        is_bytes = isinstance(signature, (bytes, bytearray, memoryview))
        got = len(bytes(signature)) if is_bytes else type(signature).__name__
        raise SignatureError(
            f"the submission of {who} carries no valid Ed25519 signature (expected {SIGNATURE_SIZE} bytes, got {got}): "
            "sign `submission_digest(...)` with the owner's key and send the signature with the upload"
        )
    try:
        Ed25519PublicKey.from_public_bytes(pub_raw).verify(bytes(signature), dig)
    except (InvalidSignature, ValueError) as exc:
        raise SignatureError(
            f"the signature does not match the submission of {who} under key {key_fingerprint(pub_raw)}: the "
            "ciphertexts, study id, owner id, idempotency key or contract hash differ from what that key signed, or "
            "another key signed it; the upload is refused and nothing is stored"
        ) from exc


def sign_upload(private: bytes, *, study_id: str, owner_id: str, idempotency_key: str,
                contract_hash: bytes | str, chunks: Iterable[bytes]) -> bytes:
    """Data-owner side in one call: sign the upload of `chunks` (serialized, in index order)."""
    digest = submission_digest(study_id, owner_id, idempotency_key, contract_hash, stream_digest(chunks))
    return sign_submission(private, digest)


def verify_upload(public: bytes, signature: bytes, *, study_id: str, owner_id: str, idempotency_key: str,
                  contract_hash: bytes | str, chunks: Iterable[bytes]) -> None:
    """Server side in one call: recompute the digest from what arrived and verify (raises SignatureError)."""
    digest = submission_digest(study_id, owner_id, idempotency_key, contract_hash, stream_digest(chunks))
    verify_submission(public, digest, signature, owner_id=owner_id)


@dataclass(frozen=True)
class OwnerSignature:
    """One owner's signature on the submission it made, as a release records it.

    `ciphertext_digest` is the `StreamHasher` digest the computation server recomputed from
    the chunks it stored, so anyone holding the study contract can re-check the signature
    with `verify` (that the owner signed exactly these ciphertexts for this study, under
    this idempotency key).
    """

    owner_id: str
    idempotency_key: str
    ciphertext_digest: bytes
    signature: bytes

    def verify(self, public: bytes, *, study_id: str, contract_hash: bytes | str) -> None:
        """Raise SignatureError unless the owner's key signed this submission of `study_id` under that contract."""
        digest = submission_digest(study_id, self.owner_id, self.idempotency_key, contract_hash,
                                   self.ciphertext_digest)
        verify_submission(public, digest, self.signature, owner_id=self.owner_id)

    def to_dict(self) -> dict[str, str]:
        return {"owner_id": self.owner_id, "idempotency_key": self.idempotency_key,
                "ciphertext_digest": self.ciphertext_digest.hex(), "signature": self.signature.hex()}

    @classmethod
    def from_dict(cls, d: dict[str, str]) -> "OwnerSignature":
        try:
            return cls(str(d["owner_id"]), str(d["idempotency_key"]), bytes.fromhex(d["ciphertext_digest"]),
                       bytes.fromhex(d["signature"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInputError(f"malformed owner signature record: {exc!r}") from exc
