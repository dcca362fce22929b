"""Cross-organization join benchmark: the join protocol's library path end to end (no gRPC yet).

`python -m benchmarks.join` runs two owners with 50,000 records each, 30,000 shared, joint
domain 16 x 16, and prints its figures on the last line; `--bins 64` runs 64 x 64 (about
16x the ciphertext products); `--records`, `--shared`, `--padding-offset` change the data.
Every step runs as a party would run it, in one process: key generation (decryption server),
X25519 key agreement and HMAC pseudonyms (owners), placement (computation server), indicator
encoding, encryption and serialization (owners: the bytes they would upload), deserialization,
products, rotations, noise, pads and flooding (computation server), decryption and its own
noise (decryption server). Reported: wall time per step and total, bytes uploaded per owner,
bytes sent to the key holder, peak RSS, and the error against the plaintext join.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from typing import Any

import numpy as np

from he_partition.join import (JoinKeyPair, check_placement, decrypt_cells, dummy_count, encode_indicators,
                               groups_for, joint_totals, noised_cells, place, pseudonyms, shared_dummies)
from he_partition.join_he import JoinScheme
from he_partition.noise import SecureRandom

from .common import write_result


def _data(records: int, shared: int, bins: int, seed: int) -> tuple[dict[str, int], dict[str, int]]:
    rng = np.random.default_rng(seed)
    ids = [f"customer-{i:07d}@example.org" for i in range(2 * records - shared)]
    a = dict(zip(ids[:records], rng.integers(0, bins, records).tolist()))
    b = dict(zip(ids[records - shared:], rng.integers(0, bins, records).tolist()))
    return a, b


def run(records: int, shared: int, bins: int, epsilon: float, pad_epsilon: float, pad_offset: int,
        seed: int) -> dict[str, Any]:
    a, b = _data(records, shared, bins, seed)
    times: dict[str, float] = {}

    def step(name: str, t0: float) -> float:
        now = time.perf_counter()
        times[name] = round(now - t0, 3)
        return now

    start = t = time.perf_counter()
    ds = JoinScheme.generate()
    public_bytes = ds.public_bytes()
    t = step("keygen", t)
    owner_scheme = JoinScheme.from_public(public_bytes)
    ka, kb = JoinKeyPair(), JoinKeyPair()
    key_a = ka.join_key(kb.public_bytes, study_id="bench", contract_hash="h")
    key_b = kb.join_key(ka.public_bytes, study_id="bench", contract_hash="h")
    dummies = dummy_count(key_a, pad_epsilon, pad_offset)
    ids_a, ids_b = list(a), list(b)
    ps_a = pseudonyms(key_a, ids_a) + shared_dummies(key_a, dummies)
    ps_b = pseudonyms(key_b, ids_b) + shared_dummies(key_b, dummies)
    t = step("pseudonyms", t)
    slots = owner_scheme.slots
    union_max = 2 * records - shared + dummies
    capacity = groups_for(union_max, slots) * slots  # public in a real study (the contract's join capacity)
    place_a, place_b = place(ps_a, ps_b, capacity, SecureRandom())
    t = step("placement", t)
    check_placement(ps_a, place_a, capacity)
    check_placement(ps_b, place_b, capacity)
    uploads = []
    for ps, ids, values, placement in ((ps_a, ids_a, a, place_a), (ps_b, ids_b, b, place_b)):
        value_of = {p: values[i] for p, i in zip(ps, ids)}
        planes = encode_indicators(placement, value_of, bins, capacity, slots)
        uploads.append([[owner_scheme.serialize(owner_scheme.encrypt(p)) for p in g] for g in planes])
    t = step("owners_encrypt", t)
    cs = JoinScheme.from_public(public_bytes)
    cts_a = [[cs.deserialize(x) for x in g] for g in uploads[0]]
    cts_b = [[cs.deserialize(x) for x in g] for g in uploads[1]]
    t = step("cs_deserialize", t)
    totals = joint_totals(cs, cts_a, cts_b)
    t = step("cs_products_and_sums", t)
    sent = [cs.serialize(c) for c in noised_cells(cs, totals, epsilon, SecureRandom())]
    t = step("cs_noise_pads_flood", t)
    cells = decrypt_cells(ds, [ds.deserialize(x) for x in sent], (bins, bins), epsilon, SecureRandom())
    t = step("ds_decrypt", t)
    total = time.perf_counter() - start

    truth = np.zeros((bins, bins), dtype=np.int64)
    for ident in set(a) & set(b):
        truth[a[ident], b[ident]] += 1
    err = cells.counts - truth
    return {
        "records_per_owner": records, "shared": shared, "bins": f"{bins}x{bins}", "epsilon": epsilon,
        "padding": {"epsilon": pad_epsilon, "offset": pad_offset, "dummies": dummies},
        "capacity": capacity, "groups": capacity // slots,
        "ciphertext_products": capacity // slots * bins * bins,
        "seconds": times, "total_seconds": round(total, 2),
        "bytes_uploaded_per_owner": [sum(len(x) for g in up for x in g) for up in uploads],
        "bytes_to_key_holder": sum(len(x) for x in sent), "public_key_bytes": len(public_bytes),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "cell_noise_sd": round(float(np.sqrt(cells.variance)), 3),
        "max_abs_error": int(np.abs(err).max()), "rmse": round(float(np.sqrt(np.mean(err ** 2))), 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=50_000, help="records per owner (default 50000)")
    p.add_argument("--shared", type=int, default=30_000, help="customers both owners hold (default 30000)")
    p.add_argument("--bins", type=int, default=16, help="bins per attribute: the table is BINS x BINS (default 16)")
    p.add_argument("--epsilon", type=float, default=1.0, help="release epsilon (default 1)")
    p.add_argument("--padding-epsilon", type=float, default=0.5,
                   help="epsilon of the dummy padding that hides the intersection size (default 0.5)")
    p.add_argument("--padding-offset", type=int, default=100, help="mean number of shared dummies (default 100)")
    p.add_argument("--seed", type=int, default=7, help="data seed (default 7)")
    args = p.parse_args(argv)
    result = run(args.records, args.shared, args.bins, args.epsilon, args.padding_epsilon, args.padding_offset,
                 args.seed)
    write_result(f"join_{args.bins}x{args.bins}", result)
    s = result["seconds"]
    print(f"join {result['bins']}, {args.records} records per owner, {args.shared} shared: "
          f"{result['ciphertext_products']} ciphertext products; " + ", ".join(f"{k} {v} s" for k, v in s.items()))
    print(f"uploaded {result['bytes_uploaded_per_owner'][0] / 1e6:.1f} MB per owner, "
          f"{result['bytes_to_key_holder'] / 1e6:.1f} MB to the key holder, peak RSS {result['peak_rss_mb']} MB, "
          f"max |error| {result['max_abs_error']} (noise sd {result['cell_noise_sd']})")
    print(json.dumps({"total_seconds": result["total_seconds"], "bins": result["bins"],
                      "bytes_uploaded_per_owner": result["bytes_uploaded_per_owner"][0],
                      "peak_rss_mb": result["peak_rss_mb"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
