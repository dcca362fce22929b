"""Shared helpers of the benchmark scripts: data location, range workloads, result files."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["SHARED_DATA", "RESULTS", "dpbench_1d", "random_ranges", "range_rmse", "write_result", "require_data"]

SHARED_DATA = Path(os.environ.get("DPAGG_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
RESULTS = Path(__file__).resolve().parent / "results"


def require_data(path: Path) -> Path:
    if not path.exists():
        sys.exit(f"benchmark data not found at {path}: set DPAGG_SHARED_DATA to the folder holding dpbench/")
    return path


def dpbench_1d() -> dict[str, npt.NDArray[np.int64]]:
    """The 18 DPBench 1-D histograms (4,096 bins each), by file stem."""
    folder = require_data(SHARED_DATA / "dpbench" / "1D")
    return {p.stem: np.load(p).astype(np.int64) for p in sorted(folder.glob("*.npy"))}


def random_ranges(n: int, count: int, seed: int) -> npt.NDArray[np.int64]:
    """`count` ranges [lo, hi): width uniform in [1, n], position uniform among valid ones."""
    rng = np.random.default_rng(seed)
    width = rng.integers(1, n + 1, count)
    lo = (rng.random(count) * (n - width + 1)).astype(np.int64)
    return np.stack([lo, lo + width], axis=1)


def range_rmse(estimate: npt.ArrayLike, truth: npt.ArrayLike, ranges: npt.NDArray[np.int64]) -> float:
    """RMSE of range sums of `estimate` against those of `truth`."""
    pe = np.concatenate([[0.0], np.cumsum(np.asarray(estimate, dtype=np.float64))])
    pt = np.concatenate([[0.0], np.cumsum(np.asarray(truth, dtype=np.float64))])
    err = (pe[ranges[:, 1]] - pe[ranges[:, 0]]) - (pt[ranges[:, 1]] - pt[ranges[:, 0]])
    return float(np.sqrt(np.mean(err**2)))


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
               **payload}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1, sort_keys=False) + "\n")
    return path
