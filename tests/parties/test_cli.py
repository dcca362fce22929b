"""The `dpagg` CLI as real processes: the demo's JSON, and a whole study driven by the same commands compose runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parties.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["DPAGG_STATE_DIR"] = str(tmp / "state")
    # the operator's study approval key (`dpagg certs --signing-keys` makes it): key holders pin it, open-study signs
    env["DPAGG_OPERATOR_KEY"] = str(tmp / "pki" / "op.approval.pub")
    env["DPAGG_APPROVAL_KEY"] = str(tmp / "pki" / "op.approval.key")
    env.pop("DPAGG_COMPUTATION", None)
    env.pop("DPAGG_DECRYPTION", None)
    env.pop("DPAGG_ANALYST", None)
    return env


def dpagg(tmp: Path, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "parties.cli", *args], cwd=tmp, env=_env(tmp), text=True,
                          capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"dpagg {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def test_demo_json_runs_as_a_process_and_prints_one_json_object(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = dpagg(tmp_path, "demo", "--json", "--plot", str(tmp_path / "demo.png"))
    elapsed = time.monotonic() - t0
    out = json.loads(proc.stdout)  # exactly one JSON document on stdout
    assert isinstance(out, dict)
    assert out["release_id"].startswith("rel-")
    assert out["tls"] is True and out["signed_by"] == ["owner-1", "owner-2", "owner-3"]  # mTLS + signed study
    assert out["epsilon_spent"] == 1.0 and out["epsilon_left"] == 0.0
    # The demo uses the default strategy (auto); its charges add up to the study's epsilon.
    assert out["epsilon_charges"] and all(c["epsilon"] > 0 for c in out["epsilon_charges"])
    assert sum(c["epsilon"] for c in out["epsilon_charges"]) == pytest.approx(1.0, rel=1e-12)
    assert out["domain"]["n_bins"] == 100 and len(out["domain"]["edges"]) == 101
    assert len(out["true_histogram"]) == 100 and len(out["released_estimates"]) == 100
    assert sum(out["true_histogram"]) == sum(o["records_kept"] for o in out["owners"])
    whole = out["range_counts"][0]
    assert (whole["lo"], whole["hi"]) == (0, 100) and whole["standard_error"] > 0
    assert abs(whole["value"] - whole["true"]) <= 5 * whole["standard_error"]
    assert (tmp_path / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert elapsed < 60


def _wait_port(path: Path, proc: subprocess.Popen[str], timeout: float = 60) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            return int(path.read_text())
        if proc.poll() is not None:
            raise AssertionError(f"server exited early: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def _creds(party: str) -> list[str]:
    return ["--ca-cert", "pki/dpagg-ca.crt", "--cert", f"pki/{party}.crt", "--key", f"pki/{party}.key"]


def test_a_whole_study_through_the_cli_processes(tmp_path: Path) -> None:
    """The same commands compose/docker-compose.yml runs, as plain processes on loopback, with mutual TLS."""
    from parties.data_owner.dataset import write_sample_csv

    made = dpagg(tmp_path, "certs", "--out", "pki", "--party", "ds:decryption", "--party", "cs:computation",
                 "--party", "op:operator", "--party", "an:analyst", "--party", "h1:data_owner", "--party",
                 "h2:data_owner", "--signing-keys", "--json")
    assert "PRIVATE KEY" not in made.stdout + made.stderr  # keys are never printed
    info = json.loads(made.stdout)
    assert info["created_ca"] and [p["party_id"] for p in info["parties"]] == ["ds", "cs", "op", "an", "h1", "h2"]
    for f in [*(tmp_path / "pki").glob("*.key")]:
        assert f.stat().st_mode & 0o777 == 0o600, f
    assert len(list((tmp_path / "pki").glob("*.key"))) == 6 + 1 + 2 + 1  # parties, the CA, two signing keys, approval

    env = _env(tmp_path)
    ds = subprocess.Popen([sys.executable, "-m", "parties.cli", "serve-decryption", "--data-dir", "ds", "--port", "0",
                           "--port-file", "ds.port", "--computation-id", "cs", *_creds("ds")], cwd=tmp_path, env=env,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cs: subprocess.Popen[str] | None = None
    try:
        ds_addr = f"127.0.0.1:{_wait_port(tmp_path / 'ds.port', ds)}"
        cs = subprocess.Popen([sys.executable, "-m", "parties.cli", "serve-computation", "--data-dir", "cs", "--port",
                               "0", "--port-file", "cs.port", "--decryption", ds_addr, "--ingest-processes", "1",
                               *_creds("cs")], cwd=tmp_path,
                              env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        cs_addr = f"127.0.0.1:{_wait_port(tmp_path / 'cs.port', cs)}"
        opened = json.loads(dpagg(tmp_path, "open-study", "--computation", cs_addr, "--study-id", "cli",
                                  "--domain", "age:0:100:50", "--epsilon", "1", "--owners", "h1,h2",
                                  "--owner-keys-dir", "pki", "--json", *_creds("op")).stdout)
        assert opened["domain_size"] == 50 and opened["expected_owners"] == ["h1", "h2"]
        assert sorted(opened["owner_keys"]) == ["h1", "h2"]
        for i, owner in enumerate(("h1", "h2")):
            write_sample_csv(tmp_path / f"{owner}.csv", seed=3, n_records=500, owner_index=i)
            sub = json.loads(dpagg(tmp_path, "submit", "--computation", cs_addr, "--decryption", ds_addr, "--study",
                                   "cli", "--owner", owner, "--csv", f"{owner}.csv", "--person-column", "person_id",
                                   "--signing-key", f"pki/{owner}.signing.key", "--json", *_creds(owner)).stdout)
            assert sub["committed"] and not sub["duplicate"]
        again = json.loads(dpagg(tmp_path, "submit", "--computation", cs_addr, "--decryption", ds_addr, "--study",
                                 "cli", "--owner", "h1", "--csv", "h1.csv", "--person-column", "person_id",
                                 "--signing-key", "pki/h1.signing.key", "--json", *_creds("h1")).stdout)
        assert again["duplicate"] and again["bytes_sent"] == 0  # the kept upload key makes re-runs no-ops
        # A data owner may not start a release, and cannot submit under another owner's name.
        denied = dpagg(tmp_path, "release", "run", "cli", "--epsilon", "rest", "--computation", cs_addr, *_creds("h1"),
                       check=False)
        assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr and "operator" in denied.stderr
        forged = dpagg(tmp_path, "submit", "--computation", cs_addr, "--decryption", ds_addr, "--study", "cli",
                       "--owner", "h2", "--csv", "h1.csv", "--signing-key", "pki/h2.signing.key",
                       "--idempotency-key", "forged-1", *_creds("h1"), check=False)
        assert forged.returncode == 1 and "h1" in forged.stderr and "Traceback" not in forged.stderr
        rel = json.loads(dpagg(tmp_path, "release", "run", "cli", "--epsilon", "rest", "--computation", cs_addr,
                               "--json", *_creds("op")).stdout)
        assert rel["state"] == "DONE" and rel["summary"]["domain_size"] == 50 and rel["owners"] == ["h1", "h2"]
        q = json.loads(dpagg(tmp_path, "query", rel["release_id"], "--analyst", cs_addr, "--range", "0:25",
                             "--range", "25:50", "--json", *_creds("an")).stdout)
        assert [(c["lo"], c["hi"]) for c in q["range_counts"]] == [(0, 25), (25, 50)]
        budget = json.loads(dpagg(tmp_path, "budget", "cli", "--decryption", ds_addr, "--json", *_creds("op")).stdout)
        assert budget["spent"] == 1.0 and budget["remaining"] == 0.0
        refused = dpagg(tmp_path, "release", "run", "cli", "--epsilon", "rest", "--computation", cs_addr, *_creds("op"),
                        check=False)
        assert refused.returncode == 1 and "RESOURCE_EXHAUSTED" in refused.stderr
        unknown = dpagg(tmp_path, "status", "nope", "--computation", cs_addr, *_creds("an"), check=False)
        assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr and "Traceback" not in unknown.stderr
        plaintext = dpagg(tmp_path, "status", "cli", "--computation", cs_addr, "--insecure", check=False)
        assert plaintext.returncode == 1 and "UNAVAILABLE" in plaintext.stderr  # no certificate, no handshake
        healthy = dpagg(tmp_path, "health", cs_addr, "--service", "dpagg.v1.Computation", *_creds("an"))
        assert "SERVING" in healthy.stdout
    finally:
        for p in (cs, ds):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in (cs, ds):
            if p is not None:
                p.communicate(timeout=30)
    assert ds.returncode == 0 and cs is not None and cs.returncode == 0  # graceful shutdown on SIGTERM


@pytest.mark.parametrize("command", [["serve-decryption", "--data-dir", "d", "--port", "0"],
                                     ["serve-computation", "--data-dir", "d", "--port", "0"],
                                     ["serve-analyst", "--data-dir", "d", "--port", "0"],
                                     ["status", "s1"], ["submit", "--study", "s1", "--owner", "a", "--csv", "x.csv"]])
def test_without_certificates_servers_and_clients_refuse_unless_insecure_is_explicit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        command: list[str]) -> None:
    from parties.cli import main

    monkeypatch.chdir(tmp_path)
    for var in ("DPAGG_CA_CERT", "DPAGG_CERT", "DPAGG_KEY"):
        monkeypatch.delenv(var, raising=False)
    assert main(command) == 1
    err = capsys.readouterr().err
    assert "mutual TLS" in err and "--cert" in err and "dpagg certs" in err and "--insecure" in err
    assert not (tmp_path / "d").exists()  # refused before anything was created or bound


def test_cli_refuses_a_bad_range_with_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["query", "rel-1", "--range", "3-4"])
