"""Measurement maps: decode(noise_slots(eta)) == eta modulo t, pads ignored, magnitude checks, sensitivities."""

from __future__ import annotations

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError, MeasurementShapeError, PrecisionError
from he_partition.core.measurements import (
    PartitionSums,
    PrefixDifferences,
    measurement_from_dict,
    owner_encoding,
)
from he_partition.core.backend import DEFAULT_PLAIN_MODULUS, centre
from he_partition.core.noise import laplace_scale

T = DEFAULT_PLAIN_MODULUS


def test_prefix_differences_decode() -> None:
    x = np.array([3, 0, 5, 5, 1])
    m = PrefixDifferences(5, 0.5, 2)
    assert m.decode(owner_encoding(x).astype(np.int64)).tolist() == [3, -3, 5, 0, -4]
    eta = np.array([4, -2, 0, 7, -1])
    assert np.array_equal(m.decode(m.noise_slots(eta)), eta)
    # The slots wrap modulo t; decoding is exact modulo t.
    assert np.array_equal(m.decode(centre(owner_encoding(x) + m.noise_slots(eta) + T, T)), [7, -5, 5, 7, -5])
    assert m.measured_slots() is None
    assert m.scale == laplace_scale(2, 0.5) == 4
    assert m.count == 5


def test_partition_sums_decode_ignores_pads() -> None:
    x = np.array([1, 2, 3, 4, 5, 6])
    m = PartitionSums(6, 1.0, 1, starts=(0, 2, 3))
    assert m.ends.tolist() == [1, 2, 5]
    assert m.measured_slots().tolist() == [False, True, True, False, False, True]
    eta = np.array([5, -1, 2])
    slots = owner_encoding(x) + m.noise_slots(eta)
    slots[~m.measured_slots()] = [T // 3, -12345, 7]  # pads: any values mod t
    assert m.decode(centre(slots, T)).tolist() == [3 + 5, 3 - 1, 15 + 2]
    assert m.count == 3


def test_decode_refuses_implausible_values_and_shapes() -> None:
    m = PartitionSums(6, 1.0, 1, starts=(0, 3))
    slots = np.array([0, 0, 6, 0, 1, T // 3])  # what a foreign-key ciphertext looks like
    with pytest.raises(PrecisionError, match="implausibly large"):
        m.decode(slots)
    with pytest.raises(MeasurementShapeError, match="expected 6"):
        m.decode(np.zeros(5, dtype=np.int64))


@pytest.mark.parametrize("starts", [(), (1,), (0, 0), (0, 6), (0, 3, 2)])
def test_partition_starts_validated(starts: tuple[int, ...]) -> None:
    with pytest.raises(InvalidInputError):
        PartitionSums(6, 1.0, 1, starts=starts)


def test_measurement_validation() -> None:
    with pytest.raises(InvalidInputError, match="epsilon"):
        PrefixDifferences(4, 0.0, 2)
    with pytest.raises(InvalidInputError, match="domain_size"):
        PrefixDifferences(0, 1.0, 2)
    with pytest.raises(InvalidInputError, match="sensitivity"):
        PrefixDifferences(4, 1.0, 0)


def test_dict_round_trip() -> None:
    for m in (PrefixDifferences(9, 0.25, 4), PartitionSums(9, 0.75, 2, starts=(0, 4, 8))):
        assert measurement_from_dict(m.to_dict()) == m
    with pytest.raises(InvalidInputError, match="unknown measurement kind"):
        measurement_from_dict({"kind": "rotate_everything"})
    with pytest.raises(InvalidInputError, match="bad fields"):
        measurement_from_dict({"kind": "prefix_differences", "domain_size": 3})


def test_only_chunks_with_measured_slots_are_sent() -> None:
    from he_partition.core.backend import PlainBackend
    from he_partition.core.measurements import HaarCoefficients, RangeCount
    from he_partition.core.noise import SeededRandom
    from he_partition.protocol import Budget, ComputationSide, DecryptionSide, encrypt_histogram

    n, slots = 40, 8
    sums = PartitionSums(n, 1.0, 1, starts=(0, 20))  # ends at bins 19 and 39: chunks 2 and 4
    assert sums.measured_chunks(slots) == (2, 4)
    assert RangeCount(n, 1.0, 1, lo=3, hi=9).measured_chunks(slots) == (0, 1)
    assert PrefixDifferences(n, 1.0, 2).measured_chunks(slots) == (0, 1, 2, 3, 4)
    assert HaarCoefficients(n, 1.0, 7).measured_chunks(slots) == (0, 1, 2, 3, 4)
    be = PlainBackend(slots)
    x = np.arange(n)
    noised = ComputationSide(be, SeededRandom(1)).measure(encrypt_histogram(be, x), sums)
    assert [c is None for c in noised.chunks] == [True, True, False, True, False]
    ds = DecryptionSide(be, SeededRandom(2), Budget(1.0), noise_parties=1)
    out = ds.decrypt_measurement(sums, noised)
    assert abs(int(out[0]) - int(x[:20].sum())) < 40 and abs(int(out[1]) - int(x[20:].sum())) < 40
