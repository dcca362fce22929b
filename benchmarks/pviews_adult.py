"""Benchmark: p-view (DP-Mondrian, seed 000) vs Identity on UCI Adult range-count workloads.

Run:  python benchmarks/pviews_adult.py [--config coarse|fine|both] [--trials N] [--seed S]
                                        [--data PATH] [--out PATH]

Builds 4-D count tensors over Adult (age, education-num, hours-per-week, sex): "coarse"
uses 5-year age bins and 10-hour bins, shape (15, 16, 10, 2) = 4,800 cells (the default
of `load_adult_tensor`, small enough for one CKKS ciphertext batch); "fine" keeps every
age and hour, shape (74, 16, 99, 2) = 234,432 cells. For eps in {0.1, 1.0} it measures the
RMSE of the seed's workloads (Sec. 5.1-5.2): all 2-way marginals, 2-D prefix queries
over every attribute pair, 3000 random range queries over 2 random attributes, and 3000
random 4-D range queries, averaged over trials (the seed uses 10). Prints a table and
writes benchmarks/results/pviews_adult.json.

Noise comes from np.random.default_rng(seed) so runs are reproducible; this is a
benchmark, not a release (a release must seed from `secrets`).

Reuse: `load_adult_tensor()` returns the tensor and its attribute description, and the
workload builders return (lows, highs) integer arrays of half-open boxes, so other
strategies (e.g. the HE partitioning) can be scored with `rmse(...)` on the same queries.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from he_partition.pviews import PViewParams, box_sums, build_pview, identity_estimate  # noqa: E402

__all__ = [
    "ADULT_PATH",
    "Attribute",
    "ATTRIBUTES",
    "adult_attributes",
    "load_adult_tensor",
    "two_way_marginals",
    "prefix_2d",
    "random_ranges",
    "rmse",
    "CONFIGS",
    "main",
]

ADULT_PATH = Path("/work/shared/data/adult_uci/adult.data")
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "pviews_adult.json"

IntArray = npt.NDArray[np.int64]
Workload = tuple[IntArray, IntArray]


@dataclass(frozen=True)
class Attribute:
    """One axis of the tensor: the Adult column, its number of bins, and how it is binned."""

    name: str
    column: int
    size: int
    description: str


# Column numbers follow adult.names: 0 age (17..90), 4 education-num (1..16),
# 9 sex, 12 hours-per-week (1..99).
_AGE_MIN, _AGE_MAX = 17, 90
_HOURS_MIN, _HOURS_MAX = 1, 99


def adult_attributes(age_width: int = 5, hours_width: int = 10) -> tuple[Attribute, ...]:
    """The four axes; the defaults give a (15, 16, 10, 2) tensor of 4,800 cells.

    Raises:
        ValueError: a bin width is < 1.
    """
    for name, w in (("age_width", age_width), ("hours_width", hours_width)):
        if w < 1:
            raise ValueError(f"{name} must be >= 1, got {w}")
    n_age = -(-(_AGE_MAX - _AGE_MIN + 1) // age_width)
    n_hours = -(-(_HOURS_MAX - _HOURS_MIN + 1) // hours_width)
    return (
        Attribute("age", 0, n_age, f"{age_width}-year bins from {_AGE_MIN}"),
        Attribute("education_num", 4, 16, "education-num 1..16"),
        Attribute("hours_per_week", 12, n_hours, f"{hours_width}-hour bins from {_HOURS_MIN}"),
        Attribute("sex", 9, 2, "Female = 0, Male = 1"),
    )


ATTRIBUTES = adult_attributes()


def _bin(attr: Attribute, raw: str, age_width: int, hours_width: int) -> int:
    if attr.name == "age":
        return (int(raw) - _AGE_MIN) // age_width
    if attr.name == "education_num":
        return int(raw) - 1
    if attr.name == "hours_per_week":
        return (int(raw) - _HOURS_MIN) // hours_width
    if attr.name == "sex":
        return {"Female": 0, "Male": 1}[raw]
    raise KeyError(attr.name)


def load_adult_tensor(
    path: Path = ADULT_PATH, *, age_width: int = 5, hours_width: int = 10
) -> tuple[npt.NDArray[np.float64], tuple[Attribute, ...]]:
    """Return the count tensor of Adult's training file over (age, education-num, hours, sex).

    Defaults give shape (15, 16, 10, 2). One record per row of adult.data (32,561 rows);
    each adds 1 to one cell, so the neighbouring relation of every mechanism run on it is
    add/remove one row.

    Raises:
        FileNotFoundError: the file is absent (the message says where it was expected).
        ValueError: a row has a value outside the documented ranges, or a width < 1.
    """
    attrs = adult_attributes(age_width, hours_width)
    if not path.is_file():
        raise FileNotFoundError(
            f"Adult data not found at {path}; download adult.data from "
            "https://archive.ics.uci.edu/dataset/2/adult or pass --data PATH"
        )
    tensor = np.zeros(tuple(a.size for a in attrs), dtype=np.float64)
    with path.open(encoding="ascii") as fh:
        for lineno, line in enumerate(fh, start=1):
            fields = [f.strip() for f in line.split(",")]
            if len(fields) < 15:
                continue  # blank trailing line
            try:
                idx = tuple(_bin(a, fields[a.column], age_width, hours_width) for a in attrs)
            except (ValueError, KeyError) as exc:
                raise ValueError(f"{path}:{lineno}: cannot bin row: {exc}") from None
            if any(not 0 <= i < a.size for i, a in zip(idx, attrs)):
                raise ValueError(f"{path}:{lineno}: value outside the bins: {idx}")
            tensor[idx] += 1
    return tensor, attrs


def two_way_marginals(shape: tuple[int, ...]) -> Workload:
    """Every cell of every 2-way marginal (the seed's '2-way All Marginal')."""
    lows: list[list[int]] = []
    highs: list[list[int]] = []
    for i, j in itertools.combinations(range(len(shape)), 2):
        for a in range(shape[i]):
            for b in range(shape[j]):
                lo = [0] * len(shape)
                hi = list(shape)
                lo[i], hi[i], lo[j], hi[j] = a, a + 1, b, b + 1
                lows.append(lo)
                highs.append(hi)
    return np.asarray(lows, dtype=np.int64), np.asarray(highs, dtype=np.int64)


def prefix_2d(shape: tuple[int, ...]) -> Workload:
    """All prefix boxes [0, p) x [0, q) over every attribute pair (the seed's 'Prefix-2D')."""
    lows: list[list[int]] = []
    highs: list[list[int]] = []
    for i, j in itertools.combinations(range(len(shape)), 2):
        for p in range(1, shape[i] + 1):
            for q in range(1, shape[j] + 1):
                hi = list(shape)
                hi[i], hi[j] = p, q
                lows.append([0] * len(shape))
                highs.append(hi)
    return np.asarray(lows, dtype=np.int64), np.asarray(highs, dtype=np.int64)


def random_ranges(shape: tuple[int, ...], k: int, n: int, rng: np.random.Generator) -> Workload:
    """n random range queries, each constraining k random attributes (the seed's 'Random kD')."""
    d = len(shape)
    lows = np.zeros((n, d), dtype=np.int64)
    highs = np.tile(np.asarray(shape, dtype=np.int64), (n, 1))
    for q in range(n):
        for axis in rng.choice(d, size=k, replace=False):
            a, b = sorted(int(v) for v in rng.integers(0, shape[axis], size=2))
            lows[q, axis], highs[q, axis] = a, b + 1
    return lows, highs


def rmse(estimate: npt.ArrayLike, truth: npt.ArrayLike, workload: Workload) -> float:
    """RMSE of the workload's answers on `estimate` against `truth` (seed 000, Sec. 5.2)."""
    lows, highs = workload
    err = box_sums(estimate, lows, highs) - box_sums(truth, lows, highs)
    return float(math.sqrt(float(np.mean(err * err))))


def _run(
    tensor: npt.NDArray[np.float64],
    workloads: dict[str, Workload],
    epsilons: tuple[float, ...],
    trials: int,
    seed: int,
    params: PViewParams,
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for eps in epsilons:
        rng = np.random.default_rng([seed, int(round(eps * 1000))])
        per: dict[str, dict[str, list[float]]] = {w: {"identity": [], "pview": []} for w in workloads}
        blocks: list[int] = []
        seconds: list[float] = []
        for _ in range(trials):
            t0 = time.perf_counter()
            view = build_pview(tensor, eps, rng, params)
            seconds.append(time.perf_counter() - t0)
            blocks.append(view.n_blocks)
            pview_est = view.estimate()
            ident_est = identity_estimate(tensor, eps, rng)
            for name, wl in workloads.items():
                per[name]["pview"].append(rmse(pview_est, tensor, wl))
                per[name]["identity"].append(rmse(ident_est, tensor, wl))
        for name in workloads:
            rows.append(
                {
                    "epsilon": eps,
                    "workload": name,
                    "queries": int(workloads[name][0].shape[0]),
                    "identity_rmse": float(np.mean(per[name]["identity"])),
                    "pview_rmse": float(np.mean(per[name]["pview"])),
                    "identity_rmse_trials": per[name]["identity"],
                    "pview_rmse_trials": per[name]["pview"],
                    "pview_blocks_mean": float(np.mean(blocks)),
                    "pview_build_seconds_mean": float(np.mean(seconds)),
                }
            )
    return rows


def _print_table(rows: list[dict[str, object]]) -> None:
    head = (
        f"{'eps':>5}  {'workload':<18} {'queries':>7}  {'Identity':>10}  {'p-view':>10}"
        f"  {'ratio':>6}  {'blocks':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        ident = float(r["identity_rmse"])  # type: ignore[arg-type]
        pview = float(r["pview_rmse"])  # type: ignore[arg-type]
        print(
            f"{r['epsilon']:>5}  {r['workload']:<18} {r['queries']:>7}  {ident:>10.2f}  {pview:>10.2f}"
            f"  {pview / ident:>6.2f}  {r['pview_blocks_mean']:>7.1f}"
        )


CONFIGS: dict[str, tuple[int, int]] = {"coarse": (5, 10), "fine": (1, 1)}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns a process exit code."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, default=ADULT_PATH)
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    parser.add_argument("--config", choices=[*CONFIGS, "both"], default="both")
    parser.add_argument("--trials", type=int, default=10, help="trials per epsilon (seed: 10)")
    parser.add_argument("--seed", type=int, default=2022)
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error(f"--trials must be >= 1, got {args.trials}")
    names = list(CONFIGS) if args.config == "both" else [args.config]
    params = PViewParams()
    epsilons = (0.1, 1.0)
    configs: list[dict[str, object]] = []
    t_all = time.perf_counter()
    for name in names:
        age_width, hours_width = CONFIGS[name]
        try:
            tensor, attrs = load_adult_tensor(args.data, age_width=age_width, hours_width=hours_width)
        except (FileNotFoundError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        shape = tuple(int(s) for s in tensor.shape)
        qrng = np.random.default_rng(args.seed)
        workloads: dict[str, Workload] = {
            "2way_marginals": two_way_marginals(shape),
            "prefix_2d": prefix_2d(shape),
            "random_2d_range": random_ranges(shape, 2, 3000, qrng),
            "random_4d_range": random_ranges(shape, 4, 3000, qrng),
        }
        print(
            f"\n[{name}] Adult: {int(tensor.sum())} records, tensor {shape} = {tensor.size} cells "
            f"({', '.join(a.name for a in attrs)}); {args.trials} trials; mean RMSE over trials"
        )
        t0 = time.perf_counter()
        rows = _run(tensor, workloads, epsilons, args.trials, args.seed, params)
        elapsed = time.perf_counter() - t0
        _print_table(rows)
        print(f"[{name}] {elapsed:.1f} s")
        configs.append(
            {
                "config": name,
                "shape": list(shape),
                "cells": int(tensor.size),
                "attributes": [asdict(a) for a in attrs],
                "rows": rows,
                "elapsed_seconds": elapsed,
            }
        )
    result = {
        "dataset": str(args.data),
        "records": int(tensor.sum()),
        "pview_params": asdict(params),
        "epsilons": list(epsilons),
        "trials": args.trials,
        "seed": args.seed,
        "neighbouring_relation": "add/remove one record (row of adult.data)",
        "configs": configs,
        "elapsed_seconds": time.perf_counter() - t_all,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
