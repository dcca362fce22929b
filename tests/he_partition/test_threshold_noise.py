"""The holders' DP noise inside their decryption shares: real SEAL, K = 3.

Combining the three shares yields data + the sum of the three holders' `discrete_laplace_share`
draws exactly (mod t), the draws reproduced independently from each holder's keyed source.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from he_partition.core.noise_shares import discrete_laplace_share, holder_noise_source
from he_partition.he.threshold.decrypt import combine, decryption_share
from he_partition.he.threshold.wire import keyed_smudging_noise
from tests.he_partition.test_threshold import HOLDERS, _encrypted_sum, _rows, make_setup

SCALE = Fraction(20)
T = 562949952847873
LABEL = b"study-1/release-1/eps=0.5/measurement-0"


@pytest.fixture(scope="module")
def setup() -> dict[str, Any]:
    return make_setup()


def _noise_key(holder: int) -> bytes:
    return bytes([holder + 1]) * 32


def _draws(holder: int, slots: int, label: bytes = LABEL) -> np.ndarray:
    return discrete_laplace_share(SCALE, len(HOLDERS), slots,
                                  holder_noise_source(_noise_key(holder), holder, len(HOLDERS), label))


def _shares(s: dict[str, Any], ct: bytes, slots: int, label: bytes = LABEL) -> list[bytes]:
    return [decryption_share(s["ctx"], s["secrets"][h], s["fp"], ct, dp_noise=_draws(h, slots, label),
                             rng=holder_noise_source(_noise_key(h), h, len(HOLDERS), b"smudge/" + label))
            for h in HOLDERS]


def test_combined_decryption_is_data_plus_the_sum_of_the_holders_draws(setup: dict[str, Any]) -> None:
    rows = _rows(10, 11)
    ct = _encrypted_sum(setup, rows)  # with the 2^61 flood: the worst case the release sends
    slots = 6000  # measured slots; the rest carry no DP noise
    got = combine(setup["ctx"], ct, _shares(setup, ct, slots), HOLDERS, setup["fp"])
    data = np.sum(np.array(rows, dtype=np.int64), axis=0)
    noise = sum(_draws(h, slots) for h in HOLDERS)
    assert np.count_nonzero(noise) > slots // 2  # the draws are real noise, not zeros
    expected = data.copy()
    expected[:slots] += noise
    assert got.tolist() == (expected % T).tolist()
    # negative noise on a zero slot wraps mod t and comes back as a negative value once centred
    zero = _encrypted_sum(setup, [[0] * 8192], flood=False)
    got0 = combine(setup["ctx"], zero, _shares(setup, zero, 8192), HOLDERS, setup["fp"])
    centred = np.where(got0 > T // 2, got0 - T, got0)
    assert centred.tolist() == sum(_draws(h, 8192) for h in HOLDERS).tolist()
    assert centred.min() < 0 < centred.max()


def test_a_fixed_seed_gives_the_same_result_twice_and_another_request_other_noise(setup: dict[str, Any]) -> None:
    ct = _encrypted_sum(setup, _rows(2, 12), flood=False)
    first = _shares(setup, ct, 100)
    assert _shares(setup, ct, 100) == first  # identical share bytes, smudging included
    a = combine(setup["ctx"], ct, first, HOLDERS, setup["fp"])
    b = combine(setup["ctx"], ct, _shares(setup, ct, 100), HOLDERS, setup["fp"])
    c = combine(setup["ctx"], ct, _shares(setup, ct, 100, b"another request"), HOLDERS, setup["fp"])
    assert a.tolist() == b.tolist()
    assert a[:100].tolist() != c[:100].tolist() and a[100:].tolist() == c[100:].tolist()


def test_keyed_smudging_is_reproducible_and_on_its_interval() -> None:
    from he_partition.core.noise import KeyedRandom

    x = keyed_smudging_noise(20000, 70, KeyedRandom(b"k" * 32, b"l"))
    assert x == keyed_smudging_noise(20000, 70, KeyedRandom(b"k" * 32, b"l"))
    assert min(x) >= -(1 << 70) and max(x) < 1 << 70
    assert min(x) < -(1 << 69) and max(x) > 1 << 69  # spread over the interval, both signs
    assert x != keyed_smudging_noise(20000, 70, KeyedRandom(b"k" * 32, b"m"))


def test_a_noise_vector_longer_than_the_slots_is_refused(setup: dict[str, Any]) -> None:
    ct = _encrypted_sum(setup, _rows(1, 13), flood=False)
    with pytest.raises(InvalidInputError, match="8193 slots, a ciphertext holds 8192"):
        decryption_share(setup["ctx"], setup["secrets"][0], setup["fp"], ct, dp_noise=[1] * 8193)


@pytest.mark.statistical
def test_keyed_smudging_words_are_uniform_across_the_word_boundary() -> None:
    """bits = 64: 65 bits split as hi (3 bits) 2^62 + lo; the top bits and the low bits must each be uniform."""
    from he_partition.core.noise import KeyedRandom

    x = keyed_smudging_noise(16000, 64, KeyedRandom(b"s" * 32, b"words"))
    assert all(-(1 << 64) <= v < 1 << 64 for v in x)
    for part in ([(v + (1 << 64)) >> 61 for v in x], [(v + (1 << 64)) & 15 for v in x]):  # top 4 / low 4 bits
        counts = [part.count(b) for b in range(16)]
        chi2 = sum((c - 1000) ** 2 / 1000 for c in counts)
        assert chi2 < 56  # 15 degrees of freedom: p < 1e-6 above this (seeded: deterministic)
    small = keyed_smudging_noise(16000, 3, KeyedRandom(b"s" * 32, b"small"))
    assert sorted(set(small)) == list(range(-8, 8))
