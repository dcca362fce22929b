#!/usr/bin/env python
"""The summary step of a release at 1M partitions: stored as JSON in SQLite (before) or as Arrow files (now).

    python benchmarks/summary_store.py                  # 1,048,576 partitions
    python benchmarks/summary_store.py --partitions 4096

A bin-by-bin summary (every bin its own partition: the largest summary a domain gives) is built
once per step in a fresh child process, then the step is timed and its peak memory measured as
the growth of the process's peak RSS (VmHWM, reset after the summary is built), which counts
pyarrow's and SQLite's allocations as well as Python's. Steps, each as the computation server
or the SDK runs it:

- store: the computation server's main process stores the finished release (before: the JSON
  text, `Summary.to_json`, in the SQLite row; now: `SqliteComputationStore.summary_fields`, the
  Arrow files under the data directory, and the row);
- serve: the analyst service reads a stored release (after a restart) and sends all its pages
  (before: parse the JSON and send GetReleasePages' numbers; now: GetReleaseArrow's file pages,
  read from disk a page at a time), every page serialized as gRPC would;
- read: the SDK turns the pages into a Summary (before: `summary_from_pages`; now:
  `summary_from_arrow_pages`), and its DataFrame (`to_pandas`).

Both formats are produced by this tree's code (the JSON path is still what the in-memory store
and older rows use), so "before" is today's step, not a reconstruction. Writes
benchmarks/results/summary_store.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _summary(n: int) -> Any:
    from he_partition.core.summary import Summary

    rng = np.random.default_rng(1)
    sums = (rng.poisson(3, n) + rng.integers(-4, 5, n)).tolist()  # counts plus noise: small integers
    return Summary(domain_size=n, epsilon=1.0, strategy="identity", noise_parties=2, starts=tuple(range(n)),
                   sums=tuple(sums), sum_variance=(8.0,) * n, epsilon_spent=(("partition_sums", 1.0),),
                   params={"bins": n})


def _step(name: str, fmt: str, n: int, out: Any) -> None:
    from he_partition.core.summary_arrow import SUMMARY_FILES
    from parties.common import paging
    from parties.computation.store import ReleaseRecord
    from parties.computation.store_sqlite import SqliteComputationStore
    from parties.wire.v1 import common_pb2

    import pandas  # noqa: F401  (imported before the clock: a one-time cost per process, reported apart)
    import pyarrow.ipc  # noqa: F401

    data = Path(tempfile.mkdtemp(prefix="summary-store-"))
    s = _summary(n)
    store = SqliteComputationStore(data, durable=True)
    result: dict[str, Any] = {"step": name, "format": fmt, "partitions": n}
    if name != "store":  # the release stored beforehand, then a fresh store as after a restart
        fields = ({"summary_json": s.to_json()} if fmt == "json" else store.summary_fields("rel-1", s))
        store.save_release(ReleaseRecord("rel-1", "s1", "DONE", 1.0, ("a",), "h", "t0", finished_at="t1",
                                         **{k: v for k, v in fields.items() if k != "summary_cache"}))
        store.close()
        store = SqliteComputationStore(data, durable=True)
        if name == "read":
            rec = store.get_release("rel-1")
            assert rec is not None
            head = common_pb2.ReleaseSummary(release_id="rel-1", study_id="s1")
            if fmt == "json":
                summary = rec.summary
                assert summary is not None
                pages = list(paging.summary_pages(summary, release_id="rel-1", study_id="s1"))
            else:
                pages = list(paging.arrow_pages(head, [(f, Path(rec.summary_file) / f) for f in SUMMARY_FILES]))
            wire = [p.SerializeToString() for p in pages]
            del pages, rec
        del s
    base = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS from here
    t0 = time.perf_counter()
    if name == "store":
        # as the computation server does: the record keeps the Summary it was made from (`summary_cache`), so
        # the listing columns are filled without reading the stored form back
        if fmt == "json":
            text = s.to_json()
            fields = {"summary_json": text, "summary_cache": (text, s)}
        else:
            fields = store.summary_fields("rel-1", s)
        store.save_release(ReleaseRecord("rel-1", "s1", "DONE", 1.0, ("a",), "h", "t0", finished_at="t1", **fields))
        result["stored_bytes"] = len(fields["summary_json"]) if fmt == "json" else fields["summary_size"]
    elif name == "serve":
        rec = store.get_release("rel-1")
        assert rec is not None
        if fmt == "json":
            pages = paging.summary_pages(rec.summary, release_id="rel-1", study_id="s1")  # type: ignore[arg-type]
        else:
            head = common_pb2.ReleaseSummary(release_id="rel-1", study_id="s1")
            pages = paging.arrow_pages(head, [(f, Path(rec.summary_file) / f) for f in SUMMARY_FILES])
        result["wire_bytes"] = sum(len(p.SerializeToString()) for p in pages)
    else:
        from parties.wire.v1 import analyst_pb2

        if fmt == "json":
            msgs = (analyst_pb2.ReleaseSummaryPage.FromString(b) for b in wire)
            got = paging.summary_from_pages(msgs, "m")[1]
        else:
            got = paging.summary_from_arrow_pages((analyst_pb2.ReleaseArrowPage.FromString(b) for b in wire), "m")[1]
        frame = got.to_pandas()
        result["frame_rows"] = len(frame)
        result["equal_to_built"] = got == _summary(n) if n <= 1 << 16 else None
    result["seconds"] = round(time.perf_counter() - t0, 3)
    result["peak_growth_mb"] = round((_status("VmHWM") - base) / 1e6, 1)
    store.close()
    out.put(result)


def run(n: int) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    results = []
    for name in ("store", "serve", "read"):
        for fmt in ("json", "arrow"):
            q = ctx.Queue()
            p = ctx.Process(target=_step, args=(name, fmt, n, q))
            p.start()
            r = q.get(timeout=1800)
            p.join()
            print(json.dumps(r), flush=True)
            results.append(r)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=1 << 20)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "summary_store.json"),
                    help="where to write the results (default benchmarks/results/summary_store.json)")
    args = ap.parse_args()
    results = run(args.partitions)
    if not args.no_write:
        out = Path(args.out)
        out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                               "load_avg_at_start": os.getloadavg()[0]},
                                   "note": "each step in a fresh process; peak_growth_mb = VmHWM growth from the "
                                           "step's start (reset via clear_refs); shared 2-core machine",
                                   "results": results}, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
