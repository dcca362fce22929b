#!/usr/bin/env python
"""One key-share holder's shares of a measurement: in its server process against its local workers.

    python benchmarks/holder_workers.py                  # 128 chunks (1,048,576 bins), 0 and 2 workers
    python benchmarks/holder_workers.py --workers 0,2,4 --chunks 528

A real holder (`ThresholdHolder` with a real key share, a real SQLite ledger and a one-owner
signed c1 book; no gRPC): `measurement_shares` of one measurement of `--chunks` chunks, first
cold (every chunk's c1 s_i computed: a study's first measurement) then warm (the fastest of three
later measurements: c1 s_i kept in the server process, or in the worker that computed it, so a
pooled run still recomputes the chunks that land on another worker), timed from the call to the
last share read. The pooled
shares are checked byte for byte against the in-process ones. Prints the figures and the load
average; writes benchmarks/results/holder_workers.json.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SLOTS = 8192
FP = hashlib.sha256(b"benchmark collective key").digest()


def _study(chunks: int) -> dict[str, Any]:
    from he_partition.he.bfv import generate_secret_context
    from he_partition.he.threshold.c1 import c1_bytes
    from he_partition.he.threshold.keys import holder_keygen
    from parties.common.contract import StudyContract
    from parties.common.signing import generate_signing_key
    from parties.decryption.keyshare.uploads import UploadC1Book, sign_c1_parts

    ctx = generate_secret_context()
    secret, _ = holder_keygen(ctx, b"holder-workers-benchmark-seed-01", 0)
    private, public = generate_signing_key()
    domain = chunks * SLOTS
    contract = StudyContract(study_id="bench", domain_size=domain, epsilon=100.0, expected_owners=("a",),
                             context_fingerprint=FP.hex(), strategy="hier", owner_keys={"a": public.hex()})
    moduli = [int(m.value()) for m in ctx.seal_context().data.first_context_data().parms().coeff_modulus()]
    rng = np.random.default_rng(1)
    parts = [c1_bytes(np.stack([rng.integers(0, q, SLOTS, dtype=np.uint64) for q in moduli])) for _ in range(chunks)]
    book = UploadC1Book(ctx)
    book.accept(contract, [sign_c1_parts(private, study_id="bench", owner_id="a", idempotency_key="up",
                                         contract_hash=contract.contract_hash, parts=parts)])
    return {"ctx": ctx, "secret": secret, "contract": contract, "book": book,
            "noise": rng.integers(-300, 300, domain).astype(np.int64), "measured": np.ones(domain, dtype=bool)}


def _run(s: dict[str, Any], workers: int, chunks: int, tmp: Path) -> tuple[dict[str, float], list[bytes]]:
    from parties.common.util import write_private_file
    from parties.decryption.keyshare.holder import ThresholdHolder, measurement_shares
    from parties.decryption.keyshare.share_workers import holder_pool

    key_file = tmp / f"secret-{workers}.bin"
    write_private_file(key_file, s["secret"].to_bytes())
    pool = holder_pool(workers) if workers > 1 else None
    holder = ThresholdHolder(s["ctx"], s["secret"], 3, FP, b"n" * 32, tmp / f"ledger-{workers}.sqlite",
                             uploads=s["book"], pool=pool, key_files=lambda _: key_file)
    holder.register_study(s["contract"])
    try:
        if pool is not None:  # as `serve-decryption` does: the workers are up before the first measurement
            pool.start()
            for _, f in [pool.submit_task(time.sleep, 0.3) for _ in range(workers)]:
                f.result()  # each worker has started (and imported its tasks' module)
        times: list[float] = []
        first: list[bytes] = []
        for run in range(4):
            t0 = time.perf_counter()
            shares = list(measurement_shares(holder, f"request-{run}".encode(), "bench", list(range(chunks)),
                                             s["noise"], s["measured"], SLOTS, lambda: None).shares)
            times.append(time.perf_counter() - t0)
            first = first or shares
        return {"cold_s": round(times[0], 3), "warm_s": round(min(times[1:]), 3)}, first
    finally:
        holder.close()
        if pool is not None:
            pool.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--chunks", type=int, default=128, help="measured chunks (default 128: 1,048,576 bins)")
    ap.add_argument("--workers", default="0,2", help="comma-separated worker counts (0: in-process; default 0,2)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    s = _study(args.chunks)
    rows, reference = [], None
    with tempfile.TemporaryDirectory(prefix="dpagg-holder-workers-") as tmp:
        for w in [int(x) for x in args.workers.split(",")]:
            load = os.getloadavg()[0]
            got, shares = _run(s, w, args.chunks, Path(tmp))
            reference = reference or shares
            rows.append({"workers": w, **got, "identical_to_first": shares == reference,
                         "load_average_1min": round(load, 2)})
            print(f"workers {w}: cold {got['cold_s']:.3f} s, warm {got['warm_s']:.3f} s for {args.chunks} chunks "
                  f"(load {load:.2f}; shares identical: {shares == reference})")
    if not args.no_write:
        from benchmarks.common import write_result

        print(f"wrote {write_result('holder_workers', {'chunks': args.chunks, 'cases': rows, 'cores': os.cpu_count(), 'note': 'one holder, no gRPC; cold = c1 s_i computed, warm = kept'})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
