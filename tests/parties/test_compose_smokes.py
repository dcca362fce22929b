"""The compose deployments are booted live by CI: `.ci/run` runs compose/smokes.sh, which runs every smoke script."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"


def test_ci_runs_every_compose_smoke_live() -> None:
    """.ci/run calls compose/smokes.sh after the tests, and smokes.sh names every compose/smoke-*.sh."""
    ci = (ROOT / ".ci" / "run").read_text()
    lines = [line.strip() for line in ci.splitlines() if not line.lstrip().startswith("#")]
    pytest_line = next(i for i, line in enumerate(lines) if "python -m pytest" in line)
    assert "bash compose/smokes.sh" in lines[pytest_line + 1:], ci
    listed = re.search(r"^SMOKES=\((.*)\)$", (COMPOSE / "smokes.sh").read_text(), flags=re.M)
    assert listed is not None
    scripts = {p.name for p in COMPOSE.glob("smoke*.sh")} - {"smoke-lib.sh", "smokes.sh"}
    assert set(listed.group(1).split()) == scripts


def test_smokes_skip_with_the_reason_where_docker_is_not_installed(tmp_path: Path) -> None:
    """Without a docker command the runner says why it skipped and exits 0, so CI on such a machine stays green."""
    env = {k: v for k, v in os.environ.items() if k != "DPAGG_SMOKES"}
    env["PATH"] = str(tmp_path)  # an empty folder: no docker, no dockerd
    proc = subprocess.run(["/bin/bash", str(COMPOSE / "smokes.sh")], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "SMOKES SKIPPED: Docker is not installed (no docker command on PATH)"
