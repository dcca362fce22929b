"""n-of-n collective BFV key generation (Mouchet et al., PETS 2021) on SEAL's bindings, bytes in and out.

Holder i keeps s_i (its SEAL secret key, NTT form at the key level) and publishes
p_i = -(a s_i) + e_i over the common polynomial `a` (`threshold.wire.common_polynomial`): SEAL's
own `create_public_key` gives (-(a' s_i) + e_i, a') under a random a'; adding (a' - a) s_i
re-randomizes it to the common a (the route SEAL's bindings allow: a key-level ciphertext cannot
be loaded, a key-level PublicKey can). The holders commit to their p_i before revealing
(`threshold.wire.key_share_commitment` / `verify_reveals`); sum p_i with `a` is the collective
SEAL PublicKey, under which ciphertexts decrypt with sum s_i (in [-K, K]: fresh budget ~102 bits
for K = 3). Collective Galois keys: `threshold.galois`.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import tenseal as ts
import tenseal.sealapi as seal

from he_partition.core.errors import InvalidInputError
from he_partition.he.seal_io import seal_ciphertext_bytes
from he_partition.he.seal_io import load_seal_bytes, seal_bytes, seal_version as seal_io_version
from he_partition.he.threshold.wire import common_polynomial, verify_reveals

_SECRET_MAGIC = b"DPTK1"
_SHARE_MAGIC = b"DPTP1"


def seal_version(ctx: ts.Context) -> bytes:
    """SEAL's header bytes (header size, major, minor) as this TenSEAL build writes them (`seal_io.seal_version`:
    a property of the linked SEAL library, not of `ctx`; probed once per process and cached)."""
    return seal_io_version()


def key_moduli(ctx: ts.Context) -> list[int]:
    return [int(m.value()) for m in ctx.seal_context().data.key_context_data().parms().coeff_modulus()]


def _degree(ctx: ts.Context) -> int:
    return int(ctx.seal_context().data.key_context_data().parms().poly_modulus_degree())


def load_seal(factory: Any, ctx: ts.Context, data: bytes, what: str) -> Any:
    """A SEAL object loaded from bytes under `ctx`'s parameters (he_partition.he.seal_io)."""
    try:
        return load_seal_bytes(factory(), ctx.seal_context().data, data)
    except (RuntimeError, ValueError) as exc:
        raise InvalidInputError(f"not a valid {what} for these BFV parameters: {exc}") from exc


def secret_plaintext(ctx: ts.Context, secret: "HolderSecret", parms_id: list[int], k: int) -> Any:
    """s_i as a SEAL NTT-form Plaintext at a level with k primes (the key level's first k NTT tables).

    SEAL's Plaintext serialization: header, parms_id, coefficient count, scale, then the
    coefficient DynArray (its own header, size, uncompressed uint64 values). `multiply_plain`
    by it gives c s_i mod q exactly, inside SEAL, so the share reads one polynomial.
    """
    return load_seal(seal.Plaintext, ctx, secret_plaintext_bytes(ctx, secret, parms_id, k), "holder secret plaintext")


def secret_plaintext_bytes(ctx: ts.Context, secret: "HolderSecret", parms_id: list[int], k: int) -> bytes:
    """SEAL bytes of s_i as an NTT-form Plaintext with k primes (also the bytes of a SEAL SecretKey at the key level)."""
    version = seal_version(ctx)

    def header(size: int) -> bytes:
        return b"\x5e\xa1" + version + b"\x00\x00\x00" + struct.pack("<Q", size)

    arr = np.ascontiguousarray(secret.s_ntt[:k], dtype="<u8")
    data = arr.tobytes()
    dyn = header(16 + 8 + len(data)) + struct.pack("<Q", arr.size) + data
    body = struct.pack("<4Q", *parms_id) + struct.pack("<Qd", arr.size, 1.0) + dyn
    return header(16 + len(body)) + body


def pack_residues(magic: bytes, holder: int, arr: npt.NDArray[np.uint64]) -> bytes:
    """`magic`, the holder id and the shape, then the (k, N) residues little-endian: a holder secret or key share."""
    return magic + struct.pack(">BII", holder, arr.shape[0], arr.shape[1]) + arr.astype("<u8").tobytes()


def unpack_residues(magic: bytes, data: bytes, what: str, moduli: list[int],
                    degree: int) -> tuple[int, npt.NDArray[np.uint64]]:
    """(holder id, residues) of `pack_residues` bytes, checked: magic, shape, size, every value reduced mod its prime."""
    head = len(magic) + 9
    if not isinstance(data, (bytes, bytearray)) or len(data) < head or not bytes(data).startswith(magic):
        raise InvalidInputError(f"not a {what} (wrong magic bytes or too short)")
    holder, k, n = struct.unpack(">BII", data[len(magic):head])
    if (k, n) != (len(moduli), degree) or len(data) != head + 8 * k * n:
        raise InvalidInputError(f"{what} has shape ({k}, {n}) and {len(data)} bytes, expected "
                                f"({len(moduli)}, {degree}) and {head + 8 * len(moduli) * degree}")
    arr = np.frombuffer(bytes(data), dtype="<u8", offset=head).reshape(k, n).astype(np.uint64)
    if any(int(arr[j].max()) >= q for j, q in enumerate(moduli)):
        raise InvalidInputError(f"{what} has a coefficient not reduced modulo its prime")
    return holder, arr


@dataclass(frozen=True)
class HolderSecret:
    """Holder `holder`'s secret s_i: NTT-form residues at the key level (shape (k, N)). Never leaves the holder."""

    holder: int
    s_ntt: npt.NDArray[np.uint64]

    def to_bytes(self) -> bytes:
        return pack_residues(_SECRET_MAGIC, self.holder, self.s_ntt)

    @classmethod
    def from_bytes(cls, ctx: ts.Context, data: bytes) -> "HolderSecret":
        holder, arr = unpack_residues(_SECRET_MAGIC, data, "holder secret", key_moduli(ctx), _degree(ctx))
        return cls(holder, arr)


def _read(dyn: Any, count: int) -> npt.NDArray[np.object_]:
    return np.array([dyn[i] for i in range(count)], dtype=object)


def read_u64(dyn: Any, count: int, start: int = 0) -> npt.NDArray[np.uint64]:
    """`count` values of a SEAL DynArray from index `start`, as uint64 (the bindings read one element per call)."""
    get = dyn.__getitem__
    return np.fromiter(map(get, range(start, start + count)), dtype=np.uint64, count=count)


def holder_keygen(ctx: ts.Context, seed: bytes, holder: int) -> tuple[HolderSecret, bytes]:
    """(s_i, p_i bytes) for holder `holder`: p_i = -(a s_i) + e_i at the key level, NTT form.

    s_i and e_i come from SEAL's KeyGenerator (its CSPRNG); `a` from `seed`. Publish
    `key_share_commitment(holder, seed, p_i)` first, p_i only after every commitment is in.
    """
    moduli, n = key_moduli(ctx), _degree(ctx)
    k = len(moduli)
    q = np.array(moduli, dtype=object)[:, None]
    a = np.array(common_polynomial(seed, moduli, n), dtype=object)
    gen = seal.KeyGenerator(ctx.seal_context().data)
    pk = seal.PublicKey()
    gen.create_public_key(pk)
    secret_key = gen.secret_key()  # keep the object alive: the array view below reads its memory
    plain = secret_key.data()
    s = _read(plain.dyn_array(), k * n).reshape(k, n)
    pk_ct = pk.data()
    p = _read(pk_ct.dyn_array(), 2 * k * n).reshape(2, k, n)
    b = (p[0] + ((p[1] - a) % q) * s) % q
    return HolderSecret(holder, s.astype(np.uint64)), pack_residues(_SHARE_MAGIC, holder, b.astype(np.uint64))


def collective_public_key(ctx: ts.Context, seed: bytes, commitments: dict[int, bytes],
                          reveals: dict[int, bytes]) -> bytes:
    """SEAL PublicKey bytes of (sum p_i, a), after checking every reveal against its commitment.

    Refuses (InvalidInputError) a missing, uncommitted or rogue key share, or one whose
    embedded holder id differs from the id it was revealed under.
    """
    verify_reveals(seed, commitments, reveals)
    moduli, n = key_moduli(ctx), _degree(ctx)
    q = np.array(moduli, dtype=object)[:, None]
    total = np.zeros((len(moduli), n), dtype=object)
    for holder in sorted(reveals):
        embedded, b = unpack_residues(_SHARE_MAGIC, reveals[holder], f"key share of holder {holder}", moduli, n)
        if embedded != holder:
            raise InvalidInputError(f"key share revealed as holder {holder} names holder {embedded}")
        total = (total + b.astype(object)) % q
    a = np.array(common_polynomial(seed, moduli, n), dtype=object)
    polys = np.stack([total, a]).astype(np.uint64)
    raw = seal_ciphertext_bytes(seal_version(ctx), list(ctx.seal_context().data.key_parms_id()), polys, ntt=True)
    load_seal(seal.PublicKey, ctx, raw, "collective public key")  # SEAL validates it before anyone uses it
    return raw


def key_fingerprint(public_key: bytes) -> bytes:
    """32-byte fingerprint of a collective public key (its canonical uncompressed SEAL bytes)."""
    return hashlib.sha256(b"dpagg/collective-key/v1" + public_key).digest()


def encrypt_sum(ctx: ts.Context, public_key: bytes, rows: list[list[int]]) -> bytes:
    """SEAL bytes of the sum of one fresh encryption per row (batched slots) under `public_key`.

    What owners (each encrypting its row) and the CS (summing) produce, in one call, through SEAL
    directly (owners using TenSEAL take `threshold.context.collective_context` instead).
    """
    if not rows:
        raise InvalidInputError("encrypt_sum needs at least one row")
    sealctx = ctx.seal_context().data
    encryptor = seal.Encryptor(sealctx, load_seal(seal.PublicKey, ctx, public_key, "collective public key"))
    encoder, evaluator = seal.BatchEncoder(sealctx), seal.Evaluator(sealctx)
    total = seal.Ciphertext()
    for i, row in enumerate(rows):
        plain, ct = seal.Plaintext(), seal.Ciphertext()
        encoder.encode(list(row), plain)
        encryptor.encrypt(plain, ct if i else total)
        if i:
            evaluator.add_inplace(total, ct)
    return seal_bytes(total)
