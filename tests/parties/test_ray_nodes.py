"""The services' release across two Ray nodes equals the in-process executor's, summary value for value.

A real 2-node Ray cluster on this machine (`ray start --head` and a second `ray start --address`,
one CPU each, custom resources node_a and node_b), a real computation server
(`dpagg serve-computation --cluster ...`, a process of its own) whose two chunk actors land one on
each node, owners uploading through the services; then the same study on a computation server with
the in-process executor under the same seeds.

What is compared, and why the key holder's draw is fixed here: the key holder's own draw is keyed
by the release id and the digest of the bytes it receives (`_request_noise`), and those bytes carry
the computation server's fresh encryption and flooding randomness, so by design two runs never
release the same values. The test therefore checks two things: (1) untouched, the computation
server's view of every measurement (the exact bytes it sent, decrypted with the study's secret key)
is the numpy oracle's under its seed on both executors; (2) with the key holder's draw keyed by the
request alone (this test's double: release id and digest left out of its label), the released
summaries are equal exactly.

The chunk files: the actors read the owners' chunk files by path from the computation server's data
directory, which every node sees here because both run on this machine. A cluster across machines
needs those files on storage every node reads (object storage or a shared file system; see
docs/scaling.md, "Across nodes").
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from he_partition.core.measurements import Measurement
from he_partition.execution.base import owner_of
from parties.decryption.server import create_decryption_server

from .conftest import Cluster, blocky_histograms
from .test_scale_out import assert_cs_view_is_the_oracle

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'dpagg[ray]'): no cluster to start")

pytestmark = pytest.mark.slow  # two Ray nodes (4-15 s to start on 2 cores) and two deployments: 15-26 s

ROOT = Path(__file__).resolve().parents[2]
N = 2 * 8192 + 10  # three chunks: 0 and 2 are actor 0's, 1 is actor 1's
DS_SEED, CS_SEED = 11, 12

# Run against the cluster while the computation server holds its actors: the custom resource of the node
# each live chunk actor runs on.
WHERE = """
import json, sys, ray
from ray._private.state import actors
ray.init(address=sys.argv[1], _node_ip_address="127.0.0.1", log_to_driver=False)
names = {n["NodeID"]: [k for k in n["Resources"] if k in ("node_a", "node_b")] for n in ray.nodes() if n["Alive"]}
chunk = [a for a in actors().values() if "ChunkWorker" in a["ActorClassName"] and a["State"] == "ALIVE"]
print("RESULT " + json.dumps({"nodes": len(names), "actors": sorted(names.get(a["Address"]["NodeID"], ["?"])[0]
                                                                   for a in chunk)}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # Plain Ray on loopback (tests/parties/test_ray_tls.py covers TLS); the workers import this checkout.
    return {**base, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}


def _stop(proc: subprocess.Popen[bytes], grace: float = 2.0) -> None:
    """End a process group this test started: SIGTERM, then SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)  # `ray start --block` can outlive SIGTERM by 30 s; its session is a temp dir
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def two_ray_nodes(log_dir: Path) -> Iterator[str]:
    """A head (node_a) and a second node (node_b), one CPU each, on loopback; yields the head's address and
    ends both process groups after (`benchmarks/ray_nodes.py` uses it too)."""
    ray_bin = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    # Ray's session directory (the head's, which the second node takes over) must be short: its sockets' paths
    # are limited to 107 bytes and pytest's temp paths are long.
    session = Path(tempfile.mkdtemp(prefix="dpagg-ray-", dir="/tmp"))
    address = f"127.0.0.1:{_free_port()}"
    common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    procs = [subprocess.Popen(
        [ray_bin, "start", "--head", "--port", address.split(":")[1], "--include-dashboard=false",
         "--temp-dir", str(session), "--resources", json.dumps({"node_a": 1}), *common],
        env=_env(), start_new_session=True, stdout=subprocess.DEVNULL, stderr=(log_dir / "head.log").open("wb"))]
    try:
        # The second node joins once the head's GCS answers (it retries the address meanwhile).
        procs.append(subprocess.Popen(
            [ray_bin, "start", "--address", address, "--resources", json.dumps({"node_b": 1}), *common],
            env=_env(), start_new_session=True, stdout=subprocess.DEVNULL, stderr=(log_dir / "node.log").open("wb")))
        wait = ("import sys, time, ray\n"
                "ray.init(address=sys.argv[1], _node_ip_address='127.0.0.1', log_to_driver=False)\n"
                "end = time.monotonic() + 60\n"
                "while sum(n['Alive'] for n in ray.nodes()) < 2 and time.monotonic() < end:\n"
                "    time.sleep(0.2)\n"
                "print('ALIVE', sum(n['Alive'] for n in ray.nodes()))\n")
        out = subprocess.run([sys.executable, "-c", wait, address], env=_env(), capture_output=True, text=True,
                             timeout=180)
        assert "ALIVE 2" in out.stdout, out.stdout + out.stderr[-3000:] + (log_dir / "node.log").read_text()[-2000:]
        yield address
    finally:
        for p in reversed(procs):
            _stop(p)
        shutil.rmtree(session, ignore_errors=True)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The 2-node cluster for this module's test."""
    if not (shutil.which("ray") or Path(sys.executable).with_name("ray").exists()):
        pytest.skip("the `ray` command is not installed (pip install 'dpagg[ray]')")
    with two_ray_nodes(tmp_path_factory.mktemp("ray2nodes")) as address:
        yield address


@dataclass
class _ServedCS:
    """`dpagg serve-computation` in a process of its own, standing in for a ServerHandle (target, stop)."""

    proc: subprocess.Popen[bytes]
    target: str
    log: Path

    @classmethod
    def start(cls, root: Path, ds_target: str, executor: list[str]) -> "_ServedCS":
        port_file, log = root / "cs.port", root / "cs.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "parties.cli", "serve-computation", "--data-dir", str(root / "cs"), "--port",
                 "0", "--port-file", str(port_file), "--decryption", ds_target, "--insecure",
                 "--insecure-noise-seed", str(CS_SEED), *executor],
                cwd=root, env=_env(), start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)
        end = time.monotonic() + 120
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > end:
                _stop(proc)
                raise AssertionError(f"the computation server did not start:\n{log.read_text()[-4000:]}")
            time.sleep(0.1)
        return cls(proc, f"127.0.0.1:{int(port_file.read_text())}", log)

    def stop(self) -> None:
        _stop(self.proc, grace=20.0)


def deploy_and_release(root: Path, executor: list[str], cluster_address: str = "", *, bins: int = N) -> dict[str, Any]:
    """Key holder (in this process) and computation server (its own process) under fixed seeds; three owners
    upload through the services; a release of 0.5 of 1.0. Returns the summary, the CS's view and where the
    chunk actors ran (cluster_address given)."""
    ds = create_decryption_server(Cluster._ds_config(root, None, 0, DS_SEED)).start()
    handler = ds.handler
    real_noise, real_decrypt = handler._request_noise, handler.decrypt_measurement

    def request_keyed_noise(study_id: str, release_id: str, release_epsilon: float, m: Measurement, digest: str,
                            **kw: Any) -> Any:  # this test's double: the draw keyed by the request alone
        return real_noise(study_id, "rel-fixed", release_epsilon, m, "fixed", **kw)

    sent: list[tuple[Measurement, list[bytes]]] = []

    def recording(**kw: Any) -> Any:  # the real call on the very bytes the computation server sent, kept
        chunks = list(kw["chunks"])
        sent.append((kw["measurement"], chunks))
        return real_decrypt(**{**kw, "chunks": chunks})

    handler._request_noise = request_keyed_noise
    handler.decrypt_measurement = recording
    try:
        cs = _ServedCS.start(root, ds.target, executor)
    except BaseException:
        ds.stop()
        raise
    cluster = Cluster(root, ds, cs)  # type: ignore[arg-type]
    hs = blocky_histograms(bins)
    try:
        cluster.open_study(domain_size=bins, epsilon=1.0)
        secret = handler.backend_for(handler.get_study("s1"))
        for owner, h in zip(("a", "b", "c"), hs):
            assert cluster.owner(owner).submit("s1", h).committed
        started = time.monotonic()
        rel = cluster.computation().run_release("s1", epsilon=0.5)
        took = time.monotonic() - started
        assert rel.state == "DONE", (rel.error_code, rel.error_message)
        where = None
        if cluster_address:  # while the server still holds its actors
            out = subprocess.run([sys.executable, "-c", WHERE, cluster_address], env=_env(), capture_output=True,
                                 text=True, timeout=120)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            assert lines, out.stdout + out.stderr[-3000:]
            where = json.loads(lines[-1][len("RESULT "):])
    except BaseException:
        print(cs.log.read_text()[-4000:])
        raise
    finally:
        cluster.stop()
    assert_cs_view_is_the_oracle(secret, sent, hs, CS_SEED)  # (1): untouched by the double
    return {"summary": rel.summary, "sent": sent, "where": where, "release_s": took,
            "bytes_to_decryption": sum(len(c) for _, chunks in sent for c in chunks)}


def test_a_release_with_chunk_actors_on_two_ray_nodes_equals_the_in_process_release(tmp_path: Path,
                                                                                     two_nodes: str) -> None:
    on_ray = deploy_and_release(tmp_path / "ray", ["--cluster", two_nodes, "--chunk-workers", "2"], two_nodes)
    local = deploy_and_release(tmp_path / "local", ["--executor", "inprocess"])
    # Both nodes ran chunk work: one actor on each, and each actor owns chunks every measurement sent.
    assert on_ray["where"] == {"nodes": 2, "actors": ["node_a", "node_b"]}
    slots = 8192
    for m, _ in on_ray["sent"]:
        assert {owner_of(i, 2) for i in m.measured_chunks(slots)} == {0, 1}, m.kind
    # (2) The summaries, value for value.
    a, b = on_ray["summary"], local["summary"]
    assert a is not None and b is not None
    assert (a.starts, a.sums, a.sum_variance, a.epsilon_spent) == (b.starts, b.sums, b.sum_variance, b.epsilon_spent)
    assert a == b
    assert len(a.sums) > 1 and any(a.sums)  # a real release, not an empty one
    print(f"release on 2 Ray nodes {on_ray['release_s']:.1f} s, in-process {local['release_s']:.1f} s")
