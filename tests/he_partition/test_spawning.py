"""Worker processes start without running the caller's script again (a script with no `__main__` guard)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
print("the user's script ran", flush=True)
from he_partition.execution.processes import ProcessExecutor

executor = ProcessExecutor(2)
executor.start()  # spawns both workers and waits until each answers
executor.close()
print("workers answered", flush=True)
"""


def test_a_script_without_a_main_guard_runs_once_and_its_workers_start(tmp_path: Path) -> None:
    """On the former code each spawned worker imported the script again: the first line printed three times,
    and the workers died starting processes of their own during their bootstrap."""
    script = tmp_path / "study.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("the user's script ran") == 1, proc.stdout
    assert "workers answered" in proc.stdout
