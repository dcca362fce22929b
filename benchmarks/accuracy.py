"""Accuracy benchmark: RMSE of random range queries on DPBench-1D, our releases vs Identity."""

from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np
import numpy.typing as npt

from he_partition import release
from he_partition.noise import SeededRandom, discrete_laplace, discrete_laplace_variance, laplace_scale

from .common import dpbench_1d, random_ranges, range_rmse, write_result

Method = Callable[[npt.NDArray[np.int64], float, int], npt.NDArray[np.float64]]


def identity(x: npt.NDArray[np.int64], eps: float, seed: int) -> npt.NDArray[np.float64]:
    """Per-bin discrete Laplace(1/eps), one noise party: the baseline every ratio is taken to."""
    return (x + discrete_laplace(laplace_scale(1, eps), x.size, SeededRandom(seed))).astype(np.float64)


def ours(strategy: str, noise_parties: int) -> Method:
    def run(x: npt.NDArray[np.int64], eps: float, seed: int) -> npt.NDArray[np.float64]:
        return release([x], eps, strategy=strategy, noise_parties=noise_parties, rng=seed).estimate()
    return run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--strategies", default="gap", help="comma-separated strategies to run (default: gap)")
    ap.add_argument("--eps", default="0.1,1.0")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--out", default="accuracy")
    args = ap.parse_args(argv)
    data = dpbench_1d()
    epsilons = [float(e) for e in args.eps.split(",")]
    n = next(iter(data.values())).size
    ranges = random_ranges(n, args.queries, seed=2022)
    methods: dict[str, Method] = {"identity": identity}
    for s in args.strategies.split(","):
        methods[f"{s}/2-noise"] = ours(s, 2)
        methods[f"{s}/1-noise"] = ours(s, 1)
    mean_width = float(np.mean(ranges[:, 1] - ranges[:, 0]))
    rows = []
    t0 = time.perf_counter()
    for eps in epsilons:
        ident_exact = float(np.sqrt(mean_width * discrete_laplace_variance(laplace_scale(1, eps))))
        for name, x in data.items():
            row = {"dataset": name, "epsilon": eps, "identity_expected_rmse": ident_exact}
            for mname, method in methods.items():
                # sqrt of the mean per-rep MSE: averaging per-rep RMSEs would be biased low (Jensen).
                mses = [range_rmse(method(x, eps, 1000 * rep + 17), x, ranges) ** 2 for rep in range(args.reps)]
                row[mname] = float(np.sqrt(np.mean(mses)))
            rows.append(row)
    elapsed = time.perf_counter() - t0

    print(f"RMSE over {args.queries} random ranges, {args.reps} reps; ratio = method / Identity's expected RMSE "
          "(single noise, same eps)")
    header = f"{'dataset':<44} {'eps':>5} " + " ".join(f"{m:>16}" for m in methods)
    summary: dict[str, dict[str, float]] = {}
    for eps in epsilons:
        print(header)
        sel = [r for r in rows if r["epsilon"] == eps]
        for r in sel:
            print(f"{r['dataset']:<44} {eps:>5} " + " ".join(
                f"{r[m] / r['identity_expected_rmse']:>16.3f}" for m in methods))
        means = {m: float(np.mean([r[m] / r["identity_expected_rmse"] for r in sel])) for m in methods}
        maxes = {m: float(np.max([r[m] / r["identity_expected_rmse"] for r in sel])) for m in methods}
        print(f"{'MEAN ratio':<44} {eps:>5} " + " ".join(f"{means[m]:>16.3f}" for m in methods))
        print(f"{'MAX ratio':<44} {eps:>5} " + " ".join(f"{maxes[m]:>16.3f}" for m in methods))
        print()
        summary[str(eps)] = {**{f"mean_ratio/{m}": v for m, v in means.items()},
                             **{f"max_ratio/{m}": v for m, v in maxes.items()}}
    path = write_result(args.out, {"workload": {"queries": args.queries, "reps": args.reps, "range_seed": 2022,
                                                "mean_width": mean_width},
                                   "methods": list(methods), "summary": summary, "rows": rows,
                                   "elapsed_seconds": elapsed})
    print(f"wrote {path} ({elapsed:.1f} s)")


if __name__ == "__main__":
    main()
