"""Every refused request answers its documented status code with a message naming the problem
(random bytes -> INVALID_ARGUMENT is in test_call_limits.py; direct-query "left" in test_stores.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import grpc
import numpy as np
import pytest

from parties.cli import main
from parties.common.pki import create_ca, issue_party_certificate
from parties.common.config import DecryptionConfig
from parties.common.errors import ServiceError
from parties.common.tls import TlsConfig
from parties.common.tls_diagnose import diagnose
from parties.decryption.server import LEDGER_FILE, create_decryption_server

from .conftest import CS_ID, OPERATOR_APPROVAL, Cluster


def test_a_10_kb_study_id_is_refused_without_being_echoed(cluster: Cluster) -> None:
    with pytest.raises(ServiceError) as ei:
        cluster.computation().study_status("x" * 10_000)
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "study_id must be 1-64 characters" in ei.value.details and "(10000 characters)" in ei.value.details
    assert len(ei.value.details) < 300


def test_a_broken_hash_chain_is_failed_precondition_naming_the_row_not_budget_exhausted(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    cluster.computation().run_release("s1", epsilon=0.5)
    db = sqlite3.connect(cluster.root / "ds" / LEDGER_FILE, isolation_level=None)
    first = db.execute("SELECT MIN(charge_id) FROM charges").fetchone()[0]
    db.execute("DROP TRIGGER charges_no_update")
    db.execute("UPDATE charges SET epsilon = 1.0 WHERE charge_id = ?", (first,))  # the budget now looks spent
    db.close()
    with pytest.raises(ServiceError) as ei:
        cluster.computation().run_release("s1", epsilon=0.1)
    assert ei.value.code == grpc.StatusCode.FAILED_PRECONDITION  # was RESOURCE_EXHAUSTED "0 left"
    assert f"breaks at charge {first}" in ei.value.details


def test_a_full_disk_is_failed_precondition_and_charges_nothing(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    cluster.open_study(study_id="filler", domain_size=64, owners=("a",), epsilon=1000.0)
    ledger = cluster.ds.handler.ledger
    pages = ledger._db.execute("PRAGMA page_count").fetchone()[0]
    ledger._db.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's own SQLITE_FULL: no page can be added
    with pytest.raises(sqlite3.OperationalError, match="full"):
        for i in range(10_000):  # use up the free space of the pages there are: the disk is now full
            ledger.charge("filler", f"f{i}", "partition_sums", 0.01, 0.01)
    before = ledger.charges("s1")
    with pytest.raises(ServiceError) as ei:
        cluster.computation().run_release("s1", epsilon=0.5)
    assert ei.value.code == grpc.StatusCode.FAILED_PRECONDITION, ei.value  # was INTERNAL "see the server log"
    assert "storage is full" in ei.value.details and "nothing was stored, charged or decrypted" in ei.value.details
    assert ledger.charges("s1") == before


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_corrupted_ledger_file_stops_the_server_with_a_clear_error(tmp_path: Path, damage: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "ds"
    data.mkdir()
    ledger = data / LEDGER_FILE
    if damage == "garbage":
        ledger.write_bytes(b"\x8e" * 5000)
    else:
        db = sqlite3.connect(ledger)
        db.execute("CREATE TABLE t (x TEXT)")
        db.executemany("INSERT INTO t VALUES (?)", [("x" * 500,) for _ in range(400)])
        db.commit()
        db.close()
        with ledger.open("r+b") as f:
            f.truncate(ledger.stat().st_size // 2)
    code = main(["serve-decryption", "--data-dir", str(data), "--port", "0", "--insecure"])
    err = capsys.readouterr().err
    assert code != 0
    assert "is not a readable privacy ledger" in err and "Traceback" not in err, err


def test_an_expired_server_certificate_is_reported_as_expired(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    ca = create_ca(pki)
    issue_party_certificate(ca, pki, "ds-old", "decryption", valid_days=0)  # expired as soon as issued
    issue_party_certificate(ca, pki, CS_ID, "computation")
    ds = create_decryption_server(DecryptionConfig(tmp_path / "ds", port=0, tls=TlsConfig.in_directory(pki, "ds-old"),
                                                   computation_ids=(CS_ID,),
                                                   operator_keys=(OPERATOR_APPROVAL[1],))).start()
    try:
        why = diagnose(ds.target, TlsConfig.in_directory(pki, CS_ID), role="decryption")
    finally:
        ds.stop()
    assert why is not None and "expired" in why and "clock" in why, why  # was "... not issued by the CA ..."
    assert "not issued by the CA" not in why
