#!/usr/bin/env python
"""A crowd of owners uploading at once to one computation server: how many fail, how long, how long they queue.

    python benchmarks/crowd_upload.py --owners 10            # ~15 s on 2 cores
    python benchmarks/crowd_upload.py --owners 50            # ~80 s on 2 cores, 2.4 GB of uploads on disk
    python benchmarks/crowd_upload.py --owners 4 --bins 65536 --no-write   # a quick look

A decryption and a computation server, each its own `dpagg serve-*` process with mutual TLS
and their default thread pools (the computation server: 16 threads, so 4 uploads run and 4
wait; parties.common.limits), as benchmarks/reliability.py starts them. One signed study of
`--bins` bins (default 2^20) lists every owner; each owner holds `--records` records (bins
dominate: every upload is 128 ciphertexts, ~47 MB, at 2^20 bins whatever the records). Each
owner is a thread of this process with its own certificate, signing key and channels
(`DataOwnerClient`, default retry policy and wait limit). Every owner encrypts first (timed
apart); then all start their upload at the same moment (a barrier), and the upload phase runs
until the last one ends. Reported: how many failed and why, the phase's wall time, each
owner's upload time, time waiting in the server's queue and "server busy" refusals it came
back from, and that the server lists every owner as submitted. Acceptance: none fails.

Writes (merges its run into) benchmarks/results/crowd_upload.json unless --no-write.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, write_result  # noqa: E402
from benchmarks.reliability import Deployment, quantiles, vm_hwm_mb  # noqa: E402
from parties.common.limits import CallLimits, HEAVY_METHODS  # noqa: E402
from parties.data_owner.client import EncryptedHistogram, SubmitResult  # noqa: E402

UPLOAD = "/dpagg.v1.Computation/SubmitHistogram"


def _histogram(bins: int, records: int, seed: int) -> np.ndarray:
    counts = np.zeros(bins, dtype=np.int64)
    np.add.at(counts, np.random.default_rng(seed).integers(0, bins, records), 1)
    return counts


def _du_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def crowd(workdir: Path, *, owners: int, bins: int, records: int, busy_wait: float) -> dict[str, Any]:
    dep = Deployment.start(workdir, secure=True)
    try:
        names = [f"owner-{i:03d}" for i in range(owners)]
        with dep.computation(timeout=600.0) as op:
            op.wait_ready()
            keys = {o: dep.signing_key(o)[1] for o in names}
            t0 = time.monotonic()
            op.open_study(study_id="crowd", domain_size=bins, epsilon=1.0, expected_owners=names,
                          strategy="auto", owner_keys=keys)
            open_s = time.monotonic() - t0
        clients = {o: dep.owner(o) for o in names}
        t0 = time.monotonic()
        encrypted: dict[str, EncryptedHistogram] = {}
        for i, o in enumerate(names):
            encrypted[o] = clients[o].encrypt("crowd", _histogram(bins, records, i), progress=False)
            if (i + 1) % 10 == 0 or i + 1 == owners:
                print(f"  encrypted {i + 1}/{owners} owners ({time.monotonic() - t0:.0f} s)", flush=True)
        encrypt_s = time.monotonic() - t0
        upload_mb = encrypted[names[0]].nbytes / 1e6
        print(f"[{owners} owners] study of {bins:,} bins opened in {open_s:.1f} s; {owners} encryptions in "
              f"{encrypt_s:.0f} s; {len(encrypted[names[0]].chunks)} chunks = {upload_mb:.1f} MB per upload", flush=True)

        barrier = threading.Barrier(owners + 1)
        outcomes: dict[str, SubmitResult | BaseException] = {}
        ended: dict[str, float] = {}

        def upload(o: str) -> None:
            barrier.wait()
            try:
                outcomes[o] = clients[o].upload(encrypted[o], idempotency_key=f"crowd-{o}", progress=False,
                                                busy_wait=busy_wait)
            except BaseException as exc:  # noqa: BLE001 - counted as a failure below
                outcomes[o] = exc
            ended[o] = time.monotonic()

        threads = [threading.Thread(target=upload, args=(o,), daemon=True) for o in names]
        for t in threads:
            t.start()
        barrier.wait()
        start = time.monotonic()
        last_line = start
        while any(t.is_alive() for t in threads):
            time.sleep(1.0)
            if time.monotonic() - last_line >= 30:
                last_line = time.monotonic()
                print(f"  {len(ended)}/{owners} uploads ended after {last_line - start:.0f} s", flush=True)
        phase_s = max(ended.values()) - start
        cs_peak_mb = vm_hwm_mb(dep.cs.proc.pid) if dep.cs.proc else float("nan")
        for c in clients.values():
            c.close()
        done = {o: r for o, r in outcomes.items() if isinstance(r, SubmitResult) and r.committed}
        failed = {o: f"{type(r).__name__}: {r}" for o, r in outcomes.items() if o not in done}
        with dep.computation(timeout=600.0) as op:
            submitted = len(op.study_status("crowd").submitted_owners)
        results = list(done.values())
        queued = [r.queued_seconds for r in results]
        out: dict[str, Any] = {
            "owners": owners, "bins": bins, "records_per_owner": records,
            "chunks_per_upload": len(encrypted[names[0]].chunks), "mb_per_upload": round(upload_mb, 1),
            "cs_limits": {"upload_slots": CallLimits.for_pool(16).per_method[UPLOAD],
                          "queue_places": CallLimits.for_pool(16).queue_len[UPLOAD],
                          "heavy_methods": len(HEAVY_METHODS)},
            "open_study_s": round(open_s, 2), "encrypt_all_s": round(encrypt_s, 1),
            "failed": len(failed), "failures": sorted(set(failed.values()))[:5],
            "committed": len(done), "server_lists_submitted": submitted,
            "upload_phase_s": round(phase_s, 1),
            "upload_s": quantiles([r.seconds for r in results]),
            "queued_s": {**quantiles(queued), "owners_queued": sum(q > 0 for q in queued),
                         "total": round(sum(queued), 1)},
            "busy_refusals": {"total": sum(r.busy_refusals for r in results),
                              "owners_refused": sum(r.busy_refusals > 0 for r in results),
                              "max_per_owner": max((r.busy_refusals for r in results), default=0)},
            "streams_per_owner_max": max((r.attempts for r in results), default=0),
            "cs_peak_rss_mb": round(cs_peak_mb), "cs_data_dir_mb": round(_du_mb(workdir / "cs")),
        }
        print(f"[{owners} owners] upload phase {phase_s:.1f} s: {len(done)} committed, {len(failed)} failed; "
              f"server lists {submitted} submitted; upload p50 {out['upload_s']['p50_s']} s max "
              f"{out['upload_s']['max_s']} s; queued {out['queued_s']['owners_queued']} owner(s), max "
              f"{out['queued_s']['max_s']} s; {out['busy_refusals']['total']} busy refusal(s) retried by "
              f"{out['busy_refusals']['owners_refused']} owner(s); CS peak RSS {cs_peak_mb:.0f} MB, data dir "
              f"{out['cs_data_dir_mb']} MB", flush=True)
        for o, why in list(failed.items())[:5]:
            print(f"  FAILED {o}: {why}")
        return out
    finally:
        dep.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--owners", type=int, nargs="+", default=[10], help="crowd sizes, one run each (default 10)")
    ap.add_argument("--bins", type=int, default=1 << 20, help="bins of the study (default 2^20)")
    ap.add_argument("--records", type=int, default=20, help="records per owner (default 20)")
    ap.add_argument("--busy-wait", type=float, default=900.0,
                    help="how long each owner comes back to a busy server, s (the client's default, 900)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep data and logs here (default: a temp dir)")
    ap.add_argument("--no-write", action="store_true", help="do not write benchmarks/results/crowd_upload.json")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so the servers are stopped too
    runs: list[dict[str, Any]] = []
    with ExitStack() as stack:
        if args.workdir is None:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dpagg-crowd-")))
        else:
            base = args.workdir.resolve()
        for n in args.owners:
            runs.append(crowd(base / f"crowd-{n}", owners=n, bins=args.bins, records=args.records,
                              busy_wait=args.busy_wait))
    if not args.no_write:
        path = RESULTS / "crowd_upload.json"
        earlier = json.loads(path.read_text()).get("runs", []) if path.exists() else []
        keep = [r for r in earlier if (r.get("owners"), r.get("bins")) not in {(n["owners"], n["bins"]) for n in runs}]
        merged = sorted(keep + runs, key=lambda r: (r["bins"], r["owners"]))
        print(f"wrote {write_result('crowd_upload', {'runs': merged})}")
    return 1 if any(r["failed"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
