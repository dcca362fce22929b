"""Wire format, commitments and exact samplers of n-of-n threshold BFV, no SEAL arithmetic.

This is the SEAL-independent part of the threshold core (Mouchet, Troncoso-Pastoriza, Bossuat,
Hubaux, PETS 2021): the common random polynomial `a` from an agreed seed, the commit-then-reveal
step of collective key generation, the exact smudging sampler of decryption shares, and the
binding of each decryption share to hash(ciphertext) and its holder id, with the checks a combiner
runs before it adds any share. Everything is bytes in, bytes out; a malformed byte string raises
`InvalidInputError` naming what is wrong. The RLWE arithmetic (p_i = -(a s_i) + e_i, h_i = c1 s_i + e)
on SEAL objects is in `threshold.keys` and `threshold.decrypt`.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from he_partition.core.errors import InvalidInputError, ShareCombineError
from he_partition.core.noise import RandomSource

#: Default smudging width: e_smudge uniform on [-2^B, 2^B) per coefficient.
SMUDGING_BITS = 70
_SHARE_MAGIC = b"DPTS1"
_COMMIT_DOMAIN = b"dpagg/threshold/pk-commit/v1"
_A_DOMAIN = b"dpagg/threshold/common-a/v1"
_MAX_HOLDER_ID = 255


def common_polynomial(seed: bytes, moduli: Sequence[int], degree: int, *, tag: bytes = b"pk") -> list[list[int]]:
    """The common random polynomial `a` (RNS, one row per prime), uniform mod each prime.

    Expanded from `seed` with SHAKE-256 (domain-separated by `tag`, e.g. b"pk" or a Galois
    element), by rejection sampling: each coefficient draws ceil(bits(q)/8) bytes, masked to
    bits(q) bits, kept when < q, so it is exactly uniform mod q. The values are read as the NTT
    form of `a` (a uniform polynomial is uniform in either form). Every holder derives the same `a`.
    """
    if len(seed) < 16:
        raise InvalidInputError(f"the common seed must have at least 16 bytes, got {len(seed)}")
    if degree <= 0 or not moduli:
        raise InvalidInputError("common_polynomial needs a positive degree and at least one prime")
    rows: list[list[int]] = []
    for j, q in enumerate(moduli):
        bits = int(q).bit_length()
        width = (bits + 7) // 8
        mask = (1 << bits) - 1
        xof = hashlib.shake_256(_A_DOMAIN + struct.pack(">HI", len(tag), j) + tag + seed)
        row: list[int] = []
        need, chunk = degree, width * degree * 2
        stream, pos = xof.digest(chunk), 0
        while len(row) < need:
            if pos + width > len(stream):
                chunk *= 2
                stream = xof.digest(chunk)  # SHAKE is a prefix-stable XOF: earlier bytes unchanged
            v = int.from_bytes(stream[pos:pos + width], "little") & mask
            pos += width
            if v < q:
                row.append(v)
        rows.append(row)
    return rows


def _check_holder(holder: int) -> None:
    if not isinstance(holder, int) or not 0 <= holder <= _MAX_HOLDER_ID:
        raise InvalidInputError(f"holder id must be an integer in [0, {_MAX_HOLDER_ID}], got {holder!r}")


def key_share_commitment(holder: int, seed: bytes, key_share: bytes) -> bytes:
    """SHA-256 commitment to a public-key share p_i, bound to the holder id and the common seed.

    Every holder publishes this before any p_i is revealed, so no holder (in particular the last
    one to reveal) can choose its p_i as a function of the others' and so steer the joint key.
    """
    _check_holder(holder)
    return hashlib.sha256(_COMMIT_DOMAIN + bytes([holder]) + struct.pack(">I", len(seed)) + seed
                          + key_share).digest()


def verify_reveals(seed: bytes, commitments: dict[int, bytes], reveals: dict[int, bytes]) -> None:
    """Refuse a reveal round whose holders or key shares do not match the commitments.

    Raises `InvalidInputError` naming the first holder that is missing, unexpected, or whose
    revealed key share does not hash to its commitment (a rogue or substituted share).
    """
    if len(commitments) < 2:
        raise InvalidInputError(f"n-of-n key generation needs at least 2 holders, got {len(commitments)}")
    missing = sorted(set(commitments) - set(reveals))
    if missing:
        raise InvalidInputError(f"key share of holder {missing[0]} was committed but not revealed")
    extra = sorted(set(reveals) - set(commitments))
    if extra:
        raise InvalidInputError(f"key share of holder {extra[0]} was revealed without a commitment")
    for holder in sorted(commitments):
        if not hmac.compare_digest(key_share_commitment(holder, seed, reveals[holder]), commitments[holder]):
            raise InvalidInputError(f"key share of holder {holder} does not match its commitment")


def smudging_noise(count: int, bits: int = SMUDGING_BITS) -> list[int]:
    """`count` integers, each exactly uniform on [-2^bits, 2^bits), from the OS CSPRNG.

    Not DP noise: this is the smudging term e_smudge of a decryption share h_i = c1 s_i + e_smudge,
    known only to the holder that draws it. Exact: `smudging_words` (bits <= 123), or bits + 1 bits
    cut from ceil((bits + 1) / 8) CSPRNG bytes, are uniform on [0, 2^(bits+1)), shifted by -2^bits.
    Statistical-distance bound per ciphertext: if the
    data-dependent part of a share's phase has |v| <= 2^b per coefficient, the share with and
    without v differ by at most N * 2^b / 2^(bits+1) in total variation (N coefficients); with
    N = 8192, b = 17.6 (measured for a sum of 10 owners) and bits = 70 that is 2^(13 + 17.6 - 71) ~ 2^-40.4.
    """
    if count < 0 or not 1 <= bits <= 200:
        raise InvalidInputError(f"smudging needs count >= 0 and bits in [1, 200], got {count}, {bits}")
    if bits <= MAX_WORD_SMUDGING_BITS:  # the decryption share's own sampler, as integers
        hi, lo = smudging_words(count, bits)
        return [(int(h) << 62) + int(x) - (1 << bits) for h, x in zip(hi.tolist(), lo.tolist())]
    half, width = 1 << bits, (bits + 8) // 8  # whole bytes holding bits + 1 bits
    mask = (1 << (bits + 1)) - 1
    pool = secrets.token_bytes(width * count)  # one CSPRNG call, not one per value (the share's speed path)
    return [(int.from_bytes(pool[i:i + width], "little") & mask) - half for i in range(0, width * count, width)]


#: Widest smudging the word form carries: hi 2^62 + lo with hi, lo < 2^62.
MAX_WORD_SMUDGING_BITS = 123


def smudging_words(count: int, bits: int = SMUDGING_BITS,
                   rng: RandomSource | None = None) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """`count` smudging values e, exactly uniform on [-2^bits, 2^bits), as words: e + 2^bits = hi 2^62 + lo.

    Not DP noise: the smudging term of a decryption share (see `smudging_noise`), in a form
    the share's RNS arithmetic takes without Python integers (`he.rns.residues`). Each value
    takes two 62-bit words: lo = the first (all 62 bits, or the top bits + 1 of it when
    bits + 1 <= 62) and hi = the low bits + 1 - 62 bits of the second, so hi 2^62 + lo is exactly
    uniform on [0, 2^(bits+1)). From `rng` (a holder's keyed source: the holder alone can
    reproduce it, so a repeated request gets the identical share) or, without one, from the OS
    CSPRNG (one call for all values); either way known only to the holder that draws it. Same
    statistical-distance bound as `smudging_noise` (2^-40.4 per ciphertext at bits = 70).
    """
    if count < 0 or not 1 <= bits <= MAX_WORD_SMUDGING_BITS:
        raise InvalidInputError(f"smudging words need count >= 0 and bits in [1, {MAX_WORD_SMUDGING_BITS}], "
                                f"got {count}, {bits}")
    if rng is None:
        words = (np.frombuffer(secrets.token_bytes(16 * count), dtype="<u8").reshape(count, 2)
                 >> np.uint64(2)).astype(np.uint64)
    else:
        words = np.asarray(rng.integers(1 << 62, 2 * count), dtype=np.int64).reshape(count, 2).astype(np.uint64)
    if bits + 1 <= 62:
        return np.zeros(count, dtype=np.uint64), words[:, 0] >> np.uint64(62 - (bits + 1))
    return words[:, 1] & np.uint64((1 << (bits + 1 - 62)) - 1), words[:, 0]


def keyed_smudging_noise(count: int, bits: int, rng: RandomSource) -> list[int]:
    """`smudging_words(count, bits, rng)` as Python integers on [-2^bits, 2^bits) (for tests and audits).

    Not DP noise: a decryption share's smudging, reproducible only by the holder that owns
    `rng`'s key; see `smudging_words` for exactness and the statistical-distance bound.
    """
    hi, lo = smudging_words(count, bits, rng)
    half = 1 << bits
    return [(int(h) << 62) + int(x) - half for h, x in zip(hi.tolist(), lo.tolist())]


def ciphertext_digest(ciphertext: bytes) -> bytes:
    """SHA-256 of a serialized ciphertext: the identity a decryption share is bound to."""
    return hashlib.sha256(b"dpagg/threshold/ct/v1" + ciphertext).digest()


@dataclass(frozen=True)
class DecryptionShare:
    """One holder's decryption share of one ciphertext, bound to hash(ciphertext) and holder id."""

    holder: int
    key_fingerprint: bytes  # 32 bytes: fingerprint of the collective public key
    ciphertext_digest: bytes  # 32 bytes
    payload: bytes  # the serialized h_i

    def to_bytes(self) -> bytes:
        _check_holder(self.holder)
        if len(self.key_fingerprint) != 32 or len(self.ciphertext_digest) != 32:
            raise InvalidInputError("a decryption share needs 32-byte key fingerprint and ciphertext digest")
        return (_SHARE_MAGIC + bytes([self.holder]) + self.key_fingerprint + self.ciphertext_digest
                + struct.pack(">Q", len(self.payload)) + self.payload)

    @classmethod
    def from_bytes(cls, data: bytes) -> "DecryptionShare":
        head = len(_SHARE_MAGIC) + 1 + 32 + 32 + 8
        if not isinstance(data, (bytes, bytearray)) or len(data) < head:
            raise InvalidInputError(f"a decryption share needs at least {head} bytes, got "
                                    f"{len(data) if isinstance(data, (bytes, bytearray)) else type(data).__name__}")
        data = bytes(data)
        if not data.startswith(_SHARE_MAGIC):
            raise InvalidInputError("not a decryption share (wrong magic bytes)")
        p = len(_SHARE_MAGIC)
        holder = data[p]
        fp, digest = data[p + 1:p + 33], data[p + 33:p + 65]
        (length,) = struct.unpack(">Q", data[p + 65:head])
        if length != len(data) - head:
            raise InvalidInputError(f"decryption share payload length says {length} bytes, has {len(data) - head}")
        return cls(holder, fp, digest, data[head:])


def check_shares(shares: Iterable[DecryptionShare], holders: Sequence[int], key_fingerprint: bytes,
                 ciphertext: bytes | None = None, *, bound: bytes | None = None) -> list[DecryptionShare]:
    """The shares to combine, one per holder in `holders` order, or `ShareCombineError` (an InvalidInputError) naming why not.

    Refused: a share for another ciphertext (its digest is not `ciphertext_digest(ciphertext)`,
    or not `bound` for shares bound to a chunk's c1, `threshold.c1.c1_digest`), under another
    collective key, from a holder outside the set (foreign), a second share from one holder
    (duplicate), or a holder without a share (missing). n-of-n: every holder's share is needed.
    """
    if (ciphertext is None) == (bound is None):
        raise InvalidInputError("check_shares needs the ciphertext or the digest its shares are bound to, not both")
    digest = ciphertext_digest(ciphertext) if ciphertext is not None else bytes(bound or b"")
    expected = set(holders)
    if len(expected) != len(holders) or len(expected) < 2:
        raise ShareCombineError(f"holders must be >= 2 distinct ids, got {list(holders)}")
    seen: dict[int, DecryptionShare] = {}
    for share in shares:
        if share.holder not in expected:
            raise ShareCombineError(f"decryption share from foreign holder {share.holder}")
        if share.holder in seen:
            raise ShareCombineError(f"duplicate decryption share from holder {share.holder}")
        if not hmac.compare_digest(share.key_fingerprint, key_fingerprint):
            raise ShareCombineError(f"decryption share of holder {share.holder} is under another collective key")
        if not hmac.compare_digest(share.ciphertext_digest, digest):
            raise ShareCombineError(f"decryption share of holder {share.holder} is for another ciphertext")
        seen[share.holder] = share
    missing = [h for h in holders if h not in seen]
    if missing:
        raise ShareCombineError(f"missing decryption share from holder {missing[0]}")
    return [seen[h] for h in holders]
