"""What reaches the decryption server is recorded; a garbage upload; `spend_rest` with nothing left."""

from __future__ import annotations

import dataclasses
from typing import Iterator

import grpc
import numpy as np
import pytest

from he_partition.core.measurements import PartitionSums
from he_partition.he.bfv import BfvBackend, load_context
from parties.common.errors import ServiceError
from parties.decryption.arrivals import ARRIVALS_FILE, ArrivalLog

from .adversarial_cs import AdversarialComputationServer
from .conftest import Cluster, blocky_histograms, status_of


def test_chunks_whose_charge_failed_are_recorded(cluster: Cluster) -> None:
    """A concurrent release takes the budget while this request's chunks are on the wire: the charge
    fails (RESOURCE_EXHAUSTED), and the arrival is still recorded, with nothing charged."""
    contract = cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    adv = AdversarialComputationServer(cluster.decryption(), contract, {"a": b""}, blocky_histograms(64, 1))
    m = PartitionSums(64, 0.6, 1, starts=(0,))
    racing = adv.chunks(m, np.zeros(1, dtype=np.int64))
    rival = AdversarialComputationServer(cluster.decryption(), contract, {"a": b""}, adv.histograms)

    def late_chunks() -> Iterator[bytes]:
        # The header (release r-slow, epsilon 0.6) has passed the dry run; now r-fast takes 0.6 first.
        assert rival.ask("r-fast", 0.6, m, racing) is not None
        yield from racing

    with pytest.raises(ServiceError) as ei:
        adv.ds.decrypt_measurement(study_id="s1", release_id="r-slow", release_epsilon=0.6, measurement=m,
                                   chunks=late_chunks(), chunk_count=1, contract_hash=contract.contract_hash)
    assert status_of(ei) == grpc.StatusCode.RESOURCE_EXHAUSTED
    rows = {r.release_id: r for r in cluster.ds.handler.arrivals.rows("s1")}
    assert (rows["r-fast"].outcome, rows["r-fast"].epsilon_charged) == ("answered", 0.6)
    assert (rows["r-slow"].outcome, rows["r-slow"].epsilon_charged, rows["r-slow"].chunks) == ("refused", 0.0, 1)
    assert rows["r-slow"].reason.startswith("BudgetExhaustedError")
    assert rows["r-slow"].ciphertext_digest == rows["r-fast"].ciphertext_digest
    # The record is a file in the data directory and survives a restart.
    cluster.restart_ds()
    kept = ArrivalLog(cluster.root / "ds" / ARRIVALS_FILE)
    try:
        assert [r.release_id for r in kept.rows("s1")] == ["r-fast", "r-slow"]
    finally:
        kept.close()


def test_one_owner_uploading_garbage_costs_one_measurement_and_says_so(cluster: Cluster) -> None:
    """Owner b uploads values uniform mod t under the right key (it passes the noise-budget check).

    The release fails at its first measurement with INVALID_ARGUMENT naming the cause; the
    ledger spent only that measurement's share (gap: 0.2 of the release), the release's
    declared epsilon stays reserved (ledger rule), and the arrival is recorded as refused
    with what it cost. Which owner it was cannot be told by the DS (it sees only the sum).
    """
    cluster.open_study(domain_size=64, owners=("a", "b"), epsilon=1.0)
    cluster.owner("a").submit("s1", blocky_histograms(64, 1)[0])
    b = cluster.owner("b")
    enc = b.encrypt("s1", np.zeros(64, dtype=np.int64))
    be = BfvBackend(load_context(cluster.decryption().public_context(study_id="s1")))
    garbage = np.random.default_rng(3).integers(0, be.plain_modulus, 64)
    enc = dataclasses.replace(enc, chunks=tuple(be.serialize_chunk(c) for c in be.encrypt(garbage).chunks))
    b.upload(enc, idempotency_key="garbage")
    with pytest.raises(ServiceError) as ei:
        cluster.computation().run_release("s1", epsilon=0.5)
    assert status_of(ei) == grpc.StatusCode.INVALID_ARGUMENT
    # the one text of every refusal after the charge, which names this cause among the others
    assert "refused after the charge" in ei.value.details and "an owner's values out of range" in ei.value.details
    budget = cluster.decryption().budget("s1")
    assert [c.epsilon for c in budget.charges] == [pytest.approx(0.1)]
    assert budget.reserved == pytest.approx(0.5) and budget.available == pytest.approx(0.5)
    rows = cluster.ds.handler.arrivals.rows("s1")
    assert [(r.kind, r.outcome) for r in rows] == [("prefix_differences", "refused")]
    assert rows[0].epsilon_charged == pytest.approx(0.1)


def test_spend_rest_with_only_a_rounding_leftover_is_resource_exhausted(cluster: Cluster) -> None:
    """1 - 0.9999999999999999 leaves 1e-16: formerly a release at that epsilon failed with INTERNAL."""
    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    cs = cluster.computation()
    cs.run_release("s1", epsilon=0.9999999999999999)
    assert 0 < cluster.decryption().budget("s1").available < 1e-9
    before = cluster.decryption().budget("s1").charges
    with pytest.raises(ServiceError) as ei:
        cs.run_release("s1", epsilon="rest")
    assert status_of(ei) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "1e-16 of 1" in ei.value.details and "nothing was decrypted" in ei.value.details
    assert cluster.decryption().budget("s1").charges == before
