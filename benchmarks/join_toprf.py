"""What sharing the join's OPRF key among K key holders costs per element, against the single key holder.

`python -m benchmarks.join_toprf --records 5000` times, in this process's CPU time (one thread,
no worker pools: CPU per element, less at the mercy of a busy host than wall time), one owner's batch of `records` identifiers:
- single: the single key holder's path (he_partition.join.oprf: X25519 on the x-line): owner
  blind, key holder evaluate, owner finalize;
- 3-of-3 and 2-of-3 (he_partition.join.toprf: ristretto255): owner blind, each holder of the
  route's answer (they answer in parallel, each on its own machine: the page's latency is one
  holder's, the holders' CPU is t times it), the owner's sum of the t answers, finalize;
- in-turn 3-of-3 (not built; the alternative docs/join.md weighed): three X25519 evaluations one
  after the other, what multiplicative shares on the x-line would cost (latency K holders).
Every shared run checks its outputs against the single key's under the combined key. Prints
JSON on the last line (with the load average); `--out` writes it too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from typing import Any

from he_partition.join import oprf, toprf
from he_partition.join.protocol import oprf_input


def _keys(holders: int, threshold: int) -> list[toprf.HolderKey]:
    def seed(*names: int) -> bytes:
        return hashlib.sha256(b"bench|" + bytes(sorted(names))).digest()

    if threshold == holders:
        return [toprf.holder_key(i, holders, threshold, "bench", "h", own_seed=seed(i)) for i in range(holders)]
    return [toprf.holder_key(i, holders, threshold, "bench", "h",
                             pair_seeds={j: seed(i, j) for j in range(holders) if j != i}) for i in range(holders)]


def _us(seconds: float, n: int) -> float:
    return round(seconds / n * 1e6, 1)


def run(records: int) -> dict[str, Any]:
    inputs = [oprf_input(f"+44 7700 {i:07d}") for i in range(records)]
    blinds = oprf.blind_scalars(os.urandom(32), records, pool=oprf.OprfPool(0))
    none = oprf.OprfPool(0)  # every batch in this process, one thread: CPU per element
    out: dict[str, Any] = {"records": records}
    key = oprf.study_key(os.urandom(32), "bench", "h")
    t0 = time.process_time()
    b = oprf.blind(inputs, blinds, threads=1, pool=none)
    t1 = time.process_time()
    z = oprf.blind_evaluate(key, b, threads=1, pool=none)
    t2 = time.process_time()
    oprf.finalize(inputs, blinds, z, threads=1, pool=none)
    t3 = time.process_time()
    for _ in range(2):
        z = oprf.blind_evaluate(key, z, threads=1, pool=none)
    t4 = time.process_time()
    out["single"] = {"owner_blind": _us(t1 - t0, records), "holder_evaluate": _us(t2 - t1, records),
                     "owner_finalize": _us(t3 - t2, records)}
    out["in_turn_3_of_3_x_line"] = {"holder_evaluate_each": _us((t2 - t1 + t4 - t3) / 3, records),
                                    "latency_holders": 3, "holders_cpu": _us(t2 - t1 + t4 - t3, records)}
    for holders, threshold in ((3, 3), (3, 2)):
        keys = _keys(holders, threshold)
        route = tuple(range(threshold))
        t0 = time.process_time()
        b = toprf.blind(inputs, blinds, pool=none)
        t1 = time.process_time()
        answers, each = [], []
        for j in route:
            s = time.process_time()
            answers.append(toprf.evaluate_share(keys[j], route, "a", 0, b, pool=none))
            each.append(time.process_time() - s)
        t2 = time.process_time()
        combined = toprf.combine(answers)
        t3 = time.process_time()
        got = toprf.finalize(inputs, blinds, combined, pool=none)
        t4 = time.process_time()
        k = toprf.combined_key(keys)
        if got[:50] != [oprf.evaluate(k, x) for x in inputs[:50]]:  # a sample: the check costs the key holder's path
            raise AssertionError("shared outputs differ from the single key's under the combined key")
        out[f"{threshold}_of_{holders}"] = {
            "owner_blind": _us(t1 - t0, records), "holder_evaluate_each": _us(max(each), records),
            "holders_cpu": _us(t2 - t1, records), "owner_combine": _us(t3 - t2, records),
            "owner_finalize": _us(t4 - t3, records),
            "owner_total": _us(t1 - t0 + t4 - t2, records)}
    s = out["single"]
    out["single"]["owner_total"] = round(s["owner_blind"] + s["owner_finalize"], 1)
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    out["cores"] = os.cpu_count()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=5_000)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    result = run(args.records)
    for name in ("single", "in_turn_3_of_3_x_line", "3_of_3", "2_of_3"):
        print(f"{name}: {result[name]} us/element", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
