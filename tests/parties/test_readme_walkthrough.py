"""The README's service walkthrough runs as written (free ports substituted), so it cannot drift from the code."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_the_readme_walkthrough_runs(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- walkthrough -->\n```bash\n(.*?)```", text, re.S)
    assert block, "README.md lost its <!-- walkthrough --> block"
    script = block.group(1)
    for port in ("50051", "50052"):
        script = script.replace(port, str(_free_port()))
    prelude = (
        "set -euo pipefail\n"
        f'dpagg() {{ "{sys.executable}" -m parties.cli "$@"; }}\n'
        f'python() {{ "{sys.executable}" "$@"; }}\n'
    )
    (tmp_path / "walkthrough.sh").write_text(prelude + script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPAGG_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["DPAGG_STATE_DIR"] = str(tmp_path / "state")
    # Output goes to files: the background servers keep a pipe open after the script ends.
    with open(tmp_path / "out.txt", "w") as fo, open(tmp_path / "err.txt", "w") as fe:
        proc = subprocess.Popen(["bash", "walkthrough.sh"], cwd=tmp_path, env=env, stdout=fo, stderr=fe,
                                start_new_session=True)
        try:
            proc.wait(timeout=300)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # the two servers the script started in the background
            except ProcessLookupError:
                pass
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert proc.returncode == 0, f"walkthrough failed ({proc.returncode}):\n{out}\n{err}"
    assert "clinic-a submitted" in out and "clinic-b submitted" in out and "charged epsilon 0.1" in out
    assert "ledger hash chain verified" in out and "spent 1 of 1" in out
    assert "epsilon 0.899999" in out  # the rest, as the README's comment explains
    assert "a new release may spend 0" in out  # not 9e-17


@pytest.mark.slow
def test_the_readme_threshold_walkthrough_runs(tmp_path: Path) -> None:
    """The README's three-holder how-to, as written (free ports substituted)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- threshold-walkthrough -->\n```bash\n(.*?)```", text, re.S)
    assert block, "README.md lost its <!-- threshold-walkthrough --> block"
    script = block.group(1)
    ports = {p: str(_free_port()) for p in ("50061", "50062", "50063", "50052")}
    script = script.replace("5006$i", "${HPORT[$i]}")
    for old, new in ports.items():
        script = script.replace(old, new)
    prelude = (
        "set -euo pipefail\n"
        f'dpagg() {{ "{sys.executable}" -m parties.cli "$@"; }}\n'
        f'python() {{ "{sys.executable}" "$@"; }}\n'
        f'HPORT=("" {ports["50061"]} {ports["50062"]} {ports["50063"]})\n'
    )
    (tmp_path / "threshold.sh").write_text(prelude + script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPAGG_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["DPAGG_STATE_DIR"] = str(tmp_path / "state")
    with open(tmp_path / "out.txt", "w") as fo, open(tmp_path / "err.txt", "w") as fe:
        proc = subprocess.Popen(["bash", "threshold.sh"], cwd=tmp_path, env=env, stdout=fo, stderr=fe,
                                start_new_session=True)
        try:
            proc.wait(timeout=400)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert proc.returncode == 0, f"threshold walkthrough failed ({proc.returncode}):\n{out}\n{err}"
    assert "clinic-a submitted" in out and "clinic-b submitted" in out
    assert "all 3 holders agree" in out and out.count("spent 1 of 1") == 3
