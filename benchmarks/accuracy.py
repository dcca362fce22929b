"""Accuracy benchmark: RMSE of random range queries on DPBench-1D, our releases vs Identity and baselines.

Strategies are run through `release()` (plain backend) with two noise parties (our threat
model) and with one. Baselines, single noise and plaintext, per file: "hb-plain" (HB:
b-ary tree, uniform budget, least-squares consistency; Qardaji et al. 2013 + Hay et al.
2010) and "dawa-plain" (DAWA's L1 partition exactly as in its reference code, on the true
data with Laplace-noised interval costs, rho = 0.25; then an HB tree over the buckets in
place of DAWA's GreedyH). "best-baseline" is the better of the two per file. Published
means (design-notes section 5, ektelo runs on the same workload) are reported alongside.

    python -m benchmarks.accuracy --strategies gap,hier,privelet,dawa,auto
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

from he_partition import release
from he_partition.core.estimation import IntervalTree
from he_partition.strategies.hier import hb_branching, tree_levels
from he_partition.core.noise import SeededRandom, discrete_laplace, discrete_laplace_variance, laplace_scale

from .common import dpbench_1d, random_ranges, range_rmse, write_result

Method = Callable[[npt.NDArray[np.int64], float, int], npt.NDArray[np.float64]]

#: Named variants usable in --strategies besides the registered strategy names.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "privelet-nn": ("privelet", {"nonnegative": True}),
    "hier-prune": ("hier", {"prune": True}),
    "dawa-sse": ("dawa", {"cost": "sse"}),
}

#: Published means over the 18 DPBench-1D files (ratio to Identity's expected RMSE, single
#: noise; ektelo implementations, 10 repetitions; design-notes section 5).
PUBLISHED_1D = {
    "0.1": {"HB": 0.29, "GreedyH": 0.36, "Privelet": 0.44, "DAWA": 0.28, "best-per-file": 0.22},
    "1.0": {"HB": 0.29, "GreedyH": 0.36, "Privelet": 0.44, "DAWA": 0.33, "best-per-file": 0.25},
}


def identity(x: npt.NDArray[np.int64], eps: float, seed: int) -> npt.NDArray[np.float64]:
    """Per-bin discrete Laplace(1/eps), one noise party: the baseline every ratio is taken to."""
    return (x + discrete_laplace(laplace_scale(1, eps), x.size, SeededRandom(seed))).astype(np.float64)


def ours(strategy: str, noise_parties: int) -> Method:
    name, params = VARIANTS.get(strategy, (strategy, {}))

    def run(x: npt.NDArray[np.int64], eps: float, seed: int) -> npt.NDArray[np.float64]:
        return release([x], eps, strategy=name, noise_parties=noise_parties, rng=seed,
                       params=params or None).estimate()
    return run


def _tree_over(x: npt.NDArray[np.int64], buckets: npt.NDArray[np.int64], eps: float,
               rng: SeededRandom) -> npt.NDArray[np.float64]:
    """HB over the given buckets, single discrete Laplace noise, least-squares consistent, spread evenly."""
    n = x.size
    m = buckets.size
    levels = [buckets[i] for i in tree_levels(m, hb_branching(m))]
    scale = laplace_scale(len(levels), eps)
    var = discrete_laplace_variance(scale)
    parts = [(s, np.add.reduceat(x, s) + discrete_laplace(scale, s.size, rng), var) for s in levels]
    return IntervalTree(n, parts, cells=buckets).bin_estimates()


def hb_plain(x: npt.NDArray[np.int64], eps: float, seed: int) -> npt.NDArray[np.float64]:
    """HB (Qardaji et al.) with consistency, in plaintext, one noise party."""
    return _tree_over(x, np.arange(x.size, dtype=np.int64), eps, SeededRandom(seed))


def dawa_partition_plain(x: npt.NDArray[np.int64], eps1: float, eps2: float, seed: int,
                         max_length: int | None = None) -> npt.NDArray[np.int64]:
    """DAWA's L1 partition (reference code `L1partition_approx`), on the true data.

    Buckets of lengths 2^k (any start); score = absolute deviation from the bucket mean +
    1/eps2 + Laplace((2 - 1/len - 1/n) / eps1) (none for length 1), clamped below at 1/eps2;
    the partition of least total score is chosen by dynamic programming.
    """
    from he_partition.strategies.dawa import _dyadic_partition, l1_costs

    n = x.size
    gen = np.random.default_rng(seed)
    costs = l1_costs(x.astype(np.float64), 0.0, max_length)
    noisy = []
    for k, c in enumerate(costs):
        length = 1 << k
        lap = 0.0 if length == 1 else gen.laplace(0.0, (2.0 - 1.0 / length - 1.0 / n) / eps1, c.size)
        noisy.append(np.maximum(c + 1.0 / eps2 + lap, 1.0 / eps2) - 1.0 / eps2)
    return _dyadic_partition(noisy, 1.0 / eps2, n)


def dawa_plain(x: npt.NDArray[np.int64], eps: float, seed: int, max_length: int | None = None,
               ratio: float = 0.25) -> npt.NDArray[np.float64]:
    """DAWA-style baseline: DAWA's private L1 partition, then HB over the buckets (one noise party)."""
    eps1 = ratio * eps
    eps2 = eps - eps1
    buckets = dawa_partition_plain(x, eps1, eps2, seed, max_length)
    return _tree_over(x, buckets, eps2, SeededRandom(seed + 1))


BASELINES: dict[str, Method] = {"hb-plain": hb_plain, "dawa-plain": dawa_plain}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--strategies", default="gap",
                    help="comma-separated strategies to run (default: gap); also " + ", ".join(VARIANTS))
    ap.add_argument("--no-baselines", action="store_true", help="skip the plaintext HB / DAWA baselines")
    ap.add_argument("--one-noise", default="all",
                    help="'all' (default) also runs every strategy with one noise party; 'none' skips that")
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
    strategies = [s for s in args.strategies.split(",") if s]
    for s in strategies:
        methods[f"{s}/2-noise"] = ours(s, 2)
        if args.one_noise == "all":
            methods[f"{s}/1-noise"] = ours(s, 1)
    if not args.no_baselines:
        methods.update(BASELINES)
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
            if not args.no_baselines:
                row["best-baseline"] = min(row[b] for b in BASELINES)
            rows.append(row)
            print(f"  {name:<44} eps={eps:<4} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    elapsed = time.perf_counter() - t0

    print(f"RMSE over {args.queries} random ranges, {args.reps} reps; ratio = method / Identity's expected RMSE "
          "(single noise, same eps)")
    cols = list(methods) + ([] if args.no_baselines else ["best-baseline"])
    summary = summarize(rows, epsilons, cols, [f"{s}/2-noise" for s in strategies], not args.no_baselines)
    path = write_result(args.out, {"workload": {"queries": args.queries, "reps": args.reps, "range_seed": 2022,
                                                "mean_width": mean_width,
                                                "rmse": "sqrt of the mean over reps of each rep's MSE"},
                                   "methods": cols, "published_means": PUBLISHED_1D, "summary": summary,
                                   "rows": rows, "elapsed_seconds": elapsed})
    print(f"wrote {path} ({elapsed:.1f} s)")


def summarize(rows: list[dict[str, Any]], epsilons: list[float], cols: list[str], ours_cols: list[str],
              baselines: bool, name_width: int = 44) -> dict[str, dict[str, float]]:
    """Print the per-dataset ratio table, means and maxima; return the summary for the JSON file.

    Ratios are to Identity's expected RMSE (single noise, same eps); "vs best" columns divide
    our two-noise RMSE by the best plaintext single-noise baseline of the same file.
    """
    header = f"{'dataset':<{name_width}} {'eps':>5} " + " ".join(f"{m:>14}" for m in cols)
    if baselines:
        header += " " + " ".join(f"{'vs best:' + m.split('/')[0]:>16}" for m in ours_cols)
    summary: dict[str, dict[str, float]] = {}
    for eps in epsilons:
        print(header)
        sel = [r for r in rows if r["epsilon"] == eps]
        for r in sel:
            line = f"{r['dataset'][:name_width]:<{name_width}} {eps:>5} " + " ".join(
                f"{r[m] / r['identity_expected_rmse']:>14.3f}" for m in cols)
            if baselines:
                line += " " + " ".join(f"{r[m] / r['best-baseline']:>16.3f}" for m in ours_cols)
            print(line)
        means = {m: float(np.mean([r[m] / r["identity_expected_rmse"] for r in sel])) for m in cols}
        maxes = {m: float(np.max([r[m] / r["identity_expected_rmse"] for r in sel])) for m in cols}
        out = {**{f"mean_ratio/{m}": v for m, v in means.items()}, **{f"max_ratio/{m}": v for m, v in maxes.items()}}
        tail_mean = f"{'MEAN ratio':<{name_width}} {eps:>5} " + " ".join(f"{means[m]:>14.3f}" for m in cols)
        tail_max = f"{'MAX ratio':<{name_width}} {eps:>5} " + " ".join(f"{maxes[m]:>14.3f}" for m in cols)
        if baselines:
            vs = {m: float(np.mean([r[m] / r["best-baseline"] for r in sel])) for m in ours_cols}
            vs_max = {m: float(np.max([r[m] / r["best-baseline"] for r in sel])) for m in ours_cols}
            out.update({f"mean_ratio_to_best_baseline/{m}": v for m, v in vs.items()})
            out.update({f"max_ratio_to_best_baseline/{m}": v for m, v in vs_max.items()})
            tail_mean += " " + " ".join(f"{vs[m]:>16.3f}" for m in ours_cols)
            tail_max += " " + " ".join(f"{vs_max[m]:>16.3f}" for m in ours_cols)
        print(tail_mean)
        print(tail_max)
        print()
        summary[str(eps)] = out
    return summary


if __name__ == "__main__":
    main()
