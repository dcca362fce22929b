"""The budget check and charge are atomic: concurrent releases, decryptions and ledger writers (threads and
processes) can never spend more than a study's epsilon."""

from __future__ import annotations

import math
import multiprocessing as mp
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest

from he_partition.he.bfv import BfvBackend, load_context
from he_partition.core.errors import BudgetExhaustedError
from he_partition.core.measurements import PrefixDifferences, owner_encoding
from parties.common.config import ComputationConfig
from parties.common.contract import StudyContract
from parties.common.errors import ServiceError
from parties.computation.client import ComputationClient
from parties.computation.server import create_computation_server
from parties.data_owner.client import DataOwnerClient
from parties.decryption.ledger import SqliteLedgerStore

from .conftest import CS_ID, FAST_RETRY, OPERATOR_ID, Cluster

FP = "0123456789abcdef" * 4


def test_two_concurrent_releases_from_two_computation_servers_never_overspend(secure_cluster: Cluster) -> None:
    """Two computation-server replicas (same certificate, own stores) release the same study at once,
    each asking for 0.6 of a 1.0 budget: exactly one release gets decrypted, the other is refused."""
    cluster = secure_cluster
    contract = cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cs2 = create_computation_server(ComputationConfig(cluster.root / "cs2", cluster.ds.target, noise_seed=5,
                                                      tls=cluster.tls(CS_ID, "computation"))).start()
    try:
        targets = [cluster.cs.target, cs2.target]
        enc = None  # one encryption, uploaded to both replicas: the decryption server keeps one signed c1 per study
        for target in targets:
            with DataOwnerClient("a", computation=target, decryption=cluster.ds.target, progress=False,
                                 retry=FAST_RETRY, tls=cluster.tls("a", "data_owner"),
                                 signing_key=cluster.signing_key("a")[0]) as owner:
                enc = enc or owner.encrypt("s1", np.arange(64) % 5)
                owner.upload(enc, idempotency_key="k1")
        barrier = threading.Barrier(2)
        outcomes: list[object] = [None, None]

        def release(i: int) -> None:
            with ComputationClient(targets[i], tls=cluster.tls(OPERATOR_ID, "operator"), retry=FAST_RETRY) as op:
                barrier.wait()
                try:
                    outcomes[i] = op.run_release("s1", epsilon=0.6).state
                except ServiceError as err:
                    outcomes[i] = err.code

        threads = [threading.Thread(target=release, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        cs2.stop()
    assert sorted(map(str, outcomes)) == sorted(["DONE", str(grpc.StatusCode.RESOURCE_EXHAUSTED)]), outcomes
    charges = cluster.ds.handler.ledger.charges("s1")
    assert len({c.release_id for c in charges}) == 1  # only the winner's measurements were decrypted
    assert math.fsum(c.epsilon for c in charges) == pytest.approx(0.6, abs=1e-12)
    assert cluster.ds.handler.ledger.check_consistency() == []
    assert contract.epsilon == 1.0


def test_concurrent_decryptions_of_many_releases_fit_the_budget_exactly(secure_cluster: Cluster) -> None:
    cluster = secure_cluster
    contract = cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0, strategy="gap")
    be = BfvBackend(load_context(cluster.ds.handler.public_key_for("s1")[0]))
    chunk = be.serialize_chunk(be.encrypt(owner_encoding(np.arange(64))).chunks[0])
    cluster.forward_c1(contract, {"a": [chunk]})  # a signed study: the DS decrypts with the owner's signed c1
    barrier = threading.Barrier(8)
    results: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        ds = cluster.decryption(CS_ID, "computation")
        barrier.wait()
        try:
            ds.decrypt_measurement(study_id="s1", release_id=f"r{i}", release_epsilon=0.3,
                                   measurement=PrefixDifferences(64, 0.3, 2), chunks=[chunk], chunk_count=1,
                                   contract_hash=contract.contract_hash)
            out = "ok"
        except ServiceError as err:
            out = err.code.name
        with lock:
            results.append(out)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == ["RESOURCE_EXHAUSTED"] * 5 + ["ok"] * 3  # floor(1.0 / 0.3) releases fit
    assert len(cluster.ds.handler.ledger.charges("s1")) == 3
    assert cluster.ds.handler.ledger.check_consistency() == []


def _charge_many(path: str, worker: int, tries: int) -> int:
    """A separate process charging one ledger file (each charge is its own release of 0.05)."""
    store = SqliteLedgerStore(path)
    ok = 0
    try:
        for k in range(tries):
            try:
                store.charge("s1", f"w{worker}-{k}", "partition_sums", 0.05, 0.05)
                ok += 1
            except BudgetExhaustedError:
                pass
    finally:
        store.close()
    return ok


def test_ledger_writers_in_separate_processes_never_overspend(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    store = SqliteLedgerStore(path)
    store.create_study(StudyContract(study_id="s1", domain_size=8, epsilon=1.0, expected_owners=("a",),
                                     context_fingerprint=FP))
    store.close()
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        granted = pool.starmap(_charge_many, [(str(path), w, 10) for w in range(4)])
    assert sum(granted) == 20  # 40 attempts, exactly 1.0 / 0.05 = 20 fit
    store = SqliteLedgerStore(path)
    try:
        charges = store.charges("s1")
        assert len(charges) == 20 and math.fsum(c.epsilon for c in charges) == pytest.approx(1.0, abs=1e-12)
        assert store.check_consistency() == []
    finally:
        store.close()


def test_a_release_reserves_its_whole_epsilon_with_its_first_charge() -> None:
    """Exact arithmetic of the reservation rule that makes interleaved releases safe."""
    from parties.decryption.ledger import MemoryLedgerStore, reserved_epsilon

    store = MemoryLedgerStore()
    store.create_study(StudyContract(study_id="s1", domain_size=8, epsilon=1.0, expected_owners=("a",),
                                     context_fingerprint=FP))
    store.charge("s1", "r1", "prefix_differences", 0.125, 0.625)  # r1 holds 0.625 from now on
    with pytest.raises(BudgetExhaustedError, match="0.375 left of 1 .0.625 reserved"):
        store.charge("s1", "r2", "prefix_differences", 0.125, 0.625)  # 0.625 + 0.625 > 1: refused up front
    store.charge("s1", "r3", "partition_sums", 0.375, 0.375)  # exactly what is left
    store.charge("s1", "r1", "partition_sums", 0.5, 0.625)  # r1 completes inside its reservation
    with pytest.raises(BudgetExhaustedError):
        store.charge("s1", "r4", "partition_sums", 1e-6, 1e-6)
    charges = store.charges("s1")
    assert [c.epsilon for c in charges] == [0.125, 0.375, 0.5]
    assert reserved_epsilon(charges) == 1.0 and store.spent("s1") == 1.0
    assert store.check_consistency() == []
