#!/usr/bin/env python
"""Service benchmark: 10 data-owner processes upload through real gRPC on loopback, then one release.

    python benchmarks/services.py                 # 4,096 and 1,048,576 bins
    python benchmarks/services.py --bins 4096     # one size only

The decryption and computation servers run as separate `dpagg serve-*` processes (so
their peak RSS is their own); every owner is its own process. Owners fetch the public
context and encrypt before a common start signal; the clock then runs from the first
upload byte to the released summary being stored (the release spends epsilon 1 of a
study budget of 2). Then one batch of direct range counts (10 random ranges, 2 above
65,536 bins, at epsilon 0.05 each) is timed: each range is one masked ciphertext per
8,192 bins sent to the decryption server. Reported per size: wall time
(first upload -> summary), the upload and release phases, encryption time per owner,
ciphertext bytes on the wire (owner uploads, public-context downloads, measurement
ciphertexts to the decryption server; gRPC framing not included), peak RSS (VmHWM) of
each service and the largest owner, and the release's ratio to encryption: wall time over the median owner's
encryption time measured in the same run (`ratio_to_encryption`; target <= 2.5 at 1M bins).
Every owner encrypts at the same time as the others, so on a machine with fewer cores than
owners that encryption time is the contended one, not a lone owner's.
Writes benchmarks/results/services.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGETS = {4096: 0.3, 1 << 20: 40.0}


def _vm_hwm_mb(pid: int) -> float:
    """Peak resident set size of a running process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def _start_server(args: list[str], workdir: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    port_file = workdir / f"{name}.port"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = open(workdir / f"{name}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "parties.cli", *args, "--port", "0", "--port-file", str(port_file)],
                            cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    end = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"{name} server did not start; see {workdir / (name + '.log')}")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{int(port_file.read_text())}"


def _owner(index: int, study: str, n: int, cs: str, ds: str, ready: Any, go: Any, out: Any, finish: Any,
           signing_key: bytes | None = None) -> None:
    """One data-owner process: encrypt before the start signal, upload after it, then idle until the end.

    Owners run on their own machines in a deployment; idling (instead of exiting) keeps
    10 process teardowns from competing with the release for this machine's CPUs.
    """
    import numpy as np

    from parties.data_owner.client import DataOwnerClient

    owner_id = f"owner-{index:02d}"
    rng = np.random.default_rng(1000 + index)
    hist = rng.poisson(3.0, n).astype(np.int64)
    with DataOwnerClient(owner_id, computation=cs, decryption=ds, progress=False, timeout=120.0, insecure=True,
                         signing_key=signing_key) as client:
        t0 = time.monotonic()
        enc = client.encrypt(study, hist)
        t_enc = time.monotonic() - t0
        ctx_bytes = len(client.decryption.public_context())  # size only; the download above was the real one
        ready.put(index)
        go.wait()
        start = time.monotonic()
        res = client.upload(enc, idempotency_key=f"bench-{index}")
        end = time.monotonic()
    out.put({"owner": owner_id, "encrypt_s": t_enc, "upload_start": start, "upload_end": end,
             "bytes_sent": res.bytes_sent, "chunks": res.chunk_count, "context_bytes": ctx_bytes,
             "hist_sum": int(hist.sum()), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0})
    finish.wait(1800)


def run_case(n: int, owners: int, workdir: Path, ds_workers: int | None = None,
             signed: bool = False) -> dict[str, Any]:
    from parties.common.signing import generate_signing_key
    from parties.computation.client import ComputationClient
    from parties.decryption.client import DecryptionClient

    extra = [] if ds_workers is None else ["--decrypt-workers", str(ds_workers)]
    ds_proc, ds = _start_server(["serve-decryption", "--insecure", "--data-dir", str(workdir / "ds"), *extra],
                                workdir, "ds")
    cs_proc, cs = _start_server(["serve-computation", "--insecure", "--data-dir", str(workdir / "cs"), "--decryption", ds],
                                workdir, "cs")
    try:
        with ComputationClient(cs, timeout=60.0, insecure=True) as op, DecryptionClient(ds, insecure=True) as key_holder:
            op.wait_ready()
            owner_ids = [f"owner-{i:02d}" for i in range(owners)]
            keys = {o: generate_signing_key() for o in owner_ids} if signed else {}
            contract, _ = op.open_study(study_id=f"bench-{n}", domain_size=n, epsilon=2.0, expected_owners=owner_ids,
                                        owner_keys={o: k[1] for o, k in keys.items()} or None)
            ctx = mp.get_context("spawn")
            ready, out, go, finish = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
            procs = [ctx.Process(target=_owner, args=(i, contract.study_id, n, cs, ds, ready, go, out, finish,
                                                      keys[o][0] if signed else None))
                     for i, o in enumerate(owner_ids)]
            for p in procs:
                p.start()
            for _ in range(owners):
                ready.get(timeout=1800)
            go.set()
            results = [out.get(timeout=1800) for _ in range(owners)]
            rel = op.run_release(contract.study_id, epsilon=1.0, timeout=1800)
            done = time.monotonic()
            k = 10 if n <= 65536 else 2
            bounds = np.sort(np.random.default_rng(n).integers(0, n + 1, size=(k, 2)), axis=1)
            ranges = [(int(a), int(max(b, a + 1))) for a, b in bounds if a < n]
            t0 = time.monotonic()
            direct = op.direct_range_counts(contract.study_id, ranges, 0.05, timeout=1800)
            direct_s = time.monotonic() - t0
            finish.set()
            for p in procs:
                p.join(60)
            first = min(r["upload_start"] for r in results)
            last = max(r["upload_end"] for r in results)
            budget = key_holder.budget(contract.study_id)
            assert rel.state == "DONE" and rel.summary is not None
            total = sum(r["hist_sum"] for r in results)
            released_total = sum(rel.summary.sums)
        rss = {"decryption": _vm_hwm_mb(ds_proc.pid), "computation": _vm_hwm_mb(cs_proc.pid),
               "owner_max": max(r["peak_rss_mb"] for r in results)}
    finally:
        for proc, name in ((cs_proc, "cs"), (ds_proc, "ds")):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                print(f"warning: {name} server ignored SIGTERM for 30 s; killing it. Log tail:\n"
                      + (workdir / f"{name}.log").read_text()[-2000:], file=sys.stderr)
                proc.kill()
                proc.wait(10)
    # The DS's own time in the release: each measurement's charge + decrypt + decode (its log lines);
    # the integrity check of each chunk runs as the chunk arrives and overlaps the transfer.
    ds_lines = re.findall(r", release \S+: decrypted \S+ \((\d+) chunks, \d+ values\) in ([0-9.]+) s",
                          (workdir / "ds.log").read_text())
    upload_bytes = sum(r["bytes_sent"] for r in results)
    ctx_bytes = results[0]["context_bytes"]
    wall = done - first
    encrypt_median = sorted(r["encrypt_s"] for r in results)[owners // 2]
    return {
        "bins": n,
        "signed": signed,
        "owners": owners,
        "chunks_per_owner": results[0]["chunks"],
        "wall_first_upload_to_summary_s": round(wall, 3),
        "upload_phase_s": round(last - first, 3),
        "release_s": round(done - last, 3),
        "release_server_s": round(rel.seconds, 3),
        "ds_decrypt_workers": ds_workers,
        "ds_measurements": len(ds_lines),
        "ds_chunks_decrypted": sum(int(c) for c, _ in ds_lines),
        "ds_decrypt_s": round(sum(float(t) for _, t in ds_lines), 3),
        "encrypt_s_per_owner_median": round(encrypt_median, 3),
        "ratio_to_encryption": round(wall / encrypt_median, 2),
        # the release phase outside the server's own release time: starting it, storing and answering the summary
        "release_outside_server_s": round(done - last - rel.seconds, 3),
        "bytes": {
            "owner_uploads": upload_bytes,
            "public_context_downloads": ctx_bytes * (2 * owners + 1),
            "measurements_to_decryption": rel.bytes_to_decryption,
            "total": upload_bytes + ctx_bytes * (2 * owners + 1) + rel.bytes_to_decryption,
        },
        "peak_rss_mb": {k: round(v, 1) for k, v in rss.items()},
        "partitions": rel.summary.n_partitions,
        "direct_queries": {"ranges": len(ranges), "seconds": round(direct_s, 3),
                           "epsilon_each": 0.05, "epsilon_charged": direct.epsilon_charged,
                           "epsilon_sequential": direct.epsilon_sequential},
        "epsilon_spent": budget.spent,
        "true_total": total,
        "released_total": released_total,
        "target_s": TARGETS.get(n),
        "meets_target": None if n not in TARGETS else wall <= TARGETS[n],
    }


def _table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'bins':>9} {'owners':>6} {'wall s':>8} {'upload s':>9} {'release s':>9} {'encrypt s':>9} "
            f"{'ratio':>6} {'wire MB':>9} {'DS RSS MB':>9} {'CS RSS MB':>9} {'owner RSS':>9} {'target':>7} {'direct':>14}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ok = "" if r["target_s"] is None else ("ok" if r["meets_target"] else "MISS") + f" {r['target_s']:g}"
        lines.append(
            f"{r['bins']:>9} {r['owners']:>6} {r['wall_first_upload_to_summary_s']:>8.2f} {r['upload_phase_s']:>9.2f} "
            f"{r['release_s']:>9.2f} {r['encrypt_s_per_owner_median']:>9.2f} {r['ratio_to_encryption']:>6.2f} "
            f"{r['bytes']['total'] / 1e6:>9.1f} "
            f"{r['peak_rss_mb']['decryption']:>9.0f} {r['peak_rss_mb']['computation']:>9.0f} "
            f"{r['peak_rss_mb']['owner_max']:>9.0f} {ok:>7} "
            f"{r['direct_queries']['ranges']:>3} in {r['direct_queries']['seconds']:>5.2f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--bins", type=int, action="append", help="domain size (repeatable; default 4096 and 1048576)")
    ap.add_argument("--owners", type=int, default=10, help="data-owner processes (default 10)")
    ap.add_argument("--ds-workers", type=int, default=None,
                    help="the decryption server's --decrypt-workers (default: its default, in-process)")
    ap.add_argument("--no-write", action="store_true", help="do not write benchmarks/results/services.json")
    ap.add_argument("--signed", action="store_true",
                    help="a signed study (every owner's key in the contract): the owners sign their c1 parts too")
    args = ap.parse_args(argv)
    sizes = args.bins or [4096, 1 << 20]
    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix=f"dpagg-bench-{n}-") as tmp:
            print(f"running {n} bins x {args.owners} owners ...", file=sys.stderr, flush=True)
            rows.append(run_case(n, args.owners, Path(tmp), args.ds_workers, args.signed))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(_table(rows))
    if not args.no_write:
        from benchmarks.common import write_result

        path = write_result("services", {"cases": rows, "note": "loopback gRPC, servers and owners as separate "
                                         "processes on one machine; wall = first upload byte -> summary stored"})
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
