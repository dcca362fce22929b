"""A rolled-back ledger (restored backup, lost WAL) refunds nothing: the computation server's signed receipts
are a second record of spend, and the key holder refuses a ledger older than a receipt it is shown."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest

from parties.common.errors import ServiceError
from parties.common.receipts import ReceiptBook
from parties.decryption.client import DecryptionClient
from parties.decryption.ledger import SqliteLedgerStore, backup_ledger
from parties.decryption.rollback import restore_ledger
from parties.decryption.server import LEDGER_FILE, create_decryption_server

from .conftest import FAST_RETRY, Cluster


def _ledger(cluster: Cluster) -> Path:
    return cluster.root / "ds" / LEDGER_FILE


def _charge_ids(cluster: Cluster) -> list[int]:
    return [c.charge_id for c in cluster.ds.handler.ledger.charges("s1")]


def _release_then_roll_back(cluster: Cluster, roll_back: str) -> None:
    """Release 0.4, keep an old copy of the ledger, release 0.5, stop the key holder, put the copy back."""
    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    cs = cluster.computation()
    assert cs.run_release("s1", epsilon=0.4).state == "DONE"
    old = cluster.root / "old-ledger.sqlite3"
    if roll_back == "backup":
        backup_ledger(_ledger(cluster), old)  # the documented procedure, while the server runs
    assert cs.run_release("s1", epsilon=0.5).state == "DONE"
    if roll_back == "wal":  # the main file without its WAL: what a kill -9 and a deleted -wal file leave
        shutil.copyfile(_ledger(cluster), old)
    port = cluster.ds.port
    cluster.ds.stop()
    shutil.copyfile(old, _ledger(cluster))
    for suffix in ("-wal", "-shm"):
        Path(str(_ledger(cluster)) + suffix).unlink(missing_ok=True)
    cluster.ds = create_decryption_server(cluster._ds_config(cluster.root, cluster.pki, port, 31)).start()


@pytest.mark.parametrize("roll_back", ["backup", "wal"])
def test_a_rolled_back_ledger_refunds_nothing(cluster: Cluster, roll_back: str) -> None:
    _release_then_roll_back(cluster, roll_back)
    ledger = cluster.ds.handler.ledger
    if not any(c.study_id == "s1" for c in ledger.list_studies()):
        # The WAL held the study itself; the operator opens it again (same terms, same hash): a fresh ledger.
        cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    assert ledger.spent("s1") < 0.9 - 1e-9  # the ledger really was rolled back
    before = _charge_ids(cluster)
    cs = cluster.computation()
    with pytest.raises(ServiceError) as ei:
        cs.run_release("s1", epsilon=0.5)  # would fit the rolled-back ledger
    assert ei.value.code == grpc.StatusCode.FAILED_PRECONDITION, ei.value
    assert "rolled back" in ei.value.details and "Nothing was decrypted" in ei.value.details
    with pytest.raises(ServiceError) as ei:
        cs.direct_range_counts("s1", [(0, 8)], 0.05)  # a direct query is refused too
    assert ei.value.code == grpc.StatusCode.FAILED_PRECONDITION, ei.value
    assert _charge_ids(cluster) == before  # nothing charged, so nothing decrypted
    assert sum(r.epsilon for r in cluster.analyst().list_releases("s1")) == pytest.approx(0.9)


def test_the_key_holder_refuses_a_ledger_older_than_the_receipt_it_is_shown(cluster: Cluster) -> None:
    """Even a computation server that skips its own spend check gets nothing decrypted from a rolled-back ledger."""
    _release_then_roll_back(cluster, "backup")
    book = ReceiptBook(cluster.root / "cs" / "ledger_receipts.jsonl")  # the receipts the CS kept
    newest = book.newest("s1")
    assert newest is not None and float(newest.study_spent) == pytest.approx(0.9)
    before = _charge_ids(cluster)
    contract = cluster.ds.handler.get_study("s1")
    with DecryptionClient(cluster.ds.target, retry=FAST_RETRY, insecure=True) as ds:
        ds.receipts = book
        from he_partition.core.measurements import PrefixDifferences

        with pytest.raises(ServiceError) as ei:
            ds.decrypt_measurement(study_id="s1", release_id="r-after", release_epsilon=0.1,
                                   measurement=PrefixDifferences(64, 0.1, 2), chunks=[], chunk_count=1,
                                   contract_hash=contract.contract_hash)
        assert ei.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert f"charge #{newest.charge_id}" in ei.value.details and "rolled back" in ei.value.details
        with pytest.raises(ServiceError) as ei:
            ds.charge_direct_queries(study_id="s1", request_id="q1", contract_hash=contract.contract_hash,
                                     ranges=[(0, 8)], epsilon=0.05)
        assert ei.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert _charge_ids(cluster) == before


def test_restore_needs_an_acknowledgement_and_rebooks_what_it_rolls_back(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    cs = cluster.computation()
    cs.run_release("s1", epsilon=0.4)
    backup = cluster.root / "backup.sqlite3"
    backup_ledger(_ledger(cluster), backup)
    cs.run_release("s1", epsilon=0.5)
    port = cluster.ds.port
    cluster.ds.stop()
    from he_partition.core.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="--acknowledge-rollback"):
        restore_ledger(cluster.root / "ds", backup, LEDGER_FILE, acknowledge_rollback=False)
    report = restore_ledger(cluster.root / "ds", backup, LEDGER_FILE, acknowledge_rollback=True)
    assert [c.kind for c in report.lost["s1"]] == ["prefix_differences", "partition_sums"]
    assert report.rebooked["s1"] == pytest.approx(0.5)
    store = SqliteLedgerStore(_ledger(cluster))
    try:
        assert store.spent("s1") == pytest.approx(0.9)  # nothing refunded
        assert store.verify_chain() == 3
    finally:
        store.close()
    cluster.ds = create_decryption_server(cluster._ds_config(cluster.root, cluster.pki, port, 32)).start()
    with pytest.raises(ServiceError) as ei:
        cs.run_release("s1", epsilon=0.5)  # 0.9 + 0.5 > 1: refused by the budget, not by the receipts
    assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert cs.run_release("s1", epsilon=0.1).state == "DONE"  # the acknowledged ledger works again


def test_the_cli_restores_only_with_the_acknowledgement(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    from parties.cli import main

    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    cluster.computation().run_release("s1", epsilon=0.4)
    backup = cluster.root / "backup.sqlite3"
    assert main(["ledger", "backup", "--data-dir", str(cluster.root / "ds"), "--out", str(backup)]) == 0
    cluster.computation().run_release("s1", epsilon=0.3)
    cluster.ds.stop()
    capsys.readouterr()
    assert main(["ledger", "restore", str(backup), "--data-dir", str(cluster.root / "ds")]) != 0
    assert "--acknowledge-rollback" in capsys.readouterr().err
    assert main(["ledger", "restore", str(backup), "--data-dir", str(cluster.root / "ds"),
                 "--acknowledge-rollback"]) == 0
    assert "study s1: rolled back 2 charge(s); re-booked epsilon 0.3" in capsys.readouterr().out


def _verify(cluster: Cluster, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    from parties.cli import main

    capsys.readouterr()
    code = main(["budget", "s1", "--verify", "--decryption", cluster.ds.target, "--computation", cluster.cs.target,
                 "--insecure", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_budget_verify_names_a_rolled_back_ledger_from_the_computation_servers_receipts(
        cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The hash chain of an older copy is intact: only the receipts the CS keeps can tell it was rolled back."""
    from parties.cli import main

    monkeypatch.delenv("DPAGG_COMPUTATION", raising=False)
    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    cs = cluster.computation()
    assert cs.run_release("s1", epsilon=0.4).state == "DONE"
    code, out, _ = _verify(cluster, capsys)
    assert code == 0 and "ledger holds every charge the computation server holds a signed receipt for" in out
    old = cluster.root / "old-ledger.sqlite3"
    backup_ledger(_ledger(cluster), old)
    assert cs.run_release("s1", epsilon=0.5).state == "DONE"
    newest = ReceiptBook(cluster.root / "cs" / "ledger_receipts.jsonl").newest("s1")
    assert newest is not None
    current = cluster.root / "current-ledger.sqlite3"
    backup_ledger(_ledger(cluster), current)
    # Both servers stopped, the old copy put over the ledger, both started again on their ports.
    ds_port, cs_port = cluster.ds.port, cluster.cs.port
    cluster.cs.stop()
    cluster.ds.stop()
    for suffix in ("-wal", "-shm"):
        Path(str(_ledger(cluster)) + suffix).unlink(missing_ok=True)
    shutil.copyfile(old, _ledger(cluster))
    cluster.ds = create_decryption_server(cluster._ds_config(cluster.root, cluster.pki, ds_port, 31)).start()
    from parties.computation.server import create_computation_server

    cluster.cs = create_computation_server(cluster._cs_config(cluster.root, cluster.pki, cluster.ds.target, cs_port,
                                                              12)).start()

    # Without the computation server the report is what it was: an intact chain, and a warning that says why
    # that is not enough.
    assert main(["budget", "s1", "--verify", "--decryption", cluster.ds.target, "--insecure"]) == 0
    out, err = capsys.readouterr()
    assert "spent 0.4 of 1" in out and "NOT checked against the computation server's signed receipts" in err

    code, out, err = _verify(cluster, capsys)
    assert code == 1
    line = next(x for x in out.splitlines() if x.startswith("ROLLED BACK:"))
    assert line.startswith(f"ROLLED BACK: ledger of the decryption server ({cluster.ds.target}) lacks charge "
                           f"#{newest.charge_id} (release ")
    assert "that the computation server holds a signed receipt for (spent 0.4, receipt says 0.9)" in line
    assert "BROKEN" not in err and "DISAGREE" not in out  # a rollback, not a broken chain or a disagreement
    code, out, err = _verify(cluster, capsys, "--json")
    import json

    assert code == 1 and json.loads(out)["rolled_back"] and "ROLLED BACK" in err

    # The acknowledged way (`dpagg ledger restore` over the newest ledger re-books what the old copy lacks): the
    # receipts are held again and verify passes.
    cluster.ds.stop()
    shutil.copyfile(current, _ledger(cluster))
    restore_ledger(cluster.root / "ds", old, LEDGER_FILE, acknowledge_rollback=True)
    cluster.ds = create_decryption_server(cluster._ds_config(cluster.root, cluster.pki, ds_port, 32)).start()
    code, out, _ = _verify(cluster, capsys)
    assert code == 0 and "ROLLED BACK" not in out, out


def test_reconcile_books_only_what_other_holders_signed_and_never_twice(tmp_path: Path) -> None:
    """A key-share holder books a charge it missed from another holder's signed receipt, once; its own
    receipts, a receipt that does not verify or one of another study are refused and nothing is booked."""
    from he_partition.core.errors import InvalidInputError

    from parties.decryption.receipts import ReceiptSigner, reconcile_charges

    from .test_stores import contract

    other_ledger, mine = SqliteLedgerStore(tmp_path / "other.sqlite3"), SqliteLedgerStore(tmp_path / "mine.sqlite3")
    try:
        other_signer, my_signer = ReceiptSigner.load_or_create(None), ReceiptSigner.load_or_create(None)
        for ledger in (other_ledger, mine):
            ledger.create_study(contract("s1"))
            ledger.create_study(contract("s2"))
        both = other_ledger.charge("s1", "r1", "prefix_differences", 0.25, 0.5)
        mine.charge("s1", "r1", "prefix_differences", 0.25, 0.5)
        missed = other_ledger.charge("s1", "r2", "partition_sums", 0.125, 0.125)
        receipts = [(*other_signer.issue(other_ledger, c), other_signer.public_key) for c in (both, missed)]

        body, sig, key = receipts[1]
        refused = {"own key": [(body, sig, my_signer.public_key)],
                   "bad signature": [(body, bytes(64), key)],
                   "other study": [(*other_signer.issue(other_ledger, other_ledger.charge(
                       "s2", "r9", "prefix_differences", 0.1, 0.1)), key)]}
        for why, rs in refused.items():
            with pytest.raises(InvalidInputError):
                reconcile_charges(mine, my_signer.public_key, "s1", rs)
            assert len(mine.charges("s1")) == 1, why

        booked = reconcile_charges(mine, my_signer.public_key, "s1", receipts + receipts)  # sent twice: booked once
        assert [(c.release_id, c.kind, c.epsilon) for c in booked] == [("r2", "partition_sums", 0.125)]
        assert "reconciled_from" in booked[0].detail
        assert reconcile_charges(mine, my_signer.public_key, "s1", receipts) == []  # a repeat books nothing
        assert mine.spent("s1") == pytest.approx(0.375) and mine.verify_chain() == 2
    finally:
        other_ledger.close()
        mine.close()
