"""Exact RNS arithmetic against Python integers (the share's speed path)."""
from __future__ import annotations

import numpy as np

from he_partition.he.rns import mulmod, residues

PRIMES = [1152921504606830593, 1125899906826241, 1125899906629633, 288230376151130113, 562949952847873]


def test_mulmod_equals_python_integers_including_the_edges() -> None:
    rng = np.random.default_rng(5)
    for q in PRIMES:
        a = np.concatenate([rng.integers(0, q, 20000, dtype=np.uint64), np.array([0, 1, q - 1, q - 2], np.uint64)])
        b = np.concatenate([rng.integers(0, q, 20000, dtype=np.uint64), np.array([q - 1, q - 1, q - 1, 1], np.uint64)])
        got = mulmod(a, b, q)
        assert got.tolist() == [(int(x) * int(y)) % q for x, y in zip(a, b)]
        assert mulmod(a, q - 1, q).tolist() == [(int(x) * (q - 1)) % q for x in a]
    big = (1 << 63) - 25  # past the long-double path's range: the Python-integer fallback
    a = rng.integers(0, 1 << 62, 1000, dtype=np.uint64) * np.uint64(2)
    assert mulmod(a, a, big).tolist() == [(int(x) * int(x)) % big for x in a]


def test_residues_of_wide_signed_integers() -> None:
    rng = np.random.default_rng(6)
    hi = rng.integers(0, 1 << 9, 5000, dtype=np.uint64)
    lo = rng.integers(0, 1 << 62, 5000, dtype=np.uint64)
    off = 1 << 70
    got = residues(hi, lo, 62, off, PRIMES[:4])
    for j, q in enumerate(PRIMES[:4]):
        assert got[j].tolist() == [((int(h) << 62) + int(x) - off) % q for h, x in zip(hi, lo)]
