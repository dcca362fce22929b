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

Per phase (`phases`: encrypt = owners start, fetch the context and encrypt; upload = the start
signal to the last upload answered; release; direct = the direct range counts) it also reports
the wall time and the CPU time (user + system, from /proc/<pid>/stat, snapshotted at each phase
boundary) of the computation server's main process, its child processes (its chunk workers,
summed, those that exited included), the decryption server and its children, the owners
(summed) and this driver process, so the serial part shows: `cs_main_busy_release_pct` is the
CS main process's CPU time over the release's wall time (all its threads; 100% is one core).
If anything fails, everything the case started is stopped: the owners are released and joined
(terminated if they do not exit), then the servers are terminated.
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


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_table() -> dict[int, tuple[int, float, float]]:
    """Every process now: pid -> (parent pid, own CPU s, reaped children's CPU s), from /proc/<pid>/stat."""
    table: dict[int, tuple[int, float, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        # fields after the command name (which may hold spaces): state ppid ... utime(14) stime cutime cstime
        fields = stat[stat.rindex(")") + 2:].split()
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        table[int(entry)] = (int(fields[1]), (utime + stime) / _CLK_TCK, (cutime + cstime) / _CLK_TCK)
    return table


def _descendants(table: dict[int, tuple[int, float, float]], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _cpu_snapshot(cs: int, ds: int, owners: list[int]) -> dict[str, float]:
    """CPU seconds so far per group: a server's main process, and its descendants plus the children it reaped."""
    table = _proc_table()

    def own(pid: int) -> float:
        return table[pid][1] if pid in table else 0.0

    def below(pid: int) -> float:
        reaped = table[pid][2] if pid in table else 0.0
        return reaped + sum(table[d][1] + table[d][2] for d in _descendants(table, pid))

    return {"computation": own(cs), "computation_children": below(cs),
            "decryption": own(ds), "decryption_children": below(ds),
            "owners": sum(own(p) + below(p) for p in owners), "driver": own(os.getpid())}


def _phases(marks: list[tuple[str, float, dict[str, float]]]) -> dict[str, dict[str, Any]]:
    """Per phase between consecutive marks: wall seconds, CPU seconds per group, and each group's busy %."""
    out: dict[str, dict[str, Any]] = {}
    for (_, t0, c0), (name, t1, c1) in zip(marks, marks[1:]):
        wall = t1 - t0
        cpu = {k: round(c1[k] - c0[k], 3) for k in c1}
        out[name] = {"wall_s": round(wall, 3), "cpu_s": cpu,
                     "busy_pct": {k: round(100.0 * v / wall, 1) if wall > 0 else None for k, v in cpu.items()}}
    return out


def _wait_for(queue: Any, count: int, procs: list[Any], what: str, timeout: float = 1800.0) -> list[Any]:
    """`count` items from `queue`, failing at once if an owner process exits first (it idles until the end)."""
    import queue as queue_mod

    items: list[Any] = []
    end = time.monotonic() + timeout
    while len(items) < count:
        try:
            items.append(queue.get(timeout=1.0))
        except queue_mod.Empty:
            dead = [p.name for p in procs if p.exitcode is not None]
            if dead:
                raise RuntimeError(f"owner process(es) {', '.join(dead)} exited before {what}") from None
            if time.monotonic() > end:
                raise TimeoutError(f"{what}: {len(items)} of {count} owners after {timeout:.0f} s") from None
    return items


def _stop_owners(procs: list[Any], finish: Any) -> None:
    """Release the idling owners, then join them; terminate (then kill) any that do not exit."""
    if finish is not None:
        finish.set()
    for p in procs:
        p.join(60)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(10)
        if p.is_alive():
            p.kill()
            p.join(10)


def _stop_server(proc: subprocess.Popen[bytes], name: str, workdir: Path) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        log = workdir / f"{name}.log"
        print(f"warning: {name} server ignored SIGTERM for 30 s; killing it. Log tail:\n"
              + (log.read_text()[-2000:] if log.exists() else ""), file=sys.stderr)
        proc.kill()
        proc.wait(10)


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
           signing_key: bytes | None = None, streams: int | None = None) -> None:
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
                         streams=streams,
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
             signed: bool = False, ingest: int = 0, streams: int | None = None) -> dict[str, Any]:
    from parties.common.signing import generate_signing_key
    from parties.computation.client import ComputationClient
    from parties.decryption.client import DecryptionClient

    extra = [] if ds_workers is None else ["--decrypt-workers", str(ds_workers)]
    servers: list[tuple[subprocess.Popen[bytes], str]] = []
    procs: list[Any] = []
    finish: Any = None
    try:
        ds_proc, ds = _start_server(["serve-decryption", "--insecure", "--data-dir", str(workdir / "ds"), *extra],
                                    workdir, "ds")
        servers.append((ds_proc, "ds"))
        cs_proc, cs = _start_server(["serve-computation", "--insecure", "--data-dir", str(workdir / "cs"),
                                     "--decryption", ds, "--ingest-processes", str(ingest)], workdir, "cs")
        servers.append((cs_proc, "cs"))
        with ComputationClient(cs, timeout=60.0, insecure=True) as op, DecryptionClient(ds, insecure=True) as key_holder:
            op.wait_ready()
            owner_ids = [f"owner-{i:02d}" for i in range(owners)]
            keys = {o: generate_signing_key() for o in owner_ids} if signed else {}
            contract, _ = op.open_study(study_id=f"bench-{n}", domain_size=n, epsilon=2.0, expected_owners=owner_ids,
                                        owner_keys={o: k[1] for o, k in keys.items()} or None)
            ctx = mp.get_context("spawn")
            ready, out, go, finish = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
            procs = [ctx.Process(target=_owner, name=o, args=(i, contract.study_id, n, cs, ds, ready, go, out, finish,
                                                              keys[o][0] if signed else None, streams))
                     for i, o in enumerate(owner_ids)]
            marks: list[tuple[str, float, dict[str, float]]] = [("start", time.monotonic(),
                                                                 _cpu_snapshot(cs_proc.pid, ds_proc.pid, []))]
            for p in procs:
                p.start()
            owner_pids = [p.pid for p in procs]

            def mark(name: str) -> None:
                marks.append((name, time.monotonic(), _cpu_snapshot(cs_proc.pid, ds_proc.pid, owner_pids)))

            _wait_for(ready, owners, procs, "encrypting")
            mark("encrypt")
            go.set()
            results = _wait_for(out, owners, procs, "uploading")
            mark("upload")
            rel = op.run_release(contract.study_id, epsilon=1.0, timeout=1800)
            done = time.monotonic()
            mark("release")
            k = 10 if n <= 65536 else 2
            bounds = np.sort(np.random.default_rng(n).integers(0, n + 1, size=(k, 2)), axis=1)
            ranges = [(int(a), int(max(b, a + 1))) for a, b in bounds if a < n]
            t0 = time.monotonic()
            direct = op.direct_range_counts(contract.study_id, ranges, 0.05, timeout=1800)
            direct_s = time.monotonic() - t0
            mark("direct")
            _stop_owners(procs, finish)
            first = min(r["upload_start"] for r in results)
            last = max(r["upload_end"] for r in results)
            budget = key_holder.budget(contract.study_id)
            assert rel.state == "DONE" and rel.summary is not None
            total = sum(r["hist_sum"] for r in results)
            released_total = sum(rel.summary.sums)
        table = _proc_table()

        def workers_peak(root: int) -> float:  # the largest of a server's worker (and ingest) processes, so far
            peaks = []
            for pid in _descendants(table, root):
                try:
                    peaks.append(_vm_hwm_mb(pid))
                except OSError:  # ended meanwhile
                    pass
            return max(peaks, default=0.0)

        rss = {"decryption_workers_max": workers_peak(ds_proc.pid), "computation_workers_max": workers_peak(cs_proc.pid),
               "decryption": _vm_hwm_mb(ds_proc.pid), "computation": _vm_hwm_mb(cs_proc.pid),
               "owner_max": max(r["peak_rss_mb"] for r in results),
               # this process: the SDK client that reads the whole summary (in pages when it is large)
               "client": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    finally:
        _stop_owners(procs, finish)
        for proc, name in reversed(servers):
            _stop_server(proc, name, workdir)
    phases = _phases(marks)
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
        "phases": phases,
        "cs_main_busy_release_pct": phases["release"]["busy_pct"]["computation"],
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


_GROUPS = (("computation", "CS main"), ("computation_children", "CS workers"), ("decryption", "DS main"),
           ("decryption_children", "DS workers"), ("owners", "owners"), ("driver", "driver"))


def _phase_table(rows: list[dict[str, Any]]) -> str:
    """Per case and phase: wall seconds, then CPU seconds (busy % of the phase's wall time) per process group."""
    head = f"{'bins':>9} {'phase':>8} {'wall s':>7} " + " ".join(f"{label:>17}" for _, label in _GROUPS)
    lines = ["CPU seconds per phase (busy % of the phase's wall time; 100% = one core)", head, "-" * len(head)]
    for r in rows:
        for name, ph in r["phases"].items():
            cells = " ".join(f"{ph['cpu_s'][k]:>8.2f} ({ph['busy_pct'][k] or 0:>5.0f}%)" for k, _ in _GROUPS)
            lines.append(f"{r['bins']:>9} {name:>8} {ph['wall_s']:>7.2f} {cells}")
        lines.append(f"{'':>9} CS main process busy {r['cs_main_busy_release_pct']}% of the release wall time "
                     f"({r['phases']['release']['wall_s']:.2f} s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--bins", type=int, action="append", help="domain size (repeatable; default 4096 and 1048576)")
    ap.add_argument("--owners", type=int, default=10, help="data-owner processes (default 10)")
    ap.add_argument("--ds-workers", type=int, default=None,
                    help="the decryption server's --decrypt-workers (default: its default, min(cores, 8))")
    ap.add_argument("--no-write", action="store_true", help="do not write benchmarks/results/services.json")
    ap.add_argument("--ingest-processes", type=int, default=0, metavar="N",
                    help="the computation server's --ingest-processes (default 0: its main process takes the uploads)")
    ap.add_argument("--streams", type=int, default=None, metavar="N",
                    help="upload streams per owner (default: the client's own choice by upload size)")
    ap.add_argument("--signed", action="store_true",
                    help="a signed study (every owner's key in the contract): the owners sign their c1 parts too")
    args = ap.parse_args(argv)
    sizes = args.bins or [4096, 1 << 20]
    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix=f"dpagg-bench-{n}-") as tmp:
            print(f"running {n} bins x {args.owners} owners ...", file=sys.stderr, flush=True)
            rows.append(run_case(n, args.owners, Path(tmp), args.ds_workers, args.signed, args.ingest_processes,
                                 args.streams))
            rows[-1]["ingest_processes"] = args.ingest_processes
            rows[-1]["streams_per_owner"] = args.streams
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(_table(rows))
    print(_phase_table(rows))
    if not args.no_write:
        from benchmarks.common import write_result

        path = write_result("services", {"cases": rows, "note": "loopback gRPC, servers and owners as separate "
                                         "processes on one machine; wall = first upload byte -> summary stored"})
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
