"""Sealed uploads: an owner's ciphertexts stay unreadable to the computation server until the key holders close the study.

Why. A key holder computes on the owners' aggregate c1 (docs/threshold.md, section 3a). If
the computation server (CS) could show one owner the other owners' ciphertexts before that
owner fixed its own, the two together could choose the aggregate c1 (c1_x = target - sum of
the others: the holders' shares then give away their key shares) or scale the aggregate
(upload (c - 1) x others + c x own: the key holders' noise shrinks by c). Both need the
others' ciphertexts first. So every owner's upload is fixed before anyone can read another's:

1. **Seal.** The owner encrypts each upload chunk with AES-256-GCM under a fresh upload key k
   (`seal_chunk`; the chunk's place is authenticated). k is split into K XOR shares, share j
   encrypted to key holder j's X25519 key, which the contract pins (`holder_seal_keys`): a
   key holder alone, or the CS, cannot open it. When the holders hold a t-of-N key (the
   contract's `seal_threshold` t, N/2 < t < N) the split is Shamir's instead
   (`parties.common.key_split`): any t holders' shares give k, fewer say nothing of it.
2. **Commit.** The owner signs, with its contract key, the commitment statement
   (`commitment_statement`): study, owner, upload key, contract hash, the digest of its
   chunks' c1 parts (`threshold.c1.c1_stream_digest`) and the K encrypted shares.
3. **Close.** Once every expected owner has committed (or the operator excluded the missing
   ones), the CS sends the commitments to every key holder (`Decryption.CloseUploads`). Each
   holder verifies every signature, records the set for good (a different set later is
   refused, so no owner can join after anyone saw anything) and only then returns its shares
   of the upload keys. With every share (t-of-N: any t) the CS opens the chunks; each holder
   afterwards computes only on c1 parts whose digest the closed set holds.

A dishonest owner must therefore commit to its c1 while every other owner's is still sealed:
the aggregate c1 is a sum of uniformly random polynomials it never saw (no chosen c1), and no
upload can depend on another (no scaling). With the XOR split this holds while one key holder
is honest: every upload key needs every holder's share. With a t-of-N split it holds while
fewer than t holders collude with the CS (t of them give every key), and a CS closing two
different sets needs two sets of t holders that share no honest holder: 2t - N > f holders
colluding rules that out (docs/threshold.md, section 10). Nothing here is noise or budget.

The upload key and its shares are derived from the owner's signing key and the digest of the
plain chunks (HKDF-SHA256), so a retried or resumed upload seals to the same bytes, and two
different encryptions never share a key.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from he_partition.core.errors import InvalidInputError

from .key_split import SHARE_BYTES, check_split_threshold, combine_key, split_key
from .util import write_file_atomic

__all__ = ["SEALED_MAGIC", "Commitment", "SealKeyPair", "commitment_statement", "is_sealed", "open_chunk",
           "open_key_share", "seal_chunk", "seal_to", "seal_upload_key", "sealed_key_shares", "sealed_share_bytes",
           "share_bytes", "upload_key_from_shares", "upload_key_from_threshold_shares", "check_seal_public_key"]

#: Every sealed chunk starts with these bytes (an opened chunk is a plain TenSEAL vector, which never does).
SEALED_MAGIC = b"dpagg-sealed/v1\n"
_KEY_BYTES = 32
_SHARE_BLOB = 32 + _KEY_BYTES + 16  # ephemeral X25519 public key, encrypted share, GCM tag
_SHAMIR_BLOB = 32 + SHARE_BYTES + 16  # the same around a t-of-N share (one byte longer)


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def _hkdf(ikm: bytes, *, salt: bytes, info: bytes, length: int = _KEY_BYTES) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


def _place(study_id: str, owner_id: str, idempotency_key: str, contract_hash: str) -> bytes:
    return b"".join(_frame(x.encode()) for x in (study_id, owner_id, idempotency_key, contract_hash))


def check_seal_public_key(value: str, what: str) -> str:
    """`value` if it is an X25519 public key as 64 lowercase hex digits; InvalidInputError naming `what` otherwise."""
    text = str(value).lower()
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise InvalidInputError(f"{what} must be an X25519 public key as 64 hex digits, got {str(value)[:80]!r}")
    return text


def seal_upload_key(signing_private: bytes, plain_digest: bytes, *, study_id: str, owner_id: str,
                    idempotency_key: str, contract_hash: str) -> bytes:
    """The owner's 32-byte upload key: HKDF of its signing key over the plain chunks' digest and the upload's place."""
    return _hkdf(bytes(signing_private), salt=bytes(plain_digest),
                 info=b"dpagg/seal-upload-key/v1" + _place(study_id, owner_id, idempotency_key, contract_hash))


def _aad(place: bytes, index: int) -> bytes:
    return b"dpagg/sealed-chunk/v1" + place + int(index).to_bytes(8, "big")


def seal_chunk(key: bytes, index: int, data: bytes, *, study_id: str, owner_id: str, idempotency_key: str,
               contract_hash: str) -> bytes:
    """AES-256-GCM of one chunk under the upload key (nonce: the chunk index; the upload's place authenticated)."""
    place = _place(study_id, owner_id, idempotency_key, contract_hash)
    return SEALED_MAGIC + AESGCM(key).encrypt(int(index).to_bytes(12, "big"), bytes(data), _aad(place, index))


def is_sealed(data: bytes) -> bool:
    """True for a chunk `seal_chunk` made (not yet opened)."""
    return bytes(data[:len(SEALED_MAGIC)]) == SEALED_MAGIC


def open_chunk(key: bytes, index: int, sealed: bytes, *, study_id: str, owner_id: str, idempotency_key: str,
               contract_hash: str) -> bytes:
    """The plain chunk of `seal_chunk`; InvalidInputError when it was not sealed under `key` at this place."""
    if not is_sealed(sealed):
        raise InvalidInputError(f"chunk {index} of owner {owner_id!r} is not a sealed chunk")
    place = _place(study_id, owner_id, idempotency_key, contract_hash)
    try:
        return AESGCM(key).decrypt(int(index).to_bytes(12, "big"), bytes(sealed[len(SEALED_MAGIC):]),
                                   _aad(place, index))
    except InvalidTag:
        raise InvalidInputError(f"chunk {index} of owner {owner_id!r} does not open under the upload key its "
                                "commitment released (altered, or sealed under another key)") from None


def _share_context(place: bytes, holder: int, holder_public: bytes, ephemeral_public: bytes) -> bytes:
    return (b"dpagg/seal-share/v1" + place + int(holder).to_bytes(4, "big") + _frame(holder_public)
            + _frame(ephemeral_public))


def _seal_with(eph: X25519PrivateKey, public: bytes, data: bytes, bind: Callable[[bytes], bytes]) -> bytes:
    """eph_public || AES-256-GCM(data) under HKDF(ECDH(eph, public), info = bind(eph_public)), the same bytes as
    associated data (one key per message, so the zero nonce is never reused)."""
    eph_public = eph.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    bound = bind(eph_public)
    wrap = _hkdf(eph.exchange(X25519PublicKey.from_public_bytes(public)), salt=b"", info=bound)
    return eph_public + AESGCM(wrap).encrypt(b"\0" * 12, data, bound)


def _open_with(private: X25519PrivateKey, blob: bytes, bind: Callable[[bytes], bytes]) -> bytes:
    """The data of a `_seal_with` blob (InvalidTag or ValueError when it was not made for this key and binding)."""
    eph_public = bytes(blob[:32])
    bound = bind(eph_public)
    wrap = _hkdf(private.exchange(X25519PublicKey.from_public_bytes(eph_public)), salt=b"", info=bound)
    return AESGCM(wrap).decrypt(b"\0" * 12, bytes(blob[32:]), bound)


def sealed_key_shares(key: bytes, holder_public_keys: Sequence[str], *, study_id: str, owner_id: str,
                      idempotency_key: str, contract_hash: str, threshold: int = 0) -> tuple[bytes, ...]:
    """Split `key` into len(holder_public_keys) shares, share j encrypted to holder j's X25519 key.

    `threshold` 0: XOR shares (every holder's share gives the key). Every share but the last is
    derived from `key` (HKDF), so the same key gives the same blobs (a resumed upload commits to
    the same bytes); K - 1 shares reveal nothing of it. `threshold` t (N/2 < t < N, the
    contract's `seal_threshold`): Shamir shares over GF(2^256 + 297) (`key_split.split_key`),
    the t - 1 coefficients derived from `key` with HKDF the same way; any t give the key, t - 1
    reveal nothing of it.
    """
    if not holder_public_keys:
        raise InvalidInputError("the contract pins no key holder seal keys: nothing to seal the upload key to")
    place = _place(study_id, owner_id, idempotency_key, contract_hash)
    k = len(holder_public_keys)
    if threshold:
        check_split_threshold(threshold, k)
        shares = split_key(key, threshold, k, lambda m: _hkdf(key, salt=b"", length=64, info=(
            b"dpagg/seal-share-coefficient/v1" + place + m.to_bytes(4, "big"))))
    else:
        shares = [_hkdf(key, salt=b"", info=b"dpagg/seal-share-value/v1" + place + j.to_bytes(4, "big"))
                  for j in range(k - 1)]
        last = bytearray(key)
        for s in shares:
            last = bytearray(a ^ b for a, b in zip(last, s))
        shares.append(bytes(last))
    out = []
    for j, (share, hex_key) in enumerate(zip(shares, holder_public_keys)):
        holder_public = bytes.fromhex(check_seal_public_key(hex_key, f"holder_seal_keys[{j}]"))
        eph = X25519PrivateKey.from_private_bytes(
            _hkdf(key, salt=b"", info=b"dpagg/seal-share-ephemeral/v1" + place + j.to_bytes(4, "big")))
        out.append(_seal_with(eph, holder_public, share, functools.partial(_share_context, place, j, holder_public)))
    return tuple(out)


def upload_key_from_shares(shares: Iterable[bytes]) -> bytes:
    """The upload key: the XOR of every holder's opened share."""
    key = bytearray(_KEY_BYTES)
    count = 0
    for s in shares:
        if len(s) != _KEY_BYTES:
            raise InvalidInputError(f"an upload key share has {len(s)} bytes, expected {_KEY_BYTES}")
        key = bytearray(a ^ b for a, b in zip(key, s))
        count += 1
    if not count:
        raise InvalidInputError("no upload key shares")
    return bytes(key)


def upload_key_from_threshold_shares(shares: Mapping[int, bytes], threshold: int) -> bytes:
    """The upload key of a t-of-N split from holder index -> opened share, at least t of them (`key_split.combine_key`:
    InvalidInputError for fewer, or for shares that do not lie on one polynomial)."""
    return combine_key(shares, threshold)


def share_bytes(threshold: int) -> int:
    """The length of one opened share: 32 (XOR, `threshold` 0) or 33 (a t-of-N share)."""
    return SHARE_BYTES if threshold else _KEY_BYTES


def sealed_share_bytes(threshold: int) -> int:
    """The length of one sealed share (`sealed_key_shares`): 80 (XOR, `threshold` 0) or 81 (a t-of-N share)."""
    return _SHAMIR_BLOB if threshold else _SHARE_BLOB


class SealKeyPair:
    """A key holder's X25519 key for the owners' upload-key shares; the private half never leaves its key store."""

    FILE = "seal_key.bin"

    def __init__(self, private: X25519PrivateKey) -> None:
        self._private = private
        self.public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @property
    def public_hex(self) -> str:
        return self.public.hex()

    @classmethod
    def load_or_create(cls, directory: Path | None) -> "SealKeyPair":
        """The key in `directory/seal_key.bin` (raw, created mode 0600 on first use); None: this process only."""
        if directory is None:
            return cls(X25519PrivateKey.generate())
        path = Path(directory) / cls.FILE
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            raw = X25519PrivateKey.generate().private_bytes(serialization.Encoding.Raw,
                                                            serialization.PrivateFormat.Raw,
                                                            serialization.NoEncryption())
            write_file_atomic(path, raw, mode=0o600)  # never readable by others, not even for a moment
        return cls(X25519PrivateKey.from_private_bytes(path.read_bytes()))

    def open(self, blob: bytes, context: bytes, what: str) -> bytes:
        """Open a `seal_to` blob made for this key and `context`; InvalidInputError naming `what` otherwise."""
        try:
            return _open_with(self._private, blob, lambda eph_public: _seal_to_binding(self.public, eph_public, context))
        except (InvalidTag, ValueError):
            raise InvalidInputError(f"{what} does not open with this holder's seal key (made for another holder or "
                                    "setup, or altered on the way)") from None

    def open_share(self, blob: bytes, holder: int, *, study_id: str, owner_id: str, idempotency_key: str,
                   contract_hash: str) -> bytes:
        """This holder's share of an owner's upload key; InvalidInputError when `blob` was not made for it."""
        return open_key_share(self._private, self.public, blob, holder, study_id=study_id, owner_id=owner_id,
                              idempotency_key=idempotency_key, contract_hash=contract_hash)


def seal_to(public: bytes, data: bytes, context: bytes) -> bytes:
    """`data` encrypted to the X25519 key `public` (a fresh ephemeral key, HKDF, AES-256-GCM), bound to `context`:
    ephemeral public key || ciphertext || tag. Only the private key's holder opens it (`SealKeyPair.open`)."""
    return _seal_with(X25519PrivateKey.generate(), public, data,
                      lambda eph_public: _seal_to_binding(public, eph_public, context))


def _seal_to_binding(public: bytes, ephemeral_public: bytes, context: bytes) -> bytes:
    return b"dpagg/seal-to/v1" + _frame(public) + _frame(ephemeral_public) + _frame(context)


def open_key_share(private: X25519PrivateKey, public: bytes, blob: bytes, holder: int, *, study_id: str,
                   owner_id: str, idempotency_key: str, contract_hash: str) -> bytes:
    """Decrypt one `sealed_key_shares` blob with holder `holder`'s private key (InvalidInputError otherwise)."""
    if len(blob) not in (_SHARE_BLOB, _SHAMIR_BLOB):
        raise InvalidInputError(f"owner {owner_id!r}'s upload key share for holder {holder} has {len(blob)} bytes, "
                                f"expected {_SHARE_BLOB} (XOR) or {_SHAMIR_BLOB} (t-of-N)")
    place = _place(study_id, owner_id, idempotency_key, contract_hash)
    try:
        return _open_with(private, blob, lambda eph_public: _share_context(place, holder, public, eph_public))
    except (InvalidTag, ValueError):
        raise InvalidInputError(f"owner {owner_id!r}'s upload key share does not open with holder {holder}'s seal "
                                "key (made for another holder, study or upload)") from None


def commitment_statement(study_id: str, owner_id: str, idempotency_key: str, contract_hash: str,
                         c1_parts_digest: bytes, key_shares: Sequence[bytes]) -> bytes:
    """The 32-byte digest an owner signs to commit to its upload: its c1 parts' digest and its sealed key shares."""
    h = hashlib.sha256(_frame(b"dpagg/upload-commitment/v1"))
    h.update(_place(study_id, owner_id, idempotency_key, contract_hash))
    h.update(_frame(bytes(c1_parts_digest)))
    h.update(len(key_shares).to_bytes(4, "big"))
    for s in key_shares:
        h.update(_frame(bytes(s)))
    return h.digest()


@dataclass(frozen=True)
class Commitment:
    """One owner's commitment to its upload, as the CS relays it to the key holders."""

    owner_id: str
    idempotency_key: str
    c1_parts_digest: bytes
    key_shares: tuple[bytes, ...]
    signature: bytes

    def statement(self, study_id: str, contract_hash: str) -> bytes:
        return commitment_statement(study_id, self.owner_id, self.idempotency_key, contract_hash,
                                    self.c1_parts_digest, self.key_shares)

    def verify(self, contract: Any, consequence: str = "") -> None:
        """Refuse (SignatureError, its message ending in `consequence`) a commitment the owner's key in `contract`
        (a StudyContract) did not sign."""
        from .signing import SignatureError, verify_submission

        key = contract.owner_public_key(self.owner_id)
        if key is None:
            raise SignatureError(f"owner {self.owner_id!r} has no key in study {contract.study_id}'s contract")
        try:
            verify_submission(key, self.statement(contract.study_id, contract.contract_hash), self.signature,
                              owner_id=self.owner_id)
        except SignatureError:
            raise SignatureError(f"owner {self.owner_id!r}'s commitment does not verify under the contract's key "
                                 f"for that owner{': ' + consequence if consequence else ''}") from None

    def to_json(self) -> dict[str, Any]:
        return {"owner_id": self.owner_id, "idempotency_key": self.idempotency_key,
                "c1_parts_digest": self.c1_parts_digest.hex(), "key_shares": [s.hex() for s in self.key_shares],
                "signature": self.signature.hex()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Commitment":
        return cls(str(d["owner_id"]), str(d["idempotency_key"]), bytes.fromhex(d["c1_parts_digest"]),
                   tuple(bytes.fromhex(x) for x in d["key_shares"]), bytes.fromhex(d["signature"]))

    def same(self, other: "Commitment") -> bool:
        return (self.owner_id == other.owner_id and self.idempotency_key == other.idempotency_key
                and hmac.compare_digest(self.c1_parts_digest, other.c1_parts_digest)
                and self.key_shares == other.key_shares and hmac.compare_digest(self.signature, other.signature))
