"""UCI Adult split vertically between two organizations, joined under encryption (library path).

`python -m benchmarks.join_adult` reads ../shared/data/adult_uci/adult.data (or
$DPAGG_SHARED_DATA/adult_uci): organization A (say, a bank) knows the age of a random 70%
of the people, organization B (an employer survey) the years of education of another
random 70%; about half the people are in both. The row number stands in for a shared
identifier (Adult has none). The DP cross-tabulation (age in 16 bins of 5 years from 17,
education-num 1..16) of the people in both is computed with he_partition.join and
compared with the plaintext join. Prints the figures; writes benchmarks/results/join_adult.json.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from he_partition.join import (JoinKeyPair, check_placement, decrypt_cells, encode_indicators, groups_for,
                               joint_totals, noised_cells, place, pseudonyms)
from he_partition.join_he import JoinScheme
from he_partition.noise import SecureRandom

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
    cts_a = [[scheme.encrypt(x) for x in g] for g in planes_a]
    cts_b = [[scheme.encrypt(x) for x in g] for g in planes_b]
    sent = noised_cells(scheme, joint_totals(scheme, cts_a, cts_b), args.epsilon, SecureRandom())
    cells = decrypt_cells(ds, sent, (AGE_BINS, EDU_BINS), args.epsilon, SecureRandom())
    seconds = time.perf_counter() - t0
    truth = np.zeros((AGE_BINS, EDU_BINS), dtype=np.int64)
    for ident in set(a) & set(b):
        truth[a[ident], b[ident]] += 1
    err = cells.counts - truth
    edu_marginal_true = truth.sum(axis=0)
    edu_marginal_dp = cells.counts.sum(axis=0)
    result = {"people_a": len(a), "people_b": len(b), "shared": int(truth.sum()), "table": "16 age bins x 16 education",
              "epsilon": args.epsilon, "capacity": capacity, "seconds": round(seconds, 2),
              "cell_noise_sd": round(float(np.sqrt(cells.variance)), 3),
              "cell_rmse": round(float(np.sqrt(np.mean(err ** 2))), 3),
              "bachelors_share_true": round(float(edu_marginal_true[12] / truth.sum()), 4),
              "bachelors_share_dp": round(float(edu_marginal_dp[12] / cells.counts.sum()), 4)}
    write_result("join_adult", result)
    print(f"Adult split: A {len(a)} people (age), B {len(b)} people (education), {truth.sum()} in both; "
          f"16 x 16 table in {seconds:.1f} s; cell RMSE {result['cell_rmse']} (noise sd {result['cell_noise_sd']}); "
          f"share with a bachelor's degree {result['bachelors_share_true']} true, {result['bachelors_share_dp']} DP")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
