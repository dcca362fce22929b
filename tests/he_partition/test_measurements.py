"""Measurement maps: decode(noise_slots(eta)) == eta, layout checks, sensitivities."""

from __future__ import annotations

import numpy as np
import pytest

from he_partition.errors import InvalidInputError, MeasurementShapeError, PrecisionError
from he_partition.measurements import (
    PartitionSums,
    PrefixDifferences,
    measurement_from_dict,
    owner_encoding,
    round_slots,
)
from he_partition.noise import laplace_scale


def test_prefix_differences_decode() -> None:
    x = np.array([3, 0, 5, 5, 1])
    m = PrefixDifferences(5, 0.5, 2)
    assert m.decode(owner_encoding(x).astype(np.int64)).tolist() == [3, -3, 5, 0, -4]
    eta = np.array([4, -2, 0, 7, -1])
    assert np.array_equal(m.decode(m.noise_slots(eta).astype(np.int64)), eta)
    assert m.mask() is None
    assert m.scale == laplace_scale(2, 0.5) == 4
    assert m.count == 5


def test_partition_sums_decode_and_mask() -> None:
    x = np.array([1, 2, 3, 4, 5, 6])
    m = PartitionSums(6, 1.0, 1, starts=(0, 2, 3))
    assert m.ends.tolist() == [1, 2, 5]
    assert m.mask().tolist() == [0, 1, 1, 0, 0, 1]
    masked = owner_encoding(x) * m.mask()
    eta = np.array([5, -1, 2])
    slots = (masked + m.noise_slots(eta)).astype(np.int64)
    assert m.decode(slots).tolist() == [3 + 5, 3 - 1, 15 + 2]
    assert m.count == 3


def test_partition_sums_refuses_foreign_layout() -> None:
    m = PartitionSums(6, 1.0, 1, starts=(0, 3))
    slots = np.array([0, 0, 6, 0, 1, 21])  # slot 4 carries information
    with pytest.raises(MeasurementShapeError, match="not zero"):
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


def test_round_slots() -> None:
    assert round_slots(np.array([1.0000004, -2.9999, 0.2])).tolist() == [1, -3, 0]
    with pytest.raises(PrecisionError, match="another key"):
        round_slots(np.array([1.0, 2.4]))
    with pytest.raises(PrecisionError):
        round_slots(np.array([np.nan]))


def test_dict_round_trip() -> None:
    for m in (PrefixDifferences(9, 0.25, 4), PartitionSums(9, 0.75, 2, starts=(0, 4, 8))):
        assert measurement_from_dict(m.to_dict()) == m
    with pytest.raises(InvalidInputError, match="unknown measurement kind"):
        measurement_from_dict({"kind": "rotate_everything"})
    with pytest.raises(InvalidInputError, match="bad fields"):
        measurement_from_dict({"kind": "prefix_differences", "domain_size": 3})
