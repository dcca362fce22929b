"""The c1 forwarding through the real services: 10 owners x 1M bins, K = 3 holders, mutual TLS.

Run: python -m benchmarks.threshold_c1_services [--bins 1000000] [--owners 10]. Starts three key-share
holders and a threshold-mode computation server on port 0 (the test fixture's PKI), submits the owners'
signed uploads, then times the CS's forwarding of every owner's c1 parts to the three holders
(extraction from the stored chunks, gRPC to the holders in parallel, each verifying and summing).
Writes benchmarks/results/threshold_c1_services.json.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import write_result
from parties.common.signing import generate_signing_key
from parties.computation.threshold.c1_forward import owner_c1_parts
from tests.parties.test_threshold_services import Threshold


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bins", type=int, default=1_000_000)
    ap.add_argument("--owners", type=int, default=10)
    args = ap.parse_args()
    owners = [f"o{i}" for i in range(args.owners)]
    with tempfile.TemporaryDirectory() as tmp:
        t = Threshold.start(Path(tmp))
        try:
            t.computation().setup_key()
            keys = {o: generate_signing_key() for o in owners}
            t.signing.update(keys)
            contract, _ = t.computation().open_study(
                study_id="bench", domain_size=args.bins, epsilon=1.0, expected_owners=owners, strategy="hier",
                owner_keys={o: keys[o][1] for o in owners})
            rng = np.random.default_rng(1)
            t0 = time.perf_counter()
            for o in owners:
                t.owner(o).submit("bench", rng.integers(0, 20, args.bins))
            submit_s = time.perf_counter() - t0
            h = t.cs.handler
            subs = h.store.submissions("bench")
            ctx = h.backend_for(contract).context
            t0 = time.perf_counter()
            parts = [owner_c1_parts(ctx, s, h.store.read_chunk, h.c1_signatures.get(
                "bench", s.meta.owner_id, s.meta.idempotency_key)) for s in subs]
            extract_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            t.combiner.forward_uploads(contract, lambda: parts, [(s.meta.owner_id, s.meta.idempotency_key)
                                                                  for s in subs])
            forward_s = time.perf_counter() - t0
            out = {"bins": args.bins, "owners": args.owners, "holders": 3,
                   "bytes_forwarded_per_holder": sum(len(p) for u in parts for p in u.parts),
                   "owners_submit_seconds_total": round(submit_s, 1), "cs_extract_seconds": round(extract_s, 1),
                   "forward_and_holders_verify_seconds": round(forward_s, 1)}
            print(out)
            write_result("threshold_c1_services", out)
        finally:
            t.stop()


if __name__ == "__main__":
    main()
