"""UCI Adult split vertically between two organizations, joined under encryption (library path).

`python -m benchmarks.join_adult` reads ../shared/data/adult_uci/adult.data (or
$DPAGG_SHARED_DATA/adult_uci): organization A (say, a bank) knows the age of a random 70%
of the people, organization B (an employer survey) the years of education of another
random 70%; about half the people are in both. The row number stands in for a shared
identifier (Adult has none). The DP cross-tabulation (age in 16 bins of 5 years from 17,
education-num 1..16) of the people in both is computed with he_partition.join.protocol and released
with every join release ("cells" and the strategies over the Hilbert-ordered table), each
`--repeats` times from one set of encrypted cell totals, and compared with the plaintext
join: cell RMSE and the error of the education marginal. Prints the figures; writes
benchmarks/results/join_adult.json.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from he_partition.join.protocol import (JOIN_RELEASES, JoinKeyPair, JoinTerms, check_placement, encode_indicators, groups_for,
                               place, pseudonyms)
from he_partition.he.join_scheme import JoinScheme
from he_partition.execution import make_executor
from he_partition.join.parallel import JoinEvaluator
from he_partition.join.release import bin_cells, cell_table, release_table
from he_partition.core.noise import SecureRandom

from .common import SHARED_DATA, require_data, write_result

AGE_BINS, EDU_BINS = 16, 16


def load(share: float, seed: int) -> tuple[dict[str, int], dict[str, int]]:
    path = require_data(SHARED_DATA / "adult_uci" / "adult.data")
    rows = [line.split(",") for line in path.read_text().splitlines() if line.count(",") == 14]
    age = np.array([int(r[0]) for r in rows])
    edu = np.array([int(r[4]) for r in rows])
    rng = np.random.default_rng(seed)
    in_a = rng.random(len(rows)) < share
    in_b = rng.random(len(rows)) < share
    age_bin = np.clip((age - 17) // 5, 0, AGE_BINS - 1)
    a = {f"person-{i}": int(age_bin[i]) for i in np.flatnonzero(in_a)}
    b = {f"person-{i}": int(edu[i]) - 1 for i in np.flatnonzero(in_b)}
    return a, b


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--share", type=float, default=0.7, help="share of the people each organization holds (0.7)")
    p.add_argument("--epsilon", type=float, default=1.0, help="release epsilon (default 1)")
    p.add_argument("--seed", type=int, default=3, help="split seed (default 3)")
    p.add_argument("--repeats", type=int, default=5, help="releases per strategy (default 5)")
    p.add_argument("--workers", type=int, default=1, help="worker processes for the cell totals (default 1)")
    p.add_argument("--release", action="append", choices=JOIN_RELEASES,
                   help="release to compare; repeatable (default: all)")
    args = p.parse_args(argv)
    a, b = load(args.share, args.seed)
    t0 = time.perf_counter()
    ds = JoinScheme.generate()
    scheme = JoinScheme.from_public(ds.public_bytes())
    ka, kb = JoinKeyPair(), JoinKeyPair()
    key_a = ka.join_key(kb.public_bytes, study_id="adult", contract_hash="h")
    key_b = kb.join_key(ka.public_bytes, study_id="adult", contract_hash="h")
    ps_a, ps_b = pseudonyms(key_a, list(a)), pseudonyms(key_b, list(b))
    capacity = groups_for(len(a) + len(b), scheme.slots) * scheme.slots  # public bound: both sets disjoint
    place_a, place_b = place(ps_a, ps_b, capacity, SecureRandom())
    check_placement(ps_a, place_a, capacity)
    check_placement(ps_b, place_b, capacity)
    planes_a = encode_indicators(place_a, dict(zip(ps_a, a.values())), AGE_BINS, capacity, scheme.slots)
    planes_b = encode_indicators(place_b, dict(zip(ps_b, b.values())), EDU_BINS, capacity, scheme.slots)
    up_a = [[scheme.serialize(scheme.encrypt(x)) for x in g] for g in planes_a]
    up_b = [[scheme.serialize(scheme.encrypt(x)) for x in g] for g in planes_b]
    truth = np.zeros((AGE_BINS, EDU_BINS), dtype=np.int64)
    for ident in set(a) & set(b):
        truth[a[ident], b[ident]] += 1
    releases: dict[str, dict[str, float]] = {}
    order = JoinTerms(AGE_BINS, EDU_BINS, capacity, 1.0, 0, order="hilbert")
    with JoinEvaluator(scheme.public_bytes(), up_a, up_b, bin_cells(order), SecureRandom(),
                       executor=make_executor("processes", workers=args.workers) if args.workers > 1 else None) as ev:
        setup = time.perf_counter() - t0
        for name in args.release or JOIN_RELEASES:
            terms = JoinTerms(AGE_BINS, EDU_BINS, capacity, 1.0, 0, release=name, order="hilbert")
            rmse, marginal, seconds, partitions = [], [], [], []
            for _ in range(args.repeats):
                t1 = time.perf_counter()
                summary, _ = release_table(ev.measure, ds, terms, args.epsilon, SecureRandom())
                seconds.append(time.perf_counter() - t1)
                est, _ = cell_table(summary)
                rmse.append(float(np.sqrt(np.mean((est - truth) ** 2))))
                marginal.append(float(np.sqrt(np.mean((est.sum(axis=0) - truth.sum(axis=0)) ** 2))))
                partitions.append(summary.n_partitions)
            releases[name] = {"cell_rmse": round(float(np.mean(rmse)), 3),
                              "education_marginal_rmse": round(float(np.mean(marginal)), 3),
                              "partitions": round(float(np.mean(partitions)), 1),
                              "seconds_per_release": round(float(np.mean(seconds)), 2)}
            print(f"  {name:8s} cell RMSE {releases[name]['cell_rmse']:6.2f}, education marginal RMSE "
                  f"{releases[name]['education_marginal_rmse']:6.2f}, {releases[name]['partitions']:.0f} partitions, "
                  f"{releases[name]['seconds_per_release']:.1f} s per release", flush=True)
    best = min(releases, key=lambda r: releases[r]["cell_rmse"])
    result = {"people_a": len(a), "people_b": len(b), "shared": int(truth.sum()), "table": "16 age bins x 16 education",
              "nonzero_cells": int(np.count_nonzero(truth)), "epsilon": args.epsilon, "capacity": capacity,
              "repeats": args.repeats, "setup_seconds": round(setup, 2), "releases": releases, "best": best}
    write_result("join_adult", result)
    print(f"Adult split: A {len(a)} people (age), B {len(b)} people (education), {truth.sum()} in both; "
          f"encryption and cell totals {setup:.1f} s; lowest cell RMSE: {best} {releases[best]['cell_rmse']} "
          f"(cells {releases.get('cells', {}).get('cell_rmse', 'not run')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
