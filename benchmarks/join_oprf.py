"""What the join's oblivious pseudonyms add per owner: blind, the key holder's evaluation, unblind and hash.

`python -m benchmarks.join_oprf --records 50000` times one owner's batch of `records`
identifiers (phone-number-like) plus its padding: `evaluation_batch` (hash to the group and
blind), `blind_evaluate` under a study key (the key holder's part), `finalize` (unblind and
hash), and the bytes that travel each way (32 per element, in pages of 32,768). Each run
names where the batches run: `--processes N` in N worker processes (`oprf.OprfPool`, what
the owners and the key holder use on a multi-core host; default: one per core), `--threads N`
in N threads of this process (the in-process path: small batches, one-core hosts). A
process run starts its pool cold, as an owner's process does: its first batch (blind)
includes the workers' start (`pool_start_included`); `--warm` starts and warms the pool
first, as a key holder's pool is after its first page. Prints JSON on the last line;
`--out` writes it too.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from he_partition.join import oprf
from he_partition.join.protocol import oprf_input
from parties.data_owner.join import evaluation_batch
from parties.decryption.oprf import PAGE_ELEMENTS


def run(records: int, pads: int, threads: int, processes: int, warm: bool) -> dict[str, Any]:
    """One timed batch: in `processes` worker processes, or (processes 0) in `threads` threads of this process."""
    inputs = [oprf_input(f"+44 7700 {i:07d}") for i in range(records)]
    key = oprf.study_key(os.urandom(32), "bench", "h")
    secret = os.urandom(32)
    pool = oprf.OprfPool(processes)  # 0: no processes, every batch in this process
    try:
        if warm and processes > 1:
            n = min(records, 4 * processes * 512)
            oprf.blind(inputs[:n], oprf.blind_scalars(secret, n), pool=pool)
        t0 = time.perf_counter()
        batch, blinds, where = evaluation_batch(secret, inputs, pads, pool=pool) if processes > 1 else \
            _threaded_batch(secret, inputs, pads, pool, threads)
        t1 = time.perf_counter()
        evaluated = oprf.blind_evaluate(key, batch, threads=threads, pool=pool)
        t2 = time.perf_counter()
        out = oprf.finalize(inputs, blinds, [evaluated[k] for k in where], threads=threads, pool=pool)
        t3 = time.perf_counter()
    finally:
        pool.close()
    assert out[0] == oprf.evaluate(key, inputs[0])
    return {"records": records, "padding_elements": pads, "processes": processes if processes > 1 else 0,
            "threads": threads if processes <= 1 else None,
            "pool_start_included": processes > 1 and not warm,
            "seconds": {"owner_blind": round(t1 - t0, 2), "key_holder_evaluate": round(t2 - t1, 2),
                        "owner_finalize": round(t3 - t2, 2), "total": round(t3 - t0, 2)},
            "us_per_element": {"owner_blind": round((t1 - t0) / len(batch) * 1e6, 1),
                               "key_holder_evaluate": round((t2 - t1) / len(batch) * 1e6, 1),
                               "owner_finalize": round((t3 - t2) / records * 1e6, 1)},
            "bytes_each_way": 32 * len(batch), "pages": -(-len(batch) // PAGE_ELEMENTS),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def _threaded_batch(secret: bytes, inputs: list[bytes], pads: int, pool: oprf.OprfPool,
                    threads: int) -> tuple[list[bytes], list[bytes], list[int]]:
    """evaluation_batch in `threads` threads: it blinds with oprf.blind's default threads, so the run's count is
    set for its duration."""
    old = oprf._batched

    def batched(fn: Any, items: Any, _threads: int | None) -> Any:
        return old(fn, items, threads)

    oprf._batched = batched  # type: ignore[assignment]
    try:
        return evaluation_batch(secret, inputs, pads, pool=pool)
    finally:
        oprf._batched = old  # type: ignore[assignment]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=50_000)
    p.add_argument("--pads", type=int, default=86, help="padding elements (the private dummies; default 86)")
    p.add_argument("--processes", type=int, nargs="*", default=None,
                   help="worker process counts to time (default: one per core, oprf.default_workers)")
    p.add_argument("--threads", type=int, nargs="*", default=[2],
                   help="thread counts to time in this process (default 2; none: no in-process run)")
    p.add_argument("--warm", action="store_true", help="start and warm each pool before timing")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    processes = args.processes if args.processes is not None else [oprf.default_workers()]
    runs = [(0, t) for t in args.threads] + [(n, 1) for n in processes if n > 1]
    results = [run(args.records, args.pads, t, n, args.warm) for n, t in runs]
    for r in results:
        where = f"processes {r['processes']}" if r["processes"] else f"threads {r['threads']}"
        print(f"{where}: {r['seconds']}", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
