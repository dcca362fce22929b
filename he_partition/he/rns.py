"""Vectorized exact arithmetic on RNS residues (uint64, primes below 2^62) without Python integers.

SEAL's primes in this project are below 2^61; products of two residues reach 2^122, past uint64.
`mulmod` computes a b mod q exactly with the long-double quotient trick (as NTL's MulMod): the
quotient floor(a b / q) is estimated in 80-bit extended precision (64-bit mantissa: off by at
most a few units for a, b < q < 2^62), the remainder a b - est q is computed modulo 2^64 in
uint64 (exact, because the true remainder is within a few q of [0, q) and q < 2^62) and
corrected into [0, q). Where the platform's long double has no 64-bit mantissa, it falls back
to Python integers (same result, slower). Adds no noise, holds no secret.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
_EXTENDED = np.finfo(np.longdouble).nmant >= 63


def mulmod(a: U64, b: U64 | int, q: int) -> U64:
    """a * b mod q, element-wise, for a, b in [0, q) and q < 2^62 (exact)."""
    a = np.asarray(a, dtype=np.uint64)
    bb = np.asarray(b, dtype=np.uint64)
    if not _EXTENDED or q >= 1 << 62:
        out: U64 = np.asarray((a.astype(object) * bb.astype(object)) % q, dtype=np.uint64)
        return out
    est = np.floor(a.astype(np.longdouble) * bb.astype(np.longdouble) / np.longdouble(q)).astype(np.uint64)
    with np.errstate(over="ignore"):
        r = (a * bb - est * np.uint64(q)).view(np.int64)  # wraps mod 2^64: exact, |r| < 4 q
    r = np.where(r < 0, r + np.int64(q), r)
    r = np.where(r < 0, r + np.int64(q), r)
    r = np.where(r >= np.int64(q), r - np.int64(q), r)
    r = np.where(r >= np.int64(q), r - np.int64(q), r)
    res: U64 = r.astype(np.uint64)
    return res


def residues(hi: U64, lo: U64, shift: int, offset: int, moduli: Sequence[int]) -> U64:
    """(hi 2^shift + lo - offset) mod each prime, shape (len(moduli), n): a wide integer per element in RNS.

    hi, lo: uint64 arrays (lo < 2^64, hi < 2^62); `offset` a non-negative Python int.
    """
    out = np.empty((len(moduli), len(lo)), dtype=np.uint64)
    for j, q in enumerate(moduli):
        qq = np.uint64(q)
        hi = np.asarray(hi, dtype=np.uint64)
        if len(hi) and int(hi.max()) < 1 << 16:  # small high words (70-bit smudging: 9 bits): a table lookup
            table = np.array([(x << shift) % q for x in range(int(hi.max()) + 1)], dtype=np.uint64)
            high = table[hi.astype(np.int64)]
        else:
            high = mulmod(hi % qq, pow(2, shift, q), q)
        v = high + np.asarray(lo, dtype=np.uint64) % qq
        v = v + np.uint64(q - offset % q)
        out[j] = v % qq  # v < 3 q < 2^64
    return out
