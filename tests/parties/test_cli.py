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
    assert out["epsilon_spent"] == 1.0 and out["epsilon_left"] == 0.0
    assert [c["epsilon"] for c in out["epsilon_charges"]] == [0.2, 0.8]
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


def test_a_whole_study_through_the_cli_processes(tmp_path: Path) -> None:
    """The same commands compose/docker-compose.yml runs, as plain processes on loopback."""
    from parties.data_owner.dataset import write_sample_csv

    env = _env(tmp_path)
    ds = subprocess.Popen([sys.executable, "-m", "parties.cli", "serve-decryption", "--data-dir", "ds", "--port", "0",
                           "--port-file", "ds.port"], cwd=tmp_path, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cs: subprocess.Popen[str] | None = None
    try:
        ds_addr = f"127.0.0.1:{_wait_port(tmp_path / 'ds.port', ds)}"
        cs = subprocess.Popen([sys.executable, "-m", "parties.cli", "serve-computation", "--data-dir", "cs", "--port",
                               "0", "--port-file", "cs.port", "--decryption", ds_addr], cwd=tmp_path, env=env,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        cs_addr = f"127.0.0.1:{_wait_port(tmp_path / 'cs.port', cs)}"
        opened = json.loads(dpagg(tmp_path, "open-study", "--computation", cs_addr, "--study-id", "cli",
                                  "--domain", "age:0:100:50", "--epsilon", "1", "--owners", "h1,h2", "--json").stdout)
        assert opened["domain_size"] == 50 and opened["expected_owners"] == ["h1", "h2"]
        for i, owner in enumerate(("h1", "h2")):
            write_sample_csv(tmp_path / f"{owner}.csv", seed=3, n_records=500, owner_index=i)
            sub = json.loads(dpagg(tmp_path, "submit", "--computation", cs_addr, "--decryption", ds_addr, "--study",
                                   "cli", "--owner", owner, "--csv", f"{owner}.csv", "--person-column", "person_id",
                                   "--json").stdout)
            assert sub["committed"] and not sub["duplicate"]
        again = json.loads(dpagg(tmp_path, "submit", "--computation", cs_addr, "--decryption", ds_addr, "--study",
                                 "cli", "--owner", "h1", "--csv", "h1.csv", "--person-column", "person_id",
                                 "--json").stdout)
        assert again["duplicate"] and again["bytes_sent"] == 0  # the kept upload key makes re-runs no-ops
        rel = json.loads(dpagg(tmp_path, "release", "run", "cli", "--computation", cs_addr, "--json").stdout)
        assert rel["state"] == "DONE" and rel["summary"]["domain_size"] == 50
        q = json.loads(dpagg(tmp_path, "query", rel["release_id"], "--analyst", cs_addr, "--range", "0:25",
                             "--range", "25:50", "--json").stdout)
        assert [(c["lo"], c["hi"]) for c in q["range_counts"]] == [(0, 25), (25, 50)]
        budget = json.loads(dpagg(tmp_path, "budget", "cli", "--decryption", ds_addr, "--json").stdout)
        assert budget["spent"] == 1.0 and budget["remaining"] == 0.0
        refused = dpagg(tmp_path, "release", "run", "cli", "--computation", cs_addr, check=False)
        assert refused.returncode == 1 and "RESOURCE_EXHAUSTED" in refused.stderr
        unknown = dpagg(tmp_path, "status", "nope", "--computation", cs_addr, check=False)
        assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr and "Traceback" not in unknown.stderr
    finally:
        for p in (cs, ds):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in (cs, ds):
            if p is not None:
                p.communicate(timeout=30)
    assert ds.returncode == 0 and cs is not None and cs.returncode == 0  # graceful shutdown on SIGTERM


def test_cli_refuses_a_bad_range_with_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["query", "rel-1", "--range", "3-4"])
