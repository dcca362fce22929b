"""The owners' join uploads checked under encryption before any join cell is decrypted (he_partition.join.wellformed)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from he_partition.he.join_scheme import MIN_NOISE_BUDGET_BITS, JoinParams, JoinScheme
from he_partition.join.wellformed import (check_rounds, coefficients, residues, residues_plain, well_formed)

SEED = bytes(range(32))


@pytest.fixture(scope="module")
def schemes() -> tuple[JoinScheme, JoinScheme]:
    ds = JoinScheme.generate(JoinParams.for_version(2))
    return ds, JoinScheme.from_public(ds.public_bytes())


def _planes(slots: int, groups: int = 2, values: int = 3, seed: int = 0) -> np.ndarray:
    """Honest one-hot-or-empty indicator planes (groups, values, slots)."""
    rng = np.random.default_rng(seed)
    planes = np.zeros((groups, values, slots), dtype=np.int64)
    for g in range(groups):
        filled = rng.choice(slots, size=slots // 3, replace=False)
        planes[g, rng.integers(values, size=filled.size), filled] = 1
    return planes


def _check(schemes: tuple[JoinScheme, JoinScheme], planes: np.ndarray) -> tuple[bool, list[int]]:
    ds, cs = schemes
    up = [[cs.serialize(cs.encrypt(p)) for p in g] for g in planes]
    cts = [ds.deserialize_released(c) for c in residues(cs, up, SEED, "a")]
    assert all(ds.noise_budget(c) >= MIN_NOISE_BUDGET_BITS for c in cts)
    return well_formed(ds, cts), [int(ds.decrypt(c)[0]) for c in cts]


def test_rounds_bring_the_miss_below_two_to_the_minus_forty() -> None:
    for t, rounds in ((1_032_193, 3), (8_273_921, 2)):  # 2^20 is a little above t = 1,032,193
        assert check_rounds(t) == rounds and float(t) ** -rounds <= 2.0 ** -40 < float(t) ** -(rounds - 1)
    assert check_rounds(257) == 5  # a small modulus: more rounds


def test_coefficients_are_the_key_holders_and_differ_per_plane_owner_and_round() -> None:
    t = 8_273_921
    r = coefficients(SEED, "a", 0, 0, 0, 8192, t)
    assert r.shape == (8192,) and 0 <= r.min() and r.max() < t
    assert np.array_equal(r, coefficients(SEED, "a", 0, 0, 0, 8192, t))
    for other in (coefficients(SEED, "b", 0, 0, 0, 8192, t), coefficients(SEED, "a", 1, 0, 0, 8192, t),
                  coefficients(SEED, "a", 0, 1, 0, 8192, t), coefficients(SEED, "a", 0, 0, 1, 8192, t),
                  coefficients(os.urandom(32), "a", 0, 0, 0, 8192, t)):
        assert not np.array_equal(r, other)


def test_honest_uploads_pass(schemes: tuple[JoinScheme, JoinScheme]) -> None:
    planes = _planes(schemes[0].slots)
    assert residues_plain(planes, SEED, "a", schemes[0].plain_modulus) == [0, 0]
    ok, values = _check(schemes, planes)
    assert ok and values == [0, 0]


@pytest.mark.parametrize("bad", ["scaled-2", "scaled-1000", "two-hot", "minus-one"])
def test_malformed_uploads_fail(schemes: tuple[JoinScheme, JoinScheme], bad: str) -> None:
    planes = _planes(schemes[0].slots)
    hit = int(np.flatnonzero(planes[1].sum(axis=0) == 1)[0])
    v = int(np.flatnonzero(planes[1, :, hit])[0])
    if bad == "scaled-2":
        planes[1, v, hit] = 2
    elif bad == "scaled-1000":
        planes[1, v, hit] = 1000
    elif bad == "minus-one":
        planes[1, v, hit] = -1
    else:  # two values set at one position: each plane 0/1, but the position counts twice
        planes[1, (v + 1) % planes.shape[1], hit] = 1
    assert all(z != 0 for z in residues_plain(planes, SEED, "a", schemes[0].plain_modulus))
    ok, values = _check(schemes, planes)
    assert not ok and all(v != 0 for v in values)


def test_the_key_holder_sees_a_blinded_value(schemes: tuple[JoinScheme, JoinScheme]) -> None:
    """Two checks of the same malformed upload decrypt to different values (the blind rho), and the other slots are
    pads: the key holder learns only 'nonzero'."""
    ds, cs = schemes
    planes = _planes(ds.slots, groups=1, values=2)
    planes[0, 0, 0] = 5
    up = [[cs.serialize(cs.encrypt(p)) for p in g] for g in planes]
    first = [ds.decrypt(ds.deserialize_released(c)) for c in residues(cs, up, SEED, "a")]
    second = [ds.decrypt(ds.deserialize_released(c)) for c in residues(cs, up, SEED, "a")]
    assert first[0][0] != second[0][0]
    assert len(set(first[0][1:20].tolist())) > 10  # pads, not the rotation-sum's copies of slot 0
