"""A server process ends within seconds of SIGTERM, whatever its threads are doing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, threading, time
from pathlib import Path
from parties.common.config import ComputationConfig
from parties.computation.server import create_computation_server

handle = create_computation_server(ComputationConfig(Path(sys.argv[1]), "127.0.0.1:9", insecure=True))
# a thread still working for a client that left (as a long RangeCounts did): never returns by itself
threading.Thread(target=lambda: [time.sleep(0.05) for _ in iter(int, 1)], name="busy").start()
handle.serve(port_file=sys.argv[2])
"""


def test_a_server_stops_within_seconds_of_sigterm_even_with_a_busy_thread(tmp_path: Path) -> None:
    """On the former code the process logged "server stopped" and stayed alive holding its memory until kill -9."""
    script = tmp_path / "serve.py"
    script.write_text(SCRIPT)
    port_file = tmp_path / "port"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "cs"), str(port_file)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < end, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
