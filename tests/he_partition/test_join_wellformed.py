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


def _check(schemes: tuple[JoinScheme, JoinScheme], planes: np.ndarray) -> tuple[bool, list[np.ndarray]]:
    """(the key holder's finding, each round's slots mod t as it decrypts them)."""
    ds, cs = schemes
    up = [[cs.serialize(cs.encrypt(p)) for p in g] for g in planes]
    cts = [ds.deserialize_released(c) for c in residues(cs, up, SEED, "a")]
    assert all(ds.noise_budget(c) >= MIN_NOISE_BUDGET_BITS for c in cts)
    return well_formed(ds, cts), [ds.decrypt(c) % ds.plain_modulus for c in cts]


def test_rounds_bring_the_miss_below_two_to_the_minus_forty() -> None:
    for t in (1_032_193, 8_273_921, 257):  # rounds of 8-bit coefficients: a miss 2 / 2^8 each
        assert check_rounds(t) == 6
    assert check_rounds(17) == 13  # a modulus below 2^8: each round misses with probability 2/17


def test_coefficients_are_the_key_holders_and_differ_per_plane_owner_and_round() -> None:
    t = 8_273_921
    r = coefficients(SEED, "a", 0, 0, 0, 8192, t)
    assert r.shape == (8192,) and 0 <= r.min() and r.max() < 256 and len(set(r.tolist())) == 256
    assert np.array_equal(r, coefficients(SEED, "a", 0, 0, 0, 8192, t))
    for other in (coefficients(SEED, "b", 0, 0, 0, 8192, t), coefficients(SEED, "a", 1, 0, 0, 8192, t),
                  coefficients(SEED, "a", 0, 1, 0, 8192, t), coefficients(SEED, "a", 0, 0, 1, 8192, t),
                  coefficients(os.urandom(32), "a", 0, 0, 0, 8192, t)):
        assert not np.array_equal(r, other)


def test_honest_uploads_pass(schemes: tuple[JoinScheme, JoinScheme]) -> None:
    planes = _planes(schemes[0].slots)
    assert not any(z.any() for z in residues_plain(schemes[0], planes, SEED, "a"))
    ok, values = _check(schemes, planes)
    assert ok and len(values) == 6 and not any(v.any() for v in values)


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
    expected = residues_plain(schemes[0], planes, SEED, "a")
    assert all(np.flatnonzero(z).tolist() == [hit] for z in expected)  # nonzero at the malformed position only
    ok, values = _check(schemes, planes)
    assert not ok and all(np.array_equal(v, z) for v, z in zip(values, expected))


def test_the_key_holder_sees_zeros_under_a_flood_far_wider_than_the_noise(
        schemes: tuple[JoinScheme, JoinScheme]) -> None:
    """An honest upload's residues: every slot 0; unflooded, their noise stays below 2^60 (2 groups of 16 planes;
    the 2^110 flood: statistical distance below N 2^60 / 2^111 = 2^-38 per ciphertext). With uniform slot
    coefficients and a rotation-sum it was 2^79 to 2^82 (2^-16)."""
    from he_partition.he.keyholder import residual_view

    ds, cs = schemes
    planes = _planes(ds.slots, groups=2, values=16)
    up = [[cs.serialize(cs.encrypt(p)) for p in g] for g in planes]
    cs.flooding = False
    try:
        bare = [ds.deserialize_released(c) for c in residues(cs, up, SEED, "a")]
    finally:
        cs.flooding = True
    assert not any(ds.decrypt(c).any() for c in bare)
    widest = max(max(abs(int(v)) for v in residual_view(ds, c)) for c in bare)
    assert widest < 2 ** 60, widest.bit_length()


@pytest.mark.parametrize("executor", ["inprocess", "processes"])
def test_the_check_spread_over_workers_decrypts_to_the_same_residues(schemes: tuple[JoinScheme, JoinScheme],
                                                                   executor: str) -> None:
    """Each worker sums its share of both owners' groups; the coordinator adds each owner's shares and floods once:
    the key holder decrypts exactly the serial check's values, honest (zeros) and malformed (nonzero where the owner
    deviated), and the other owner's stay zeros."""
    from he_partition.execution import InProcessExecutor, ProcessExecutor
    from he_partition.join.check_workers import parallel_residues

    ds, cs = schemes
    planes = _planes(ds.slots, groups=3)
    bad = planes.copy()
    hit = int(np.flatnonzero(bad[2].sum(axis=0) == 1)[0])
    bad[2, int(np.flatnonzero(bad[2, :, hit])[0]), hit] = 2  # in the group the second worker does not hold
    pool = ProcessExecutor(2) if executor == "processes" else InProcessExecutor()
    try:
        for p, honest in ((planes, True), (bad, False)):
            up = [[cs.serialize(cs.encrypt(x)) for x in g] for g in p]
            other = [[cs.serialize(cs.encrypt(x)) for x in g] for g in planes[:2]]  # an honest second owner
            both = parallel_residues(cs, cs.public_bytes(), {"a": up, "b": other}, SEED, pool)
            cts = [ds.deserialize_released(c) for c in both["a"]]
            assert well_formed(ds, cts) is honest
            assert well_formed(ds, [ds.deserialize_released(c) for c in both["b"]])
            expected = residues_plain(ds, p, SEED, "a")
            assert all(np.array_equal(ds.decrypt(c) % ds.plain_modulus, z) for c, z in zip(cts, expected))
    finally:
        pool.close()
