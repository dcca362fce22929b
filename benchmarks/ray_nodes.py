#!/usr/bin/env python
"""The services' release with the computation server's chunk actors on a 2-node local Ray, against in-process.

    python benchmarks/ray_nodes.py                    # 2^20 bins, ~55 s on 2 cores
    python benchmarks/ray_nodes.py --bins 65536       # a quick look

The deployments of tests/parties/test_ray_nodes.py at `--bins` bins: a 2-node Ray cluster on
this machine (one CPU per node), then the same study (3 owners, the gap strategy, a release of
0.5 of 1.0) on a `dpagg serve-computation` process with its chunk actors on the cluster, with
`--executor inprocess` and with `--executor processes --chunk-workers 2`, under the same seeds,
the key holder's draw keyed by the request alone (see the test's docstring). Prints one JSON
object: where the actors ran, whether the three summaries are equal, the measurements sent and
their bytes, each release's wall time (RunRelease call to summary) and the cluster's start time.
Writes nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.parties.test_ray_nodes import deploy_and_release, two_ray_nodes  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bins", type=int, default=1 << 20)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dpagg-ray-nodes-"))
    try:
        started = time.monotonic()
        with two_ray_nodes(root) as address:
            start_s = time.monotonic() - started
            runs = {
                "ray_2_nodes": deploy_and_release(root / "ray", ["--cluster", address, "--chunk-workers", "2"],
                                                  address, bins=args.bins),
                "inprocess": deploy_and_release(root / "inprocess", ["--executor", "inprocess"], bins=args.bins),
                "processes_2": deploy_and_release(root / "processes", ["--executor", "processes", "--chunk-workers",
                                                                       "2"], bins=args.bins),
            }
        summaries = [r["summary"] for r in runs.values()]
        print(json.dumps({
            "bins": args.bins,
            "cluster_start_s": round(start_s, 2),
            "actors_on": runs["ray_2_nodes"]["where"],
            "summaries_equal": all(s == summaries[0] for s in summaries),
            "measurements": [[m.kind, len(chunks)] for m, chunks in runs["ray_2_nodes"]["sent"]],
            "bytes_to_decryption": {k: r["bytes_to_decryption"] for k, r in runs.items()},
            "release_s": {k: round(r["release_s"], 2) for k, r in runs.items()},
        }, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
