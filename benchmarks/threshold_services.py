#!/usr/bin/env python
"""Services with K = 3 key-share holders against K = 1, in the same run: wall time ratio and peak RSS.

    python benchmarks/threshold_services.py                     # 1,048,576 bins, K = 1 then K = 3
    python benchmarks/threshold_services.py --bins 4096         # a quick run
    python benchmarks/threshold_services.py --threshold 2       # K = 3 as a 2-of-3 key
    python benchmarks/threshold_services.py --cases 3 --holder-workers 0,default   # holders in-process / pooled

Each case starts real `dpagg serve-*` processes on loopback (plaintext test setup): K = 1 is one
decryption server and a computation server with `--decryption`; K = 3 is three decryption servers in
key-share mode (`--key-share NAME --holders ...`) and a computation server with `--holder NAME=HOST:PORT`
x3, keyed by `dpagg setup-key` before the study opens. Then, as benchmarks/services.py does, 10
data-owner processes encrypt under the study key (fetched through the computation server's relay in
both cases) before a common start signal, upload, and one release (epsilon 1 of a budget of 2) runs.
The clock runs from the first upload byte to the released summary being stored. Reported per case:
wall, upload and release phases, the computation server's release time, the key setup time (K = 3),
peak RSS (VmHWM) of every server process and the largest owner, every holder's spend (they must
agree), and the K = 3 / K = 1 ratios (target: wall within 1.3x). The cases alternate K = 1, K = 3
`--repeat` times so both see the same machine load. Writes benchmarks/results/threshold_services.json.
`--holder-workers` runs each K > 1 case once per entry (each holder's `--decrypt-workers`: 0, in the
server process, as before the holders had workers; `default`, its default min(cores, 8)), alternating,
and writes benchmarks/results/threshold_services_holder_workers.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.services import _start_server, _stop_owners, _vm_hwm_mb  # noqa: E402

TARGET_RATIO = 1.3
HOLDERS = ("holder-1", "holder-2", "holder-3")


def _signing_key(index: int) -> bytes:
    """A benchmark owner's Ed25519 key (derived from its index: the holders check c1 in signed studies only)."""
    import hashlib
    return hashlib.sha256(f"dpagg-benchmark-owner-{index}".encode()).digest()


def _owner(index: int, study: str, n: int, cs: str, ready: Any, go: Any, out: Any, finish: Any) -> None:
    """One data-owner process: the study key through the CS's relay, encrypt before the signal, upload after."""
    from parties.data_owner.client import DataOwnerClient

    owner_id = f"owner-{index:02d}"
    hist = np.random.default_rng(1000 + index).poisson(3.0, n).astype(np.int64)
    with DataOwnerClient(owner_id, computation=cs, progress=False, timeout=120.0, insecure=True,
                         signing_key=_signing_key(index)) as client:
        t0 = time.monotonic()
        enc = client.encrypt(study, hist)
        t_enc = time.monotonic() - t0
        ready.put(index)
        go.wait()
        start = time.monotonic()
        res = client.upload(enc, idempotency_key=f"bench-{index}")
        end = time.monotonic()
    out.put({"encrypt_s": t_enc, "upload_start": start, "upload_end": end, "bytes_sent": res.bytes_sent,
             "hist_sum": int(hist.sum()), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0})
    finish.wait(1800)


def _servers(k: int, workdir: Path, threshold: int = 0, holder_workers: int | None = None
             ) -> tuple[dict[str, tuple[subprocess.Popen[bytes], str]], str, float]:
    """Start the key holder(s) and the CS; K > 1 runs the key setup. Returns ({name: (proc, addr)}, cs, setup_s).

    `holder_workers`: each holder's --decrypt-workers (None: its default)."""
    procs: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    if k == 1:
        procs["decryption"] = _start_server(["serve-decryption", "--insecure", "--data-dir", str(workdir / "ds")],
                                            workdir, "ds")
        link = ["--decryption", procs["decryption"][1]]
    else:
        names = HOLDERS[:k]
        workers = [] if holder_workers is None else ["--decrypt-workers", str(holder_workers)]
        for name in names:
            procs[name] = _start_server(["serve-decryption", "--insecure", "--data-dir", str(workdir / name),
                                         "--key-share", name, "--holders", ",".join(names), *workers], workdir, name)
        link = [a for name in names for a in ("--holder", f"{name}={procs[name][1]}")]
    procs["computation"] = _start_server(["serve-computation", "--insecure", "--data-dir", str(workdir / "cs"), *link],
                                         workdir, "cs")
    cs = procs["computation"][1]
    setup_s = 0.0
    if k > 1:
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "parties.cli", "setup-key", "--computation", cs, "--insecure",
                        "--threshold", str(threshold)], check=True, cwd=workdir, capture_output=True, timeout=600)
        setup_s = time.monotonic() - t0
    return procs, cs, setup_s


def run_case(n: int, k: int, owners: int, workdir: Path, threshold: int = 0,
             holder_workers: int | None = None) -> dict[str, Any]:
    from parties.computation.client import ComputationClient
    from parties.decryption.client import DecryptionClient

    procs, cs, setup_s = _servers(k, workdir, threshold if k > 1 else 0, holder_workers)
    workers: list[Any] = []
    finish: Any = None
    try:
        with ComputationClient(cs, timeout=60.0, insecure=True) as op:
            op.wait_ready()
            owner_ids = [f"owner-{i:02d}" for i in range(owners)]
            from parties.common.signing import public_key_of
            contract, _ = op.open_study(study_id=f"bench-{n}", domain_size=n, epsilon=2.0, expected_owners=owner_ids,
                                        owner_keys={o: public_key_of(_signing_key(i)) for i, o in enumerate(owner_ids)})
            ctx = mp.get_context("spawn")
            ready, out, go, finish = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
            workers += [ctx.Process(target=_owner, args=(i, contract.study_id, n, cs, ready, go, out, finish))
                       for i in range(owners)]
            for p in workers:
                p.start()
            for _ in range(owners):
                ready.get(timeout=1800)
            go.set()
            results = [out.get(timeout=1800) for _ in range(owners)]
            rel = op.run_release(contract.study_id, epsilon=1.0, timeout=1800)
            done = time.monotonic()
            _stop_owners(workers, finish)
        assert rel.state == "DONE" and rel.summary is not None, rel
        spent = {}
        for name, (_, addr) in procs.items():
            if name != "computation":
                with DecryptionClient(addr, insecure=True) as holder:
                    spent[name] = holder.budget(contract.study_id).spent
        rss = {name: round(_vm_hwm_mb(proc.pid), 1) for name, (proc, _) in procs.items()}
        rss["owner_max"] = round(max(r["peak_rss_mb"] for r in results), 1)
    finally:  # a failure anywhere stops every owner and server this case started
        _stop_owners(workers, finish)
        for name, (proc, _) in procs.items():
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                print(f"warning: {name} ignored SIGTERM for 30 s; killing it", file=sys.stderr)
                proc.kill()
                proc.wait(10)
    first = min(r["upload_start"] for r in results)
    last = max(r["upload_end"] for r in results)
    return {**_key_holder_work(k, workdir),
        "bins": n, "holders": k, "threshold": (threshold or k) if k > 1 else 1, "owners": owners,
        "holder_decrypt_workers": ("default" if holder_workers is None else holder_workers) if k > 1 else None,
        "wall_first_upload_to_summary_s": round(done - first, 3),
        "upload_phase_s": round(last - first, 3),
        "release_s": round(done - last, 3),
        "release_server_s": round(rel.seconds, 3),
        "key_setup_s": round(setup_s, 3),
        "encrypt_s_per_owner_median": round(sorted(r["encrypt_s"] for r in results)[owners // 2], 3),
        "bytes_to_key_holders": rel.bytes_to_decryption,
        "peak_rss_mb": rss,
        "epsilon_spent_per_holder": spent,
        "holders_agree": len(set(spent.values())) == 1,
        "partitions": rel.summary.n_partitions,
        "true_total": sum(r["hist_sum"] for r in results),
        "released_total": float(sum(rel.summary.sums)),
    }


def _key_holder_work(k: int, workdir: Path) -> dict[str, Any]:
    """What the key holder(s) did in the release, from their logs.

    K = 1: the decryption server's own time per measurement (charge + decrypt + decode). K = 3: per
    holder, the ciphertexts it issued shares for, and per measurement the spread between the first and
    the last holder's "issued" log line (how long the combiner waits for the slowest holder).
    """
    if k == 1:
        lines = re.findall(r", release \S+: decrypted \S+ \((\d+) chunks, \d+ values\) in ([0-9.]+) s",
                           (workdir / "ds.log").read_text())
        return {"ds_measurements": len(lines), "ds_chunks_decrypted": sum(int(c) for c, _ in lines),
                "ds_decrypt_s": round(sum(float(t) for _, t in lines), 3)}
    issued: dict[str, dict[str, float]] = {}
    shares: dict[str, int] = {}
    pattern = re.compile(r"^(\S+ \S+) INFO .*: issued (\d+) shares of (\S+) \(", re.M)
    for name in HOLDERS[:k]:
        for i, (stamp, n, kind) in enumerate(pattern.findall((workdir / f"{name}.log").read_text())):
            when = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            issued.setdefault(f"{i}:{kind}", {})[name] = when  # the i-th measurement, as every holder logs it
            shares[name] = shares.get(name, 0) + int(n)
    spread = {kind: round(max(ts.values()) - min(ts.values()), 3) for kind, ts in issued.items()}
    return {"holder_shares_issued": shares, "holder_spread_s_per_measurement": spread}


def _ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """K = 3 over K = 1 for each timed figure (median over the repeats of each)."""
    out: dict[str, Any] = {}
    for key in ("wall_first_upload_to_summary_s", "upload_phase_s", "release_s", "release_server_s"):
        if not {1, 3} <= {r["holders"] for r in rows}:
            return {"target_wall_ratio": TARGET_RATIO, "meets_target": None}
        med = {k: float(np.median([r[key] for r in rows if r["holders"] == k])) for k in (1, 3)}
        out[key] = round(med[3] / med[1], 3) if med[1] > 0 else None
    out["target_wall_ratio"] = TARGET_RATIO
    out["meets_target"] = out["wall_first_upload_to_summary_s"] is not None and \
        out["wall_first_upload_to_summary_s"] <= TARGET_RATIO
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--bins", type=int, default=1 << 20, help="domain size (default 1048576)")
    ap.add_argument("--owners", type=int, default=10, help="data-owner processes (default 10)")
    ap.add_argument("--repeat", type=int, default=1, help="K = 1 / K = 3 pairs, alternating (default 1)")
    ap.add_argument("--cases", default="1,3", help="which K to run, comma-separated (default 1,3; e.g. 3 to profile)")
    ap.add_argument("--keep-logs", metavar="DIR", help="copy every server's log to DIR/k<K>-<repeat>/")
    ap.add_argument("--threshold", type=int, default=0, metavar="T",
                    help="K > 1 cases use a T-of-K key (default: K-of-K); the release then asks T holders")
    ap.add_argument("--holder-workers", default="", metavar="LIST",
                    help="comma-separated holder --decrypt-workers to compare in K > 1 cases (e.g. 0,default)")
    ap.add_argument("--no-write", action="store_true", help="do not write benchmarks/results/threshold_services.json")
    args = ap.parse_args(argv)
    variants: list[int | None] = [None if w == "default" else int(w) for w in args.holder_workers.split(",") if w] \
        or [None]
    rows = []
    for rep in range(args.repeat):
        for k, workers in [(int(c), w) for c in args.cases.split(",") for w in (variants if int(c) > 1 else [None])]:
            with tempfile.TemporaryDirectory(prefix=f"dpagg-bench-k{k}-") as tmp:
                print(f"[{rep + 1}/{args.repeat}] {args.bins} bins, K = {k}, {args.owners} owners, holder workers "
                      f"{'default' if workers is None else workers} ...", file=sys.stderr, flush=True)
                rows.append(run_case(args.bins, k, args.owners, Path(tmp), args.threshold, workers))
                if args.keep_logs:
                    keep = Path(args.keep_logs) / f"k{k}-w{'d' if workers is None else workers}-{rep + 1}"
                    keep.mkdir(parents=True, exist_ok=True)
                    for log in Path(tmp).glob("*.log"):
                        shutil.copy(log, keep / log.name)
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    ratios = _ratios([r for r in rows if r["holder_decrypt_workers"] in (None, "default")])
    for r in rows:
        print(f"K={r['holders']} (holder workers {r['holder_decrypt_workers']}): wall {r['wall_first_upload_to_summary_s']:.2f} s (upload {r['upload_phase_s']:.2f}, "
              f"release {r['release_s']:.2f}; setup {r['key_setup_s']:.2f}) RSS MB {r['peak_rss_mb']}")
    print(f"K=3 / K=1: {ratios}")
    if not args.no_write:
        from benchmarks.common import write_result

        name = "threshold_services" + (f"_t{args.threshold}" if args.threshold else "") + \
            ("_holder_workers" if args.holder_workers else "")
        path = write_result(name, {
            "cases": rows, "ratios_k3_over_k1": ratios,
            "note": "loopback gRPC, plaintext test setup; every server and owner a separate process on one "
                    "machine shared with other jobs; wall = first upload byte -> summary stored; K = 1 and K = 3 "
                    "alternate in the same run"})
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
