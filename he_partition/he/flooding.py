"""The flooding polynomial's coefficients modulo each prime, from OS CSPRNG words, in uint64 arithmetic."""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np
import numpy.typing as npt

from ..core.errors import InvalidInputError
from .rns import mulmod

__all__ = ["FLOOD_BITS", "flood_residues"]

#: Half-width (bits) of the flooding noise added to every outgoing join ciphertext (the default width here).
FLOOD_BITS = 110


def flood_residues(words: npt.NDArray[np.uint64], moduli: Sequence[int], *,
                   bits: int = FLOOD_BITS) -> npt.NDArray[np.uint64]:
    """The flood's coefficients r mod each prime, shape (len(moduli), n), from n pairs of random 64-bit words.

    Each pair (lo, hi) is one integer r = ((hi mod 2^(FLOOD_BITS + 1 - 64)) 2^64 + lo) - 2^FLOOD_BITS:
    uniform on [-2^FLOOD_BITS, 2^FLOOD_BITS) when the words are uniform (the 111 low bits of a
    uniform 128-bit integer), and every prime's residue is of that same integer, computed in
    uint64 arithmetic (lo mod q plus table look-ups for the high word's 16-bit pieces, tables
    made once with `rns.mulmod`) instead of Python integers: the values of
    `int(words) % 2^(FLOOD_BITS + 1) - 2^FLOOD_BITS` reduced mod q, exactly (tests compare them).
    Draws nothing itself: the caller passes OS CSPRNG words. `bits` (65 to 111; FLOOD_BITS by
    default) sets the width: the decryption server's own flood (`bfv.BfvBackend.holder_flooded`) is narrower.
    """
    if not 64 < bits <= 111:
        raise InvalidInputError(f"a flood of 2^{bits} is outside what flood_residues draws (2^65 to 2^111)")
    words = np.asarray(words, dtype=np.uint64)
    lo = words[:, 0]
    hi = words[:, 1] & np.uint64((1 << (bits + 1 - 64)) - 1)  # at most 48 bits: three 16-bit pieces
    pieces = [((hi >> np.uint64(16 * k)) & np.uint64(0xFFFF)).astype(np.intp) for k in range(3)]
    out = np.empty((len(moduli), len(lo)), dtype=np.uint64)
    for j, (q, tables) in enumerate(zip(moduli, _flood_tables(tuple(int(q) for q in moduli)))):
        qq = np.uint64(q)
        v = tables[0][pieces[0]] + tables[1][pieces[1]]  # each table entry < q < 2^61: sums stay below 2^64
        v = np.where(v >= qq, v - qq, v) + tables[2][pieces[2]]
        v = np.where(v >= qq, v - qq, v) + lo % qq
        out[j] = (v + np.uint64(q - (1 << bits) % q)) % qq
    return out


@lru_cache(maxsize=4)
def _flood_tables(moduli: tuple[int, ...]) -> tuple[npt.NDArray[np.uint64], ...]:
    """Per prime q, table[k][h] = h 2^(64 + 16 k) mod q for every 16-bit h (k = 0, 1, 2): the high word's part."""
    h = np.arange(1 << 16, dtype=np.uint64)
    return tuple(np.stack([mulmod(h, pow(2, 64 + 16 * k, q), q) for k in range(3)]) for q in moduli)
