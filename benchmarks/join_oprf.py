"""What the join's oblivious pseudonyms add per owner: blind, the key holder's evaluation, unblind and hash.

`python -m benchmarks.join_oprf --records 50000` times one owner's batch of `records`
identifiers (phone-number-like) plus its padding: `evaluation_batch` (hash to the group and
blind), `blind_evaluate` under a study key (the key holder's part), `finalize` (unblind and
hash), with `--threads` worker threads for each batch (libsodium releases the GIL), and the
bytes that travel each way (32 per element, in pages of 32,768). Prints JSON on the last line;
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


def run(records: int, pads: int, threads: int) -> dict[str, Any]:
    inputs = [oprf_input(f"+44 7700 {i:07d}") for i in range(records)]
    key = oprf.study_key(os.urandom(32), "bench", "h")
    secret = os.urandom(32)
    t0 = time.perf_counter()
    # evaluation_batch blinds with oprf.blind's default threads; time the same with `threads`
    old = oprf._batched

    def batched(fn: Any, items: Any, _threads: int | None) -> Any:
        return old(fn, items, threads)

    oprf._batched = batched  # type: ignore[assignment]
    try:
        batch, blinds, where = evaluation_batch(secret, inputs, pads)
        t1 = time.perf_counter()
        evaluated = oprf.blind_evaluate(key, batch, threads=threads)
        t2 = time.perf_counter()
        out = oprf.finalize(inputs, blinds, [evaluated[k] for k in where], threads=threads)
        t3 = time.perf_counter()
    finally:
        oprf._batched = old  # type: ignore[assignment]
    assert out[0] == oprf.evaluate(key, inputs[0])
    return {"records": records, "padding_elements": pads, "threads": threads,
            "seconds": {"owner_blind": round(t1 - t0, 2), "key_holder_evaluate": round(t2 - t1, 2),
                        "owner_finalize": round(t3 - t2, 2), "total": round(t3 - t0, 2)},
            "us_per_element": {"owner_blind": round((t1 - t0) / len(batch) * 1e6, 1),
                               "key_holder_evaluate": round((t2 - t1) / len(batch) * 1e6, 1),
                               "owner_finalize": round((t3 - t2) / records * 1e6, 1)},
            "bytes_each_way": 32 * len(batch), "pages": -(-len(batch) // PAGE_ELEMENTS),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=50_000)
    p.add_argument("--pads", type=int, default=86, help="padding elements (the private dummies; default 86)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    results = [run(args.records, args.pads, t) for t in args.threads]
    for r in results:
        print(f"threads {r['threads']}: {r['seconds']}", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
