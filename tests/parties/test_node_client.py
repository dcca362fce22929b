"""The Node.js example analyst client (examples/node-analyst, built from proto/ only) against real TLS servers."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from .conftest import ANALYST_ID, Cluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node-analyst"


@pytest.fixture(scope="module")
def node_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example with its npm dependencies installed (skips without node, npm or registry access)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the Node example client test")
    if (EXAMPLE / "node_modules" / "@grpc" / "grpc-js").is_dir():
        return EXAMPLE
    where = tmp_path_factory.mktemp("node-analyst")
    for name in ("package.json", "package-lock.json", "analyst.js"):
        shutil.copy(EXAMPLE / name, where / name)
    proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=where,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.skip(f"npm ci failed (no registry access?): {proc.stderr.strip()[-300:]}")
    return where


def _run(client: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proto = EXAMPLE.parents[1] / "proto"
    return subprocess.run(["node", str(client / "analyst.js"), "--proto-dir", str(proto), *args],
                          capture_output=True, text=True, timeout=120)


def test_node_analyst_reads_the_same_answers_as_the_python_sdk(node_client: Path, secure_cluster: Cluster) -> None:
    c = secure_cluster
    c.open_study(domain_size=50, owners=("a", "b"), epsilon=1.0)
    rng = np.random.default_rng(4)
    for o in ("a", "b"):
        assert c.owner(o).submit("s1", rng.integers(0, 30, size=50)).committed
    release = c.computation().run_release("s1", epsilon=1.0)
    tls = c.tls(ANALYST_ID, "analyst")
    assert tls is not None
    auth = ["--ca", str(tls.ca_cert), "--cert", str(tls.cert), "--key", str(tls.key)]
    proc = _run(node_client, "--target", c.cs.target, "--study", "s1", "--range", "0:10", "--range", "5:50", *auth)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines[0]["release"]["release_id"] == release.release_id and lines[0]["release"]["domain_size"] == 50
    expected = c.analyst().range_counts(release.release_id, [(0, 10), (5, 50)])
    got = [(r["range"]["lo"], r["range"]["hi"], r["range"]["value"], r["range"]["standard_error"]) for r in lines[1:]]
    assert got == [(e.lo, e.hi, e.value, e.standard_error) for e in expected]

    bad = _run(node_client, "--target", c.cs.target, "--study", "s1", "--release", "rel-nope", *auth)
    assert bad.returncode == 1 and bad.stderr.startswith("dpagg-node-analyst: NOT_FOUND:"), bad.stderr
    owner = c.tls("a", "data_owner")
    assert owner is not None
    denied = _run(node_client, "--target", c.cs.target, "--study", "s1", "--ca", str(owner.ca_cert), "--cert",
                  str(owner.cert), "--key", str(owner.key))
    assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr, denied.stderr
