"""Benchmark: K holders' discrete Laplace shares against today's single-holder draw, 1M values.

`python -m benchmarks.noise_shares [--size 1000000] [--holders 3] [--scale 20] [--repeats 3]` times, with
the production source (`SecureRandom`) and a holder's keyed source (`KeyedRandom` via
`holder_noise_source`): one holder's share (`discrete_laplace_share`), all K shares, and one
`discrete_laplace` draw of the same scale (the single key holder today). Best of `repeats` runs;
the inverse-CDF table is built once before timing (its build time is reported separately).
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction
from typing import Any, Callable

from he_partition.core.noise import SecureRandom, discrete_laplace
from he_partition.core.noise_shares import discrete_laplace_share, holder_noise_source

from .common import write_result


def _best(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def run(size: int, holders: int, scale: Fraction, repeats: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    discrete_laplace_share(scale, holders, 1, SecureRandom())
    table = time.perf_counter() - t0
    key = b"benchmark-noise-key-0123456789ab"
    share_secure = _best(lambda: discrete_laplace_share(scale, holders, size, SecureRandom()), repeats)
    share_keyed = _best(lambda: discrete_laplace_share(scale, holders, size,
                                                       holder_noise_source(key, 0, holders, b"bench")), repeats)
    all_shares = _best(lambda: [discrete_laplace_share(scale, holders, size, SecureRandom())
                                for _ in range(holders)], repeats)
    single = _best(lambda: discrete_laplace(scale, size, SecureRandom()), repeats)
    return {"size": size, "holders": holders, "scale": str(scale), "table_build_s": table,
            "one_share_secure_s": share_secure, "one_share_keyed_s": share_keyed,
            "all_shares_secure_s": all_shares, "single_holder_discrete_laplace_s": single}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--holders", type=int, default=3)
    ap.add_argument("--scale", default="20", help="noise scale (a fraction, e.g. 20 or 7/3)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    result = run(args.size, args.holders, Fraction(args.scale), args.repeats)
    for k, v in result.items():
        print(f"{k:36s} {v:.4f}" if isinstance(v, float) else f"{k:36s} {v}")
    write_result("noise_shares", result)


if __name__ == "__main__":
    main()
