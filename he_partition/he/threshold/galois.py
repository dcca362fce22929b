"""Collective Galois keys for n-of-n threshold BFV: one round, linear in the secret.

A SEAL Galois key for element g is a key-switching key from s(X^g) to s: for each of the d data
primes q_j (the decomposition) a pair (b_{g,j}, a_{g,j}) at the key level in NTT form with
b_{g,j} = -(a_{g,j} s) + e_{g,j} + [P s(X^g)]_j, where [.]_j is the term only in RNS row j (P the
special prime). It is linear in s: if every holder i publishes b^i_{g,j} over the *same* a_{g,j},
sum_i b^i_{g,j} = -(a_{g,j} s) + sum_i e^i_{g,j} + [P s(X^g)]_j for s = sum_i s_i, a valid key for
the collective secret with K times one key's error (Mouchet et al., PETS 2021, section 4).

Holder i gets its b^i from SEAL's own `create_galois_keys` under s_i (a `KeyGenerator` loaded with
its secret) with SEAL's random a', re-randomized to the common a_{g,j} as the public-key share is:
b^i = b' + (a' - a) s_i. The common a_{g,j} comes from the setup seed through
`threshold.wire.common_polynomial` with its own domain tag per element and decomposition index
(`galois_tag`), so it is separated from the public key's a and from every other element's.
Commit-then-reveal as for p_i (`threshold.wire.key_share_commitment` over the share bytes, which
name the holder and the elements): no holder can pick its share after seeing the others'.

Adds no noise beyond SEAL's key error (e, centred binomial, per holder) and spends no budget.
"""
from __future__ import annotations

import struct
from typing import Any, Sequence

import numpy as np
import numpy.typing as npt
import tenseal as ts
import tenseal.sealapi as seal

from he_partition.core.errors import InvalidInputError
from he_partition.he.seal_io import seal_ciphertext_bytes
from he_partition.he.rns import mulmod
from he_partition.he.threshold.keys import (HolderSecret, key_moduli, load_seal, read_u64, seal_version,
                                            secret_plaintext_bytes)
from he_partition.he.threshold.wire import common_polynomial, verify_reveals

__all__ = ["galois_elements", "galois_tag", "holder_galois_share", "collective_galois_keys", "GaloisKeyShare"]

_MAGIC = b"DPTG1"


def galois_elements(ctx: ts.Context, steps: Sequence[int]) -> list[int]:
    """SEAL's Galois elements for row rotations by `steps` (0 = column swap, the element 2N - 1)."""
    tool = ctx.seal_context().data.key_context_data().galois_tool()
    n = _degree(ctx)
    return sorted({2 * n - 1 if int(s) == 0 else int(tool.get_elt_from_step(int(s))) for s in steps})


def galois_tag(element: int, index: int) -> bytes:
    """The `common_polynomial` domain tag of element `element`'s decomposition component `index`."""
    return b"galois/" + struct.pack(">II", element, index)


def _degree(ctx: ts.Context) -> int:
    return int(ctx.seal_context().data.key_context_data().parms().poly_modulus_degree())


def _check_elements(ctx: ts.Context, elements: Sequence[int]) -> list[int]:
    n = _degree(ctx)
    out = [int(e) for e in elements]
    if not out or len(set(out)) != len(out) or any(e % 2 == 0 or not 1 < e < 2 * n for e in out):
        raise InvalidInputError(f"Galois elements must be distinct odd integers in (1, {2 * n}), got {list(elements)}")
    return sorted(out)


def _secret_key(ctx: ts.Context, secret: HolderSecret) -> Any:
    """s_i as a SEAL SecretKey (a SecretKey saves as its NTT-form key-level Plaintext)."""
    parms_id = list(ctx.seal_context().data.key_parms_id())
    raw = secret_plaintext_bytes(ctx, secret, parms_id, len(key_moduli(ctx)))
    return load_seal(seal.SecretKey, ctx, raw, "holder secret key")


class GaloisKeyShare:
    """Holder `holder`'s Galois key shares b^i_{g,j}: shape (elements, d, k, N), NTT form, key level."""

    def __init__(self, holder: int, elements: Sequence[int], b: npt.NDArray[np.uint64]) -> None:
        self.holder, self.elements, self.b = int(holder), [int(e) for e in elements], b

    def to_bytes(self) -> bytes:
        e, d, k, n = self.b.shape
        return (_MAGIC + struct.pack(">BIIII", self.holder, e, d, k, n) + struct.pack(f">{e}I", *self.elements)
                + np.ascontiguousarray(self.b, dtype="<u8").tobytes())

    @classmethod
    def from_bytes(cls, ctx: ts.Context, data: bytes, elements: Sequence[int]) -> "GaloisKeyShare":
        """Parse and check a share against the agreed `elements` and the key level's shape; InvalidInputError if not."""
        moduli, n = key_moduli(ctx), _degree(ctx)
        want = (len(elements), len(moduli) - 1, len(moduli), n)
        head = len(_MAGIC) + 17
        if not isinstance(data, (bytes, bytearray)) or len(data) < head or not bytes(data).startswith(_MAGIC):
            raise InvalidInputError("not a Galois key share (wrong magic bytes or too short)")
        holder, *shape = struct.unpack(">BIIII", data[len(_MAGIC):head])
        count = min(shape[0], max(0, (len(data) - head) // 4))
        got = list(struct.unpack(f">{count}I", data[head:head + 4 * count]))
        if got != list(elements):
            raise InvalidInputError(f"Galois key share of holder {holder} is for elements {got}, "
                                    f"not the agreed {list(elements)}")
        if tuple(shape) != want:
            raise InvalidInputError(f"Galois key share of holder {holder} has shape {tuple(shape)}, expected {want}")
        body = head + 4 * want[0]
        if len(data) != body + 8 * int(np.prod(want)):
            raise InvalidInputError(f"Galois key share of holder {holder} has {len(data)} bytes, "
                                    f"expected {body + 8 * int(np.prod(want))}")
        b = np.frombuffer(bytes(data), dtype="<u8", offset=body).reshape(want).astype(np.uint64)
        if any(int(b[:, :, j].max()) >= q for j, q in enumerate(moduli)):
            raise InvalidInputError(f"Galois key share of holder {holder} has a coefficient not reduced modulo its prime")
        return cls(holder, got, b)


def _common(seed: bytes, moduli: list[int], n: int, element: int, index: int) -> npt.NDArray[np.uint64]:
    return np.array(common_polynomial(seed, moduli, n, tag=galois_tag(element, index)), dtype=np.uint64)


def holder_galois_share(ctx: ts.Context, secret: HolderSecret, seed: bytes, elements: Sequence[int]) -> bytes:
    """Holder `secret.holder`'s Galois key share bytes for `elements` over the common a_{g,j} of `seed`.

    Publish `key_share_commitment(holder, seed, share)` first and the share only once every
    holder's commitment is in (as for p_i). The error e comes from SEAL's KeyGenerator (its CSPRNG).
    """
    elements = _check_elements(ctx, elements)
    moduli, n = key_moduli(ctx), _degree(ctx)
    k, d = len(moduli), len(moduli) - 1
    sealctx = ctx.seal_context().data
    sk = _secret_key(ctx, secret)
    gen = seal.KeyGenerator(sealctx, sk)
    keys = seal.GaloisKeys()
    gen.create_galois_keys(elements, keys)
    out = np.empty((len(elements), d, k, n), dtype=np.uint64)
    for e_idx, element in enumerate(elements):
        components = keys.key(element)
        if len(components) != d:
            raise InvalidInputError(f"SEAL made {len(components)} key-switching components for element {element}, "
                                    f"expected {d}")
        for j, pk in enumerate(components):
            ct = pk.data()
            polys = read_u64(ct.dyn_array(), 2 * k * n).reshape(2, k, n)
            a = _common(seed, moduli, n, element, j)
            for r, q in enumerate(moduli):
                diff = (polys[1, r] + np.uint64(q) - a[r]) % np.uint64(q)  # a' - a
                out[e_idx, j, r] = (polys[0, r] + mulmod(diff, secret.s_ntt[r], q)) % np.uint64(q)
    return GaloisKeyShare(secret.holder, elements, out).to_bytes()


def collective_galois_keys(ctx: ts.Context, seed: bytes, elements: Sequence[int], commitments: dict[int, bytes],
                           reveals: dict[int, bytes]) -> bytes:
    """SEAL GaloisKeys bytes (uncompressed) of sum_i b^i_{g,j} over the common a_{g,j}, after the reveal checks.

    Refuses (InvalidInputError, naming the holder) a missing, uncommitted or rogue share (one not
    matching its commitment), one naming another holder or other elements, or of the wrong shape.
    """
    verify_reveals(seed, commitments, reveals)
    elements = _check_elements(ctx, elements)
    moduli, n = key_moduli(ctx), _degree(ctx)
    qs = np.array(moduli, dtype=np.uint64)[:, None]
    total: npt.NDArray[np.uint64] | None = None
    for holder in sorted(reveals):
        share = GaloisKeyShare.from_bytes(ctx, reveals[holder], elements)
        if share.holder != holder:
            raise InvalidInputError(f"Galois key share revealed as holder {holder} names holder {share.holder}")
        total = share.b.copy() if total is None else (total + share.b) % qs  # both < q < 2^61
    assert total is not None
    version = seal_version(ctx)
    parms_id = list(ctx.seal_context().data.key_parms_id())
    by_index = {(e - 1) >> 1: i for i, e in enumerate(elements)}
    body = struct.pack("<4Q", *parms_id) + struct.pack("<Q", n)  # SEAL keeps one slot per index (g - 1) / 2 < N
    parts = [body]
    for index in range(n):
        if index not in by_index:
            parts.append(struct.pack("<Q", 0))
            continue
        e_idx = by_index[index]
        element = elements[e_idx]
        parts.append(struct.pack("<Q", len(moduli) - 1))
        for j in range(len(moduli) - 1):
            polys = np.stack([total[e_idx, j], _common(seed, moduli, n, element, j)])
            parts.append(seal_ciphertext_bytes(version, parms_id, polys, ntt=True))
    payload = b"".join(parts)
    raw = b"\x5e\xa1" + version + b"\x00\x00\x00" + struct.pack("<Q", 16 + len(payload)) + payload
    load_seal(seal.GaloisKeys, ctx, raw, "collective Galois keys")  # SEAL validates it before anyone uses it
    return raw
