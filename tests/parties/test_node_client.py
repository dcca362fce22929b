"""The Node.js analyst client of the TypeScript SDK (sdk-ts/analyst, loaded from proto/ only) against real servers.

The script runs in place (so it finds ../../proto as documented); its npm packages come from
sdk-ts/node_modules, installed once per session (`npm ci`, shared with tests/parties/test_ts_sdk.py) when absent.
Skips with the reason without node, npm or a registry. Marked slow (the repo's marker for end-to-end runs;
`-m "not slow"` leaves it out).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .conftest import ANALYST_ID, Cluster

pytestmark = pytest.mark.slow

SDK = Path(__file__).resolve().parents[2] / "sdk-ts"
EXAMPLE = SDK / "analyst"
SCRIPT = EXAMPLE / "analyst.cjs"


@pytest.fixture(scope="module")
def node_env() -> dict[str, str]:
    """Environment for `node analyst.cjs` (any Node: the system's) with @grpc/grpc-js and @grpc/proto-loader
    resolvable from sdk-ts/node_modules, installed once per session with the TypeScript SDK's tests (one `npm ci`,
    skipped with the reason where npm or the registry is missing)."""
    from .test_ts_sdk import sdk_node22

    if shutil.which("node") is None:
        pytest.skip("node is needed for the Node example client test (not on PATH)")
    if not (SDK / "node_modules" / "@grpc" / "grpc-js").is_dir():
        found = sdk_node22()
        if isinstance(found, str):
            pytest.skip(found)
    return dict(os.environ)


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["node", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env)


def _parse(stdout: str) -> dict[str, Any]:
    """The JSON lines by kind: "health", "releases", "release" once each, "range" as a list."""
    out: dict[str, Any] = {"range": []}
    for line in stdout.splitlines():
        obj = json.loads(line)
        (kind, value), = obj.items()
        if kind == "range":
            out["range"].append(value)
        else:
            assert kind not in out, f"{kind} printed twice"
            out[kind] = value
    return out


def _released(c: Cluster, *, epsilon: float, releases: int) -> list[str]:
    """Open study s1 over 50 bins for owners a and b, submit, and run `releases` releases; their ids."""
    c.open_study(domain_size=50, owners=("a", "b"), epsilon=epsilon)
    rng = np.random.default_rng(4)
    for o in ("a", "b"):
        assert c.owner(o).submit("s1", rng.integers(0, 30, size=50)).committed
    return [c.computation().run_release("s1", epsilon=epsilon / releases).release_id for _ in range(releases)]


def test_node_analyst_reads_the_same_range_counts_as_the_python_sdk(node_env: dict[str, str],
                                                                    cluster: Cluster) -> None:
    first, newest = _released(cluster, epsilon=2.0, releases=2)
    proc = _run(node_env, "--target", cluster.cs.target, "--study", "s1", "--ranges", "0:10,10:50,5:45",
                "--insecure")
    assert proc.returncode == 0, proc.stderr
    out = _parse(proc.stdout)
    assert out["health"] == {"service": "dpagg.v1.Analyst", "status": "SERVING"}
    assert [r["release_id"] for r in out["releases"]] == [newest, first]
    assert out["release"]["release_id"] == newest and out["release"]["domain_size"] == 50

    ranges = [(0, 10), (10, 50), (5, 45)]
    expected = cluster.analyst().range_counts(newest, ranges)
    got = [(r["lo"], r["hi"], r["value"], r["standard_error"]) for r in out["range"]]
    assert got == [(e.lo, e.hi, e.value, e.standard_error) for e in expected]  # exact: the summary is fixed
    older = cluster.analyst().range_counts(first, ranges)
    assert [(e.value, e.standard_error) for e in older] != [(e.value, e.standard_error) for e in expected]


def test_node_analyst_errors_are_a_status_name_on_stderr_and_exit_1(node_env: dict[str, str],
                                                                    cluster: Cluster) -> None:
    _released(cluster, epsilon=1.0, releases=1)
    target = ["--target", cluster.cs.target, "--insecure"]

    # ListReleases answers an empty list for an unknown study; the client turns that into NOT_FOUND.
    unknown = _run(node_env, *target, "--study", "no-such-study")
    assert unknown.returncode == 1 and unknown.stderr.startswith("dpagg-node-analyst: NOT_FOUND:"), unknown.stderr
    assert "no-such-study" in unknown.stderr

    # A malformed id is refused by the server itself.
    malformed = _run(node_env, *target, "--study", "bad id!")
    assert malformed.returncode == 1, malformed.stderr
    assert malformed.stderr.startswith("dpagg-node-analyst: INVALID_ARGUMENT:") and "study_id" in malformed.stderr

    # GetRelease of an unknown release id: the server's NOT_FOUND with its details.
    missing = _run(node_env, *target, "--study", "s1", "--release", "rel-nope")
    assert missing.returncode == 1, missing.stderr
    assert missing.stderr.startswith("dpagg-node-analyst: NOT_FOUND: unknown release 'rel-nope'"), missing.stderr


def test_node_analyst_over_mutual_tls(node_env: dict[str, str], secure_cluster: Cluster) -> None:
    c = secure_cluster
    (release_id,) = _released(c, epsilon=1.0, releases=1)
    tls = c.tls(ANALYST_ID, "analyst")
    assert tls is not None
    auth = ["--ca", str(tls.ca_cert), "--cert", str(tls.cert), "--key", str(tls.key)]
    proc = _run(node_env, "--target", c.cs.target, "--study", "s1", "--range", "0:10", "--range", "5:50", *auth)
    assert proc.returncode == 0, proc.stderr
    out = _parse(proc.stdout)
    assert out["health"]["status"] == "SERVING" and out["release"]["release_id"] == release_id
    expected = c.analyst().range_counts(release_id, [(0, 10), (5, 50)])
    got = [(r["lo"], r["hi"], r["value"], r["standard_error"]) for r in out["range"]]
    assert got == [(e.lo, e.hi, e.value, e.standard_error) for e in expected]

    owner = c.tls("a", "data_owner")
    assert owner is not None
    denied = _run(node_env, "--target", c.cs.target, "--study", "s1", "--ca", str(owner.ca_cert), "--cert",
                  str(owner.cert), "--key", str(owner.key))
    assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr, denied.stderr


def _halfwidth(lo: float | None, hi: float | None) -> float:
    assert lo is not None and hi is not None
    return (hi - lo) / 2.0


def test_node_analyst_confidence_intervals_match_the_python_sdk(node_env: dict[str, str], cluster: Cluster) -> None:
    """--confidence: Python's interval and method: one whole partition, a sum of whole partitions (the same
    integers) and a range that cuts partitions (the cut values' noise enumerated: the same bisection, to its 1e-6
    tolerance), all exact."""
    (release_id,) = _released(cluster, epsilon=1.0, releases=1)
    summary = cluster.analyst().get_release(release_id).summary
    starts = [*summary.starts, summary.domain_size]
    assert len(starts) >= 4, starts  # at least three partitions to pick whole ones from
    ranges = [(starts[0], starts[1]), (starts[1], starts[3]), (0, summary.domain_size), (1, starts[2] + 1)]
    spec = ",".join(f"{a}:{b}" for a, b in ranges)
    proc = _run(node_env, "--target", cluster.cs.target, "--study", "s1", "--ranges", spec, "--insecure",
                "--confidence", "0.95")
    assert proc.returncode == 0, proc.stderr
    out = _parse(proc.stdout)
    assert out["confidence"]["level"] == 0.95 and "in at least 95% of releases" in out["confidence"]["meaning"]
    methods = []
    for r, (a, b) in zip(out["range"], ranges):
        ci = summary.interval(a, b, 0.95)
        assert (r["lo"], r["hi"], r["confidence"]) == (a, b, 0.95)
        assert r["ci_lo"] < r["value"] < r["ci_hi"]
        node_half, py_half = _halfwidth(r["ci_lo"], r["ci_hi"]), _halfwidth(ci.lo, ci.hi)
        assert r["interval_method"] == ci.method, (r, ci)
        assert node_half == pytest.approx(py_half, rel=2e-6, abs=1e-9), (a, b, r, ci)
        methods.append(r["interval_method"])
    assert methods == ["exact"] * 4 and summary.cuts_partition(*ranges[3])  # the last cuts partitions

    bad = _run(node_env, "--target", cluster.cs.target, "--study", "s1", "--insecure", "--confidence", "95")
    assert bad.returncode == 2 and "strictly between 0 and 1" in bad.stderr


def test_the_ported_interval_functions_equal_pythons(tmp_path: Path) -> None:
    """sdk-ts/analyst/intervals.cjs (no npm packages) against he_partition.core.intervals, case by case."""
    if shutil.which("node") is None:
        pytest.skip("node is needed (not on PATH)")
    from he_partition.core.intervals import chernoff_halfwidth, exact_cut_halfwidth, exact_halfwidth, exact_sum_halfwidth

    cases: list[dict[str, Any]] = [{"v": v, "c": c, "d": d} for v in (0.5, 2.0, 8.0, 50.0, 800.0) for c in (0.5, 0.9, 0.95, 0.99)
             for d in (1, 2)]
    sums: list[dict[str, Any]] = [{"vs": [2.0, 8.0], "ns": [3, 1], "c": 0.95}, {"vs": [12.5], "ns": [10], "c": 0.99},
            {"vs": [1.0, 3.0, 40.0], "ns": [2, 2, 1], "c": 0.9}]
    cuts: list[dict[str, Any]] = [{"vs": [8.0], "ns": [3], "ws": [0.25], "cv": [8.0], "c": 0.95},
            {"vs": [], "ns": [], "ws": [0.5, 0.1], "cv": [2.0, 50.0], "c": 0.9},
            {"vs": [12.5, 3.0], "ns": [2, 1], "ws": [0.75], "cv": [200.0], "c": 0.99}]
    script = tmp_path / "run.js"
    script.write_text(
        f"const i = require({json.dumps(str(EXAMPLE / 'intervals.cjs'))});\n"
        f"const cases = {json.dumps(cases)}, sums = {json.dumps(sums)}, cuts = {json.dumps(cuts)};\n"
        "console.log(JSON.stringify({\n"
        "  exact: cases.map((k) => i.exactHalfwidth(k.v, k.c, k.d)),\n"
        "  chernoff: cases.map((k) => i.chernoffHalfwidth([1, 0.4], [k.v, 2 * k.v], k.c, k.d + 0.5, [3, 1])),\n"
        "  sums: sums.map((k) => i.exactSumHalfwidth(k.vs, k.ns, k.c, 2)),\n"
        "  cuts: cuts.map((k) => i.exactCutHalfwidth(k.vs, k.ns, k.ws, k.cv, k.c, 2)),\n"
        "}));\n")
    proc = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["exact"] == [exact_halfwidth(k["v"], k["c"], k["d"]) for k in cases]
    want = [chernoff_halfwidth([1, 0.4], [k["v"], 2 * k["v"]], k["c"], k["d"] + 0.5, counts=[3, 1]) for k in cases]
    assert got["chernoff"] == pytest.approx(want, rel=1e-9)
    assert got["sums"] == [exact_sum_halfwidth(k["vs"], k["ns"], k["c"], 2) for k in sums]
    want_cuts = [exact_cut_halfwidth(k["vs"], k["ns"], k["ws"], k["cv"], k["c"], 2) for k in cuts]
    assert None not in want_cuts and got["cuts"] == pytest.approx(want_cuts, rel=2e-6)


def test_the_ported_interval_of_a_one_level_tree_is_pythons_exact_one(tmp_path: Path) -> None:
    """auto's one count per bin: intervals.cjs answers it as a partition, the same exact half-width as Python."""
    if shutil.which("node") is None:
        pytest.skip("node is needed (not on PATH)")
    from he_partition.protocol import release

    rng = np.random.default_rng(1)
    summary = release([rng.integers(0, 40, 50) for _ in range(2)], 0.9, rng=3)
    assert summary.estimator == "tree" and len(summary.released) == 1
    ranges = [(0, 10), (3, 4), (0, 50)]
    script = tmp_path / "run.js"
    script.write_text(
        f"const i = require({json.dumps(str(EXAMPLE / 'intervals.cjs'))});\n"
        f"const s = {summary.to_json()}, ranges = {json.dumps(ranges)};\n"
        "console.log(JSON.stringify(ranges.map(([lo, hi]) => i.rangeInterval(s, lo, hi, 0, 1, 0.95))));\n")
    proc = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for got, (lo, hi) in zip(json.loads(proc.stdout), ranges):
        ci = summary.interval(lo, hi, 0.95)
        assert (got["method"], got["hi"]) == ("exact", (ci.hi - ci.lo) / 2) and ci.method == "exact"
