"""Scale-out benchmark: a BFV release's CS chunk work in-process and on a 2-node local Ray cluster, same values.

`python -m benchmarks.scale [--bins 1048576] [--owners 10] [--strategy auto] [--no-ray] [--processes]`:
generates a key, encrypts every owner's histogram once (the encryption pass, this benchmark's unit of
time) and stores the chunks as files, then runs the same seeded release (every measurement: CS
noise + flood + serialize on the executor, DS verify + charge + decrypt + its noise in this
process) on each executor. For Ray it starts a 2-node local cluster itself (`ray start --head
--port P --node-ip-address 127.0.0.1`, then `ray start --address 127.0.0.1:P` with distinct
custom resources, one actor pinned to each node), and stops exactly what it started (the two
`ray start --block` process groups). Checks the released summaries are equal and prints JSON
(times, ratio to the encryption pass, bytes to the DS, peak RSS) and writes
benchmarks/results/scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from he_partition.core.backend import ChunkedVector, n_chunks
from he_partition.core.measurements import Measurement
from he_partition.core.noise import SeededRandom
from he_partition.core.summary import Summary
from he_partition.execution import ChunkExecutor, ChunkFiles, InProcessExecutor, ProcessExecutor
from he_partition.he.bfv import BfvBackend, generate_secret_context, load_context, public_context_bytes
from he_partition.protocol import Budget, ComputationSide, DecryptionSide, encrypt_histogram, make_strategy, run_strategy

from .common import write_result


def _rss_mb(pid: int) -> float:
    """Resident set size of one process now (VmRSS), in MB; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _group_rss_mb(pgid: int) -> float:
    total = 0.0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.getpgid(int(d.name)) == pgid:
                    total += _rss_mb(int(d.name))
            except OSError:
                continue
    return total


class Setup:
    def __init__(self, bins: int, owners: int, root: Path, seed: int) -> None:
        secret = generate_secret_context()
        self.context = public_context_bytes(secret)
        self.secret = BfvBackend(secret)
        self.public = BfvBackend(load_context(self.context))
        rng = np.random.default_rng(seed)
        hists = [rng.poisson(np.where((np.arange(bins) // 512) % 4 == 0, 30.0, 1.0)) for _ in range(owners)]
        t0 = time.perf_counter()
        encrypted = [encrypt_histogram(self.public, h) for h in hists]
        self.encryption_pass_s = time.perf_counter() - t0
        templates = []
        self.upload_bytes = 0
        for o, vec in enumerate(encrypted):
            d = root / f"owner{o}"
            d.mkdir()
            for i, c in enumerate(vec.chunks):
                data = self.public.serialize_chunk(c)
                self.upload_bytes += len(data)
                (d / f"{i:07d}.ct").write_bytes(data)
            templates.append(str(d / "{index:07d}.ct"))
        del encrypted
        self.source = ChunkFiles(tuple(templates))
        self.bins = bins
        self.n_chunks = n_chunks(bins, self.public.slots)


def _release(setup: Setup, executor: ChunkExecutor, strategy: str, seed: int) -> tuple[Summary, dict[str, Any]]:
    """One seeded release with the CS chunk work on `executor` and the DS side in this process."""
    cs = ComputationSide(setup.public, SeededRandom(seed))
    ds = DecryptionSide(setup.secret, SeededRandom(seed + 1), Budget(1.0))
    sent = [0]
    t0 = time.perf_counter()
    executor.load("bench", setup.context, setup.source, setup.n_chunks)
    load_s = time.perf_counter() - t0

    def measure(m: Measurement) -> Any:
        chunks: dict[int, Any] = {}
        for i, data in cs.measure_on(executor, "bench", m):
            sent[0] += len(data)
            chunks[i] = setup.secret.deserialize_chunk(data)
        vec = ChunkedVector(setup.bins, tuple(chunks.get(i) for i in range(setup.n_chunks)))
        return ds.decrypt_measurement(m, vec)

    summary = run_strategy(make_strategy(strategy, setup.bins, 1.0, noise_parties=2), measure)
    total = time.perf_counter() - t0
    executor.drop("bench")
    return summary, {"release_s": total, "aggregate_load_s": load_s, "ratio": total / setup.encryption_pass_s,
                     "bytes_to_ds": sent[0], "measurements": len(summary.epsilon_spent)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalRayCluster:
    """Two `ray start --block` nodes on loopback, each in its own process group, stopped by that group id."""

    def __init__(self, tmp: Path) -> None:
        ray_bin = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
        self.port = _free_port()
        common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--block", "--disable-usage-stats"]
        self.nodes: list[subprocess.Popen[bytes]] = []
        self.nodes.append(subprocess.Popen(
            [ray_bin, "start", "--head", "--port", str(self.port), "--include-dashboard=false",
             "--temp-dir", str(tmp / "ray"), "--resources", json.dumps({"node_a": 1}), *common],
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self._wait_nodes(1)
        self.nodes.append(subprocess.Popen(
            [ray_bin, "start", "--address", f"127.0.0.1:{self.port}", "--resources", json.dumps({"node_b": 1}),
             *common], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self._wait_nodes(2)

    def _wait_nodes(self, count: int) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            out = subprocess.run([sys.executable, "-c", (
                "import ray,sys; ray.init(address=sys.argv[1], _node_ip_address='127.0.0.1', log_to_driver=False);"
                "print(sum(1 for n in ray.nodes() if n['Alive']))"), f"127.0.0.1:{self.port}"],
                capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(count)]:
                return
            time.sleep(1)
        raise RuntimeError(f"the local Ray cluster did not reach {count} node(s) in 120 s")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def rss_mb(self) -> float:
        return sum(_group_rss_mb(p.pid) for p in self.nodes)

    def stop(self) -> None:
        for p in reversed(self.nodes):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bins", type=int, default=1 << 20)
    ap.add_argument("--owners", type=int, default=10)
    ap.add_argument("--strategy", default="auto")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-ray", action="store_true", help="skip the 2-node Ray run")
    ap.add_argument("--processes", action="store_true", help="also run on local worker processes (one per core)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dpagg-scale-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        setup = Setup(args.bins, args.owners, root, args.seed)
        out: dict[str, Any] = {"bins": args.bins, "owners": args.owners, "strategy": args.strategy,
                               "chunks": setup.n_chunks, "setup_s": time.perf_counter() - t0,
                               "encryption_pass_s": setup.encryption_pass_s, "upload_bytes": setup.upload_bytes,
                               "runs": {}}
        summary, out["runs"]["inprocess"] = _release(setup, InProcessExecutor(setup.public), args.strategy, args.seed)
        out["runs"]["inprocess"]["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if args.processes:
            executor = ProcessExecutor()
            try:
                got, out["runs"]["processes"] = _release(setup, executor, args.strategy, args.seed)
                out["runs"]["processes"]["workers_rss_mb"] = sum(_rss_mb(p) for p in executor.worker_pids() if p)
                out["runs"]["processes"]["equal_to_inprocess"] = got == summary
            finally:
                executor.close()
        if not args.no_ray:
            # Ray's token auth (on by default for `ray start`): a fresh token for this cluster, given to the nodes and
            # to this driver through the environment before Ray is imported. It authenticates; it does not encrypt
            # (docs/scaling.md: RAY_USE_TLS).
            os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
            import ray

            from he_partition.execution.ray_cluster import RayExecutor

            t0 = time.perf_counter()
            cluster = LocalRayCluster(root)
            try:
                start_s = time.perf_counter() - t0
                on_ray = RayExecutor(2, address=cluster.address, resources=[{"node_a": 1}, {"node_b": 1}])
                got, run = _release(setup, on_ray, args.strategy, args.seed)
                run.update(cluster_start_s=start_s, cluster_rss_mb=cluster.rss_mb(), equal_to_inprocess=got == summary,
                           nodes=2)
                out["runs"]["ray_2_nodes"] = run
                on_ray.close()
                ray.shutdown()
            finally:
                cluster.stop()
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out, indent=1))
    print(f"wrote {write_result('scale', out)}", file=sys.stderr)
    if not all(r.get("equal_to_inprocess", True) for r in out["runs"].values()):
        sys.exit("released values differ between executors")


if __name__ == "__main__":
    main()
