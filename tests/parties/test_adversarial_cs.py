"""A deviating computation server against a REAL decryption server (gRPC, port 0): what it can no longer learn.

Each test is one attack a deviating computation server could try; the double is
`adversarial_cs.AdversarialComputationServer`. The studies are signed and the double forwards
the owners' signed c1 parts first, as a computation server does: it then chooses c0 only (its
draws, pads and flood), and the DS decrypts with the owners' aggregate c1. The claims are listed,
with these tests, in docs/threat-model.md ("What a deviating computation server learns from the
decryption server").
"""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest

from he_partition.core.measurements import MAX_DECODED_MAGNITUDE, PartitionSums
from parties.common.errors import ServiceError

from .adversarial_cs import AdversarialComputationServer
from .conftest import Cluster, blocky_histograms, join_cells, status_of


def _adversary(cluster: Cluster, *, epsilon: float, owners: tuple[str, ...] = ("a", "b"),
               forward: bool = True) -> AdversarialComputationServer:
    contract = cluster.open_study(domain_size=64, owners=owners, epsilon=epsilon, signed=True)
    hs = blocky_histograms(64, owners=len(owners))
    adv = AdversarialComputationServer(cluster.decryption(), contract,
                                       {o: cluster.signing_key(o)[0] for o in owners}, hs)
    if forward:
        assert adv.forward() == 1
    return adv


def _refusal(adv: AdversarialComputationServer, release_id: str, epsilon: float, m: PartitionSums,
             chunks: list[bytes]) -> ServiceError:
    with pytest.raises(ServiceError) as ei:
        adv.ask(release_id, epsilon, m, chunks)
    return ei.value


def test_the_refusal_oracle_no_longer_finds_the_sum_and_every_step_is_charged(cluster: Cluster) -> None:
    """Measured against an earlier design: a binary search on refusals recovered a partition sum exactly.

    Now the magnitude check runs on values that carry the DS's own draw, fresh for each
    request: four searches of 16 steps at epsilon 1/16 (DS noise scale 16) do not all end on
    the sum nor on one value, and all 64 steps are charged. On the former code every search
    returned the sum exactly. (The refusal caps are raised here to show the draw alone; at the
    default caps the search stops after 8 refusals: test_decryption_oracle.py.)
    """
    adv = _adversary(cluster, epsilon=4.0)
    cluster.ds.handler.refusals.per_study = cluster.ds.handler.refusals.per_key = 1000
    total = int(sum(h.sum() for h in adv.histograms))
    found = [adv.refusal_oracle_search(1 / 16, 16, prefix=f"probe{k}") for k in range(4)]
    # One noisy search can land on the sum by chance (a few per cent: the draws depend on the
    # ciphertexts, whose encryption randomness is not seeded); four that all do, or four equal
    # results, would mean the answers are not carrying fresh draws (chance below 1e-5).
    assert found != [total] * 4, (found, total)
    assert len(set(found)) > 1, found
    # Off by about the DS's noise at the epsilon paid (scale 16 per step), not by anything larger.
    assert all(abs(f - total) < 16 * 40 for f in found), (found, total)
    budget = cluster.decryption().budget("s1")
    assert len(budget.charges) == 64
    assert budget.spent == pytest.approx(4.0, abs=1e-12)


def test_a_refusal_is_charged_and_recorded(cluster: Cluster) -> None:
    adv = _adversary(cluster, epsilon=1.0)
    m = PartitionSums(64, 0.25, 1, starts=(0,))
    assert adv.ask("r1", 0.25, m, adv.chunks(m, np.array([MAX_DECODED_MAGNITUDE]))) is None  # certainly too large
    assert [c.epsilon for c in cluster.decryption().budget("s1").charges] == [0.25]
    rows = cluster.ds.handler.arrivals.rows("s1")
    assert [(r.release_id, r.outcome, r.epsilon_charged) for r in rows] == [("r1", "refused", 0.25)]
    assert "refused after the charge" in rows[0].reason  # which check refused is not said


def test_a_replay_gets_the_same_answer_so_draws_cannot_be_averaged(cluster: Cluster) -> None:
    """The same request (same bytes, same release) is answered with the same DS draw, even after a
    restart, and charged once; on an earlier code each replay carried a fresh draw, so averaging replays shrank
    the DS noise."""
    adv = _adversary(cluster, epsilon=1.0)
    m = PartitionSums(64, 0.1, 1, starts=(0, 16, 32, 48))
    chunks = adv.chunks(m, np.zeros(4, dtype=np.int64))
    first = adv.ask("r1", 0.5, m, chunks)
    second = adv.ask("r1", 0.5, m, chunks)
    cluster.restart_ds()
    adv.ds = cluster.decryption()
    third = adv.ask("r1", 0.5, m, chunks)
    assert first is not None and second is not None and third is not None
    truth = np.array([h.reshape(4, 16).sum(axis=1) for h in adv.histograms]).sum(axis=0)
    assert not np.array_equal(first, truth)  # the DS's draw is there
    assert np.array_equal(first, second) and np.array_equal(first, third)
    # the same values again say nothing new: paid once (a key holder that charged, then died before its reply,
    # answers the computation server's re-sent request from that charge; it was charged again before)
    assert len(cluster.decryption().budget("s1").charges) == 1


def test_two_different_ciphertexts_never_share_the_ds_draw(cluster: Cluster) -> None:
    """Fixing the draw per request must not let a difference of two answers cancel it: the CS asks for
    the same measurement twice in one release, with its own draws 0 and 1000 (two different c0s)."""
    adv = _adversary(cluster, epsilon=10.0)
    m = PartitionSums(64, 0.2, 1, starts=(0,))
    differences = []
    # Two independent draws at scale 5 coincide with probability about 0.05, so one pair could
    # match by chance; a shared draw would match in every one of six (chance 0.05^6 < 2e-8).
    for k in range(6):
        zero = adv.ask(f"r{k}", 0.4, m, adv.chunks(m, np.zeros(1, dtype=np.int64)))
        shifted = adv.ask(f"r{k}", 0.4, m, adv.chunks(m, np.full(1, 1000, dtype=np.int64)))
        assert zero is not None and shifted is not None
        differences.append(int(shifted[0] - zero[0]))
    assert differences != [1000] * 6


def test_dropping_an_owner_is_refused_and_charged(cluster: Cluster) -> None:
    """The CS can no longer ask for the aggregate without owner b (the former differencing attack): the DS
    decrypts owner a's c0 with the signed c1 of a and b, which is noise, refused by the integrity check after
    the charge (the check reads the secret key: its refusal is paid for and says only "refused after the charge")."""
    adv = _adversary(cluster, epsilon=10.0)
    m = PartitionSums(64, 0.2, 1, starts=(0,))
    without_b = adv.uploads["a"]
    assert adv.ask("r1", 0.4, m, adv.chunks(m, np.zeros(1, dtype=np.int64), aggregate=without_b)) is None
    assert [r.outcome for r in cluster.ds.handler.arrivals.rows("s1")] == ["refused"]
    assert [c.epsilon for c in cluster.decryption().budget("s1").charges] == [pytest.approx(0.2)]  # m.epsilon
    # and closing on owner a alone, then forwarding its parts, is refused: the uploads closed on a and b
    with pytest.raises(ServiceError) as ei:
        adv.forward(["a"])
    assert status_of(ei) == grpc.StatusCode.FAILED_PRECONDITION and "closed on" in ei.value.details


def test_the_ds_decrypts_with_the_signed_c1_not_the_one_it_is_sent(cluster: Cluster) -> None:
    """A chunk's c1 is the owners' aggregate the DS verified: the honest c0 sent with a crafted c1 (decrypted as
    sent it would be noise) is answered like the honest chunk, the truth plus a DS draw (a fresh one: another
    request), and charged as another request."""
    from he_partition.he.bfv import _CiphertextCodec
    from he_partition.he.threshold.c1 import ciphertext_parts
    from he_partition.he.threshold.context import vector_ciphertext

    adv = _adversary(cluster, epsilon=1.0)
    m = PartitionSums(64, 0.1, 1, starts=(0, 32))
    honest = adv.chunks(m, np.zeros(2, dtype=np.int64))
    _, moduli, polys = ciphertext_parts(adv.backend.context, vector_ciphertext(honest[0]))
    polys[1] = np.array([[(q // 3 + i) % q for i in range(polys.shape[2])] for q in moduli], dtype=np.uint64)
    crafted = [_CiphertextCodec(adv.backend.context, adv.backend.slots).vector_bytes(polys)]
    first, second = adv.ask("r1", 0.5, m, honest), adv.ask("r1", 0.5, m, crafted)
    truth = np.array([h.reshape(2, 32).sum(axis=1) for h in adv.histograms]).sum(axis=0)
    assert first is not None and second is not None
    assert np.all(np.abs(first - truth) < 40 * float(m.scale)) and np.all(np.abs(second - truth) < 40 * float(m.scale))
    assert len(cluster.decryption().budget("s1").charges) == 2


def test_a_signed_study_with_nothing_forwarded_is_refused_and_nothing_is_charged(cluster: Cluster) -> None:
    adv = _adversary(cluster, epsilon=1.0, forward=False)
    m = PartitionSums(64, 0.1, 1, starts=(0,))
    err = _refusal(adv, "r1", 0.1, m, adv.chunks(m, np.zeros(1, dtype=np.int64)))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and "no owners' signed c1 parts" in err.details
    assert cluster.decryption().budget("s1").charges == ()


def test_tiny_epsilons_are_refused_before_anything_is_charged(cluster: Cluster) -> None:
    """An epsilon whose noise alone would pass the decode bound answers nothing and costs nothing.

    On the former code the charge came first and the sampler then failed (INTERNAL, budget spent).
    """
    adv = _adversary(cluster, epsilon=1.0)
    m = PartitionSums(64, 1e-14, 1, starts=(0,))
    with pytest.raises(ServiceError) as ei:
        adv.ask("tiny", 1e-14, m, adv.chunks(m, np.zeros(1, dtype=np.int64)))
    assert status_of(ei) == grpc.StatusCode.INVALID_ARGUMENT
    assert "too small" in ei.value.details and "nothing was charged" in ei.value.details
    assert cluster.decryption().budget("s1").charges == ()
    assert [r.outcome for r in cluster.ds.handler.arrivals.rows("s1")] == ["refused"]


def test_pads_reused_across_chunks_do_not_change_what_is_answered(cluster: Cluster) -> None:
    """Pads are never decoded: the same extreme pad in every free slot of every chunk is answered like
    fresh pads (values = truth + the CS's draw + the DS's draw), and no refusal depends on them."""
    adv = _adversary(cluster, epsilon=1.0)
    t = adv.backend.plain_modulus
    m = PartitionSums(64, 0.25, 1, starts=(0, 32))
    extreme = adv.ask("r1", 0.5, m, adv.chunks(m, np.zeros(2, dtype=np.int64),
                                               pad=lambda k: np.full(k, t // 2, dtype=np.int64)))
    fresh = adv.ask("r2", 0.5, m, adv.chunks(m, np.zeros(2, dtype=np.int64)))
    assert extreme is not None and fresh is not None
    truth = np.array([h.reshape(2, 32).sum(axis=1) for h in adv.histograms]).sum(axis=0)
    scale = float(m.scale)
    assert np.all(np.abs(extreme - truth) < 40 * scale)
    assert np.all(np.abs(fresh - truth) < 40 * scale)


def test_a_scaled_aggregate_does_not_shrink_the_ds_noise(cluster: Cluster) -> None:
    """A CS multiplies the aggregate by c = 4096 (plain multiply, no keys needed), hoping the DS's draw at
    scale 100 is divided by 4096 so that rounding recovers the exact total. The DS decrypts the scaled c0
    with the owners' unscaled c1: noise, refused by the integrity check after the charge (or, were it
    answered, nothing near c x total). What the CS gets at epsilon 0.01 is the honest answer, with the
    DS's draw at scale 100."""
    adv = _adversary(cluster, epsilon=1.0)
    total = int(sum(h.sum() for h in adv.histograms))
    c = 4096
    scaled = type(adv.aggregate)(adv.aggregate.length, tuple(ch * c for ch in adv.aggregate.chunks))
    m = PartitionSums(64, 0.01, 1, starts=(0,))
    answer = adv.ask("r1", 0.01, m, adv.chunks(m, np.zeros(1, dtype=np.int64), aggregate=scaled))
    assert answer is None or round(int(answer[0]) / c) != total
    assert [ch.epsilon for ch in cluster.decryption().budget("s1").charges] == [0.01]  # refused or not: paid
    # the honest measurement at the same epsilon: the total plus the DS's draw (scale 100), never divided
    errors = []
    for k in range(4):
        honest = adv.ask(f"h{k}", 0.01, m, adv.chunks(m, np.zeros(1, dtype=np.int64)))
        assert honest is not None
        errors.append(int(honest[0]) - total)
    assert any(e != 0 for e in errors) and all(abs(e) < 100 * 40 for e in errors), errors
    assert [ch.epsilon for ch in cluster.decryption().budget("s1").charges] == [0.01] * 5


def _pass_join_check(ds: Any, contract: Any, scheme: Any) -> None:
    """Play the computation server's well-formedness check (here over empty uploads: the key holder records the
    outcome of residues it decrypts; it never sees the uploads themselves)."""
    from he_partition.join.wellformed import residues

    seed, _ = ds.join_check_seed(study_id=contract.study_id, contract_hash=contract.contract_hash)
    terms = contract.join_terms()
    for side, owner in enumerate(contract.expected_owners):
        empty = [[scheme.serialize(scheme.encrypt([0])) for _ in range(terms.values_of(side))]]
        assert ds.check_join_upload(study_id=contract.study_id, contract_hash=contract.contract_hash, owner_id=owner,
                                    seed=seed, residues=residues(scheme, empty, seed, owner))


def test_a_replayed_join_measurement_gets_the_same_answer(cluster: Cluster) -> None:
    """The join key holder fixes its draw per request too: the same cells in the same release are answered
    with the same draw (and charged again); on the former code each replay carried a fresh draw."""
    j = join_cells(cluster, (7, 0, 3, 12))
    contract, ds, scheme, cells, m = j.contract, j.decryption, j.scheme, j.cells, j.measurement
    _pass_join_check(ds, contract, scheme)
    answers = [ds.decrypt_join_cells(study_id="j1", release_id="r1", release_epsilon=1.0, measurement=m,
                                     contract_hash=contract.contract_hash, cells=cells, cell_count=4).values
               for _ in range(2)]
    assert not np.array_equal(answers[0], [7, 0, 3, 12])  # the key holder's draw is there
    assert np.array_equal(answers[0], answers[1])
    assert [c.kind for c in ds.budget("j1").charges] == ["join_padding", "partition_sums", "partition_sums"]
