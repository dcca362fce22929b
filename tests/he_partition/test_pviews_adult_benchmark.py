"""Tests of the Adult benchmark's helpers: flattening orders, owner split, and the HE round trip."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from benchmarks.pviews_adult import (
    ADULT_PATH,
    HE_METHODS,
    _he_estimate,
    load_adult_records,
    load_adult_tensor,
    morton_order,
    owner_tensors,
    row_major_order,
)


@pytest.mark.parametrize("shape", [(1,), (5,), (3, 2), (4, 4), (15, 16, 10, 2), (3, 1, 5)])
def test_orders_are_permutations(shape: tuple[int, ...]) -> None:
    n = int(np.prod(shape))
    for order in (row_major_order(shape), morton_order(shape)):
        assert order.dtype == np.int64
        np.testing.assert_array_equal(np.sort(order), np.arange(n))


def test_morton_order_keeps_dyadic_boxes_contiguous() -> None:
    shape = (8, 4, 6)
    order = morton_order(shape)
    pos = np.empty(order.size, dtype=np.int64)
    pos[order] = np.arange(order.size)
    pos = pos.reshape(shape)
    # Every aligned 2 x 2 x 2 box (inside the tensor) occupies 8 consecutive positions.
    for i, j, k in itertools.product(range(0, 8, 2), range(0, 4, 2), range(0, 6, 2)):
        run = np.sort(pos[i : i + 2, j : j + 2, k : k + 2].reshape(-1))
        np.testing.assert_array_equal(run, np.arange(run[0], run[0] + 8))
    # 2-D: the classic Z pattern.
    np.testing.assert_array_equal(morton_order((4, 4))[:8], [0, 1, 4, 5, 2, 3, 6, 7])


def test_owner_split_sums_to_the_tensor() -> None:
    cells = np.array([[0, 1], [2, 0], [1, 1], [0, 1], [2, 1]], dtype=np.int64)
    owners = owner_tensors(cells, (3, 2), 3)
    assert len(owners) == 3
    assert [int(o.sum()) for o in owners] == [2, 2, 1]  # contiguous runs of rows
    total = np.zeros((3, 2))
    np.add.at(total, tuple(cells.T), 1.0)
    np.testing.assert_array_equal(sum(owners), total)
    with pytest.raises(ValueError, match="owners must be >= 1"):
        owner_tensors(cells, (3, 2), 0)


@pytest.mark.parametrize(("column", "strategy", "parties"), HE_METHODS)
def test_he_estimate_puts_bins_back_in_place(column: str, strategy: str, parties: int) -> None:
    # A huge epsilon makes the noise negligible: the estimate must land on the right cells.
    rng = np.random.default_rng(1)
    tensor = rng.poisson(50.0, size=(4, 3, 2)).astype(float)
    owners = [np.floor(tensor / 2), tensor - np.floor(tensor / 2)]
    for order in (row_major_order(tensor.shape), morton_order(tensor.shape)):
        est, summary = _he_estimate(owners, order, 1e6, strategy, parties, seed=7)
        assert est.shape == tensor.shape
        if strategy != "gap":  # gap spreads partition sums evenly; the others resolve single bins
            np.testing.assert_allclose(est, tensor, atol=0.5)
        assert est.sum() == pytest.approx(tensor.sum(), abs=1.0)


@pytest.mark.skipif(not ADULT_PATH.is_file(), reason=f"Adult data not found at {ADULT_PATH}")
def test_adult_records_and_tensor_agree() -> None:
    cells, attrs = load_adult_records()
    tensor, attrs2 = load_adult_tensor()
    assert attrs == attrs2
    assert cells.shape == (32561, 4)
    assert tensor.shape == (15, 16, 10, 2) and tensor.sum() == 32561
    assert sum(o.sum() for o in owner_tensors(cells, tensor.shape, 3)) == 32561
