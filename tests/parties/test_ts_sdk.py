"""The TypeScript SDK (sdk-ts/) against the Python side: its own tests, SEAL bodies both ways, and owners in a study.

Node 22 comes with the package (`npm ci` in sdk-ts installs the npm package `node@22` as a dev
dependency; the system node is not used for these tests). Where sdk-ts/node_modules is missing the
fixture runs `npm ci` there once; every test skips with the reason when npm is missing or the
registry cannot be reached. The release tests are marked slow.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from .conftest import Cluster

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk-ts"
NODE = SDK / "node_modules" / ".bin" / "node"


@pytest.fixture(scope="session")
def node22() -> Path:
    """Node 22 from sdk-ts/node_modules (installed with `npm ci` when absent); skips with the reason otherwise."""
    if not (SDK / "node_modules" / "node-seal").is_dir() or not NODE.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm is not installed: the TypeScript SDK's tests need `npm ci` in sdk-ts (Node 22 comes with it)")
        try:
            proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=SDK, capture_output=True, text=True,
                                  timeout=600)
        except subprocess.TimeoutExpired:
            pytest.skip("`npm ci` in sdk-ts did not finish in 600 s (no registry access?)")
        if proc.returncode != 0 or not NODE.exists():
            pytest.skip(f"`npm ci` in sdk-ts failed (no registry access?): {proc.stderr.strip()[-300:]}")
    version = subprocess.run([str(NODE), "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    major, minor = (int(x) for x in version.lstrip("v").split(".")[:2])
    if (major, minor) < (22, 18):
        pytest.skip(f"sdk-ts needs Node >= 22.18 (TypeScript type stripping); node_modules has {version}")
    return NODE


def _node(node: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(node), *args], cwd=SDK, capture_output=True, text=True, timeout=timeout)


def test_the_packages_own_tests_pass_under_node_test(node22: Path) -> None:
    proc = _node(node22, "--test", "test/*.test.ts")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "# fail 0" in proc.stdout and "# pass 0" not in proc.stdout


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


def _ts_submit(node: Path, c: Cluster, study: str, owner: str, counts: np.ndarray, tmp: Path) -> dict[str, object]:
    from parties.common.signing import save_private_key

    path = tmp / f"{owner}.counts.json"
    path.write_text(json.dumps([int(x) for x in counts]))
    key = save_private_key(tmp / f"{owner}.key", c.signing_key(owner)[0])
    tls = c.tls(owner, "data_owner")
    assert tls is not None
    proc = _node(node, "bin/dpagg-ts.ts", "submit", "--target", c.cs.target, "--study", study, "--owner", owner,
                 "--counts", str(path), "--signing-key", str(key), "--ca", str(tls.ca_cert), "--cert", str(tls.cert),
                 "--key", str(tls.key))
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


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
                     str(tls.cert), "--key", str(tls.key))
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
