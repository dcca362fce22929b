"""Performance benchmark: an in-process BFV release against one encryption pass of its inputs, with peak RSS.

`python -m benchmarks.perf [--sizes 4096,1048576] [--owners 10] [--strategy auto]` runs, per size and in a
fresh process (so peak RSS is that run's): key generation, one encryption pass of every owner's histogram
(what the data owners must do anyway), then `release(..., backend="bfv")` end to end (its own key
generation, the owners' encryption, every measurement with pads and flooding, decryption, strategy).
The figure the issue asks for is the ratio release / encryption pass, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from typing import Any

import numpy as np

from he_partition.he.keyholder import generate_backends
from he_partition.protocol import encrypt_histogram, release

from .common import write_result


def _one(n: int, owners: int, strategy: str, seed: int) -> dict[str, Any]:
    data_rng = np.random.default_rng(seed)
    hists = [data_rng.poisson(np.where((np.arange(n) // 512) % 4 == 0, 30.0, 1.0)) for _ in range(owners)]
    t0 = time.perf_counter()
    _, public = generate_backends()
    keygen = time.perf_counter() - t0
    t0 = time.perf_counter()
    for h in hists:
        encrypt_histogram(public, h)
    encryption = time.perf_counter() - t0
    t0 = time.perf_counter()
    summary = release(hists, 1.0, strategy=strategy, backend="bfv", rng=seed)
    total = time.perf_counter() - t0
    return {"n": n, "owners": owners, "strategy": strategy, "keygen_s": keygen, "encryption_pass_s": encryption,
            "release_s": total, "ratio": total / encryption, "partitions": summary.n_partitions,
            "measurements": len(summary.epsilon_spent),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4096,1048576", help="comma-separated domain sizes (bins)")
    ap.add_argument("--owners", type=int, default=10, help="data owners (default 10)")
    ap.add_argument("--strategy", default="auto", help="release strategy (default auto, the library default)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one size in this process
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one, args.owners, args.strategy, seed=1)))
        return
    runs = []
    for n in [int(s) for s in args.sizes.split(",")]:
        out = subprocess.run([sys.executable, "-m", "benchmarks.perf", "--one", str(n), "--owners", str(args.owners),
                              "--strategy", args.strategy], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        runs.append(r)
        print(f"n={n:>8}: encryption pass {r['encryption_pass_s']:.3f} s, release {r['release_s']:.3f} s "
              f"({r['measurements']} measurements), ratio {r['ratio']:.2f}x, keygen {r['keygen_s']:.3f} s, "
              f"peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
    path = write_result("perf", {"owners": args.owners, "strategy": args.strategy, "runs": runs})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
