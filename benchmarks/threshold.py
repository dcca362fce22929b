"""Micro-benchmark of n-of-n threshold BFV: key generation, per-ciphertext share and combine times.

Run: python benchmarks/threshold.py [--holders 3] [--repeats 5]. Prints and writes
benchmarks/results/threshold.json. Ciphertexts: sums of 10 owners' encryptions under the collective key.
"""
from __future__ import annotations

import argparse
import statistics
import time

from fractions import Fraction

import numpy as np

from benchmarks.common import write_result
from he_partition.core.noise_shares import discrete_laplace_share, holder_noise_source
from he_partition.he.bfv import generate_secret_context
from he_partition.he.threshold.decrypt import combine, decryption_share
from he_partition.he.threshold.galois import collective_galois_keys, galois_elements, holder_galois_share
from he_partition.he.threshold.keys import collective_public_key, encrypt_sum, holder_keygen, key_fingerprint
from he_partition.he.threshold.wire import key_share_commitment


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--holders", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    ctx = generate_secret_context()
    holders = list(range(args.holders))
    seed = b"benchmark-common-seed-0123456789"
    t0 = time.perf_counter()
    keys = {h: holder_keygen(ctx, seed, h) for h in holders}
    commits = {h: key_share_commitment(h, seed, keys[h][1]) for h in holders}
    pk = collective_public_key(ctx, seed, commits, {h: keys[h][1] for h in holders})
    keygen_s = time.perf_counter() - t0
    fp = key_fingerprint(pk)
    rng = np.random.default_rng(0)
    share_s, combine_s, noised_s = [], [], []
    for _ in range(args.repeats):
        rows = [[int(v) for v in rng.integers(0, 1 << 20, 8192)] for _ in range(10)]
        ct = encrypt_sum(ctx, pk, rows)
        t0 = time.perf_counter()
        shares = [decryption_share(ctx, keys[h][0], fp, ct) for h in holders]
        share_s.append((time.perf_counter() - t0) / len(holders))
        t0 = time.perf_counter()
        got = combine(ctx, ct, shares, holders, fp)
        combine_s.append(time.perf_counter() - t0)
        assert got.tolist() == np.sum(np.array(rows, dtype=np.int64), axis=0).tolist()
        # with the holder's DP share (scale 20, all 8192 slots) drawn from its keyed source, as a holder issues it
        t0 = time.perf_counter()
        src = holder_noise_source(b"benchmark-noise-key-0123456789ab", 0, len(holders), b"request")
        decryption_share(ctx, keys[0][0], fp, ct, dp_noise=discrete_laplace_share(Fraction(20), len(holders), 8192, src),
                         rng=holder_noise_source(b"benchmark-noise-key-0123456789ab", 0, len(holders), b"smudge"))
        noised_s.append(time.perf_counter() - t0)
    # collective Galois keys: one share per holder for a set of elements, then the sum
    elements = galois_elements(ctx, [1, 2, 4, 0])
    galois_s = []
    for _ in range(max(1, args.repeats // 2)):
        t0 = time.perf_counter()
        gshare = holder_galois_share(ctx, keys[0][0], seed, elements)
        galois_s.append((time.perf_counter() - t0) / len(elements))
    gshares = {h: holder_galois_share(ctx, keys[h][0], seed, elements) for h in holders}
    t0 = time.perf_counter()
    gk = collective_galois_keys(ctx, seed, elements, {h: key_share_commitment(h, seed, gshares[h]) for h in holders},
                                gshares)
    galois_combine_s = time.perf_counter() - t0
    result = {"holders": args.holders, "repeats": args.repeats, "slots": 8192,
              "keygen_seconds_all_holders": round(keygen_s, 4),
              "share_seconds_per_ciphertext_median": round(statistics.median(share_s), 4),
              "combine_seconds_per_ciphertext_median": round(statistics.median(combine_s), 4),
              "share_with_dp_noise_seconds_per_ciphertext_median": round(statistics.median(noised_s), 4),
              "galois_elements": len(elements),
              "galois_share_seconds_per_holder_per_element_median": round(statistics.median(galois_s), 4),
              "galois_share_bytes_per_holder_per_element": (len(gshare) - 4 * len(elements)) // len(elements),
              "galois_collective_seconds_all_elements": round(galois_combine_s, 4),
              "galois_keys_bytes_all_elements": len(gk)}
    print(result)
    print(write_result("threshold", result))


if __name__ == "__main__":
    main()
