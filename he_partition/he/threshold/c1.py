"""The c1 part of BFV ciphertexts, for the key-share holders' check against a chosen ciphertext.

A holder's share is c1 s_i + noise: whoever picks c1 picks what the share reveals about s_i
(with c1 = floor(Delta / 3) one share gives the whole s_i: tests/he_partition/threshold_attacker.py).
An honest measurement ciphertext has the c1 of the owners' aggregate, chunk by chunk: the
computation server adds its DP noise, pads and flood to c0 only (`BfvBackend.noise_in_c0`), and
no measurement applies any other map to the ciphertext (the maps are on the slot noise, and the
decode runs after decryption). So a holder that knows the owners' signed c1 parts can recompute
the expected c1 of every chunk it is asked to decrypt and refuse any other (`check_c1`).

The parts are residues mod each prime of the ciphertext's level, coefficient form, as SEAL
stores them: `c1_bytes` is a canonical encoding (little-endian u64, prime-major) so that an
owner's signature over them (`c1_stream_digest`) and the holder's sum agree bit for bit.
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

import numpy as np
import numpy.typing as npt
import tenseal as ts

from he_partition.core.errors import InvalidInputError
from he_partition.he.seal_io import ciphertext_polys
from he_partition.he.threshold.context import vector_ciphertext

__all__ = ["C1_MISMATCH", "C1Part", "c1_of_vector", "c1_digest", "ciphertext_parts", "level_moduli", "c1_bytes", "c1_from_bytes", "c1_stream_digest",
           "aggregate_c1", "ciphertext_c1", "check_c1"]

#: The words every refusal of a chosen c1 carries (a holder's error text names them).
C1_MISMATCH = "c1 does not match the owners' signed uploads"

C1Part = npt.NDArray[np.uint64]  # shape (k, N): residues of c1 mod each prime of the ciphertext's level

_TAG = b"dpagg/c1-stream/v1"
_DIGEST_TAG = b"dpagg/c1-part/v1"


def level_moduli(ctx: ts.Context, parms_id: Sequence[int]) -> list[int]:
    """The primes of the level `parms_id` names; InvalidInputError when it is no level of `ctx`'s parameters."""
    level = ctx.seal_context().data.get_context_data(list(parms_id))
    if level is None:
        raise InvalidInputError("the ciphertext is at no level of these BFV parameters")
    return [int(m.value()) for m in level.parms().coeff_modulus()]


def ciphertext_parts(ctx: ts.Context, raw: bytes) -> tuple[list[int], list[int], npt.NDArray[np.uint64]]:
    """(parms_id, the level's primes, (c0, c1) of shape (2, k, N)) of 2-part coefficient-form SEAL ciphertext bytes.

    Parsed with numpy (`seal_io.ciphertext_polys`), then checked as SEAL's load checks: a level
    of these parameters, its prime count and degree, every residue reduced. InvalidInputError otherwise.
    """
    try:
        parms_id, ntt, polys = ciphertext_polys(raw)
    except InvalidInputError as exc:
        raise InvalidInputError(f"not a valid ciphertext for these BFV parameters: {exc}") from None
    if polys.shape[0] != 2 or ntt:
        raise InvalidInputError(f"expected a 2-part coefficient-form ciphertext, got {polys.shape[0]} parts"
                                f"{' in NTT form' if ntt else ''}")
    moduli = level_moduli(ctx, parms_id)
    n = int(ctx.seal_context().data.first_context_data().parms().poly_modulus_degree())
    if polys.shape[1:] != (len(moduli), n):
        raise InvalidInputError(f"the ciphertext has {polys.shape[1]} primes x {polys.shape[2]} coefficients, its "
                                f"level has {len(moduli)} x {n}")
    if bool((polys >= np.array(moduli, dtype=np.uint64)[None, :, None]).any()):
        raise InvalidInputError("the ciphertext's coefficients are not reduced modulo its primes")
    return list(parms_id), moduli, polys


def ciphertext_c1(ctx: ts.Context, raw: bytes) -> C1Part:
    """c1 of a 2-part coefficient-form SEAL ciphertext (bytes), shape (k, N); InvalidInputError otherwise."""
    c1: C1Part = ciphertext_parts(ctx, raw)[2][1]
    return c1


def c1_of_vector(ctx: ts.Context, vector_bytes: bytes) -> C1Part:
    """c1 of one serialized TenSEAL BFV vector (an owner's upload chunk or a measurement chunk)."""
    return ciphertext_c1(ctx, vector_ciphertext(vector_bytes))


def c1_bytes(part: C1Part) -> bytes:
    """Canonical bytes of one c1 part: little-endian u64 residues, prime-major."""
    return np.ascontiguousarray(part, dtype="<u8").tobytes()


def c1_from_bytes(data: bytes, moduli: Sequence[int], n: int) -> C1Part:
    """Parse `c1_bytes` output for a level with `moduli` and degree `n`; refuse wrong sizes or unreduced residues."""
    k = len(moduli)
    if len(data) != 8 * k * n:
        raise InvalidInputError(f"a c1 part has {len(data)} bytes, expected {8 * k * n} ({k} primes x {n} "
                                "coefficients x 8 bytes)")
    part = np.frombuffer(data, dtype="<u8").reshape(k, n).astype(np.uint64, copy=False)
    if any(int(part[j].max()) >= q for j, q in enumerate(moduli)):
        raise InvalidInputError("a c1 part is not reduced modulo its primes")
    return part


def c1_stream_digest(parts: Iterable[bytes]) -> bytes:
    """SHA-256 over an owner's c1 parts in chunk order (each length-prefixed; count and total at the end)."""
    h = hashlib.sha256(len(_TAG).to_bytes(8, "big") + _TAG)
    count = total = 0
    for p in parts:
        h.update(len(p).to_bytes(8, "big") + bytes(p))
        count, total = count + 1, total + len(p)
    h.update(b"end" + count.to_bytes(8, "big") + total.to_bytes(8, "big"))
    return h.digest()


def c1_digest(part: C1Part) -> bytes:
    """SHA-256 of one c1 part's canonical bytes: what a chunk's decryption shares are bound to."""
    return hashlib.sha256(_DIGEST_TAG + c1_bytes(part)).digest()


#: Parts added between two reductions: a reduced total (< q) and 6 parts (each < q < 2^61) stay below 2^64.
_SUM_BATCH = 6


def aggregate_c1(parts: Iterable[C1Part], moduli: Sequence[int]) -> C1Part:
    """The sum of c1 parts mod each prime: the c1 of the owners' aggregate (ciphertext addition adds c1).

    Reduced every `_SUM_BATCH` parts, not after each addition (the residues are below 2^61).
    """
    qs = np.array(moduli, dtype=np.uint64)[:, None]
    total: C1Part | None = None
    pending = 0
    for p in parts:
        if total is None:
            total = np.array(p, dtype=np.uint64)
        else:
            total += p
            pending += 1
            if pending == _SUM_BATCH:
                np.remainder(total, qs, out=total)
                pending = 0
    if total is None:
        raise InvalidInputError("no c1 parts to aggregate")
    np.remainder(total, qs, out=total)
    return total


def check_c1(ctx: ts.Context, raw: bytes, expected: C1Part, *, chunk: int) -> None:
    """Refuse (InvalidInputError naming C1_MISMATCH) a ciphertext whose c1 is not `expected`, bit for bit."""
    try:
        got = ciphertext_c1(ctx, raw)
    except InvalidInputError as exc:
        raise InvalidInputError(f"chunk {chunk}: {exc}; nothing was charged or decrypted") from None
    if got.shape != expected.shape or not np.array_equal(got, expected):
        raise InvalidInputError(f"chunk {chunk}: {C1_MISMATCH} (a ciphertext the owners did not make, or noise "
                                "added outside c0): nothing was charged or decrypted")
