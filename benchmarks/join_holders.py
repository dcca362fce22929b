"""A join's cells decrypted by K key-share holders that compute each value themselves, against one key holder.

Run: python -m benchmarks.join_holders [--rows 16] [--cols 16] [--groups 13] [--holders 3]. Prints and writes
benchmarks/results/join_holders.json. 13 groups of 8,192 positions is the capacity of a 50,000 x 50,000 join at
padding epsilon 0.5 (`capacity_for`).

Library level, one process, CPU seconds of each step (`time.process_time`), on random one-hot planes:
- one key holder (`JoinScheme.generate`): the CS's cell totals (`joint_totals`: products, relinearization,
  rotation-sums), its noised values (`release.noised_value`: DP draw, pads, the 2^110 flood, the switch to the
  last prime), the key holder's decryption of slot 0;
- K holders (the collective join keys of `benchmarks.threshold_relin.collective`): the CS's cell totals and its
  draw added as a plaintext (`holders.noised_for_holders`), one holder's own cell totals and its shares
  (`holders.HolderJoinValues`: every holder does the same work, on its own machine in a deployment), and the
  CS's combine. Values are checked against the plaintext join plus the noises. With --holder-workers N, holder 0
  again on N local worker processes (wall seconds; its shares must be the same bytes).
"""
from __future__ import annotations

import argparse
import os
import time
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from benchmarks.common import write_result
from benchmarks.threshold_relin import collective
from he_partition.core.noise import CipherRandom
from he_partition.execution.processes import ProcessExecutor
from he_partition.core.noise_shares import discrete_laplace_share, holder_noise_source
from he_partition.he.join_scheme import JoinParams, JoinScheme
from he_partition.he.threshold.relin import join_context
from he_partition.join.holders import (HolderJoinValues, combine_values, noised_for_holders,
                                       rotation_steps)
from he_partition.join.protocol import joint_totals
from he_partition.join.release import cells_strategy, noised_value


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def planes(scheme: JoinScheme, a_of: np.ndarray, b_of: np.ndarray, rows: int, cols: int) -> tuple[list[Any], list[Any]]:
    a = [[scheme.serialize(scheme.encrypt((g == v).astype(np.int64))) for v in range(rows)] for g in a_of]
    b = [[scheme.serialize(scheme.encrypt((g == v).astype(np.int64))) for v in range(cols)] for g in b_of]
    return a, b


def parsed(scheme: JoinScheme, upload: list[list[bytes]]) -> list[list[Any]]:
    return [[scheme.deserialize(c) for c in g] for g in upload]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--cols", type=int, default=16)
    ap.add_argument("--groups", type=int, default=13)
    ap.add_argument("--holders", type=int, default=3)
    ap.add_argument("--version", type=int, default=2)
    ap.add_argument("--holder-workers", type=int, default=0,
                    help="also time holder 0 on this many local worker processes (wall seconds, the workers started "
                         "before the clock, as a holder's pool starts with its server)")
    args = ap.parse_args()
    params = JoinParams.for_version(args.version)
    rng = np.random.default_rng(7)
    a_of = rng.integers(-1, args.rows, (args.groups, params.slots))
    b_of = rng.integers(-1, args.cols, (args.groups, params.slots))
    truth = np.array([np.sum((a_of == i) & (b_of == j)) for i in range(args.rows) for j in range(args.cols)])
    n = args.rows * args.cols
    m = next(cells_strategy(n, 1.0, noise_parties=2))
    result: dict[str, Any] = {"rows": args.rows, "cols": args.cols, "groups": args.groups, "holders": args.holders,
                              "products": args.groups * n, "load_before": os.getloadavg()[0]}

    single = JoinScheme.generate(params)
    a, b = planes(single, a_of, b_of, args.rows, args.cols)
    totals, cs_s = timed(lambda: joint_totals(single, parsed(single, a), parsed(single, b)))
    draws = rng.integers(-3, 4, n)
    pads = CipherRandom()
    sent, noise_s = timed(lambda: [single.serialize(noised_value(single, v, int(d), pads)) for v, d in zip(totals, draws)])
    got, ds_s = timed(lambda: np.array([single.decrypt(single.deserialize_released(c))[0] for c in sent]))
    assert (got == truth + draws).all()
    result["single_key_holder"] = {"cs_cell_totals_s": cs_s, "cs_noise_s": noise_s, "key_holder_decrypt_s": ds_s,
                                   "cpu_s": cs_s + noise_s + ds_s, "bytes_to_key_holder": sum(map(len, sent))}

    ctx = join_context(args.version)
    holders = list(range(args.holders))
    keys, setup_s = timed(lambda: collective(ctx, holders, rotation_steps(params.slots)))
    scheme = JoinScheme.from_keys(params, keys["pk"], keys["rk"], keys["gk"])
    public = scheme.public_bytes()
    a, b = planes(scheme, a_of, b_of, args.rows, args.cols)
    totals, cs_s = timed(lambda: joint_totals(scheme, parsed(scheme, a), parsed(scheme, b)))
    values, noise_s = timed(lambda: [noised_for_holders(scheme, v, int(d)) for v, d in zip(totals, draws)])
    bins = list(range(n))
    shares: dict[int, list[bytes]] = {}
    dp: dict[int, Any] = {}
    holder_s: dict[int, dict[str, float]] = {}
    for h in holders:  # each holder's work is the same; all run here so the combine has every share
        key = bytes([h + 1]) * 32
        dp[h] = discrete_laplace_share(Fraction(1), args.holders, n, holder_noise_source(key, h, args.holders, b"r"))
        t0 = time.process_time()
        hv = HolderJoinValues(ctx, keys["secrets"][h], keys["fp"], public, a, b, bins)
        t1 = time.process_time()
        shares[h] = hv.shares(m, dp[h], holder_noise_source(key, h, args.holders, b"s"))
        holder_s[h] = {"cell_totals_s": t1 - t0, "shares_s": time.process_time() - t1}
    got, combine_s = timed(lambda: combine_values(ctx, values, [[shares[h][v] for h in holders] for v in range(n)],
                                                  holders, keys["fp"], scheme.plain_modulus))
    assert (got == truth + draws + sum(dp.values())).all()
    if args.holder_workers:
        pool = ProcessExecutor(args.holder_workers)
        pool.start()
        key = bytes([1]) * 32
        t0 = time.perf_counter()
        with HolderJoinValues(ctx, keys["secrets"][0], keys["fp"], public, a, b, bins, executor=pool) as hv:
            t1 = time.perf_counter()
            pooled = hv.shares(m, dp[0], holder_noise_source(key, 0, args.holders, b"s"))
        t2 = time.perf_counter()
        pool.close()
        assert pooled == shares[0]  # the same bytes as in one process
        result["holder_0_on_workers"] = {"workers": args.holder_workers, "cell_totals_wall_s": t1 - t0,
                                         "shares_wall_s": t2 - t1, "wall_s": t2 - t0}
    per_holder = float(np.median([x["cell_totals_s"] + x["shares_s"] for x in holder_s.values()]))
    result["k_holders"] = {"key_setup_s_all_holders": setup_s, "cs_cell_totals_s": cs_s, "cs_noise_s": noise_s,
                           "holder_s": holder_s, "holder_cpu_s_median": per_holder, "combine_s": combine_s,
                           "share_bytes_per_holder": sum(map(len, shares[0])),
                           "bytes_from_cs_per_value": len(values[0]),
                           "cpu_s_all_parties": cs_s + noise_s + args.holders * per_holder + combine_s,
                           "upload_bytes_to_each_holder": sum(len(c) for up in (a, b) for g in up for c in g),
                           # modelled, not measured: each holder on its own machine starts with the CS (uploads closed)
                           "modelled_wall_s_each_party_on_its_own_core": cs_s + noise_s + max(0.0, per_holder - cs_s)
                           + combine_s}
    one = result["single_key_holder"]["cpu_s"]
    result["ratio_cpu_all_parties"] = result["k_holders"]["cpu_s_all_parties"] / one
    result["modelled_ratio_each_party_on_its_own_core"] = (
        result["k_holders"]["modelled_wall_s_each_party_on_its_own_core"] / one)
    result["values_exact"] = True
    result["load_after"] = os.getloadavg()[0]
    print(result)
    print(write_result("join_holders" if (args.rows, args.cols, args.groups) == (16, 16, 13)
                       else f"join_holders_{args.rows}x{args.cols}_g{args.groups}", result))


if __name__ == "__main__":
    main()
