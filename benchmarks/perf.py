"""Performance benchmark: per-stage time and peak memory of a CKKS release vs the numpy oracle."""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

import numpy as np

from he_partition import GapParams
from he_partition.backend import PlainBackend, VectorBackend
from he_partition.gap import gap_strategy
from he_partition.measurements import Measurement, round_slots
from he_partition.noise import SeededRandom, discrete_laplace
from he_partition.protocol import Budget, encrypt_histogram

from .common import write_result


def _pipeline(backend_name: str, n: int, owners: int, seed: int) -> dict[str, Any]:
    """One release, stage by stage, with the same code paths as release() (gap strategy)."""
    t: dict[str, float] = defaultdict(float)
    rng = SeededRandom(seed)
    data_rng = np.random.default_rng(seed)
    hists = [data_rng.poisson(np.where((np.arange(n) // 512) % 4 == 0, 30.0, 1.0)) for _ in range(owners)]

    t0 = time.perf_counter()
    ds_be: VectorBackend
    if backend_name == "ckks":
        from he_partition.ckks import CkksBackend, generate_secret_context, load_context, public_context_bytes

        secret = generate_secret_context()
        ds_be = CkksBackend(secret)
        pub_be: VectorBackend = CkksBackend(load_context(public_context_bytes(secret)))
    else:
        ds_be = pub_be = PlainBackend()
    t["keygen"] = time.perf_counter() - t0

    agg = None
    for h in hists:  # owners stream in; the server keeps only the running sum
        a = time.perf_counter()
        v = encrypt_histogram(pub_be, h)
        b = time.perf_counter()
        agg = v if agg is None else pub_be.add(agg, v)
        c = time.perf_counter()
        t["encrypt (all owners)"] += b - a
        t["aggregate"] += c - b
    assert agg is not None
    budget = Budget(1.0)

    def measure(m: Measurement) -> np.ndarray:
        a = time.perf_counter()
        eta = discrete_laplace(m.scale, m.count, rng)
        noise = m.noise_slots(eta)
        b = time.perf_counter()
        mask = m.mask()
        masked = agg if mask is None else pub_be.mul_mask(agg, mask)
        ct = pub_be.add_noise(masked, noise)
        c = time.perf_counter()
        budget.charge(m.kind, m.epsilon)
        slots = round_slots(ds_be.decrypt(ct))
        d = time.perf_counter()
        values = m.decode(slots) + discrete_laplace(m.scale, m.count, rng)
        e = time.perf_counter()
        t["noise sampling (both servers)"] += (b - a) + (e - d)
        t["measurements under HE (mask, add noise)"] += c - b
        t["decrypt + round"] += d - c
        return values

    strat = gap_strategy(n, 1.0, noise_parties=2, params=GapParams())
    a = time.perf_counter()
    m = next(strat)
    try:
        while True:
            m = strat.send(measure(m))
    except StopIteration as stop:
        summary = stop.value
    t["strategy total (incl. partition choice)"] = time.perf_counter() - a
    t["total excl. keygen"] = sum(v for k, v in t.items() if k not in ("keygen", "strategy total (incl. partition choice)")) \
        + (t["strategy total (incl. partition choice)"] - t["noise sampling (both servers)"]
           - t["measurements under HE (mask, add noise)"] - t["decrypt + round"])
    t["total incl. keygen"] = t["total excl. keygen"] + t["keygen"]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"backend": backend_name, "n": n, "owners": owners, "seconds": dict(t), "peak_rss_mb": peak_mb,
            "partitions": summary.n_partitions}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="4096,65536,1048576")
    ap.add_argument("--owners", type=int, default=10)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one (backend:n) in this process
    args = ap.parse_args(argv)
    if args.one:
        backend, n = args.one.split(":")
        print(json.dumps(_pipeline(backend, int(n), args.owners, seed=1)))
        return
    results = []
    for n in [int(s) for s in args.sizes.split(",")]:
        for backend in ("plain", "ckks"):
            # A fresh process per run, so that peak RSS belongs to that run alone.
            out = subprocess.run([sys.executable, "-m", "benchmarks.perf", "--one", f"{backend}:{n}",
                                  "--owners", str(args.owners)], capture_output=True, text=True, check=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = results[-1]
            print(f"n={n:>8} {backend:>5}: total {r['seconds']['total excl. keygen']:.3f} s excl. keygen "
                  f"({r['seconds']['keygen']:.3f} s keygen), peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
    print()
    stages = [k for k in results[0]["seconds"]]
    print(f"{'stage (seconds)':<42}" + "".join(f"{r['backend'] + ' ' + str(r['n']):>18}" for r in results))
    for s in stages:
        print(f"{s:<42}" + "".join(f"{r['seconds'][s]:>18.3f}" for r in results))
    print(f"{'peak RSS (MB)':<42}" + "".join(f"{r['peak_rss_mb']:>18.0f}" for r in results))
    ratios = {}
    for n in sorted({r["n"] for r in results}):
        p = next(r for r in results if r["n"] == n and r["backend"] == "plain")
        c = next(r for r in results if r["n"] == n and r["backend"] == "ckks")
        ratios[str(n)] = c["seconds"]["total excl. keygen"] / p["seconds"]["total excl. keygen"]
        print(f"CKKS / plaintext time ratio at n={n}: {ratios[str(n)]:.1f}x")
    path = write_result("perf", {"owners": args.owners, "runs": results, "ckks_over_plain": ratios})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
