"""Collective relinearization keys at the join's parameters: costs per holder and round, and the noise they leave.

Run: python -m benchmarks.threshold_relin [--holders 3] [--groups 16] [--version 2]. Prints and writes
benchmarks/results/threshold_relin.json (threshold_relin_groups<G>.json for another --groups; 504 is version 2's
capacity edge: 504 x 8192 = 4,128,768 positions).

Noise is read with the combined secret s = sum s_i loaded as one SEAL secret key (only here, to measure:
no deployment ever forms it), so the budgets compare one to one with the single-key join scheme
(`JoinScheme.generate`) on the same circuit: a product of two fresh ciphertexts relinearized; the
join's shape (`groups` products of all-ones indicator planes summed into one cell, relinearized, the
13-rotation sum with collective Galois keys, the DP noise and pads, the 2^110 flood, the switch to the
last prime: `JoinScheme.noised`). Then the K holders' combined decryption (`threshold.decrypt`) of the
result: of the released (switched) ciphertext with smudging of B bits, and of the same ciphertext
left at the full level with B = 110 (what the combiner's view needs: section 8 of docs/threshold.md).
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
import tenseal.sealapi as seal

from benchmarks.common import write_result
from he_partition.he.join_scheme import MIN_NOISE_BUDGET_BITS, JoinParams, JoinScheme, _context
from he_partition.he.keyholder import residual_view
from he_partition.he.seal_io import seal_bytes
from he_partition.he.threshold.decrypt import combined_phase, decode_phase, decryption_share
from he_partition.he.threshold.galois import collective_galois_keys, galois_elements, holder_galois_share
from he_partition.he.threshold.keys import (HolderSecret, collective_public_key, holder_keygen, key_fingerprint,
                                            key_moduli, load_seal, secret_plaintext_bytes)
from he_partition.he.threshold.relin import (collective_relin_keys, join_context, relin_round_one,
                                             relin_round_two)
from he_partition.he.threshold.c1 import ciphertext_parts
from he_partition.he.threshold.wire import DecryptionShare, key_share_commitment

SEED = b"benchmark-relin-seed-0123456789a"


def _bits(values: Any) -> float:
    top = max(abs(int(v)) for v in values)
    return float(np.log2(top)) if top else 0.0


def collective(ctx: Any, holders: list[int], steps: list[int]) -> dict[str, Any]:
    """Every holder's key material, both relinearization rounds and the Galois round, timed per holder."""
    keys = {h: holder_keygen(ctx, SEED, h) for h in holders}
    secrets_ = {h: keys[h][0] for h in holders}
    commits = {h: key_share_commitment(h, SEED, keys[h][1]) for h in holders}
    pk = collective_public_key(ctx, SEED, commits, {h: keys[h][1] for h in holders})
    t0 = time.perf_counter()
    one = {h: relin_round_one(ctx, secrets_[h], SEED) for h in holders}
    round1_s = (time.perf_counter() - t0) / len(holders)
    c1 = {h: key_share_commitment(h, SEED, one[h].share) for h in holders}
    r1 = {h: one[h].share for h in holders}
    t0 = time.perf_counter()
    r2 = {h: relin_round_two(ctx, secrets_[h], one[h], SEED, c1, r1) for h in holders}
    round2_s = (time.perf_counter() - t0) / len(holders)
    c2 = {h: key_share_commitment(h, SEED, r2[h]) for h in holders}
    t0 = time.perf_counter()
    rk = collective_relin_keys(ctx, SEED, (c1, r1), c2, r2)
    build_s = time.perf_counter() - t0
    elements = galois_elements(ctx, steps)
    t0 = time.perf_counter()
    gshares = {h: holder_galois_share(ctx, secrets_[h], SEED, elements) for h in holders}
    galois_s = (time.perf_counter() - t0) / len(holders)
    gk = collective_galois_keys(ctx, SEED, elements, {h: key_share_commitment(h, SEED, b) for h, b in gshares.items()},
                                gshares)
    return {"secrets": secrets_, "pk": pk, "rk": rk, "gk": gk, "fp": key_fingerprint(pk),
            "costs": {"round1_s_per_holder": round1_s, "round2_s_per_holder": round2_s, "build_s": build_s,
                      "round1_bytes_per_holder": len(r1[holders[0]]), "round2_bytes_per_holder": len(r2[holders[0]]),
                      "relin_key_bytes": len(rk), "galois_elements": len(elements),
                      "galois_s_per_holder": galois_s, "galois_bytes_per_holder": len(gshares[holders[0]])}}


def measuring_scheme(ctx: Any, params: JoinParams, keys: dict[str, Any]) -> JoinScheme:
    """The join scheme under the collective keys, with s = sum s_i as its secret key: a measuring instrument only."""
    jctx = _context(params)
    moduli = key_moduli(ctx)
    qs = np.array(moduli, dtype=np.uint64)[:, None]
    s = np.zeros((len(moduli), params.poly_modulus_degree), dtype=np.uint64)
    for secret in keys["secrets"].values():
        s = (s + secret.s_ntt) % qs
    raw = secret_plaintext_bytes(ctx, HolderSecret(0, s), list(jctx.key_parms_id()), len(moduli))
    return JoinScheme(params, jctx, load_seal(seal.PublicKey, ctx, keys["pk"], "collective public key"),
                      load_seal(seal.RelinKeys, ctx, keys["rk"], "collective relinearization keys"),
                      load_seal(seal.GaloisKeys, ctx, keys["gk"], "collective Galois keys"),
                      load_seal(seal.SecretKey, ctx, raw, "combined secret (measurement only)"))


def circuit(js: JoinScheme, groups: int) -> dict[str, Any]:
    """Budgets and largest noise along the join's shape; returns the figures and the ciphertexts for the combine."""
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 2, js.slots), rng.integers(0, 2, js.slots)
    prod = js.multiply_accumulate(None, js.encrypt(a), js.encrypt(b))
    relin = js._relinearized(prod)
    before, after = residual_view(js, prod), residual_view(js, relin)  # phases of the 3-part and the 2-part product
    out: dict[str, Any] = {"fresh_budget": js.noise_budget(js.encrypt(a)), "product_budget": js.noise_budget(prod),
                           "product_relin_budget": js.noise_budget(relin),
                           "product_relin_noise_bits": _bits(after),
                           "relin_added_noise_bits": _bits([int(x) - int(y) for x, y in zip(after, before)]),
                           "product_relin_exact": bool((js.decrypt(relin) == a * b).all())}
    ones = np.ones(js.slots, dtype=np.int64)
    acc = None
    for _ in range(groups):
        acc = js.multiply_accumulate(acc, js.encrypt(ones), js.encrypt(ones))
    summed = js._relinearized(acc)
    out["groups_relin_budget"] = js.noise_budget(summed)
    total = js.total(summed)
    out["rotation_sum_budget"] = js.noise_budget(total)
    out["before_flood_noise_bits"] = _bits(residual_view(js, total))
    noise = np.array([3], dtype=np.int64)

    def pads(n: int) -> Any:
        return np.frombuffer(os.urandom(8 * n), dtype="<u8") % np.uint64(js.plain_modulus)

    released = js.noised(total, noise, 1, pads)
    out["released_budget"] = js.noise_budget(released)
    expected = (groups * js.slots + 3) % js.plain_modulus
    expected = expected - js.plain_modulus if expected > js.plain_modulus // 2 else expected
    out["released_exact"] = bool(js.decrypt(released)[0] == expected)
    js.flooding = False
    try:
        full = js.noised(total, noise, 1, pads)  # same DP noise and pads, no flood, no switch
    finally:
        js.flooding = True
    js._evaluator.add_inplace(full, js._flood(full))  # the CS's 2^110 flood at the full level, not switched
    out["full_level_flooded_budget"] = js.noise_budget(full)
    out["_released"], out["_full"], out["_expected"] = released, full, expected
    return out


def threshold_budget(ctx: Any, keys: dict[str, Any], holders: list[int], ct: Any, bits: int) -> tuple[int, int]:
    """(noise budget, slot 0) of the K holders' combined decryption of `ct` with smudging of `bits` bits each."""
    raw = seal_bytes(ct)
    parms_id, moduli, parts = ciphertext_parts(ctx, raw)
    shares = [DecryptionShare.from_bytes(decryption_share(ctx, keys["secrets"][h], keys["fp"], raw, bits))
              for h in holders]
    plain, budget = decode_phase(ctx, parms_id, combined_phase(parts[0], shares, moduli))
    t = int(ctx.seal_context().data.first_context_data().parms().plain_modulus().value())
    slot = int(seal.BatchEncoder(ctx.seal_context().data).decode_uint64(plain)[0])
    return budget, slot - t if slot > t // 2 else slot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--holders", type=int, default=3)
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--version", type=int, default=2)
    args = ap.parse_args()
    params = JoinParams.for_version(args.version)
    ctx = join_context(args.version)
    holders = list(range(args.holders))
    steps = [1 << i for i in range(12)] + [0]  # the join's rotation-sum: rows by 1..2048, then the column swap
    keys = collective(ctx, holders, steps)
    result: dict[str, Any] = {"holders": args.holders, "groups": args.groups, "join_version": args.version,
                              "load_before": os.getloadavg()[0], "costs": keys["costs"]}
    for name, js in (("single_key", JoinScheme.generate(params)), ("collective", measuring_scheme(ctx, params, keys))):
        figures = circuit(js, args.groups)
        if name == "collective":
            combine: dict[str, Any] = {}
            for bits in (8, 12, 16, 70):
                budget, slot = threshold_budget(ctx, keys, holders, figures["_released"], bits)
                combine[f"released_B{bits}"] = {"budget": budget, "exact": slot == figures["_expected"]}
            budget, slot = threshold_budget(ctx, keys, holders, figures["_full"], 110)
            combine["full_level_B110"] = {"budget": budget, "exact": slot == figures["_expected"]}
            figures["threshold_combine"] = combine
        result[name] = {k: v for k, v in figures.items() if not k.startswith("_")}
    result["min_budget_required"] = MIN_NOISE_BUDGET_BITS
    result["load_after"] = os.getloadavg()[0]
    print(result)
    print(write_result("threshold_relin" if args.groups == 16 else f"threshold_relin_groups{args.groups}", result))


if __name__ == "__main__":
    main()
