"""The compose `threshold` profile booted for real: runs compose/smoke-threshold.sh when Docker with Compose v2 is here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .test_compose_live import _compose_v2

SMOKE = Path(__file__).resolve().parents[2] / "compose" / "smoke-threshold.sh"

pytestmark = pytest.mark.slow


def test_threshold_profile_smoke_script_passes() -> None:
    """3 key-share holders: key setup, a release and a query, equal ledgers, a holder down stops a release."""
    why = _compose_v2()
    if why:
        pytest.skip(f"compose threshold smoke test needs Docker with Compose v2: {why}")
    proc = subprocess.run(["bash", str(SMOKE)], capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0 and "SMOKE PASSED" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
