"""The README's service walkthrough runs as written (free ports substituted), so it cannot drift from the code."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_block(tmp_path: Path, marker: str, ports: tuple[str, ...], *, timeout: float,
               rewrite: Callable[[str, dict[str, str]], tuple[str, str]] | None = None) -> str:
    """Run the README's bash block after `<!-- marker -->` with free ports in place of `ports`; its stdout."""
    text = (ROOT / "README.md").read_text()
    block = re.search(rf"<!-- {marker} -->\n```bash\n(.*?)```", text, re.S)
    assert block, f"README.md lost its <!-- {marker} --> block"
    script = block.group(1)
    free = {p: str(_free_port()) for p in ports}
    extra = ""
    if rewrite is not None:
        script, extra = rewrite(script, free)
    for old, port in free.items():
        script = script.replace(old, port)
    # `set -m`: each background job in its own process group, as in the interactive shell the README is typed
    # into, so `kill %1` stops a server as it does there; at the end the jobs still running are noted in
    # jobs.txt (a walkthrough that stops its servers leaves none) and stopped
    prelude = (
        "set -euo pipefail -m\n"
        "trap 'jobs -p > jobs.txt; for p in $(jobs -p); do kill -- -$p 2>/dev/null || true; done' EXIT\n"
        "trap 'exit 143' TERM\n"
        f'dpagg() {{ "{sys.executable}" -m parties.cli "$@"; }}\n'
        f'python() {{ "{sys.executable}" "$@"; }}\n' + extra
    )
    (tmp_path / "block.sh").write_text(prelude + script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPAGG_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["DPAGG_STATE_DIR"] = str(tmp_path / "state")
    # Output goes to files: the background servers keep a pipe open after the script ends.
    with open(tmp_path / "out.txt", "w") as fo, open(tmp_path / "err.txt", "w") as fe:
        proc = subprocess.Popen(["bash", "block.sh"], cwd=tmp_path, env=env, stdout=fo, stderr=fe,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # the servers the script started in the background
            except ProcessLookupError:
                pass
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert proc.returncode == 0, f"{marker} failed ({proc.returncode}):\n{out}\n{err}"
    return out


@pytest.mark.slow
def test_the_readme_walkthrough_runs(tmp_path: Path) -> None:
    out = _run_block(tmp_path, "walkthrough", ("50051", "50052"), timeout=300)
    assert "clinic-a submitted" in out and "clinic-b submitted" in out and "charged epsilon 0.1" in out
    assert "ledger hash chain verified" in out and "spent 1 of 1" in out
    assert "epsilon 0.899999" in out  # the rest, as the README's comment explains
    assert "a new release may spend 0" in out  # not 9e-17
    assert "a range of 10 bins (age width 20): expected error" in out and "95% interval +-13 (exact)" in out
    # the walkthrough ends by stopping its servers: no job of the shell it ran in was left running
    assert (tmp_path / "jobs.txt").read_text().split() == []


@pytest.mark.slow
def test_the_readme_threshold_walkthrough_runs(tmp_path: Path) -> None:
    """The README's three-holder how-to, as written (free ports substituted)."""
    def holder_ports(script: str, free: dict[str, str]) -> tuple[str, str]:
        return (script.replace("5006$i", "${HPORT[$i]}"),
                f'HPORT=("" {free["50061"]} {free["50062"]} {free["50063"]})\n')

    out = _run_block(tmp_path, "threshold-walkthrough", ("50061", "50062", "50063", "50052"), timeout=400,
                     rewrite=holder_ports)
    assert "clinic-a submitted" in out and "clinic-b submitted" in out
    assert "all 3 holders agree" in out and out.count("spent 1 of 1") == 3
