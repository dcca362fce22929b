"""Threshold BFV wire format: common polynomial, commit-then-reveal, smudging sampler, share binding."""
from __future__ import annotations

import pytest

from he_partition.core.errors import InvalidInputError
from he_partition.he.threshold.wire import (DecryptionShare, check_shares, ciphertext_digest, common_polynomial,
                                            key_share_commitment, smudging_noise, verify_reveals)

PRIMES = [1152921504606830593, 1125899906826241, 1125899906629633]  # 60-, 50-, 50-bit primes
SEED = bytes(range(32))
FP = b"\x07" * 32


def test_common_polynomial_is_deterministic_in_range_and_seed_dependent() -> None:
    a = common_polynomial(SEED, PRIMES, 256)
    assert a == common_polynomial(SEED, PRIMES, 256)
    assert all(0 <= v < q for row, q in zip(a, PRIMES) for v in row)
    assert a != common_polynomial(bytes(32), PRIMES, 256)
    assert a != common_polynomial(SEED, PRIMES, 256, tag=b"galois-3")
    assert len({v for v in a[0]}) == 256  # 60-bit uniform values: a collision would be a bug


def test_common_polynomial_is_uniform_on_a_small_prime() -> None:
    q = 97  # 7 bits: 128 - 97 of the candidates are rejected; the kept ones must still be uniform
    row = common_polynomial(SEED, [q], 97 * 200)[0]
    counts = [row.count(v) for v in range(q)]
    expected = len(row) / q
    chi2 = sum((c - expected) ** 2 / expected for c in counts)
    assert chi2 < 160  # 96 degrees of freedom: p < 1e-4 above this


def test_commit_then_reveal_accepts_honest_and_refuses_rogue_share() -> None:
    shares = {0: b"p0", 1: b"p1", 2: b"p2"}
    commits = {h: key_share_commitment(h, SEED, p) for h, p in shares.items()}
    verify_reveals(SEED, commits, shares)
    with pytest.raises(InvalidInputError, match="holder 2 does not match its commitment"):
        verify_reveals(SEED, commits, {**shares, 2: b"rogue"})
    with pytest.raises(InvalidInputError, match="holder 1 was committed but not revealed"):
        verify_reveals(SEED, commits, {0: b"p0", 2: b"p2"})
    with pytest.raises(InvalidInputError, match="holder 5 was revealed without a commitment"):
        verify_reveals(SEED, commits, {**shares, 5: b"p5"})
    # a commitment is bound to the holder id and the seed: replaying it elsewhere fails
    with pytest.raises(InvalidInputError, match="does not match"):
        verify_reveals(SEED, {0: commits[1], 1: commits[0], 2: commits[2]}, {0: b"p1", 1: b"p0", 2: b"p2"})
    with pytest.raises(InvalidInputError, match="does not match"):
        verify_reveals(bytes(32), commits, shares)


@pytest.mark.statistical
def test_smudging_noise_is_uniform_on_its_interval() -> None:
    bits = 3
    xs = smudging_noise(16000, bits)
    assert min(xs) == -8 and max(xs) == 7
    counts = [xs.count(v) for v in range(-8, 8)]
    chi2 = sum((c - 1000) ** 2 / 1000 for c in counts)
    assert chi2 < 56  # 15 degrees of freedom: p < 1e-6 above this (OS CSPRNG: cannot be seeded)
    wide = smudging_noise(2000)
    assert all(-(1 << 70) <= x < (1 << 70) for x in wide)
    assert max(abs(x) for x in wide) > 1 << 68  # really uses the full 70-bit width


def _share(holder: int, ct: bytes, fp: bytes = FP) -> DecryptionShare:
    return DecryptionShare(holder, fp, ciphertext_digest(ct), b"h%d" % holder)


def test_share_round_trips_and_malformed_bytes_are_refused() -> None:
    s = _share(2, b"ct")
    assert DecryptionShare.from_bytes(s.to_bytes()) == s
    raw = s.to_bytes()
    with pytest.raises(InvalidInputError, match="at least"):
        DecryptionShare.from_bytes(raw[:20])
    with pytest.raises(InvalidInputError, match="wrong magic"):
        DecryptionShare.from_bytes(b"X" + raw[1:])
    with pytest.raises(InvalidInputError, match="payload length"):
        DecryptionShare.from_bytes(raw + b"extra")


def test_combine_refuses_missing_duplicate_foreign_and_misbound_shares() -> None:
    ct, holders = b"ciphertext-1", [0, 1, 2]
    good = [_share(h, ct) for h in holders]
    assert check_shares(reversed(good), holders, FP, ct) == good
    with pytest.raises(InvalidInputError, match="missing decryption share from holder 1"):
        check_shares([good[0], good[2]], holders, FP, ct)
    with pytest.raises(InvalidInputError, match="duplicate decryption share from holder 0"):
        check_shares([good[0], good[0], good[1], good[2]], holders, FP, ct)
    with pytest.raises(InvalidInputError, match="foreign holder 7"):
        check_shares(good + [_share(7, ct)], holders, FP, ct)
    with pytest.raises(InvalidInputError, match="holder 1 is for another ciphertext"):
        check_shares([good[0], _share(1, b"other"), good[2]], holders, FP, ct)
    with pytest.raises(InvalidInputError, match="holder 2 is under another collective key"):
        check_shares([good[0], good[1], _share(2, ct, b"\x08" * 32)], holders, FP, ct)
