"""Direct range-count measurements: layout, decode, what the decryption side sees, and its privacy pieces."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from he_partition.core.accounting import RangeQuery
from he_partition.core.backend import PlainBackend
from he_partition.he.bfv import BfvBackend, generate_secret_context
from he_partition.core.errors import InvalidInputError, MeasurementShapeError, PrecisionError
from he_partition.core.measurements import (
    PREFIX_MASK_EPSILON,
    RangeCount,
    measurement_from_dict,
    owner_encoding,
)
from he_partition.core.noise import SeededRandom, discrete_laplace_variance, laplace_scale
from he_partition.protocol import Budget, ComputationSide, DecryptionSide, encrypt_histogram


def test_decode_is_count_plus_the_answer_noise_only() -> None:
    x = np.arange(1, 21, dtype=np.int64)
    p = owner_encoding(x)
    m = RangeCount(20, 0.5, 1, lo=5, hi=12)
    mu, eta = 123_456, -7
    assert np.flatnonzero(m.measured_slots()).tolist() == [4, 11]  # only P[lo-1] and P[hi-1] are measured
    slots = p + m.noise_slots(np.array([mu, eta]))
    assert slots[4] == p[4] + mu  # the prefix the decryption side sees hides behind mu
    slots[~m.measured_slots()] = 999_999_999  # pads: ignored
    assert m.decode(slots).tolist() == [int(x[5:12].sum()) + eta]


def test_range_from_zero_needs_no_mask() -> None:
    x = np.arange(10, dtype=np.int64)
    m = RangeCount(10, 1.0, 1, lo=0, hi=4)
    assert np.flatnonzero(m.measured_slots()).tolist() == [3]
    slots = owner_encoding(x) + m.noise_slots(np.array([3]))
    assert m.decode(slots).tolist() == [int(x[:4].sum()) + 3]
    assert len(m.computation_noise(SeededRandom(1))) == 1
    assert m.privacy_pieces() == (RangeQuery((0,), (4,), 1.0),)


def test_foreign_layouts_are_refused() -> None:
    m = RangeCount(16, 1.0, 1, lo=2, hi=9)
    slots = np.zeros(16, dtype=np.int64)
    slots[[1, 8]] = [10, 30]
    assert m.decode(slots).tolist() == [20]
    slots[8] = 2**47  # a foreign-key ciphertext decodes to values uniform modulo t
    with pytest.raises(PrecisionError, match="implausibly large"):
        m.decode(slots)
    with pytest.raises(MeasurementShapeError, match="expected 16 decrypted slots"):
        m.decode(np.zeros(15, dtype=np.int64))
    with pytest.raises(MeasurementShapeError, match="takes 2 noise values"):
        m.noise_slots(np.array([1]))


@pytest.mark.parametrize("lo, hi", [(-1, 3), (3, 3), (4, 2), (0, 17)])
def test_ranges_are_validated(lo: int, hi: int) -> None:
    with pytest.raises(InvalidInputError, match=r"need 0 <= lo < hi <= 16"):
        RangeCount(16, 1.0, 1, lo=lo, hi=hi)


def test_privacy_pieces_and_scales_are_exact() -> None:
    m = RangeCount(100, 0.25, 3, lo=40, hi=60)
    assert PREFIX_MASK_EPSILON == 2.0**-20
    assert m.scale == Fraction(12)  # c / eps
    assert m.mask_scale == Fraction(3 * 2**20) == laplace_scale(3, PREFIX_MASK_EPSILON)
    assert m.privacy_pieces() == (RangeQuery((40,), (60,), 0.25), RangeQuery((0,), (40,), 2.0**-20))
    assert measurement_from_dict(m.to_dict()) == m
    assert m.to_dict()["lo"] == 40 and m.to_dict()["hi"] == 60


@pytest.mark.statistical
def test_mask_and_answer_noise_follow_their_discrete_laplace_scales() -> None:
    m = RangeCount(100, 1.0, 1, lo=10, hi=20)
    rng = SeededRandom(2024)
    draws = np.array([m.computation_noise(rng) for _ in range(4000)])
    mu, eta = draws[:, 0], draws[:, 1]
    # eta: discrete Laplace of scale 1 -> chi-square against the exact pmf on {-3..3} and the tails.
    q = np.exp(-1.0)
    support = np.arange(-3, 4)
    pmf = (1 - q) / (1 + q) * q ** np.abs(support)
    observed = np.array([np.sum(eta == k) for k in support] + [np.sum(np.abs(eta) > 3)])
    expected = np.append(pmf, 1 - pmf.sum()) * len(eta)
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    # mu: scale 2^20 -> |mu| / 2^20 is (nearly exactly) Exponential(1); KS test.
    assert stats.kstest(np.abs(mu) / 2**20, "expon").pvalue > 1e-3
    assert np.var(eta) == pytest.approx(discrete_laplace_variance(m.scale), rel=0.15)


@pytest.mark.parametrize("lo, hi", [(0, 1), (5, 9999), (8191, 8193), (8192, 10000), (9999, 10000)])
def test_bfv_and_plain_release_the_same_answer_across_chunk_edges(lo: int, hi: int) -> None:
    x = np.random.default_rng(3).integers(0, 10_000, 10000)
    m = RangeCount(10000, 1.0, 1, lo=lo, hi=hi)
    out = []
    for backend in (PlainBackend(), BfvBackend(generate_secret_context())):
        agg = encrypt_histogram(backend, x)
        cs = ComputationSide(backend, SeededRandom(7))
        ds = DecryptionSide(backend, SeededRandom(8), Budget(10.0), noise_parties=2)
        out.append(ds.decrypt_measurement(m, cs.measure(agg, m)).tolist())
    assert out[0] == out[1]
    assert abs(out[0][0] - int(x[lo:hi].sum())) < 40  # two draws of scale 1
