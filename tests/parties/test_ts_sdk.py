"""The TypeScript SDK (sdk-ts/) against the Python side: its own tests, SEAL bodies both ways, and owners in a study.

Node 22 comes with the package (`npm ci` in sdk-ts installs the npm package `node@22` as a dev
dependency; the system node is not used for these tests). Where sdk-ts/node_modules is missing the
fixture runs `npm ci` there once; every test skips with the reason when npm is missing or the
registry cannot be reached. The release tests are marked slow.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pytest

from .conftest import Cluster

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk-ts"
NODE = SDK / "node_modules" / ".bin" / "node"


#: How long `npm ci` may take (it downloads Node 22 itself, about 30 MB); each request gets NPM_FETCH_TIMEOUT_MS.
NPM_CI_TIMEOUT_S = 600
NPM_FETCH_TIMEOUT_MS = 120_000


def node22_or_reason(sdk: Path = SDK, env: Mapping[str, str] | None = None) -> Path | str:
    """Node 22 from `sdk`/node_modules, installed with `npm ci` there when absent; else why not (the skip reason).

    Cheap when node_modules is there (one `node --version`). Without it: no npm on PATH, a registry that does not
    answer a metadata read within seconds (offline: no 10-minute wait), a failed or overlong `npm ci`, or a Node older
    than 22.18 each give a reason instead of a failure. `env`: the environment npm and node run in (tests)."""
    env = dict(os.environ if env is None else env)
    node = sdk / "node_modules" / ".bin" / "node"
    if not (sdk / "node_modules" / "node-seal").is_dir() or not node.exists():
        npm = shutil.which("npm", path=env.get("PATH", ""))
        if npm is None:
            return "npm is not installed: the TypeScript SDK's tests need `npm ci` in sdk-ts (Node 22 comes with it)"
        quick = ["--no-audit", "--no-fund", "--fetch-retries=0"]
        try:
            # One metadata read of a package the install needs (any registry that can serve the install answers it).
            seal = json.loads((sdk / "package.json").read_text())["dependencies"]["node-seal"]
            ping = subprocess.run([npm, "view", f"node-seal@{seal}", "version", *quick, "--fetch-timeout=15000"],
                                  cwd=sdk, capture_output=True, text=True, timeout=60, env=env)
        except subprocess.TimeoutExpired:
            ping = None
        if ping is None or ping.returncode != 0:
            why = "no answer in 60 s" if ping is None else \
                (ping.stderr.strip().splitlines() or ["`npm view node-seal` failed"])[-1]
            return f"the npm registry cannot be reached, so sdk-ts/node_modules cannot be installed: {why[-300:]}"
        try:
            proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--fetch-retries=1",
                                   f"--fetch-timeout={NPM_FETCH_TIMEOUT_MS}"], cwd=sdk, capture_output=True,
                                  text=True, timeout=NPM_CI_TIMEOUT_S, env=env)
        except subprocess.TimeoutExpired:
            return f"`npm ci` in sdk-ts did not finish in {NPM_CI_TIMEOUT_S} s (a slow or unreachable registry?)"
        if proc.returncode != 0 or not node.exists():
            return f"`npm ci` in sdk-ts failed (no registry access?): {proc.stderr.strip()[-300:]}"
    try:
        version = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=60,
                                 env=env).stdout.strip()
        major, minor = (int(x) for x in version.lstrip("v").split(".")[:2])
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return f"sdk-ts/node_modules/.bin/node does not run ({exc}); delete sdk-ts/node_modules to reinstall"
    if (major, minor) < (22, 18):
        return f"sdk-ts needs Node >= 22.18 (TypeScript type stripping); node_modules has {version}"
    return node


@functools.cache
def sdk_node22() -> Path | str:
    """`node22_or_reason()` once per session (the Node analyst client's tests use the same install)."""
    return node22_or_reason()


@pytest.fixture(scope="session")
def node22() -> Path:
    """Node 22 from sdk-ts/node_modules (installed with `npm ci` once per session when absent); skips with the reason
    where it cannot be had."""
    found = sdk_node22()
    if isinstance(found, str):
        pytest.skip(found)
    return found


def _node(node: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(node), *args], cwd=SDK, capture_output=True, text=True, timeout=timeout)


def test_the_packages_own_tests_pass_under_node_test(node22: Path) -> None:
    proc = _node(node22, "--test", "test/*.test.ts")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "# fail 0" in proc.stdout and "# pass 0" not in proc.stdout


def test_the_package_typechecks_under_strict_typescript(node22: Path) -> None:
    """`npm run typecheck` (tsc, strict, no emit) over src/, bin/ and test/: the types the package documents hold."""
    proc = _node(node22, "node_modules/typescript/bin/tsc", "-p", "tsconfig.json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


def test_seal_bodies_agree_both_ways_once_the_headers_are_converted(node22: Path, tmp_path: Path) -> None:
    """Fails if either side's SEAL changes its body format: a node-seal chunk decrypts exactly in Python with a fresh
    ciphertext's noise budget, and a TenSEAL ciphertext goes through node-seal and comes back byte for byte."""
    import tenseal as ts
    import tenseal.sealapi as sealapi

    from he_partition.he.bfv import public_context_bytes
    from he_partition.he.params import generate_secret_context
    from he_partition.he.seal_io import load_seal_bytes, seal_bytes
    from he_partition.he.threshold.context import vector_ciphertext

    ctx = generate_secret_context()
    (tmp_path / "public.ctx").write_bytes(public_context_bytes(ctx))
    t = int(ctx.seal_context().data.first_context_data().parms().plain_modulus().value())
    values = [int(v) for v in np.random.default_rng(3).integers(0, t, size=8192, dtype=np.int64)]
    (tmp_path / "values.json").write_text(json.dumps(values))
    proc = _node(node22, "test/tools/seal-cross.ts", "encrypt", str(tmp_path / "public.ctx"),
                 str(tmp_path / "values.json"), str(tmp_path / "chunk.bin"))
    assert proc.returncode == 0, proc.stderr
    chunk = (tmp_path / "chunk.bin").read_bytes()
    assert [v % t for v in ts.bfv_vector_from(ctx, chunk).decrypt()] == values  # decrypt centres mod t
    raw = vector_ciphertext(chunk)
    seal = ctx.seal_context().data
    ct = load_seal_bytes(sealapi.Ciphertext(), seal, raw)
    budget = sealapi.Decryptor(seal, ctx.secret_key().data).invariant_noise_budget(ct)
    assert budget >= 100, budget  # a fresh encryption under these parameters: 103 bits

    mine = ts.bfv_vector(ctx, values).ciphertext()[0]
    python_bytes = _uncompressed(seal_bytes(mine))
    (tmp_path / "python.ct").write_bytes(python_bytes)
    proc = _node(node22, "test/tools/seal-cross.ts", "roundtrip", str(tmp_path / "public.ctx"),
                 str(tmp_path / "python.ct"), str(tmp_path / "back.ct"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "back.ct").read_bytes() == python_bytes


def _uncompressed(data: bytes) -> bytes:
    """A SEAL ciphertext's bytes with its members uncompressed (SEAL writes zstd by default)."""
    from he_partition.he.seal_io import _body, seal_header

    body = _body(data, "ciphertext")
    return seal_header(16 + len(body), data[2:5]) + body


def _ts_submit(node: Path, c: Cluster, study: str, owner: str, counts: np.ndarray | None, tmp: Path, *args: str,
               env: dict[str, str] | None = None, check: bool = True) -> dict[str, Any]:
    """`dpagg-ts submit` of `counts` (or, with counts None, of what `args` name: --csv ...) over mutual TLS, signed."""
    from parties.common.signing import save_private_key

    if counts is not None:
        path = tmp / f"{owner}.counts.json"
        path.write_text(json.dumps([int(x) for x in counts]))
        args = ("--counts", str(path), *args)
    key = save_private_key(tmp / f"{owner}.key", c.signing_key(owner)[0])
    tls = c.tls(owner, "data_owner")
    assert tls is not None
    if "--state-dir" not in args:  # never the home folder's ~/.dpagg
        args = (*args, "--state-dir", str(tmp / f"state-{owner}"))
    proc = subprocess.run([str(node), "bin/dpagg-ts.ts", "submit", "--target", c.cs.target, "--study", study, "--owner",
                           owner, "--signing-key", str(key), "--ca", str(tls.ca_cert), "--cert", str(tls.cert), "--key",
                           str(tls.key), *args], cwd=SDK, capture_output=True, text=True, timeout=300,
                          env=None if env is None else {**os.environ, **env})
    if not check:
        return {"returncode": proc.returncode, "stderr": proc.stderr}
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _records_csv(path: Path, n_persons: int, *, seed: int, max_records: int = 3) -> Path:
    """person_id,age records: each person has 1 to `max_records` records (ages 0..104, some outside 0..100), with
    quoted fields, a byte-order mark, blank lines and Windows line ends, so both readers are tried on them."""
    import csv

    rng = np.random.default_rng(seed)
    with open(path, "w", newline="", encoding="utf-8-sig") as fh:
        w = csv.writer(fh, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
        w.writerow(["person_id", "age", "note"])
        for p in range(n_persons):
            base = int(rng.integers(0, 105))
            for _ in range(int(rng.integers(1, max_records + 1))):
                age = min(base + int(rng.integers(0, 3)), 104)
                w.writerow([f"p{p:05d}", age if p % 7 else f"{age}.5" if p % 2 else f" {age} ", "a, \"quoted\" note"])
            if p % 50 == 0:
                fh.write("\r\n")
    return path


def _ts_histogram(node: Path, csv: Path, domain: str, *args: str) -> dict[str, Any]:
    proc = _node(node, "bin/dpagg-ts.ts", "histogram", "--csv", str(csv), "--domain", domain, *args)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _py_histogram(csv: Path, domain: str, *, person_column: str | None = "person_id", per_bin: int = 3,
                  max_bins: int = 3) -> dict[str, Any]:
    from parties.data_owner.dataset import ContributionBounds, read_histogram
    from parties.data_owner.domain import DomainSpec

    h = read_histogram(csv, DomainSpec.parse(domain), person_column=person_column,
                       bounds=ContributionBounds(per_bin=per_bin, max_bins=max_bins), on_bad_value="drop")
    return {"counts": [int(x) for x in h.counts], "contribution_bound": h.contribution_bound,
            "records_read": h.records_read, "records_dropped": h.records_dropped, "out_of_domain": h.out_of_domain}


@pytest.mark.parametrize("domain", ["age:0:100:50", "age:0:100:7", "age:0.5:99.5:33", "age:edges:0,18,18.5,65,101",
                                    "age:categories:20,21,30,44.5,100"])
def test_the_typescript_owner_bins_a_csv_as_the_python_owner_does(node22: Path, tmp_path: Path, domain: str) -> None:
    """The same file, the same domain spec (the contract's grammar) and bounds that keep every record (3 per bin, 3
    bins; no person has more than 3 records): the TypeScript owner's histogram before encryption is Python's, exactly,
    with the same counts of records read, outside the domain (or unreadable, dropped) and dropped by the bound."""
    csv = _records_csv(tmp_path / "records.csv", 400, seed=5)
    py = _py_histogram(csv, domain)
    assert py["records_dropped"] == 0 and sum(py["counts"]) > 0
    ts = _ts_histogram(node22, csv, domain, "--person-column", "person_id", "--per-bin", "3", "--max-bins", "3",
                       "--drop-bad-values")
    assert ts == py


@pytest.mark.parametrize("text", [
    "person_id,age\np1,20\n\np2,old\n",                  # not a number, after a blank line
    "person_id,age\r\np1,20\r\np2,\r\n",              # empty value, CRLF
    "person_id,age\np1,20\n\"p\n2\",nan\n",           # NaN, a quoted id across two lines
    "person_id,age\np1,20,extra\n",                       # more fields than the header
    "person_id,age\n,20\n",                               # no person id
    "id,years\np1,20\n",                                  # no such column
    "",                                                     # empty file
])
def test_the_typescript_owner_refuses_a_bad_csv_with_the_python_owners_words(node22: Path, tmp_path: Path,
                                                                             text: str) -> None:
    from he_partition.core.errors import InvalidInputError
    from parties.data_owner.dataset import ContributionBounds, read_histogram
    from parties.data_owner.domain import DomainSpec

    csv = tmp_path / "bad.csv"
    csv.write_bytes(text.encode())
    with pytest.raises(InvalidInputError) as py:
        read_histogram(csv, DomainSpec.parse("age:0:100:10"), person_column="person_id",
                       bounds=ContributionBounds(), drop_hint="--drop-bad-values")
    proc = _node(node22, "bin/dpagg-ts.ts", "histogram", "--csv", str(csv), "--domain", "age:0:100:10",
                 "--person-column", "person_id")
    assert proc.returncode == 1 and proc.stderr.strip() == f"dpagg-ts: {py.value}"


def test_the_typescript_owner_bounds_a_persons_contribution_as_the_python_owner_does(node22: Path,
                                                                                     tmp_path: Path) -> None:
    """Bounds that drop records: the choice is random on both sides, so what agrees is what the bound fixes: the
    records dropped and kept and each bin's count within what one person's bins allow."""
    csv = _records_csv(tmp_path / "records.csv", 300, seed=6, max_records=6)
    domain = "age:0:105:21"
    py = _py_histogram(csv, domain, per_bin=1, max_bins=1)
    ts = _ts_histogram(node22, csv, domain, "--person-column", "person_id")
    assert ts["records_dropped"] == py["records_dropped"] > 0
    assert sum(ts["counts"]) == sum(py["counts"]) == 300  # one record per person kept
    everything = _py_histogram(csv, domain, per_bin=6, max_bins=6)["counts"]
    assert all(0 <= t <= e for t, e in zip(ts["counts"], everything))


def test_a_csv_split_between_a_python_and_a_typescript_owner_gives_the_all_python_histogram(
        node22: Path, tmp_path: Path) -> None:
    """One CSV split in two (by lines, a person's records may fall on both sides): the Python owner's histogram of
    one half plus the TypeScript owner's of the other equals the all-Python histogram of the whole, bin by bin."""
    csv = _records_csv(tmp_path / "records.csv", 500, seed=7)
    lines = csv.read_text(encoding="utf-8-sig").splitlines(keepends=True)
    header, body = lines[0], lines[1:]
    (tmp_path / "a.csv").write_text(header + "".join(body[: len(body) // 2]))
    (tmp_path / "b.csv").write_text(header + "".join(body[len(body) // 2:]))
    domain = "age:0:100:40"
    whole = _py_histogram(csv, domain)
    a = _py_histogram(tmp_path / "a.csv", domain)
    b = _ts_histogram(node22, tmp_path / "b.csv", domain, "--person-column", "person_id", "--per-bin", "3",
                      "--max-bins", "3", "--drop-bad-values")
    assert [x + y for x, y in zip(a["counts"], b["counts"])] == whole["counts"]
    assert a["records_read"] + b["records_read"] == whole["records_read"]


@pytest.mark.slow
def test_python_dpagg_submit_and_typescript_submit_of_one_csv_release_the_all_python_histogram(
        node22: Path, secure_cluster: Cluster, tmp_path: Path) -> None:
    """Through the services with mutual TLS, K = 1, a signed study whose contract records the domain spec: owner a
    submits one half of a CSV with Python's `dpagg submit`, owner b the other half with `dpagg-ts submit --csv`; the
    release (at EPS, so without noise) equals the all-Python histogram of the whole file, partition by partition."""
    from parties.cli import main
    from parties.common.signing import save_private_key

    c = secure_cluster
    domain = "age:0:100:50"
    c.open_study(domain_size=50, owners=("a", "b"), epsilon=EPS, domain_spec=domain, contribution_bound=9)
    csv = _records_csv(tmp_path / "records.csv", 500, seed=8)
    lines = csv.read_text(encoding="utf-8-sig").splitlines(keepends=True)
    (tmp_path / "a.csv").write_text(lines[0] + "".join(lines[1: len(lines) // 2]))
    (tmp_path / "b.csv").write_text(lines[0] + "".join(lines[len(lines) // 2:]))
    tls = c.tls("a", "data_owner")
    assert tls is not None
    key_a = save_private_key(tmp_path / "a.key", c.signing_key("a")[0])
    bounds = ("--person-column", "person_id", "--per-bin", "3", "--max-bins", "3", "--drop-bad-values")
    assert main(["submit", "--study", "s1", "--owner", "a", "--csv", str(tmp_path / "a.csv"), *bounds,
                 "--computation", c.cs.target, "--no-progress", "--state-dir", str(tmp_path / "state-a"),
                 "--signing-key", str(key_a), "--ca-cert", str(tls.ca_cert), "--cert", str(tls.cert),
                 "--key", str(tls.key)]) == 0
    res = _ts_submit(node22, c, "s1", "b", None, tmp_path, "--csv", str(tmp_path / "b.csv"), *bounds,
                     "--state-dir", str(tmp_path / "state-b"))
    assert res["committed"] is True
    rel = c.computation().run_release("s1", epsilon=EPS)
    summary = c.analyst().get_release(rel.release_id).summary
    truth = np.asarray(_py_histogram(csv, domain)["counts"])
    starts = [*summary.starts, 50]
    assert [int(round(x)) for x in summary.sums] == [int(truth[lo:hi].sum()) for lo, hi in zip(starts, starts[1:])]


def test_a_typescript_submit_killed_mid_upload_resumes_from_its_saved_chunks_and_commits_once(
        node22: Path, secure_cluster: Cluster, tmp_path: Path) -> None:
    """Mutual TLS, a signed study of 20,000 bins (3 chunks), a CSV whose bound drops records at random: the first
    process sends one chunk and dies (SIGKILL); the same command again keeps the very same records (keyed choice),
    reuses the saved ciphertexts (the server keeps the chunk it holds: same signature) and sends the 2 others; a
    third run sends nothing. The release counts the records once."""
    c = secure_cluster
    bins = 20_000
    c.open_study(domain_size=bins, owners=("a",), epsilon=EPS, domain_spec=f"age:0:105:{bins}")
    csv = _records_csv(tmp_path / "records.csv", 400, seed=9, max_records=4)
    argv = ("--csv", str(csv), "--person-column", "person_id", "--drop-bad-values", "--state-dir",
            str(tmp_path / "state"))
    died = _ts_submit(node22, c, "s1", "a", None, tmp_path, *argv, env={"DPAGG_TS_TEST_CRASH_AFTER_CHUNKS": "1"},
                      check=False)
    assert died["returncode"] == -signal.SIGKILL, died["stderr"]
    saved = list((tmp_path / "state" / "uploads").glob("s1.a.*.chunks/chunk-*.ct"))
    assert len(saved) == 3
    key = saved[0].parent.name.split(".")[2]
    status = c.computation().upload_status("s1", "a", key)
    assert status.state == "PARTIAL" and list(status.received) == [0]
    res = _ts_submit(node22, c, "s1", "a", None, tmp_path, *argv)
    assert res["idempotencyKey"] == key and res["committed"] is True
    assert (res["chunkCount"], res["chunksSent"], res["duplicate"]) == (3, 2, False)
    assert res["records_dropped"] > 0  # the bound chose among a person's records
    assert not list((tmp_path / "state" / "uploads").glob("*.chunks"))  # forgotten once committed
    again = _ts_submit(node22, c, "s1", "a", None, tmp_path, *argv)
    assert (again["duplicate"], again["chunksSent"]) == (True, 0)
    rel = c.computation().run_release("s1", epsilon=EPS)
    summary = c.analyst().get_release(rel.release_id).summary
    assert int(round(sum(summary.sums))) == 400  # one record of each of the 400 persons, counted once


#: So large that every discrete Laplace draw of the release is 0 with overwhelming probability (scale 2 / EPS per
#: draw): the servers key each draw to the measurement ciphertext's digest, and an encryption is randomized, so two
#: studies never share their draws, only their noise-free values. At this epsilon those are what is released.
EPS = 1000.0


def _release(c: Cluster, study: str, submit_b: object) -> tuple[object, np.ndarray]:
    c.open_study(study_id=study, domain_size=50, owners=("a", "b"), epsilon=EPS)
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, 30, size=50), rng.integers(0, 30, size=50)
    assert c.owner("a").submit(study, a).committed
    submit_b(study, b)  # type: ignore[operator]
    rel = c.computation().run_release(study, epsilon=EPS)
    return c.analyst().get_release(rel.release_id).summary, a + b


@pytest.mark.slow
def test_a_python_and_a_typescript_owner_release_what_two_python_owners_release(node22: Path, tmp_path: Path) -> None:
    """Mutual TLS, K = 1, a signed study: owner b submits from TypeScript in one cluster and from Python in another
    started with the same seeds; the released summaries are equal, and equal the owners' true sums (EPS says why)."""
    summaries = []
    for lang in ("ts", "python"):
        c = Cluster.start(tmp_path / lang, secure=True)
        try:
            if lang == "ts":
                def submit(study: str, counts: np.ndarray, c: Cluster = c) -> None:
                    res = _ts_submit(node22, c, study, "b", counts, tmp_path)
                    assert res["committed"] is True and res["chunkCount"] == 1
            else:
                def submit(study: str, counts: np.ndarray, c: Cluster = c) -> None:
                    assert c.owner("b").submit(study, counts).committed
            summaries.append(_release(c, "s1", submit))
        finally:
            c.stop()
    (ts_summary, truth), (py_summary, _) = summaries
    assert ts_summary.to_dict() == py_summary.to_dict()  # type: ignore[attr-defined]
    starts = [*ts_summary.starts, 50]  # type: ignore[attr-defined]
    exact = [int(truth[lo:hi].sum()) for lo, hi in zip(starts, starts[1:])]
    assert [int(round(x)) for x in ts_summary.sums] == exact  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_typescript_owner_in_a_3_of_3_threshold_study_seals_to_every_holder(node22: Path, tmp_path: Path) -> None:
    """Three key-share holders (K = 3, every one needed), mutual TLS: owner a submits from Python, owner b from
    TypeScript, sealed to the three holders' seal keys and committed; the release equals the true sums (EPS)."""
    from parties.common.signing import save_private_key

    from .test_threshold_services import Threshold

    t = Threshold.start(tmp_path / "t")
    try:
        t.computation().setup_key()
        contract = t.open("s1", owners=("a", "b"), epsilon=EPS, strategy="gap", domain_size=50)
        assert len(contract.holder_seal_keys) == 3
        rng = np.random.default_rng(4)
        a, b = rng.integers(0, 30, size=50), rng.integers(0, 30, size=50)
        assert t.owner("a").submit("s1", a).committed
        path = tmp_path / "b.counts.json"
        path.write_text(json.dumps([int(x) for x in b]))
        key = save_private_key(tmp_path / "b.key", t.signing["b"][0])
        tls = t.pki.tls("b", "data_owner")
        proc = _node(node22, "bin/dpagg-ts.ts", "submit", "--target", t.cs.target, "--study", "s1", "--owner", "b",
                     "--counts", str(path), "--signing-key", str(key), "--ca", str(tls.ca_cert), "--cert",
                     str(tls.cert), "--key", str(tls.key), "--state-dir", str(tmp_path / "state"))
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.strip().splitlines()[-1])["committed"] is True
        rel = t.computation().run_release("s1", epsilon=EPS)
        from parties.analyst.client import AnalystClient

        analyst = AnalystClient(t.cs.target, tls=t.pki.tls("an", "analyst"))
        t.clients.append(analyst)
        summary = analyst.get_release(rel.release_id).summary
        starts = [*summary.starts, 50]
        truth = a + b
        assert [int(round(x)) for x in summary.sums] == [int(truth[lo:hi].sum()) for lo, hi in zip(starts, starts[1:])]
    finally:
        t.stop()


def _ts_query(node: Path, c: Cluster, *args: str) -> dict[str, Any]:
    from .conftest import ANALYST_ID

    tls = c.tls(ANALYST_ID, "analyst")
    assert tls is not None
    proc = _node(node, "bin/dpagg-ts.ts", "query", "--target", c.cs.target, "--ca", str(tls.ca_cert), "--cert",
                 str(tls.cert), "--key", str(tls.key), *args)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


@pytest.mark.parametrize("strategy", ["gap", "hier"])
def test_the_typed_analyst_api_answers_as_the_python_sdk(node22: Path, secure_cluster: Cluster,
                                                         strategy: str) -> None:
    """Mutual TLS as the analyst: the TypeScript API lists the study's releases newest first, reads a release's
    status, and answers range counts with the Python SDK's values and standard errors (exactly) and its confidence
    intervals and their method: exact for a whole partition and a sum of whole ones (the same integers), exact for
    ranges that cut partitions (the same bisection, to its 1e-6 tolerance), and the bound for least squares."""
    c = secure_cluster
    c.open_study(domain_size=50, owners=("a", "b"), epsilon=2.0, strategy=strategy)
    rng = np.random.default_rng(4)
    for o in ("a", "b"):
        assert c.owner(o).submit("s1", rng.integers(0, 30, size=50)).committed
    first, newest = (c.computation().run_release("s1", epsilon=0.5).release_id for _ in range(2))
    summary = c.analyst().get_release(newest).summary
    starts = [*summary.starts, 50]
    ranges = [(0, 50), (0, 10), (5, 45), (3, 4), (starts[0], starts[1]), (starts[0], starts[min(2, len(starts) - 1)])]
    text = ",".join(f"{lo}:{hi}" for lo, hi in ranges)
    out = _ts_query(node22, c, "--study", "s1", "--ranges", text, "--confidence", "0.95")
    assert [r["releaseId"] for r in out["releases"]] == [newest, first]
    assert out["status"]["state"] == "DONE" and out["status"]["releaseId"] == newest
    assert out["status"]["epsilon"] == 0.5 and sorted(out["status"]["owners"]) == ["a", "b"]
    expected = c.analyst().range_counts(newest, ranges, confidence=0.95)
    methods = set()
    # a tree of several levels: Python bounds by the estimator's weights (chernoff), the port by the standard error
    least_squares = summary.estimator != "partition" and len(summary.released) > 1
    for got, want, (lo, hi) in zip(out["ranges"], expected, ranges):
        assert (got["lo"], got["hi"], got["value"], got["standardError"]) == (lo, hi, want.value, want.standard_error)
        ci = summary.interval(lo, hi, 0.95)
        assert got["confidence"] == 0.95 and want.ci_hi is not None
        half, want_half = got["ciHi"] - got["value"], want.ci_hi - want.value
        if least_squares:  # wider, never narrower
            assert got["intervalMethod"] == "bound" and half >= want_half - 2e-6 * max(1.0, want_half)
        else:
            assert got["intervalMethod"] == ci.method
            assert got["ciLo"] == pytest.approx(want.ci_lo, abs=2e-6 * max(1.0, want_half))
            assert half == pytest.approx(want_half, abs=2e-6 * max(1.0, want_half)), (lo, hi, ci.method)
        methods.add((got["intervalMethod"], summary.cuts_partition(lo, hi)))
    if strategy == "gap":  # whole partitions and cut ones, both exact
        assert methods == {("exact", False), ("exact", True)}
    elif least_squares:
        assert {m for m, _ in methods} == {"bound"}
    else:  # hier released one level of one-bin partitions: answered as a partition, exactly
        assert {m for m, _ in methods} == {"exact"}
    older = _ts_query(node22, c, "--release", first, "--ranges", "0:10")
    assert older["releases"] == [] and older["ranges"][0]["value"] == c.analyst().range_counts(first, [(0, 10)])[0].value


def _sdk_without_node_modules(tmp_path: Path) -> Path:
    sdk = tmp_path / "sdk-ts"
    sdk.mkdir()
    for name in ("package.json", "package-lock.json"):
        shutil.copy(SDK / name, sdk / name)
    return sdk


def test_without_npm_the_typescript_tests_skip_with_the_reason(tmp_path: Path) -> None:
    """No sdk-ts/node_modules and no npm on PATH: a reason, not a failure (and nothing is run)."""
    sdk = _sdk_without_node_modules(tmp_path)
    reason = node22_or_reason(sdk, {**os.environ, "PATH": str(tmp_path / "empty")})
    assert isinstance(reason, str) and reason.startswith("npm is not installed")
    assert not (sdk / "node_modules").exists()


def test_without_a_registry_the_typescript_tests_skip_within_seconds(tmp_path: Path) -> None:
    """No sdk-ts/node_modules and a registry that does not answer (here: a closed local port, an empty npm cache):
    its metadata read says so within seconds and the tests skip with the reason instead of failing or waiting."""
    import time

    if shutil.which("npm") is None:
        pytest.skip("npm is not installed (the case of the test above)")
    sdk = _sdk_without_node_modules(tmp_path)
    env = {**os.environ, "npm_config_registry": "http://127.0.0.1:9/", "npm_config_cache": str(tmp_path / "cache"),
           "npm_config_offline": "false", "npm_config_prefer_offline": "false"}
    started = time.monotonic()
    reason = node22_or_reason(sdk, env)
    assert isinstance(reason, str) and reason.startswith("the npm registry cannot be reached"), reason
    assert time.monotonic() - started < 30
    assert not (sdk / "node_modules").exists()


def test_a_node_older_than_22_in_node_modules_skips_with_its_version(tmp_path: Path) -> None:
    sdk = _sdk_without_node_modules(tmp_path)
    (sdk / "node_modules" / "node-seal").mkdir(parents=True)
    (sdk / "node_modules" / ".bin").mkdir()
    fake = sdk / "node_modules" / ".bin" / "node"
    fake.write_text("#!/bin/sh\necho v20.19.5\n")
    fake.chmod(0o755)
    assert node22_or_reason(sdk) == "sdk-ts needs Node >= 22.18 (TypeScript type stripping); node_modules has v20.19.5"
