"""2-D accuracy benchmark: RMSE of random rectangles on the DPBench-2D grids, flattened along a Hilbert curve.

Each 256 x 256 grid is flattened along the Hilbert curve (he_partition.strategies.hilbert), released
as a 1-D histogram of 65,536 bins, and the per-bin estimates are put back on the grid.
Workload: 2,000 rectangles with side lengths uniform in [1, 256] and uniform positions;
ratios are to Identity's expected RMSE (per-cell Laplace, single noise, same eps).
Baselines (plaintext, single noise, same Hilbert order): "hb-plain" (HB over the curve;
with b = 16 its blocks are aligned squares, i.e. a quadtree) and "dawa-plain" (DAWA's L1
partition over the curve, buckets up to 4,096 cells, then HB over the buckets), which is
the construction of the published "DAWA over a Hilbert ordering".

    python -m benchmarks.accuracy_2d --strategies auto,hier,dawa,privelet-nn
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Callable

import numpy as np
import numpy.typing as npt

from he_partition.strategies.hilbert import flatten, unflatten
from he_partition.core.noise import discrete_laplace_variance, laplace_scale

from .accuracy import dawa_plain, hb_plain, identity, ours, summarize
from .common import SHARED_DATA, require_data, write_result

Method = Callable[[npt.NDArray[np.int64], float, int], npt.NDArray[np.float64]]

#: Published means over the 10 DPBench-2D grids (ratio to Identity's expected RMSE, single
#: noise; design-notes section 5). QuadTree: 0.56 to 0.96 depending on the budget split.
PUBLISHED_2D = {
    "0.1": {"DAWA-Hilbert": 0.17, "AGrid": 0.23, "HB2D": 0.57, "Privelet2D": 0.96},
    "1.0": {"DAWA-Hilbert": 0.21, "AGrid": 0.46},
}


def dpbench_2d() -> dict[str, npt.NDArray[np.int64]]:
    """The 10 DPBench 2-D grids (256 x 256), by file stem."""
    folder = require_data(SHARED_DATA / "dpbench" / "2D")
    return {p.stem: np.load(p).astype(np.int64) for p in sorted(Path(folder).glob("*.npy"))}


def random_rectangles(side: int, count: int, seed: int) -> npt.NDArray[np.int64]:
    """(r0, r1, c0, c1) rows: side lengths uniform in [1, side], positions uniform among valid ones."""
    rng = np.random.default_rng(seed)
    h = rng.integers(1, side + 1, count)
    w = rng.integers(1, side + 1, count)
    r0 = (rng.random(count) * (side - h + 1)).astype(np.int64)
    c0 = (rng.random(count) * (side - w + 1)).astype(np.int64)
    return np.stack([r0, r0 + h, c0, c0 + w], axis=1)


def rectangle_rmse(estimate: npt.ArrayLike, truth: npt.ArrayLike, rects: npt.NDArray[np.int64]) -> float:
    """RMSE of rectangle sums of a 2-D estimate against the truth (summed-area tables)."""
    def sat(a: npt.ArrayLike) -> npt.NDArray[np.float64]:
        s = np.zeros((np.shape(a)[0] + 1, np.shape(a)[1] + 1))
        s[1:, 1:] = np.cumsum(np.cumsum(np.asarray(a, dtype=np.float64), axis=0), axis=1)
        return s

    se, st = sat(estimate), sat(truth)
    r0, r1, c0, c1 = rects.T
    def box(s: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return s[r1, c1] - s[r0, c1] - s[r1, c0] + s[r0, c0]

    err = box(se) - box(st)
    return float(np.sqrt(np.mean(err**2)))


def on_grid(method: Method) -> Callable[[npt.NDArray[np.int64], float, int], npt.NDArray[np.float64]]:
    """Run a 1-D method on the Hilbert-flattened grid and return a 2-D estimate."""
    def run(grid: npt.NDArray[np.int64], eps: float, seed: int) -> npt.NDArray[np.float64]:
        return unflatten(method(flatten(grid), eps, seed))
    return run


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--strategies", default="auto", help="comma-separated strategies (as in benchmarks.accuracy)")
    ap.add_argument("--eps", default="0.1,1.0")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--one-noise", default="none", help="'all' also runs one-noise variants (default: none)")
    ap.add_argument("--out", default="accuracy_2d")
    args = ap.parse_args(argv)
    data = dpbench_2d()
    epsilons = [float(e) for e in args.eps.split(",")]
    side = next(iter(data.values())).shape[0]
    rects = random_rectangles(side, args.queries, seed=2022)
    mean_area = float(np.mean((rects[:, 1] - rects[:, 0]) * (rects[:, 3] - rects[:, 2])))
    strategies = [s for s in args.strategies.split(",") if s]
    methods: dict[str, Callable[[npt.NDArray[np.int64], float, int], npt.NDArray[np.float64]]] = {
        "identity": lambda g, e, s: identity(g.reshape(-1), e, s).reshape(g.shape)}
    for s in strategies:
        methods[f"{s}/2-noise"] = on_grid(ours(s, 2))
        if args.one_noise == "all":
            methods[f"{s}/1-noise"] = on_grid(ours(s, 1))
    if not args.no_baselines:
        methods["hb-plain"] = on_grid(hb_plain)
        methods["dawa-plain"] = on_grid(lambda x, e, s: dawa_plain(x, e, s, max_length=4096))
    rows = []
    t0 = time.perf_counter()
    for eps in epsilons:
        ident_exact = float(np.sqrt(mean_area * discrete_laplace_variance(laplace_scale(1, eps))))
        for name, grid in data.items():
            row: dict[str, float | str] = {"dataset": name, "epsilon": eps, "identity_expected_rmse": ident_exact}
            for mname, method in methods.items():
                mses = [rectangle_rmse(method(grid, eps, 1000 * rep + 17), grid, rects) ** 2
                        for rep in range(args.reps)]
                row[mname] = float(np.sqrt(np.mean(mses)))
            if not args.no_baselines:
                row["best-baseline"] = min(float(row["hb-plain"]), float(row["dawa-plain"]))
            rows.append(row)
            print(f"  {name:<28} eps={eps:<4} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    elapsed = time.perf_counter() - t0
    print(f"RMSE over {args.queries} random rectangles, {args.reps} reps; ratio = method / Identity's expected "
          "RMSE (single noise, same eps)")
    cols = list(methods) + ([] if args.no_baselines else ["best-baseline"])
    summary = summarize(rows, epsilons, cols, [f"{s}/2-noise" for s in strategies], not args.no_baselines,
                        name_width=28)
    path = write_result(args.out, {"workload": {"queries": args.queries, "reps": args.reps, "rect_seed": 2022,
                                                "mean_area": mean_area, "flattening": "hilbert",
                                                "rmse": "sqrt of the mean over reps of each rep's MSE"},
                                   "methods": cols, "published_means": PUBLISHED_2D, "summary": summary,
                                   "rows": rows, "elapsed_seconds": elapsed})
    print(f"wrote {path} ({elapsed:.1f} s)")


if __name__ == "__main__":
    main()
