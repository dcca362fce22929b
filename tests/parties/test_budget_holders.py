"""`dpagg budget` across several key holders: every holder's view, DISAGREE when one ledger was rolled back.

Three real decryption servers on port 0, each with its own SQLite ledger, open the same study and are
charged the same measurements (real TenSEAL ciphertexts, each under its own server's key), as K key-share
holders are charged for every release. One ledger is then rolled back the crude way (an old copy of the
file put in its place, the server restarted) and the report must name it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from he_partition.core.measurements import PrefixDifferences, owner_encoding
from he_partition.he.bfv import BfvBackend, load_context
from parties.cli import main
from parties.common.config import DecryptionConfig
from parties.common.server import ServerHandle
from parties.decryption.client import DecryptionClient
from parties.decryption.ledger import backup_ledger
from parties.decryption.server import LEDGER_FILE, create_decryption_server

from .conftest import FAST_RETRY

HOLDERS = ("holder-1", "holder-2", "holder-3")


@dataclass
class Holder:
    name: str
    data_dir: Path
    server: ServerHandle

    def client(self) -> DecryptionClient:
        return DecryptionClient(self.server.target, retry=FAST_RETRY, insecure=True)

    def restart(self) -> None:
        port = self.server.port
        self.server.stop()
        self.server = _start(self.data_dir, port)

    def charge(self, release_id: str, epsilon: float) -> None:
        """One measurement decrypted and charged at this holder (a real ciphertext under its own key)."""
        with self.client() as ds:
            contract = ds.get_study("s1")
            be = BfvBackend(load_context(ds.public_context(study_id="s1")))
            chunks = [be.serialize_chunk(c) for c in be.encrypt(owner_encoding(np.arange(64))).chunks]
            ds.decrypt_measurement(study_id="s1", release_id=release_id, release_epsilon=epsilon,
                                   measurement=PrefixDifferences(64, epsilon, 2), chunks=chunks, chunk_count=1,
                                   contract_hash=contract.contract_hash)


def _start(data_dir: Path, port: int = 0) -> ServerHandle:
    return create_decryption_server(DecryptionConfig(data_dir, port=port, noise_seed=3, insecure=True)).start()


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[list[Holder]]:
    started: list[Holder] = []
    try:
        for name in HOLDERS:
            started.append(Holder(name, tmp_path / name, _start(tmp_path / name)))
            with started[-1].client() as ds:
                ds.open_study(study_id="s1", domain_size=64, epsilon=1.0, expected_owners=["a"], strategy="gap")
        yield started
    finally:
        for h in started:
            h.server.stop()


def _budget(capsys: pytest.CaptureFixture[str], holders: list[Holder], *extra: str) -> tuple[int, str, str]:
    endpoints = [a for h in holders for a in ("--decryption", f"{h.name}={h.server.target}")]
    code = main(["budget", "s1", *endpoints, "--insecure", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_agreeing_holders_print_every_view_and_no_disagree(holders: list[Holder],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    for h in holders:
        h.charge("r1", 0.25)
    code, out, _ = _budget(capsys, holders, "--verify")
    assert code == 0
    assert "DISAGREE" not in out
    for h in holders:
        assert f"holder {h.name} ({h.server.target}): spent 0.25 of 1, remaining 0.75" in out
    assert "all 3 holders agree" in out and "hash chains verified at all 3 holders" in out
    assert out.count("release r1: prefix_differences 0.25") == 3

    code, out, _ = _budget(capsys, holders, "--json", "--verify")
    report = json.loads(out)
    assert code == 0 and report["agree"] is True and report["disagreements"] == []
    assert list(report["holders"]) == list(HOLDERS)
    assert {v["spent"] for v in report["holders"].values()} == {0.25}
    assert all(len(v["charges"]) == 1 for v in report["holders"].values())


def test_a_rolled_back_ledger_is_named_in_disagree_lines_and_fails_verify(
        holders: list[Holder], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for h in holders:
        h.charge("r1", 0.25)
    old = tmp_path / "old-ledger.sqlite3"
    backup_ledger(holders[2].data_dir / LEDGER_FILE, old)  # holder-3's ledger after the first charge
    for h in holders:
        h.charge("r2", 0.5)
    # Roll holder-3 back: its server stopped, the old file copied over the ledger, the server restarted.
    holders[2].server.stop()
    for suffix in ("", "-wal", "-shm"):
        (holders[2].data_dir / (LEDGER_FILE + suffix)).unlink(missing_ok=True)
    shutil.copyfile(old, holders[2].data_dir / LEDGER_FILE)
    holders[2].restart()

    code, out, _ = _budget(capsys, holders)
    assert code == 0  # without --verify the report is informational
    assert "holder holder-3" in out and "spent 0.25 of 1" in out and "spent 0.75 of 1" in out
    disagree = [line for line in out.splitlines() if line.startswith("DISAGREE:")]
    assert "DISAGREE: spent: holder-1 0.75, holder-2 0.75, holder-3 0.25 (behind: holder-3)" in disagree
    assert "DISAGREE: remaining: holder-1 0.25, holder-2 0.25, holder-3 0.75" in disagree
    assert "DISAGREE: charges: holder-3 lacks 1 of 2 (release r2 prefix_differences 0.5)" in disagree
    assert not any("holder-1 lacks" in line or "holder-2 lacks" in line for line in disagree)
    assert "agree" not in out.replace("DISAGREE", "")

    code, out, _ = _budget(capsys, holders, "--verify")
    assert code == 1  # the chains are each intact: the exit code comes from the disagreement
    code, out, _ = _budget(capsys, holders, "--json", "--verify")
    report = json.loads(out)
    assert code == 1 and report["agree"] is False
    assert report["holders"]["holder-3"]["spent"] == 0.25 and report["holders"]["holder-1"]["spent"] == 0.75
    assert any(d.startswith("DISAGREE: spent:") for d in report["disagreements"])


def test_a_holder_that_does_not_know_the_study_is_a_disagreement(
        holders: list[Holder], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stranger = Holder("holder-4", tmp_path / "holder-4", _start(tmp_path / "holder-4"))
    try:
        code, out, _ = _budget(capsys, [*holders, stranger], "--verify")
    finally:
        stranger.server.stop()
    assert code == 1
    assert any(line.startswith("DISAGREE: holder-4 did not answer (NOT_FOUND") for line in out.splitlines()), out


def test_one_endpoint_prints_todays_report_and_a_name_given_twice_is_refused(
        holders: list[Holder], capsys: pytest.CaptureFixture[str]) -> None:
    holders[0].charge("r1", 0.25)
    assert main(["budget", "s1", "--decryption", holders[0].server.target, "--insecure", "--json"]) == 0
    single = json.loads(capsys.readouterr().out)
    assert single["spent"] == 0.25 and "holders" not in single  # one endpoint: today's JSON, unchanged
    h = holders[0].server.target
    assert main(["budget", "s1", "--decryption", f"a={h}", "--decryption", f"a={h}", "--insecure"]) == 1
    assert "names a holder twice" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["budget", "s1", "--decryption", f"={h}", "--insecure"])
    assert stop.value.code == 2 and "NAME=HOST:PORT" in capsys.readouterr().err


def test_three_key_share_holders_after_a_release_then_one_rolled_back(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Real key-share holders (mutual TLS, collective key): a K = 3 release charges all three alike; a holder
    whose ledger file is replaced by an older copy is named behind. Without --decryption the holders come from
    the computation server; one it cannot be reached at is named with the address tried."""
    monkeypatch.delenv("DPAGG_DECRYPTION", raising=False)
    monkeypatch.delenv("DPAGG_COMPUTATION", raising=False)
    from .test_threshold_services import HOLDERS as KEY_SHARE_HOLDERS, Threshold

    t = Threshold.start(tmp_path)
    try:
        t.computation().setup_key()
        t.open_and_submit("s-budget")
        old = tmp_path / "h2-before.sqlite3"
        backup_ledger(tmp_path / "h2" / LEDGER_FILE, old)
        assert t.computation().run_release("s-budget", epsilon=0.5).state == "DONE"
        tls = t.pki.tls("op", "operator")
        base = ["budget", "s-budget", "--ca-cert", str(tls.ca_cert), "--cert", str(tls.cert), "--key", str(tls.key),
                *[a for name, h in zip(KEY_SHARE_HOLDERS, t.holders) for a in ("--decryption", f"{name}={h.target}")]]
        assert main([*base, "--verify"]) == 0
        out = capsys.readouterr().out
        assert "all 3 holders agree" in out and "DISAGREE" not in out
        assert all(f"holder {name} (" in out for name in KEY_SHARE_HOLDERS) and out.count("spent 0.5 of 1,") == 3

        # No --decryption: the computation server names its holders and their addresses.
        from_cs = [*base[:8], "--computation", t.cs.target]
        assert main([*from_cs, "--verify"]) == 0
        out, err = capsys.readouterr()
        assert "all 3 holders agree" in out and "every ledger holds each charge" in out
        assert all(f"holder {name} ({h.target}): spent 0.5 of 1," in out
                   for name, h in zip(KEY_SHARE_HOLDERS, t.holders)), out
        assert f"key holders from the computation server {t.cs.target}: h1={t.holders[0].target}" in err
        assert "--decryption NAME=HOST:PORT overrides them" in err

        t.stop_holder(1)
        for suffix in ("", "-wal", "-shm"):
            (tmp_path / "h2" / (LEDGER_FILE + suffix)).unlink(missing_ok=True)
        shutil.copyfile(old, tmp_path / "h2" / LEDGER_FILE)
        t.start_holder(1)
        assert main([*base, "--verify", "--json"]) == 1
        report = json.loads(capsys.readouterr().out)
        assert report["agree"] is False
        assert [h["spent"] for h in report["holders"].values()] == [0.5, 0.0, 0.5]
        assert "DISAGREE: spent: h1 0.5, h2 0, h3 0.5 (behind: h2)" in report["disagreements"]
        assert "rolled_back" not in report  # without the computation server nobody can tell a rollback
        assert main([*base, "--verify", "--computation", t.cs.target]) == 1
        out = capsys.readouterr().out
        rolled = [line for line in out.splitlines() if line.startswith("ROLLED BACK:")]
        assert len(rolled) == 1 and rolled[0].startswith("ROLLED BACK: ledger of h2 lacks charge #"), out
        assert "that the computation server holds a signed receipt for (spent 0, receipt says 0.5)" in rolled[0]
        assert "MISSED" not in out
        assert main([*base, "--reconcile", "--computation", t.cs.target]) == 1  # a rollback is not reconciled
        assert "nothing reconciled" in capsys.readouterr().err

        # A holder the computation server's address does not reach: the address tried, and what overrides it.
        t.stop_holder(2)
        assert main([*from_cs, "--verify"]) == 1
        out = capsys.readouterr().out
        down = [line for line in out.splitlines() if line.startswith("DISAGREE: h3 did not answer (UNAVAILABLE")]
        assert len(down) == 1, out
        assert (f"[{t.holders[2].target} is the address the computation server {t.cs.target} has for h3; it may "
                "not resolve from here") in down[0]
        assert "name every holder with --decryption NAME=HOST:PORT" in down[0]
        assert f"holder h3 ({t.holders[2].target}): no answer: UNAVAILABLE" in out
    finally:
        t.stop()


def _key_share_base(t: "Any", study: str) -> list[str]:
    from .test_threshold_services import HOLDERS as KEY_SHARE_HOLDERS

    tls = t.pki.tls("op", "operator")
    return ["budget", study, "--ca-cert", str(tls.ca_cert), "--cert", str(tls.cert), "--key", str(tls.key),
            *[a for name, h in zip(KEY_SHARE_HOLDERS, t.holders) for a in ("--decryption", f"{name}={h.target}")],
            "--computation", t.cs.target]


def test_a_holder_down_during_a_release_is_shown_missed_then_reconciled_and_a_real_difference_still_disagrees(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """K = 3: h2 is unreachable while h1 and h3 charge the first measurement of a release (which then fails,
    nothing decrypted). Verify names the miss (not a rollback, not DISAGREE); --reconcile books it at h2 from
    h1's and h3's signed receipts; then every view agrees. A charge only one ledger holds, with no receipt,
    still DISAGREEs."""
    from .test_threshold_services import Threshold, _fast

    t = Threshold.start(tmp_path)
    try:
        t.computation().setup_key()
        t.open_and_submit("s-miss")
        _fast(t)
        real = t.combiner.decrypt_measurement

        def down_after_the_budget_check(**kw: Any) -> Any:
            t.stop_holder(1)
            return real(**kw)

        t.combiner.decrypt_measurement = down_after_the_budget_check
        rel = t.computation().run_release("s-miss", epsilon=0.5)
        assert rel.state == "FAILED" and "key-share holder h2" in rel.error_message
        t.combiner.decrypt_measurement = real
        t.start_holder(1)
        t.combiner.clients[1].wait_ready(timeout=15)
        rows = [[(c.release_id, c.kind, c.epsilon) for c in t.ledger(i).charges("s-miss")] for i in range(3)]
        assert rows[0] == rows[2] and len(rows[0]) == 1 and rows[1] == []  # h1 and h3 charged, h2 did not
        release, kind, eps = rows[0][0]
        base = _key_share_base(t, "s-miss")

        capsys.readouterr()
        assert main([*base, "--verify"]) == 0
        out, err = capsys.readouterr()
        assert (f"MISSED BY h2: release {release} {kind} {eps:.12g} (it was unreachable; no share was issued by "
                "it; h1, h3 hold it with signed receipts)") in out
        assert "DISAGREE" not in out and "ROLLED BACK" not in out and "BROKEN" not in err
        assert "all 3 holders agree once the missed charges are booked" in out
        assert main([*base, "--verify", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["agree"] is True and report["rolled_back"] == [] and len(report["missed"]) == 1

        assert main([*base, "--reconcile", "--verify"]) == 0
        out = capsys.readouterr().out
        assert "reconciled h2: booked 1 charge(s)" in out and f"{kind} {eps:.12g}" in out
        assert "all 3 holders agree" in out and "MISSED" not in out.split("reconciled h2")[1]
        assert [[(c.release_id, c.kind, c.epsilon) for c in t.ledger(i).charges("s-miss")] for i in range(3)] \
            == [rows[0]] * 3
        assert main([*base, "--reconcile"]) == 0  # a repeat books nothing
        assert "nothing to reconcile" in capsys.readouterr().out
        assert len(t.ledger(1).charges("s-miss")) == 1
        assert t.computation().run_release("s-miss", epsilon=0.3).state == "DONE"  # every holder works on
        assert main([*base, "--verify"]) == 0
        assert "all 3 holders agree" in capsys.readouterr().out

        t.ledger(2).charge("s-miss", "elsewhere", "partition_sums", 0.1, 0.1)  # h3 only, no receipt anywhere
        assert main([*base, "--verify"]) == 1
        out = capsys.readouterr().out
        assert "DISAGREE: charges: h1 lacks 1 of" in out and "DISAGREE: charges: h2 lacks 1 of" in out
        assert "MISSED" not in out and "ROLLED BACK" not in out
        assert main([*base, "--reconcile"]) == 0  # nothing signed proves it: nothing is booked from it
        assert "nothing to reconcile" in capsys.readouterr().out
    finally:
        t.stop()
