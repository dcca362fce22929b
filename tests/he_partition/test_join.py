"""The cross-organization join's core (he_partition.join.protocol, join_he) with real BFV: pseudonyms, placement,
the encrypted product against a plaintext join, the owners' view of the placement, the key holder's view."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from scipy import stats

from he_partition.core.errors import InvalidInputError, PrecisionError
from he_partition.join.protocol import (JOIN_RELEASES, JoinKeyPair, JoinTerms, check_placement, dummy_count,
                               encode_indicators, joint_totals, place, pseudonyms, shared_dummies)
from he_partition.he.join_scheme import FLOOD_BITS, MIN_NOISE_BUDGET_BITS, JoinScheme, flood_residues
from he_partition.execution import ChunkExecutor, ProcessExecutor
from he_partition.join.parallel import JoinEvaluator
from he_partition.join.release import (apply_terms, bin_cells, cell_table, decrypt_values, measurement_terms,
                                       noised_values, release_table)
from he_partition.he.keyholder import residual_view
from he_partition.core.measurements import PartitionSums
from he_partition.core.noise import SeededRandom
from he_partition.core.summary import Summary

SLOTS = 8192


@pytest.fixture(scope="module")
def schemes() -> tuple[JoinScheme, JoinScheme]:
    """(key holder's scheme, the public scheme owners and the computation server rebuild from its bytes)."""
    ds = JoinScheme.generate()
    return ds, JoinScheme.from_public(ds.public_bytes())


@pytest.fixture(scope="module")
def two_workers() -> Any:
    """Two local worker processes, shared by the module's releases (each release holds its blocks under its own key)."""
    executor = ProcessExecutor(2)
    yield executor
    executor.close()


def _keys(study: str = "j1") -> tuple[bytes, bytes]:
    a, b = JoinKeyPair(), JoinKeyPair()
    return (a.join_key(b.public_bytes, study_id=study, contract_hash="h"),
            b.join_key(a.public_bytes, study_id=study, contract_hash="h"))


def test_both_owners_derive_the_same_pseudonyms_and_nobody_else_does() -> None:
    ka, kb = _keys()
    assert ka == kb and len(ka) == 32
    assert pseudonyms(ka, [" Alice@Example.COM "]) == pseudonyms(kb, ["alice@example.com"])
    other, _ = _keys()
    assert pseudonyms(other, ["alice@example.com"]) != pseudonyms(ka, ["alice@example.com"])
    assert _keys("j2")[0] != ka  # bound to the study
    with pytest.raises(InvalidInputError, match="appears twice"):
        pseudonyms(ka, ["bob", " BOB"])
    me = JoinKeyPair()
    with pytest.raises(InvalidInputError, match="this owner's own"):
        me.join_key(me.public_bytes, study_id="j1", contract_hash="h")


def test_dummy_count_is_shared_and_discrete_laplace_around_the_offset() -> None:
    ka, kb = _keys()
    assert dummy_count(ka, 1.0, 20) == dummy_count(kb, 1.0, 20)
    assert len(set(shared_dummies(ka, 5))) == 5 and shared_dummies(ka, 5) == shared_dummies(kb, 5)
    rng = SeededRandom(5)
    draws = np.array([dummy_count(bytes(rng.integers(256, 32).astype(np.uint8)), 1.5, 40) - 40
                      for _ in range(3000)])
    # Discrete Laplace of scale 2 (each of the padding's three draws gets a third of padding epsilon 1.5): P(X = k) = (1 - q) / (1 + q) q^|k|, q = exp(-1/2); none clamped at offset 40.
    q = np.exp(-0.5)
    ks = np.arange(-12, 13)
    expected = (1 - q) / (1 + q) * q ** np.abs(ks)
    observed = np.array([np.sum(draws == k) for k in ks])
    inside = expected.sum()
    chi2 = stats.chisquare(observed, expected / inside * observed.sum())
    assert chi2.pvalue > 1e-6, chi2


def test_placement_checks_refuse_malformed_or_foreign_positions() -> None:
    ka, _ = _keys()
    own = pseudonyms(ka, [f"id{i}" for i in range(10)])
    theirs = pseudonyms(ka, [f"id{i}" for i in range(5, 20)])
    pa, pb = place(own, theirs, 100, SeededRandom(1))
    check_placement(own, pa, 100)
    check_placement(theirs, pb, 100)
    assert all(pa[p] == pb[p] for p in set(pa) & set(pb))  # matched pairs share a position
    assert len(set(pa.values()) | set(pb.values())) == 20
    bad: list[tuple[dict[bytes, Any], str]] = [
        ({k: v for k, v in list(pa.items())[1:]}, "1 missing"),
        ({**pa, theirs[-1]: 99}, "1 foreign"),
        ({**pa, own[0]: 100}, "outside"),
        ({**pa, own[0]: pa[own[1]]}, "two records at one position"),
        ({**pa, own[0]: True}, "outside"),
    ]
    for placement, message in bad:
        with pytest.raises(InvalidInputError, match=message):
            check_placement(own, placement, 100)
    with pytest.raises(InvalidInputError, match="do not fit the study's join capacity 19: open"):
        place(own, theirs, 19, SeededRandom(1))
    with pytest.raises(InvalidInputError, match="appears twice"):
        place([own[0], own[0]], theirs, 100, SeededRandom(1))
    with pytest.raises(InvalidInputError, match="32 bytes"):
        place([b"short"], theirs, 100, SeededRandom(1))


def test_an_owner_cannot_tell_matched_from_unmatched_records_by_their_positions() -> None:
    """Positions of A's matched and unmatched records follow one distribution (seeded, many placements)."""
    ka, _ = _keys()
    a = pseudonyms(ka, [f"c{i}" for i in range(40)])
    b = pseudonyms(ka, [f"c{i}" for i in range(20, 70)])  # A's 20..39 match
    capacity = 4 * SLOTS
    matched: list[int] = []
    unmatched: list[int] = []
    rng = SeededRandom(11)
    for _ in range(300):
        pa, _pb = place(a, b, capacity, rng)
        matched += [pa[p] for p in a[20:]]
        unmatched += [pa[p] for p in a[:20]]
    ks = stats.ks_2samp(matched, unmatched)
    assert ks.pvalue > 1e-6, ks
    groups_m, groups_u = Counter(p // SLOTS for p in matched), Counter(p // SLOTS for p in unmatched)
    table = np.array([[groups_m[g] for g in range(4)], [groups_u[g] for g in range(4)]])
    assert stats.chi2_contingency(table).pvalue > 1e-6
    both = matched + unmatched  # and every position of the capacity is equally likely
    assert stats.kstest(np.array(both) / capacity, "uniform").pvalue > 1e-6


def _plain_join(a: dict[str, int], b: dict[str, int], shape: tuple[int, int]) -> np.ndarray:
    out = np.zeros(shape, dtype=np.int64)
    for ident in set(a) & set(b):
        out[a[ident], b[ident]] += 1
    return out


def _uploads(pub: JoinScheme, a: dict[str, int], b: dict[str, int], shape: tuple[int, int], capacity: int,
             seed: int, dummies: int = 0) -> tuple[list[list[bytes]], list[list[bytes]]]:
    """Both owners' side of the protocol: pseudonyms (+ shared dummies), checked placement, encrypted planes."""
    ka, kb = _keys()
    pa_ps = pseudonyms(ka, list(a)) + shared_dummies(ka, dummies)
    pb_ps = pseudonyms(kb, list(b)) + shared_dummies(kb, dummies)
    place_a, place_b = place(pa_ps, pb_ps, capacity, SeededRandom(seed))
    check_placement(pa_ps, place_a, capacity)
    check_placement(pb_ps, place_b, capacity)
    val_a = {p: a[i] for p, i in zip(pa_ps, a)}
    val_b = {p: b[i] for p, i in zip(pb_ps, b)}
    planes_a = encode_indicators(place_a, val_a, shape[0], capacity, SLOTS)
    planes_b = encode_indicators(place_b, val_b, shape[1], capacity, SLOTS)
    return ([[pub.serialize(pub.encrypt(p)) for p in g] for g in planes_a],
            [[pub.serialize(pub.encrypt(p)) for p in g] for g in planes_b])


def _run(schemes: tuple[JoinScheme, JoinScheme], a: dict[str, int], b: dict[str, int], shape: tuple[int, int],
         capacity: int, epsilon: float, seed: int, dummies: int = 0) -> tuple[Any, list[Any]]:
    """The identity release of the table with the library functions: (noisy row-major counts, what arrived)."""
    ds, pub = schemes
    up_a, up_b = _uploads(pub, a, b, shape, capacity, seed, dummies)
    cts_a = [[pub.deserialize(x) for x in g] for g in up_a]
    cts_b = [[pub.deserialize(x) for x in g] for g in up_b]
    m = PartitionSums(shape[0] * shape[1], epsilon, 1, starts=tuple(range(shape[0] * shape[1])))
    sent = noised_values(pub, joint_totals(pub, cts_a, cts_b), m, SeededRandom(seed + 1))
    arrived = [ds.deserialize_released(pub.serialize(c)) for c in sent]
    counts = decrypt_values(ds, arrived, m, SeededRandom(seed + 2)).reshape(shape)
    return _Cells(counts, 2 * m.noise_variance), arrived


class _Cells:
    def __init__(self, counts: np.ndarray, variance: float) -> None:
        self.counts, self.variance = counts, variance


def _release(schemes: tuple[JoinScheme, JoinScheme], terms: JoinTerms, up: tuple[Any, Any], epsilon: float,
             seed: int, executor: ChunkExecutor | None) -> Summary:
    """A whole release of the table through JoinEvaluator and the study's strategy (library path)."""
    ds, pub = schemes
    with JoinEvaluator(pub.public_bytes(), up[0], up[1], bin_cells(terms), SeededRandom(seed),
                       executor=executor) as ev:
        return release_table(ev.measure, ds, terms, epsilon, SeededRandom(seed + 100))[0]


def _data(n_a: int, n_b: int, shared: int, shape: tuple[int, int], seed: int) -> tuple[dict[str, int], dict[str, int]]:
    rng = np.random.default_rng(seed)
    ids = [f"person-{i}" for i in range(n_a + n_b - shared)]
    a = {i: int(rng.integers(shape[0])) for i in ids[:n_a]}
    b = {i: int(rng.integers(shape[1])) for i in ids[n_a - shared:]}
    return a, b


def test_the_encrypted_join_equals_the_plaintext_join(schemes: tuple[JoinScheme, JoinScheme]) -> None:
    shape = (3, 4)
    a, b = _data(900, 700, 400, shape, seed=1)
    truth = _plain_join(a, b, shape)
    exact, _ = _run(schemes, a, b, shape, capacity=2 * SLOTS, epsilon=1e9, seed=3, dummies=25)
    assert np.array_equal(exact.counts, truth)  # noise of scale 1e-9 rounds to 0: the arithmetic is exact
    noisy, _ = _run(schemes, a, b, shape, capacity=2 * SLOTS, epsilon=1.0, seed=4)
    assert noisy.variance == pytest.approx(2 * 2 * np.exp(-1) / (1 - np.exp(-1)) ** 2)
    assert np.all(np.abs(noisy.counts - truth) <= 8 * np.sqrt(noisy.variance))
    assert not np.array_equal(noisy.counts, truth)


def test_the_flood_residues_are_those_of_one_wide_integer_per_coefficient(
        schemes: tuple[JoinScheme, JoinScheme]) -> None:
    """The vectorized flood reduces the same integer mod every prime as Python's big integers would."""
    moduli = schemes[1].moduli
    rng = np.random.default_rng(11)
    words = rng.integers(0, 2 ** 64, (4000, 2), dtype=np.uint64, endpoint=False)
    edges = np.array([[0, 0], [2 ** 64 - 1, 2 ** 64 - 1], [0, 2 ** 64 - 1], [2 ** 64 - 1, 0],
                      [0, 1 << (FLOOD_BITS - 64)], [2 ** 64 - 1, (1 << (FLOOD_BITS - 64)) - 1]], dtype=np.uint64)
    words = np.concatenate([words, edges])
    width = 1 << (FLOOD_BITS + 1)
    wide = [((int(hi) << 64) | int(lo)) % width - (width >> 1) for lo, hi in words]
    assert min(wide) == -(width >> 1) and max(wide) == (width >> 1) - 1  # the edges reach both ends
    got = flood_residues(words, moduli)
    for j, q in enumerate(moduli):
        assert got[j].tolist() == [x % q for x in wide]


def test_the_key_holder_takes_released_values_at_the_full_or_the_last_level_only(
        schemes: tuple[JoinScheme, JoinScheme]) -> None:
    """What `noised` sends is at the last data level (a third of the bytes); the key holder's parser accepts that
    level and the full one, and refuses a middle level, a 3-part product and garbage with InvalidInputError."""
    import tenseal.sealapi as seal

    ds, pub = schemes
    fresh = pub.encrypt([5])
    sent = pub.serialize(pub.noised(fresh, [2], 1, lambda k: np.zeros(k, dtype=np.int64)))
    assert len(sent) < len(pub.serialize(fresh)) / 2
    assert ds.decrypt(ds.deserialize_released(sent))[0] == 7
    assert ds.noise_budget(ds.deserialize_released(sent)) >= MIN_NOISE_BUDGET_BITS
    assert ds.decrypt(ds.deserialize_released(pub.serialize(fresh)))[0] == 5  # the full level still parses
    middle = seal.Ciphertext()
    seal.Evaluator(pub.context).mod_switch_to_next(fresh, middle)
    with pytest.raises(InvalidInputError, match="full or the last data level"):
        ds.deserialize_released(pub.serialize(middle))
    with pytest.raises(InvalidInputError, match="full or the last data level"):
        ds.deserialize_released(pub.serialize(pub.multiply_accumulate(None, fresh, fresh)))
    with pytest.raises(InvalidInputError):
        ds.deserialize_released(b"garbage")
    with pytest.raises(InvalidInputError, match="full modulus level"):
        pub.deserialize(sent)  # an owner's upload is still refused below the full level


def test_the_key_holder_sees_flooded_noise_and_refuses_foreign_ciphertexts(
        schemes: tuple[JoinScheme, JoinScheme]) -> None:
    ds, pub = schemes
    shape = (2, 2)
    a, b = _data(300, 300, 150, shape, seed=2)
    _, arrived = _run(schemes, a, b, shape, capacity=SLOTS, epsilon=1.0, seed=9)
    budget = ds.noise_budget(arrived[0])
    assert budget >= MIN_NOISE_BUDGET_BITS
    assert list(arrived[0].parms_id()) == list(ds.context.last_parms_id())  # flooded, then switched down
    residual = np.array(residual_view(ds, arrived[0]), dtype=object).astype(float)
    width = ds.flood_width(arrived[0])
    assert 2.0 ** 10 < width < 2.0 ** 12  # 2^111 scaled by the last prime (60 bits) over q (160 bits)
    assert stats.kstest(residual / width + 0.5, "uniform").pvalue > 1e-9  # the flood, whatever the data
    slots = ds.decrypt(arrived[0])
    pads = slots[1:] % ds.plain_modulus
    assert stats.kstest(pads / ds.plain_modulus, "uniform").pvalue > 1e-9  # every unused slot is a pad
    # Without flooding the noise of a product is far narrower and data-dependent: that is what flooding hides.
    pub.flooding = False
    try:
        _, bare = _run(schemes, a, b, shape, capacity=SLOTS, epsilon=1.0, seed=9)
    finally:
        pub.flooding = True
    raw = np.array(residual_view(ds, bare[0]), dtype=object)
    assert max(abs(int(v)) for v in raw) < 2 ** 56 < 2 ** FLOOD_BITS
    other = JoinScheme.generate()
    with pytest.raises(PrecisionError, match="noise budget"):
        ds.decrypt(ds.deserialize(other.serialize(other.encrypt([1, 2, 3]))))
    with pytest.raises(InvalidInputError):
        pub.deserialize(b"garbage")
    import tenseal.sealapi as seal

    lower = seal.Ciphertext()
    seal.Evaluator(pub.context).mod_switch_to_next(pub.encrypt([1]), lower)
    with pytest.raises(InvalidInputError, match="full modulus level"):
        pub.deserialize(pub.serialize(lower))
    with pytest.raises(InvalidInputError, match="equal counts"):
        joint_totals(pub, [[pub.encrypt([1])]], [])


@pytest.mark.parametrize("release,order", [(r, "row") for r in JOIN_RELEASES] + [("hier", "hilbert"),
                                                                                     ("gap", "hilbert")])
def test_every_strategy_releases_the_encrypted_table_exactly_in_one_process_and_in_workers(
        schemes: tuple[JoinScheme, JoinScheme], release: str, order: str, two_workers: ProcessExecutor) -> None:
    """At a huge epsilon the noise rounds to 0: each partition sum equals the plaintext join's sum over its bins
    (whatever partition the strategy chose), in one process and with two workers whose blocks split partitions."""
    shape = (4, 4)
    a, b = _data(700, 600, 450, shape, seed=5)
    truth = _plain_join(a, b, shape).ravel()
    terms = JoinTerms(4, 4, SLOTS, 1.0, 0, release=release, order=order)
    up = _uploads(schemes[1], a, b, shape, SLOTS, seed=2)
    flat = truth[bin_cells(terms)]
    for workers, executor in ((1, None), (2, two_workers)):
        s = _release(schemes, terms, up, 1e9, seed=3, executor=executor)
        ends = [*s.starts[1:], 16]
        assert list(s.sums) == [int(flat[lo:hi].sum()) for lo, hi in zip(s.starts, ends)], (release, workers)
        assert s.params["join"]["release"] == release and s.params["join"]["order"] == order
        est, se = cell_table(s)
        assert est.shape == se.shape == shape and est.sum() == pytest.approx(truth.sum())
        if release == "cells":
            assert np.array_equal(est, truth.reshape(shape).astype(float))


def test_measured_values_match_the_plaintext_layout_and_stay_narrow_for_the_key_holder(
        schemes: tuple[JoinScheme, JoinScheme], two_workers: ProcessExecutor) -> None:
    """The +-1 terms of each measurement equal its decode map on prefix sums (the ordinary studies' layout), and
    the widest value (the total of every cell) keeps its unflooded noise far below the flood."""
    from he_partition.core.measurements import HaarCoefficients, PrefixDifferences, owner_encoding

    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 16, 64):
        x = rng.integers(0, 40, n)
        starts = tuple(sorted({0, *map(int, rng.integers(0, n, 3))}))
        depth = int(np.ceil(np.log2(n))) if n > 1 else 0
        for m in (PrefixDifferences(n, 1.0, 2), PartitionSums(n, 1.0, 1, starts=starts),
                  HaarCoefficients(n, 1.0, 1 + depth)):
            assert np.array_equal(apply_terms(measurement_terms(m), x), m.decode(owner_encoding(x))), (n, m.kind)
    ds, pub = schemes
    shape = (4, 4)
    a, b = _data(400, 400, 200, shape, seed=8)
    up = _uploads(pub, a, b, shape, SLOTS, seed=4)
    totals = joint_totals(pub, [[pub.deserialize(x) for x in g] for g in up[0]],
                          [[pub.deserialize(x) for x in g] for g in up[1]])
    m = PartitionSums(16, 1.0, 1, starts=(0,))
    pub.flooding = False
    try:
        total = noised_values(pub, [pub.signed_sum([(1, t) for t in totals])], m, SeededRandom(1))
    finally:
        pub.flooding = True
    arrived = ds.deserialize(pub.serialize(total[0]))
    assert ds.decrypt(arrived)[0] - int(np.sum(_plain_join(a, b, shape))) in range(-40, 41)  # the total + its draw
    raw = np.array(residual_view(ds, arrived), dtype=object)
    assert max(abs(int(v)) for v in raw) < 2 ** 60 < 2 ** FLOOD_BITS
    assert ds.noise_budget(arrived) >= MIN_NOISE_BUDGET_BITS
    # What the evaluator sends for the same value (over two workers, so it is summed from partials): flooded.
    terms = JoinTerms(4, 4, SLOTS, 1.0, 0, release="hier")
    with JoinEvaluator(pub.public_bytes(), up[0], up[1], bin_cells(terms), SeededRandom(1),
                       executor=two_workers) as ev:
        sent = ds.deserialize_released(ev.measure(m)[0])
    width = ds.flood_width(sent)
    view = np.array(residual_view(ds, sent), dtype=object).astype(float)
    assert stats.kstest(view / width + 0.5, "uniform").pvalue > 1e-9
    assert ds.noise_budget(sent) >= MIN_NOISE_BUDGET_BITS


def test_datasets_with_the_same_table_look_alike_to_the_key_holder(schemes: tuple[JoinScheme, JoinScheme]) -> None:
    """Two datasets with equal joint tables but different people: the key holder's residual views of a cell are
    draws from one distribution (the flood), not a function of who matched."""
    ds, _ = schemes
    shape = (2, 2)
    a1, b1 = _data(300, 300, 120, shape, seed=7)
    truth = _plain_join(a1, b1, shape)
    # Same table, other people: rename everyone, keep each shared person's cell.
    a2 = {f"other-{k}": v for k, v in a1.items()}
    b2 = {f"other-{k}": v for k, v in b1.items()}
    assert np.array_equal(_plain_join(a2, b2, shape), truth)
    views = []
    for a, b, seed in ((a1, b1, 21), (a2, b2, 22)):
        _, arrived = _run(schemes, a, b, shape, capacity=SLOTS, epsilon=1.0, seed=seed)
        views.append(np.array(residual_view(ds, arrived[0]), dtype=object).astype(float))
    assert stats.ks_2samp(views[0], views[1]).pvalue > 1e-9
    width = ds.flood_width(arrived[0])
    assert all(stats.kstest(v / width + 0.5, "uniform").pvalue > 1e-9 for v in views)


def test_each_worker_receives_only_the_ciphertexts_of_its_cells(schemes: tuple[JoinScheme, JoinScheme]) -> None:
    """Two workers over a row-major 4 x 3 table: the first block (rows 0-1) gets A's planes of rows 0-1 and all
    of B's; nothing of A's rows 2-3 (the uploads are not copied whole into every worker)."""
    _, pub = schemes
    a = [[f"a{g}{i}".encode() for i in range(4)] for g in range(3)]
    b = [[f"b{g}{j}".encode() for j in range(3)] for g in range(3)]
    ev = JoinEvaluator(pub.public_bytes(), a, b, list(range(12)), SeededRandom(1), executor=ProcessExecutor(2))
    first, second = (ev._make(w)[1][1:3] for w in range(2))  # what each worker is sent: (A's planes, B's)
    assert first[0] == [[f"a{g}{i}".encode() if i < 2 else b"" for i in range(4)] for g in range(3)]
    assert second[0] == [[f"a{g}{i}".encode() if i >= 2 else b"" for i in range(4)] for g in range(3)]
    assert first[1] == second[1] == b
