"""Performance benchmark: a BFV release against one encryption pass of its inputs, per executor, with peak RSS.

`python -m benchmarks.perf [--sizes 4096,1048576] [--owners 10] [--strategy auto]
[--executors none,inprocess,processes] [--workers 0]` runs, per size and executor, in a fresh
process (so peak RSS is that run's): key generation, one encryption pass of every owner's
histogram in this one process (the unit of time: what the data owners must do anyway, one after
another), then a seeded `release(..., backend="bfv", executor=...)` end to end. What the release
(the ratio's numerator) contains:

- `none`: everything in this one process, serially: its own key generation, every owner's
  encryption, every measurement (the computation side's draws, fresh noise encryption, flooding),
  the decryption side's checks and decryptions, the strategy (today's in-process path);
- `inprocess`: the same through the in-process executor (serializing each measured chunk, as the
  servers do);
- `processes`: the servers' default executor, one worker process per core (`--workers`), started
  before the timed release as a server's workers are (`executor_start_s`, reported apart; the
  ratio with it is `ratio_with_start`). The owners' encryptions (each owner an organization with
  its own machine) run in those workers, each encrypting every owner's chunks of its share, and so
  do the computation side's noise encryptions and flooding; the draws, the decryption side and the
  strategy stay in this process.

Each run also records the calling process's CPU time in the release (`release_cpu_s`), the workers'
CPU time (`workers_cpu_s`, their start included) and the load average before and after: on a shared
machine a ratio means little without them. Every run uses the same data and seed, so all executors
must release the same summary: the runs' `summary_sha256` are compared and the benchmark fails if
they differ.

`python -m benchmarks.perf --sources [--sizes 1048576]` instead times the computation server's own
draws per random source, in this process, best of 3, in CPU seconds of this process (steadier than wall
time on a shared machine; the draws are single-threaded): the discrete Laplace noise of `size` measured
values (scale 20) and `size` pads uniform mod t, from `SecureRandom` (one `os.urandom` call per draw)
and from `CipherRandom` (AES-256-CTR under a fresh OS key, the servers' default). It prints only.

`python -m benchmarks.perf --ranges [--sizes 1048576] [--strategy auto]` instead times analysts' range
answers on one owner's released summary (plaintext release, seeded; wall seconds in this process): 1,000
random ranges one `range_count` call each, the same ranges in one `range_counts` call, the once-per-summary
tables (built by the first range), and a dense row per range (`weighted_count`, the general path for any
weights, which is what every tree or wavelet range cost before) on a few ranges, scaled to 1,000. It prints only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from he_partition.core.backend import DEFAULT_PLAIN_MODULUS
from he_partition.core.noise import CipherRandom, RandomSource, SecureRandom, discrete_laplace
from he_partition.execution import ChunkExecutor, InProcessExecutor, ProcessExecutor
from he_partition.he.keyholder import generate_backends
from he_partition.protocol import encrypt_histogram, release

from .common import random_ranges, write_result

EXECUTORS = ("none", "inprocess", "processes")


def _one(n: int, owners: int, strategy: str, seed: int, executor: str, workers: int) -> dict[str, Any]:
    data_rng = np.random.default_rng(seed)
    hists = [data_rng.poisson(np.where((np.arange(n) // 512) % 4 == 0, 30.0, 1.0)) for _ in range(owners)]
    t0 = time.perf_counter()
    _, public = generate_backends()
    keygen = time.perf_counter() - t0
    t0 = time.perf_counter()
    for h in hists:
        encrypt_histogram(public, h)
    encryption = time.perf_counter() - t0
    ex: ChunkExecutor | None = None
    start = 0.0
    if executor == "processes":
        t0 = time.perf_counter()
        ex = ProcessExecutor(workers)
        ex.start()
        start = time.perf_counter() - t0
    elif executor == "inprocess":
        ex = InProcessExecutor()
    load_before = os.getloadavg()[0]
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        summary = release(hists, 1.0, strategy=strategy, backend="bfv", rng=seed, executor=ex)
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        if ex is not None:
            ex.close()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"n": n, "owners": owners, "strategy": strategy, "executor": executor,
            "workers": ex.workers if ex is not None else 0, "keygen_s": keygen,
            "encryption_pass_s": encryption, "executor_start_s": start, "release_s": total,
            "release_cpu_s": cpu, "workers_cpu_s": children.ru_utime + children.ru_stime,
            "load_average": [load_before, os.getloadavg()[0]],
            "ratio": total / encryption, "ratio_with_start": (total + start) / encryption,
            "partitions": summary.n_partitions, "measurements": len(summary.epsilon_spent),
            "summary_sha256": hashlib.sha256(summary.to_json().encode()).hexdigest(),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "worker_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def _sources(n: int, repeats: int = 3) -> dict[str, float]:
    """CPU seconds (best of `repeats`) for n discrete Laplace draws (scale 20) and n pads mod t, per source."""
    out: dict[str, float] = {}
    sources: dict[str, Callable[[], RandomSource]] = {"secure": SecureRandom, "cipher": CipherRandom}
    for name, make in sources.items():
        for what, draw in (("noise", lambda r: discrete_laplace(Fraction(20), n, r)),
                           ("pads", lambda r: r.integers(DEFAULT_PLAIN_MODULUS, n))):
            best = float("inf")
            for _ in range(repeats):
                rng = make()  # a fresh source per measurement, as the servers make one per process
                t0 = time.process_time()
                draw(rng)
                best = min(best, time.process_time() - t0)
            out[f"{name}_{what}_s"] = best
    return out


def _ranges(n: int, strategy: str, count: int = 1000, dense: int = 10) -> dict[str, Any]:
    """Wall seconds of range answers on a seeded plaintext release of one owner's histogram (see the module doc)."""
    x = np.random.default_rng(0).integers(0, 5, n)
    summary = release([x], 1.0, strategy=strategy, rng=1)
    ranges = random_ranges(n, count, seed=2)
    t0 = time.perf_counter()
    summary.range_count(0, n)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    singles = [summary.range_count(int(a), int(b)) for a, b in ranges]
    single_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batch = summary.range_counts(ranges)
    batch_s = time.perf_counter() - t0
    assert list(batch) == singles
    t0 = time.perf_counter()
    for a, b in ranges[:dense]:
        w = np.zeros(n)
        w[a:b] = 1.0
        summary.weighted_count(w)
    dense_s = (time.perf_counter() - t0) * count / dense
    return {"n": n, "estimator": summary.estimator, "leaves": summary.n_partitions, "first_range_s": first,
            "range_count_s": single_s, "range_counts_s": batch_s, "dense_rows_s": dense_s, "ranges": count}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4096,1048576", help="comma-separated domain sizes (bins)")
    ap.add_argument("--owners", type=int, default=10, help="data owners (default 10)")
    ap.add_argument("--strategy", default="auto", help="release strategy (default auto, the library default)")
    ap.add_argument("--executors", default="none,inprocess,processes",
                    help=f"comma-separated, of {', '.join(EXECUTORS)} (default all three)")
    ap.add_argument("--workers", type=int, default=0, help="worker processes of `processes` (default 0: one per core)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/results/perf.json alone")
    ap.add_argument("--sources", action="store_true",
                    help="time the computation server's noise and pads per random source instead (prints only)")
    ap.add_argument("--ranges", action="store_true",
                    help="time analysts' range answers on a released summary instead (prints only)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one size in this process
    ap.add_argument("--executor", default="none", choices=EXECUTORS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one, args.owners, args.strategy, 1, args.executor, args.workers)))
        return
    if args.sources:
        for n in [int(s) for s in args.sizes.split(",")]:
            r = _sources(n)
            print(f"n={n:>8}, CPU s: noise (scale 20) SecureRandom {r['secure_noise_s']:.3f} s, CipherRandom "
                  f"{r['cipher_noise_s']:.3f} s; pads mod t SecureRandom {r['secure_pads_s']:.3f} s, "
                  f"CipherRandom {r['cipher_pads_s']:.3f} s", flush=True)
        return
    if args.ranges:
        for n in [int(s) for s in args.sizes.split(",")]:
            r = _ranges(n, args.strategy)
            shape = f"tree, {r['leaves']} leaves" if r["estimator"] == "tree" else r["estimator"]
            print(f"n={n:>8} ({shape}): {r['ranges']} ranges: range_count each "
                  f"{r['range_count_s']:.3f} s, one range_counts {r['range_counts_s']:.3f} s, dense row per range "
                  f"~{r['dense_rows_s']:.1f} s; first range (builds the tables) {r['first_range_s']:.3f} s",
                  flush=True)
        return
    executors = [e for e in args.executors.split(",") if e]
    unknown = sorted(set(executors) - set(EXECUTORS))
    if unknown:
        ap.error(f"unknown executor(s) {', '.join(unknown)}; choose from {', '.join(EXECUTORS)}")
    runs = []
    for n in [int(s) for s in args.sizes.split(",")]:
        digests = set()
        for executor in executors:
            out = subprocess.run([sys.executable, "-m", "benchmarks.perf", "--one", str(n), "--owners", str(args.owners),
                                  "--strategy", args.strategy, "--executor", executor, "--workers", str(args.workers)],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            runs.append(r)
            digests.add(r["summary_sha256"])
            print(f"n={n:>8} {executor:>9}: encryption pass {r['encryption_pass_s']:.3f} s, release "
                  f"{r['release_s']:.3f} s ({r['measurements']} measurements), ratio {r['ratio']:.2f}x "
                  f"(with worker start {r['ratio_with_start']:.2f}x), peak RSS {r['peak_rss_mb']:.0f} MB "
                  f"(workers {r['worker_peak_rss_mb']:.0f} MB)", flush=True)
        if len(digests) != 1:
            sys.exit(f"n={n}: the executors released different summaries under the same seed")
    result = {"owners": args.owners, "strategy": args.strategy, "executors": executors,
              "equal_across_executors": True, "runs": runs}
    if args.no_write:
        return
    path = write_result("perf", result)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
