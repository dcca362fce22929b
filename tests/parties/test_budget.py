"""The decryption server's ledger through the services: refusals, nothing decrypted, survival across restarts."""

from __future__ import annotations

import sqlite3

import grpc
import numpy as np
import pytest

from he_partition.core.backend import ChunkedVector
from he_partition.he.bfv import BfvBackend, generate_secret_context, load_context
from he_partition.core.measurements import PartitionSums, PrefixDifferences, owner_encoding
from parties.common.errors import ServiceError
from parties.cli import main
from parties.decryption.server import LEDGER_FILE

from .conftest import Cluster


def _encrypted_prefix(cluster: Cluster, hist: np.ndarray, study_id: str = "s1") -> tuple[list[bytes], BfvBackend]:
    be = BfvBackend(load_context(cluster.decryption().public_context(study_id=study_id)))
    vec: ChunkedVector = be.encrypt(owner_encoding(hist))
    return [be.serialize_chunk(c) for c in vec.chunks], be


def test_second_release_past_epsilon_is_refused_and_decrypts_nothing(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    cs = cluster.computation()
    first = cs.run_release("s1", epsilon=0.6)
    ds = cluster.decryption()
    before = ds.budget("s1")
    assert [c.epsilon for c in before.charges] == [0.6 * 0.2, 0.6 - 0.6 * 0.2]
    assert before.spent == pytest.approx(0.6, abs=1e-15)

    with pytest.raises(ServiceError) as ei:
        cs.run_release("s1", epsilon=0.6)
    assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "nothing was decrypted" in ei.value.details
    assert ds.budget("s1").charges == before.charges  # no charge, so no decryption
    assert cluster.analyst().list_releases("s1")[0].release_id == first.release_id

    # The rest of the budget can still be spent exactly.
    second = cs.run_release("s1", epsilon=0.4)
    assert second.state == "DONE"
    assert ds.budget("s1").spent == pytest.approx(1.0, abs=1e-12)


def test_ledger_refuses_direct_decryption_past_the_budget(cluster: Cluster) -> None:
    """Even a computation server that skipped its own check cannot get a decryption past the budget."""
    contract = cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    ds = cluster.decryption()
    chunks, _ = _encrypted_prefix(cluster, np.arange(64))
    h = contract.contract_hash
    m = PrefixDifferences(64, 0.5, 2)
    res = ds.decrypt_measurement(study_id="s1", release_id="r1", release_epsilon=1.0, measurement=m,
                                 chunks=chunks, chunk_count=1, contract_hash=h)
    truth = np.diff(np.arange(64), prepend=0)
    assert res.values.dtype == np.int64 and res.values.shape == (64,)
    assert res.epsilon_remaining == 0.5
    assert np.max(np.abs(res.values - truth)) < 60  # only the server's discrete Laplace noise (scale 4)

    with pytest.raises(ServiceError) as ei:  # a release declaring more than is left
        ds.decrypt_measurement(study_id="s1", release_id="r2", release_epsilon=0.6, measurement=PrefixDifferences(
            64, 0.1, 2), chunks=chunks, chunk_count=1, contract_hash=h)
    assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(ServiceError) as ei:  # a release spending past what it declared
        ds.decrypt_measurement(study_id="s1", release_id="r1", release_epsilon=1.0, measurement=PrefixDifferences(
            64, 0.6, 2), chunks=chunks, chunk_count=1, contract_hash=h)
    assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert [c.epsilon for c in ds.budget("s1").charges] == [0.5]

    with pytest.raises(ServiceError) as ei:  # sensitivity below 2c would under-noise
        ds.decrypt_measurement(study_id="s1", release_id="r1", release_epsilon=1.0,
                               measurement=PrefixDifferences(64, 0.1, 1), chunks=chunks, chunk_count=1, contract_hash=h)
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT and "sensitivity 1 is below 2" in ei.value.details
    foreign = BfvBackend(generate_secret_context())
    alien = [foreign.serialize_chunk(c) for c in foreign.encrypt(owner_encoding(np.arange(64))).chunks]
    with pytest.raises(ServiceError) as ei:  # made under another key: the integrity check reads the key, so it
        ds.decrypt_measurement(study_id="s1", release_id="r1", release_epsilon=1.0,  # refuses after the charge
                               measurement=PartitionSums(64, 0.1, 1, starts=(0, 32)), chunks=alien, chunk_count=1,
                               contract_hash=h)
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT and ei.value.details.startswith("refused after the charge")
    assert [c.epsilon for c in ds.budget("s1").charges] == [0.5, 0.1]


def test_ledger_survives_a_decryption_server_restart(cluster: Cluster) -> None:
    contract = cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    cluster.computation().run_release("s1")
    before = cluster.decryption().budget("s1")
    assert before.spent == 1.0

    cluster.restart_ds()
    ds = cluster.decryption()
    after = ds.budget("s1")
    assert after == before
    assert ds.get_study("s1") == contract  # same contract, same key fingerprint
    with pytest.raises(ServiceError) as ei:
        cluster.computation().run_release("s1")
    assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_sqlite_ledger_rows_cannot_be_changed_or_removed(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64, owners=("a",))
    cluster.owner("a").submit("s1", np.arange(64))
    cluster.computation().run_release("s1")
    db = sqlite3.connect(cluster.root / "ds" / LEDGER_FILE)
    try:
        for sql in ("UPDATE charges SET epsilon = 0.0001", "DELETE FROM charges"):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                db.execute(sql)
    finally:
        db.close()


def test_a_replaced_or_edited_charge_row_breaks_the_hash_chain_and_stops_decryption(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    from parties.cli import main

    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    cluster.computation().run_release("s1", epsilon=0.5)
    assert cluster.decryption().budget("s1").chain_problem == ""
    assert main(["budget", "s1", "--verify", "--decryption", cluster.ds.target, "--insecure"]) == 0
    assert "hash chain verified" in capsys.readouterr().out
    db = sqlite3.connect(cluster.root / "ds" / LEDGER_FILE, isolation_level=None)
    first = db.execute("SELECT charge_id, epsilon FROM charges ORDER BY charge_id").fetchone()
    # REPLACE on an existing row id used to swap a charge silently (no DELETE trigger fires): refused now.
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        db.execute("INSERT OR REPLACE INTO charges (charge_id, study_id, release_id, kind, epsilon, release_epsilon, "
                   "created_at) VALUES (?, 's1', 'r', 'k', 1e-9, 1.0, 'now')", (first[0],))
    # Someone with file access drops the guard and edits a row: the chain shows it.
    db.execute("DROP TRIGGER charges_no_update")
    db.execute("UPDATE charges SET epsilon = 1e-9 WHERE charge_id = ?", (first[0],))
    db.close()
    problem = cluster.decryption().budget("s1").chain_problem
    assert f"breaks at charge {first[0]}" in problem
    assert main(["budget", "s1", "--verify", "--decryption", cluster.ds.target, "--insecure"]) == 1
    assert "BROKEN" in capsys.readouterr().err
    with pytest.raises(ServiceError) as ei:  # no decryption runs on a broken ledger
        cluster.computation().run_release("s1", epsilon=0.1)
    assert ei.value.code == grpc.StatusCode.FAILED_PRECONDITION and "hash chain" in ei.value.details


def test_a_studys_charges_are_numbered_from_one(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """On the former code the ledger's global row number showed: a second study's first charge read "#3"."""
    for study in ("s1", "s2"):
        cluster.open_study(study_id=study, domain_size=64, owners=("a",), epsilon=1.0)
        cluster.owner("a").submit(study, np.arange(64) % 3)
        cluster.computation().run_release(study, epsilon=0.5)
    capsys.readouterr()
    assert main(["budget", "s2", "--decryption", cluster.ds.target, "--insecure"]) == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("#")]
    assert lines and [ln.split()[0] for ln in lines] == [f"#{n}" for n in range(1, len(lines) + 1)]
