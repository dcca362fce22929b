"""CLI pieces a deployment runs on every start: idempotent certificates and keys, ledger backup and verification."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from parties.cli import main
from parties.decryption.server import LEDGER_FILE

from .conftest import Cluster


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_certs_per_party_dirs_and_keep_existing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["certs", "--ca", str(tmp_path / "ca"), "--out", str(tmp_path / "pki"), "--per-party-dirs",
            "--keep-existing", "--party", "decryption:decryption", "--party", "owner-1:data_owner"]
    assert main(argv) == 0
    pki = tmp_path / "pki"
    assert set(_files(pki)) == {"decryption/decryption.crt", "decryption/decryption.key", "decryption/dpagg-ca.crt",
                                "owner-1/owner-1.crt", "owner-1/owner-1.key", "owner-1/dpagg-ca.crt"}
    assert set(_files(tmp_path / "ca")) == {"dpagg-ca.crt", "dpagg-ca.key"}  # the CA key is nowhere else
    first = _files(pki)
    capsys.readouterr()
    assert main(argv) == 0  # a second start keeps everything
    assert "kept the existing certificates of decryption, owner-1" in capsys.readouterr().out
    assert _files(pki) == first
    assert main(argv[:-4] + ["--party", "owner-1:analyst"]) == 1  # kept files must match the role asked for
    assert "owner-1.crt exists but is not a certificate of this CA for role analyst" in capsys.readouterr().err
    assert main([*argv, "--party", "computation:computation"]) == 0  # a new party joins the same CA
    assert "computation/computation.crt" in _files(pki) and _files(pki)["owner-1/owner-1.key"] == first[
        "owner-1/owner-1.key"]


def test_keygen_keep_existing_and_public_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["keygen", "--out", str(tmp_path / "keys" / "owner-1.signing.key"), "--keep-existing", "--public-dir",
            str(tmp_path / "pub"), "--json"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    pub = (tmp_path / "pub" / "owner-1.signing.pub").read_text().strip()
    assert pub in first
    assert main(argv) == 0
    assert capsys.readouterr().out == first  # same key, printed again
    assert main(argv[:3]) == 1  # without --keep-existing an existing key is not replaced silently
    assert "pass --force to replace it" in capsys.readouterr().err


def test_ledger_backup_of_a_running_server_verifies_and_tampering_is_found(
        cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.open_study(owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    cluster.computation().run_release("s1", epsilon=0.5)
    backup = tmp_path / "backup" / "ledger.sqlite3"
    assert main(["ledger", "backup", "--data-dir", str(cluster.root / "ds"), "--out", str(backup)]) == 0
    assert "hash chain verified" in capsys.readouterr().out
    assert main(["ledger", "backup", "--data-dir", str(cluster.root / "ds"), "--out", str(backup)]) == 1
    assert "exists; choose a new backup file name" in capsys.readouterr().err
    assert main(["ledger", "verify", str(backup)]) == 0
    out = capsys.readouterr().out
    assert "study s1: 2 charge(s), 0.5 of 1 spent" in out
    db = sqlite3.connect(backup)
    for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        db.execute(f"DROP TRIGGER {name}")
    db.execute("UPDATE charges SET epsilon = epsilon / 10")
    db.commit()
    db.close()
    assert main(["ledger", "verify", str(backup)]) == 1
    assert "dpagg: error:" in capsys.readouterr().err
    assert (cluster.root / "ds" / LEDGER_FILE).is_file()
