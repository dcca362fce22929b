#!/usr/bin/env python
"""Open-study cost of a key per study at the single decryption server (K = 1), through the real service.

    python benchmarks/study_keys.py               # 20 studies each way
    python benchmarks/study_keys.py --studies 50

A decryption server (`create_decryption_server`, plaintext on loopback, SQLite ledger in a
temporary data directory) is started once; OpenStudy is timed over gRPC for `--studies` new
studies with a fresh key each (the default), then for as many on the one server key (the
handler's key store switched off: how studies were opened before keys were per study). Also
timed: generating one key pair alone (`generate_secret_context`), GetPublicContext of a study whose key
is loaded, of a study's first use after a restart (the key is loaded from the key store), and of the
server key, the time to erase a study's key, and OpenStudy of `--join-studies` join studies (each with its
own join key, public key with rotation keys). Storage per study: the bytes of its key directory
(secret and public context; for a join study its join key pair). Writes benchmarks/results/study_keys.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from he_partition.he.bfv import generate_secret_context
from parties.common.config import DecryptionConfig
from parties.common.signing import generate_signing_key
from parties.decryption.client import DecryptionClient
from parties.decryption.keys import STUDY_KEYS_DIR
from parties.decryption.server import KEYS_DIR, create_decryption_server
from parties.decryption.study_keys import MAX_LOADED_STUDY_KEYS

from benchmarks.common import write_result


def _summary(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    return {"median_ms": round(statistics.median(ms), 2), "mean_ms": round(statistics.fmean(ms), 2),
            "min_ms": round(ms[0], 2), "max_ms": round(ms[-1], 2)}


def _open(ds: DecryptionClient, study_id: str) -> float:
    t0 = time.perf_counter()
    ds.open_study(study_id=study_id, domain_size=4096, epsilon=1.0, expected_owners=["a", "b", "c"], strategy="gap")
    return time.perf_counter() - t0


def _open_join(ds: DecryptionClient, study_id: str, owner_keys: dict[str, bytes]) -> float:
    terms = {"shape": [4, 3], "capacity": 8192, "padding_epsilon": 0.5, "padding_offset": 90, "release": "cells"}
    t0 = time.perf_counter()
    ds.open_study(study_id=study_id, domain_size=12, epsilon=3.0, expected_owners=["a", "b"], strategy="join",
                  strategy_params_json=json.dumps(terms), owner_keys=owner_keys)
    return time.perf_counter() - t0


def _fetch(ds: DecryptionClient, study_id: str) -> float:
    t0 = time.perf_counter()
    ds.public_context(study_id=study_id)
    return time.perf_counter() - t0


def run(studies: int, join_studies: int) -> dict[str, Any]:
    loaded_max = MAX_LOADED_STUDY_KEYS
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "ds"
        config = DecryptionConfig(data_dir, port=0, insecure=True, decrypt_workers=0)
        handle = create_decryption_server(config).start()
        try:
            with DecryptionClient(handle.target, insecure=True) as ds:
                ds.wait_ready()
                _open(ds, "warm-up")  # the first call pays for the channel
                own = [_open(ds, f"own-{i}") for i in range(studies)]
                recent = [f"own-{i}" for i in range(max(0, studies - loaded_max), studies)]  # still loaded
                fetch = [_fetch(ds, s) for s in recent]
                fetch_server = [_fetch(ds, "") for _ in recent]
                owner_keys = {o: generate_signing_key()[1] for o in ("a", "b")}
                joins = [_open_join(ds, f"join-{i}", owner_keys) for i in range(join_studies)]
                handler = handle.handler
                keys, handler.study_keys = handler.study_keys, None
                try:
                    shared = [_open(ds, f"shared-{i}") for i in range(studies)]
                finally:
                    handler.study_keys = keys
            handle.stop()  # a restart: the first use of each study loads its key from the key store
            handle = create_decryption_server(replace(config, port=handle.port)).start()
            with DecryptionClient(handle.target, insecure=True) as ds:
                ds.wait_ready()
                fetch_loading = [_fetch(ds, s) for s in recent]
            keys = handle.handler.study_keys
            root = data_dir / KEYS_DIR / STUDY_KEYS_DIR
            sizes = [sum(p.stat().st_size for p in (root / f"own-{i}").iterdir()) for i in range(studies)]
            join_sizes = [sum(p.stat().st_size for p in (root / f"join-{i}").iterdir()) for i in range(join_studies)]
            secret = (root / "own-0" / "secret_context.bin").stat().st_size
            public = (root / "own-0" / "public_context.bin").stat().st_size
            assert keys is not None
            erase = []
            for i in range(studies):
                t0 = time.perf_counter()
                keys.erase(f"own-{i}", "benchmark")
                erase.append(time.perf_counter() - t0)
        finally:
            handle.stop()
    generate = []
    for _ in range(studies):
        t0 = time.perf_counter()
        generate_secret_context()
        generate.append(time.perf_counter() - t0)
    return {
        "studies": studies,
        "open_study_own_key": _summary(own),
        "open_study_server_key": _summary(shared),
        "open_study_extra_ms_median": round((statistics.median(own) - statistics.median(shared)) * 1000, 2),
        "key_generation_alone": _summary(generate),
        "public_context_fetch_study_key_loaded": _summary(fetch),
        "public_context_fetch_study_key_first_after_restart": _summary(fetch_loading),
        "public_context_fetch_server_key": _summary(fetch_server),
        "erase_key": _summary(erase),
        "storage_per_study_bytes": {"total": int(statistics.median(sizes)), "secret_context": secret,
                                    "public_context": public},
        "join_studies": join_studies,
        **({"open_join_study_own_key": _summary(joins),
            "storage_per_join_study_bytes": int(statistics.median(join_sizes))} if join_studies else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=20, help="studies opened each way (default 20)")
    parser.add_argument("--join-studies", type=int, default=3, help="join studies opened (default 3)")
    args = parser.parse_args()
    result = run(args.studies, args.join_studies)
    path = write_result("study_keys", {"benchmark": "study_keys", "k": 1, **result})
    print(path.read_text())


if __name__ == "__main__":
    main()
