"""Benchmark: p-view (DP-Mondrian, seed 000), Identity and our HE strategies on UCI Adult range counts.

Run:  python benchmarks/pviews_adult.py [--config coarse|fine|both] [--trials N] [--fine-trials N]
          [--seed S] [--owners K] [--orders row_major,morton] [--bfv-check coarse|fine|both|none]
          [--data PATH] [--out PATH]

Builds 4-D count tensors over Adult (age, education-num, hours-per-week, sex): "coarse"
uses 5-year age bins and 10-hour bins, shape (15, 16, 10, 2) = 4,800 cells (the default
of `load_adult_tensor`); "fine" keeps every age and hour, shape (74, 16, 99, 2) = 234,432
cells. For eps in {0.1, 1.0} it measures the RMSE of the seed's workloads (Sec. 5.1-5.2):
all 2-way marginals, 2-D prefix queries over every attribute pair, 3000 random range
queries over 2 random attributes, and 3000 random 4-D range queries, averaged over trials
(the seed uses 10). Methods:

* Identity: every cell + discrete Laplace(1/eps), single trusted curator.
* p-view: `build_pview` (trusted curator, exact discrete noise and permute-and-flip).
* Ours: the records are split into `--owners` data owners by row index (default 3
  contiguous thirds of adult.data); each owner's tensor is flattened to 1-D along a
  locality-preserving order (row-major, or a 4-D Z-order/Morton curve, `morton_order`),
  released with `he_partition.protocol.release(..., strategy=s, backend="plain")` for
  s in auto (the default), hier, dawa, gap with noise_parties=2 (the service default),
  plus auto with noise_parties=1 (one noise party, the fair match for the single-curator
  p-view and Identity); `Summary.estimate()` gives per-bin estimates, which are put back
  on the tensor. The plain backend releases the same Summary as backend="bfv" under
  the same seed (tests/he_partition/test_release.py); `--bfv-check` re-runs every
  strategy once (eps 1, first order) through BFV, times it and checks that equality.

All noise is seeded (SeededRandom, one independent seed per method, trial and eps) so
runs are reproducible; this is a benchmark, not a release. Prints one table per
flattening order and writes benchmarks/results/pviews_adult.json.

Results (10 trials for both configs, seed 2022; mean RMSE, +- one standard error over
trials in the JSON):

* coarse (4,800 cells, 6.8 records per cell): Identity is best or tied everywhere. The
  p-view is 2.8x to 10x Identity's RMSE; our auto (Morton order) lies between the two,
  e.g. eps 1 random 4-D ranges: Identity 22.2, auto_np1 37.1, auto 50.2, p-view 221.0;
  eps 0.1 2-D prefix: auto_np1 412 (+-23) vs Identity 436 (+-62), a tie. auto beats the
  p-view on every workload, eps and order.
* fine (234,432 cells, 0.14 records per cell), eps 0.1: with the Morton order auto_np1 is
  best on all four workloads (2-way 90.4, prefix 985, random 2-D 1698, random 4-D 853)
  and auto with two noise parties also beats the p-view on all four (107.6 / 1159 /
  1876 / 930 vs 113.3 / 1589 / 1936 / 996; only the 2-D prefix margin is clearly beyond
  the trial-to-trial noise, the others are 0.5 to 1.2 combined standard errors); with the
  row-major order the p-view beats all our strategies.
* fine, eps 1: Identity is best on 2-way marginals (15.8), random 2-D (291) and random
  4-D (130); auto_np1 (Morton) on 2-D prefixes (299 vs Identity 355 +- 70). auto
  (Morton) beats the p-view on all four workloads (35.6 / 367 / 823 / 398 vs 59.3 / 568
  / 889 / 449; random 2-D by 1.3 combined standard errors).
* The p-view beats Identity only on fine at eps 0.1 (0.5x to 0.8x its RMSE), where the
  Morton-ordered auto beats both.
* The order matters as much as the strategy: Morton beats row-major for auto_np1 by up
  to 3.3x (fine, eps 0.1, 2-D prefix: 985 vs 3230). Among our two-noise-party
  strategies, auto with Morton is the best in 15 of 16 (config, eps, workload) cells;
  the exception is fine, eps 1, random 2-D ranges, where hier row-major has 718 vs 823.
  hier is the worst of ours on fine at eps 0.1 (a tree over 234,432 bins).
* Time (2-CPU machine): p-view build 0.2 s / 0.5 s (coarse, eps 0.1 / 1) and 0.9 s /
  2.6 s (fine) with SeededRandom alone, 0.2 / 0.6 / 1.1 / 3.7 s with SecureRandom (the
  JSON's means, 0.46 / 1.11 / 1.23 / 3.02 s, were taken inside the benchmark run, its
  coarse part alongside a test run);
  plain releases 0.03-0.2 s except hier 2.4 s and dawa 8-9 s on fine. BFV check (eps 1,
  row-major, 3 owners): coarse 0.15-0.5 s per strategy, fine 1.5 s (gap) to 8.1 s
  (dawa), each releasing the same Summary as the plain backend.

Reuse: `load_adult_tensor()` returns the tensor and its attribute description, and the
workload builders return (lows, highs) integer arrays of half-open boxes, so other
strategies can be scored with `rmse(...)` on the same queries.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from he_partition.core.noise import SeededRandom  # noqa: E402
from he_partition.protocol import release  # noqa: E402
from he_partition.methods.pviews import PViewParams, box_sums, build_pview, identity_estimate  # noqa: E402

__all__ = [
    "ADULT_PATH",
    "Attribute",
    "ATTRIBUTES",
    "adult_attributes",
    "load_adult_records",
    "load_adult_tensor",
    "owner_tensors",
    "row_major_order",
    "morton_order",
    "ORDERS",
    "HE_METHODS",
    "two_way_marginals",
    "prefix_2d",
    "random_ranges",
    "rmse",
    "CONFIGS",
    "main",
]

#: ../shared/data beside the checkout, or $DPAGG_SHARED_DATA (as in benchmarks/common.py).
ADULT_PATH = Path(os.environ.get("DPAGG_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")) \
    / "adult_uci" / "adult.data"
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


def load_adult_records(
    path: Path = ADULT_PATH, *, age_width: int = 5, hours_width: int = 10
) -> tuple[IntArray, tuple[Attribute, ...]]:
    """Return each Adult training row's cell index over (age, education-num, hours, sex), in file order.

    Shape (records, 4); one row per line of adult.data (32,561 rows).

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
    cells: list[tuple[int, ...]] = []
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
            cells.append(idx)
    return np.asarray(cells, dtype=np.int64).reshape(-1, len(attrs)), attrs


def _tensor(cells: IntArray, shape: tuple[int, ...]) -> npt.NDArray[np.float64]:
    tensor = np.zeros(shape, dtype=np.float64)
    np.add.at(tensor, tuple(cells.T), 1.0)
    return tensor


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
    cells, attrs = load_adult_records(path, age_width=age_width, hours_width=hours_width)
    return _tensor(cells, tuple(a.size for a in attrs)), attrs


def owner_tensors(cells: IntArray, shape: tuple[int, ...], owners: int) -> list[npt.NDArray[np.float64]]:
    """Split the records into `owners` data owners by row index (contiguous, near-equal runs of rows).

    Raises:
        ValueError: owners < 1.
    """
    if owners < 1:
        raise ValueError(f"owners must be >= 1, got {owners}")
    return [_tensor(part, shape) for part in np.array_split(cells, owners)]


def row_major_order(shape: tuple[int, ...]) -> IntArray:
    """The C (row-major) order: position k holds flat cell k (the last axis varies fastest)."""
    return np.arange(math.prod(shape), dtype=np.int64)


def morton_order(shape: tuple[int, ...]) -> IntArray:
    """A d-dimensional Z-order (Morton) curve over a box of any extents.

    Each cell's code interleaves the bits of its coordinates from the most significant
    level down (axes with fewer bits join when their bits start; at each level axis 0 is
    the most significant); cells are listed by increasing code, so every aligned dyadic
    sub-box is one contiguous run. Returns the flat (row-major) index of the k-th cell.
    """
    bits = [max(0, (s - 1).bit_length()) for s in shape]
    coords = np.indices(shape, dtype=np.int64).reshape(len(shape), -1)
    code = np.zeros(coords.shape[1], dtype=np.int64)
    for level in range(max(bits, default=0) - 1, -1, -1):
        for axis, b in enumerate(bits):
            if level < b:
                code = (code << 1) | ((coords[axis] >> level) & 1)
    return np.asarray(np.argsort(code, kind="stable"), dtype=np.int64)


ORDERS: dict[str, Callable[[tuple[int, ...]], IntArray]] = {"row_major": row_major_order, "morton": morton_order}

#: Our strategies run through `release()`: (column name, strategy, noise_parties).
#: noise_parties=2 is the service default; auto with 1 is the fair match for the single-curator p-view.
HE_METHODS: tuple[tuple[str, str, int], ...] = (
    ("auto", "auto", 2),
    ("auto_np1", "auto", 1),
    ("hier", "hier", 2),
    ("dawa", "dawa", 2),
    ("gap", "gap", 2),
)


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


def _seed(seed: int, eps: float, trial: int, tag: str) -> int:
    """An independent 128-bit seed per (run seed, epsilon, trial, method)."""
    words = np.random.SeedSequence([seed, int(round(eps * 1000)), trial, *tag.encode()]).generate_state(4)
    return int.from_bytes(words.astype("<u4").tobytes(), "little")


def _he_estimate(
    owners: list[npt.NDArray[np.float64]], order: IntArray, eps: float, strategy: str, noise_parties: int,
    seed: int, backend: str = "plain",
) -> tuple[npt.NDArray[np.float64], object]:
    """Flatten each owner's tensor along `order`, release(), and put the per-bin estimates back on the tensor."""
    hists = [o.reshape(-1)[order].astype(np.int64) for o in owners]
    summary = release(hists, eps, strategy=strategy, backend=backend, noise_parties=noise_parties, rng=seed)
    flat = np.empty(order.size)
    flat[order] = summary.estimate()
    return flat.reshape(owners[0].shape), summary


def _run(
    tensor: npt.NDArray[np.float64],
    owners: list[npt.NDArray[np.float64]],
    workloads: dict[str, Workload],
    epsilons: tuple[float, ...],
    trials: int,
    seed: int,
    params: PViewParams,
    orders: tuple[str, ...],
) -> list[dict[str, object]]:
    shape = tuple(int(v) for v in tensor.shape)
    perms = {name: ORDERS[name](shape) for name in orders}
    rows: list[dict[str, object]] = []
    for eps in epsilons:
        per: dict[str, dict[str, list[float]]] = {w: {"identity": [], "pview": []} for w in workloads}
        he: dict[str, dict[str, list[float]]] = {w: {} for w in workloads}
        he_seconds: dict[str, list[float]] = {}
        blocks: list[int] = []
        seconds: list[float] = []
        for trial in range(trials):
            t0 = time.perf_counter()
            view = build_pview(tensor, eps, SeededRandom(_seed(seed, eps, trial, "pview")), params)
            seconds.append(time.perf_counter() - t0)
            blocks.append(view.n_blocks)
            pview_est = view.estimate()
            ident_est = identity_estimate(tensor, eps, SeededRandom(_seed(seed, eps, trial, "identity")))
            for name, wl in workloads.items():
                per[name]["pview"].append(rmse(pview_est, tensor, wl))
                per[name]["identity"].append(rmse(ident_est, tensor, wl))
            for order in orders:
                for column, strategy, parties in HE_METHODS:
                    key = f"{order}/{column}"
                    t0 = time.perf_counter()
                    est, _ = _he_estimate(owners, perms[order], eps, strategy, parties,
                                          _seed(seed, eps, trial, key))
                    he_seconds.setdefault(key, []).append(time.perf_counter() - t0)
                    for name, wl in workloads.items():
                        he[name].setdefault(key, []).append(rmse(est, tensor, wl))
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
                    "he": {
                        key: {
                            "order": key.split("/")[0],
                            "strategy": next(s for c, s, _ in HE_METHODS if c == key.split("/")[1]),
                            "noise_parties": next(n for c, _, n in HE_METHODS if c == key.split("/")[1]),
                            "rmse": float(np.mean(vals)),
                            "rmse_trials": vals,
                            "release_seconds_mean": float(np.mean(he_seconds[key])),
                        }
                        for key, vals in he[name].items()
                    },
                }
            )
    return rows


def _print_table(rows: list[dict[str, object]], orders: tuple[str, ...]) -> None:
    cols = [c for c, _, _ in HE_METHODS]
    for order in orders:
        print(f"  flattening order: {order}; HE columns are release(..., noise_parties=2) unless '_np1'")
        head = (
            f"{'eps':>5}  {'workload':<16} {'Identity':>9} {'p-view':>9}"
            + "".join(f" {c:>9}" for c in cols)
            + f"  {'best':<9}"
        )
        print(head)
        print("-" * len(head))
        for r in rows:
            he = r["he"]  # type: ignore[index]
            vals = {"Identity": float(r["identity_rmse"]), "p-view": float(r["pview_rmse"])}  # type: ignore[arg-type]
            vals.update({c: float(he[f"{order}/{c}"]["rmse"]) for c in cols})  # type: ignore[index]
            best = min(vals, key=lambda k: vals[k])
            print(
                f"{r['epsilon']:>5}  {r['workload']:<16}"
                + "".join(f" {v:>9.1f}" for v in vals.values())
                + f"  {best:<9}"
            )
        print()
    r0 = rows[0]
    print(f"  p-view: mean blocks {r0['pview_blocks_mean']:.0f} at eps {r0['epsilon']}, "
          f"build {r0['pview_build_seconds_mean']:.2f} s")
    for r in rows:
        if r["workload"] == rows[0]["workload"] and r is not r0:
            print(f"  p-view: mean blocks {r['pview_blocks_mean']:.0f} at eps {r['epsilon']}, "
                  f"build {r['pview_build_seconds_mean']:.2f} s")


def _bfv_check(
    owners: list[npt.NDArray[np.float64]], order_name: str, eps: float, seed: int, strategies: tuple[str, ...]
) -> list[dict[str, object]]:
    """Release through the BFV backend and compare with the plain backend under the same seed."""
    order = ORDERS[order_name](owners[0].shape)
    out: list[dict[str, object]] = []
    for strategy in strategies:
        s = _seed(seed, eps, 0, f"bfv/{strategy}")
        t0 = time.perf_counter()
        _, bfv = _he_estimate(owners, order, eps, strategy, 2, s, backend="bfv")
        bfv_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        _, plain = _he_estimate(owners, order, eps, strategy, 2, s, backend="plain")
        plain_seconds = time.perf_counter() - t0
        out.append({"strategy": strategy, "order": order_name, "epsilon": eps, "noise_parties": 2,
                    "owners": len(owners), "bfv_seconds": bfv_seconds, "plain_seconds": plain_seconds,
                    "same_summary_as_plain": bool(bfv == plain)})
        print(f"  BFV check: {strategy:<5} {order_name}, eps {eps}: BFV {bfv_seconds:.2f} s, plain "
              f"{plain_seconds:.2f} s, same summary as plain: {bfv == plain}")
    return out


CONFIGS: dict[str, tuple[int, int]] = {"coarse": (5, 10), "fine": (1, 1)}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns a process exit code."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, default=ADULT_PATH)
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    parser.add_argument("--config", choices=[*CONFIGS, "both"], default="both")
    parser.add_argument("--trials", type=int, default=10, help="trials per epsilon (seed: 10)")
    parser.add_argument("--fine-trials", type=int, default=None,
                        help="trials per epsilon for the fine config (default: --trials)")
    parser.add_argument("--seed", type=int, default=2022)
    parser.add_argument("--owners", type=int, default=3, help="data owners (records split by row index)")
    parser.add_argument("--orders", default="row_major,morton",
                        help=f"flattening orders for our strategies, from {', '.join(ORDERS)}")
    parser.add_argument("--bfv-check", default="coarse", choices=[*CONFIGS, "both", "none"],
                        help="config(s) whose releases also run through the BFV backend (eps 1, one trial)")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error(f"--trials must be >= 1, got {args.trials}")
    if args.fine_trials is not None and args.fine_trials < 1:
        parser.error(f"--fine-trials must be >= 1, got {args.fine_trials}")
    if args.owners < 1:
        parser.error(f"--owners must be >= 1, got {args.owners}")
    orders = tuple(o for o in args.orders.split(",") if o)
    if not orders or any(o not in ORDERS for o in orders):
        parser.error(f"--orders must be a comma-separated subset of {', '.join(ORDERS)}, got {args.orders!r}")
    names = list(CONFIGS) if args.config == "both" else [args.config]
    params = PViewParams()
    epsilons = (0.1, 1.0)
    configs: list[dict[str, object]] = []
    t_all = time.perf_counter()
    for name in names:
        age_width, hours_width = CONFIGS[name]
        try:
            cells, attrs = load_adult_records(args.data, age_width=age_width, hours_width=hours_width)
        except (FileNotFoundError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        shape = tuple(a.size for a in attrs)
        tensor = _tensor(cells, shape)
        owners = owner_tensors(cells, shape, args.owners)
        trials = args.fine_trials if name == "fine" and args.fine_trials is not None else args.trials
        qrng = np.random.default_rng(args.seed)
        workloads: dict[str, Workload] = {
            "2way_marginals": two_way_marginals(shape),
            "prefix_2d": prefix_2d(shape),
            "random_2d_range": random_ranges(shape, 2, 3000, qrng),
            "random_4d_range": random_ranges(shape, 4, 3000, qrng),
        }
        print(
            f"\n[{name}] Adult: {int(tensor.sum())} records, tensor {shape} = {tensor.size} cells "
            f"({', '.join(a.name for a in attrs)}); {trials} trials; mean RMSE over trials; "
            f"our strategies: {args.owners} data owners, plain backend (same summary as BFV under the "
            f"same seed, tests/he_partition/test_release.py)"
        )
        t0 = time.perf_counter()
        rows = _run(tensor, owners, workloads, epsilons, trials, args.seed, params, orders)
        elapsed = time.perf_counter() - t0
        _print_table(rows, orders)
        bfv = (_bfv_check(owners, orders[0], 1.0, args.seed, tuple(dict.fromkeys(s for _, s, _ in HE_METHODS)))
                if args.bfv_check in (name, "both") else [])
        print(f"[{name}] {elapsed:.1f} s")
        configs.append(
            {
                "config": name,
                "shape": list(shape),
                "cells": int(tensor.size),
                "attributes": [asdict(a) for a in attrs],
                "trials": trials,
                "rows": rows,
                "bfv_check": bfv,
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
        "noise": "exact discrete Laplace / permute-and-flip from SeededRandom (benchmark seeds)",
        "owners": args.owners,
        "orders": list(orders),
        "he_methods": [{"column": c, "strategy": s, "noise_parties": n} for c, s, n in HE_METHODS],
        "he_backend": "plain (release() gives the same Summary as backend='bfv' under the same seed)",
        "configs": configs,
        "elapsed_seconds": time.perf_counter() - t_all,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
