"""A join's values decrypted by K = 3 key-share holders that compute each value's ciphertext themselves.

The attacker double: a computation server that combines the holders' shares of a ciphertext it
made up. Holders that share whatever ciphertext they are sent (as the ordinary per-ciphertext
`decryption_share` does) hand it the collective secret key from one combine; holders that compute
the join's values from the owners' planes (`HolderJoinValues`) take no ciphertext at all, and their
shares combine only with the c1 they computed.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError, ShareCombineError
from he_partition.execution.processes import ProcessExecutor
from he_partition.core.noise_shares import discrete_laplace_share, holder_noise_source
from he_partition.he.join_scheme import JoinParams, JoinScheme, join_plain_modulus
from he_partition.he.threshold.c1 import ciphertext_parts
from he_partition.he.threshold.decrypt import combine, combined_phase, decryption_share, padded_noise, secret_product
from he_partition.he.threshold.galois import collective_galois_keys, galois_elements, holder_galois_share
from he_partition.he.seal_io import seal_ciphertext_bytes
from he_partition.he.threshold.keys import key_fingerprint, seal_version
from he_partition.he.threshold.relin import (join_context)
from he_partition.he.threshold.shamir import deal, participant_secret, receive
from he_partition.he.threshold.wire import DecryptionShare
from he_partition.join.holders import (JOIN_SMUDGING_BITS, HolderJoinValues, check_commitment, check_passes,
                                       check_values, combine_values, noised_for_holders,
                                       rotation_steps)
from he_partition.join.protocol import joint_totals
from he_partition.join.release import cells_strategy, measurement_terms

from .join_keys import commit, holder_keys, relin_rounds

SEED = b"join-holders-test-seed-0123456789"
HOLDERS = [0, 1, 2]
VERSION = 2
ROWS, COLS = 2, 3
NOISE_KEYS = {h: bytes([h + 1]) * 32 for h in HOLDERS}


@pytest.fixture(scope="module")
def setup() -> dict[str, Any]:
    """Three holders' join key (public key, relinearization and Galois rounds, all local) and two owners' planes."""
    ctx = join_context(VERSION)
    secrets_, pk = holder_keys(ctx, SEED, HOLDERS)
    rk = relin_rounds(ctx, SEED, secrets_)["rk"]
    elements = galois_elements(ctx, rotation_steps(8192))
    g = {h: holder_galois_share(ctx, secrets_[h], SEED, elements) for h in HOLDERS}
    gk = collective_galois_keys(ctx, SEED, elements, commit(SEED, g), g)
    scheme = JoinScheme.from_keys(JoinParams.for_version(VERSION), pk, rk, gk)
    rng = np.random.default_rng(11)
    slots = scheme.slots
    a_of = rng.integers(-1, ROWS, slots)  # -1: no record of A at the position
    b_of = rng.integers(-1, COLS, slots)
    a = [[scheme.serialize(scheme.encrypt((a_of == v).astype(np.int64))) for v in range(ROWS)]]
    b = [[scheme.serialize(scheme.encrypt((b_of == v).astype(np.int64))) for v in range(COLS)]]
    truth = np.array([np.sum((a_of == i) & (b_of == j)) for i in range(ROWS) for j in range(COLS)], dtype=np.int64)
    return {"ctx": ctx, "secrets": secrets_, "fp": key_fingerprint(pk), "scheme": scheme, "public": scheme.public_bytes(),
            "a": a, "b": b, "a_of": a_of, "truth": truth}


def _cs_values(s: dict[str, Any], m: Any, draws: Any) -> list[bytes]:
    """The computation server's side: the same circuit on the planes, its draw added to c0 as a plaintext."""
    scheme = s["scheme"]
    totals = joint_totals(scheme, [[scheme.deserialize(c) for c in g] for g in s["a"]],
                          [[scheme.deserialize(c) for c in g] for g in s["b"]])
    values = [scheme.signed_sum([(c, totals[k]) for c, lo, hi in t for k in range(lo, hi)])
              for t in measurement_terms(m)]
    return [noised_for_holders(scheme, v, int(d)) for v, d in zip(values, draws)]


def test_three_holders_decrypt_the_join_values_they_computed_3_of_3_and_2_of_3(setup: dict[str, Any]) -> None:
    s = setup
    m = next(cells_strategy(ROWS * COLS, 1.0, noise_parties=2))
    scale = Fraction(1)
    cs_draws = np.array([3, -1, 0, 2, -4, 1], dtype=np.int64)
    cts = _cs_values(s, m, cs_draws)
    bins = list(range(ROWS * COLS))
    holders = {h: HolderJoinValues(s["ctx"], s["secrets"][h], s["fp"], s["public"], s["a"], s["b"], bins)
               for h in HOLDERS}
    dp = {h: discrete_laplace_share(scale, 3, m.count, holder_noise_source(NOISE_KEYS[h], h, 3, b"r1")) for h in HOLDERS}
    shares = {h: holders[h].shares(m, dp[h], holder_noise_source(NOISE_KEYS[h], h, 3, b"r1/smudge")) for h in HOLDERS}
    t = join_plain_modulus(VERSION)
    got = combine_values(s["ctx"], cts, [[shares[h][v] for h in HOLDERS] for v in range(m.count)], HOLDERS, s["fp"], t)
    assert got.tolist() == (s["truth"] + cs_draws + sum(dp.values())).tolist()

    # 2-of-3: each holder's Shamir share of the same key, holders 0 and 2 (holder 1 stopped)
    ctx = s["ctx"]
    dealt = {i: deal(ctx, s["secrets"][i], HOLDERS, 2) for i in HOLDERS}
    pair = (0, 2)
    part = {j: participant_secret(ctx, receive(ctx, j, HOLDERS, 2, {i: dealt[i][j] for i in HOLDERS}), pair)
            for j in pair}
    two = {j: HolderJoinValues(ctx, part[j], s["fp"], s["public"], s["a"], s["b"], bins) for j in pair}
    dp2 = {j: discrete_laplace_share(scale, 2, m.count, holder_noise_source(NOISE_KEYS[j], j, 3, b"r2")) for j in pair}
    sh2 = {j: two[j].shares(m, dp2[j], holder_noise_source(NOISE_KEYS[j], j, 3, b"r2/smudge")) for j in pair}
    got2 = combine_values(ctx, cts, [[sh2[j][v] for j in pair] for v in range(m.count)], list(pair), s["fp"], t)
    assert got2.tolist() == (s["truth"] + cs_draws + sum(dp2.values())).tolist()


def _crt(phase: np.ndarray, moduli: list[int]) -> list[int]:
    """Centred integers mod Q = prod(moduli) of RNS residues (shape (k, N))."""
    big_q = int(np.prod([int(q) for q in moduli], dtype=object))
    out = [0] * phase.shape[1]
    for r, q in enumerate(moduli):
        m = big_q // q
        w = m * pow(m, -1, q)
        for i, x in enumerate(phase[r].tolist()):
            out[i] += int(x) * w
    return [x % big_q - big_q if x % big_q > big_q // 2 else x % big_q for x in out]


def test_a_cs_combining_shares_of_a_ciphertext_it_made_up_gets_the_key_unless_the_holders_compute_the_value(
        setup: dict[str, Any]) -> None:
    s = setup
    ctx, scheme = s["ctx"], s["scheme"]
    parms_id, moduli, parts = ciphertext_parts(ctx, s["a"][0][0])
    slots, t = scheme.slots, scheme.plain_modulus
    # The made-up ciphertext: c0 = 0, c1 = the constant C = 2^125 (far above the holders' 2^110 smudging, far below
    # Delta = Q / t): the combined phase is C s + the smudging + Delta (pads and noise), so round(r / C) = s.
    big_c = 1 << 125
    crafted_parts = np.zeros_like(parts)
    crafted_parts[1, :, 0] = [big_c % q for q in moduli]
    crafted = seal_ciphertext_bytes(seal_version(ctx), parms_id, crafted_parts, ntt=False)
    measured = np.zeros(slots, dtype=bool)
    measured[0] = True
    pads = {h: padded_noise(np.zeros(slots, dtype=np.int64), measured, holder_noise_source(NOISE_KEYS[h], h, 3, b"x"), t)
            for h in HOLDERS}
    # holders that share whatever they are sent (pads and smudging as for any value)
    naive = [DecryptionShare.from_bytes(decryption_share(ctx, s["secrets"][h], s["fp"], crafted, JOIN_SMUDGING_BITS,
                                                         dp_noise=pads[h])) for h in HOLDERS]
    phase = _crt(combined_phase(crafted_parts[0], naive, moduli), moduli)
    big_q = int(np.prod([int(q) for q in moduli], dtype=object))
    delta = big_q // t
    remainder = [(x + delta // 2) % delta - delta // 2 for x in phase]  # C s + smudging, the pads' multiples of Delta gone
    recovered = [round(r / big_c) for r in remainder]
    one = np.zeros_like(parts[1])
    one[:, 0] = 1
    s_sum = sum(secret_product(ctx, s["secrets"][h], parms_id, one)[0].astype(object) for h in HOLDERS)
    q0 = moduli[0]
    secret_key = [int(x) % q0 - q0 if int(x) % q0 > q0 // 2 else int(x) % q0 for x in s_sum]
    assert recovered == secret_key  # the whole collective secret key, from one combine

    # holders computing the values themselves: no call takes a ciphertext; their shares are bound to their own c1,
    # so the made-up ciphertext's combine is refused, and the CS's only freedom is c0
    m = next(cells_strategy(ROWS * COLS, 1.0, noise_parties=2))
    bins = list(range(ROWS * COLS))
    honest = {h: HolderJoinValues(ctx, s["secrets"][h], s["fp"], s["public"], s["a"], s["b"], bins).shares(
        m, [0] * m.count, holder_noise_source(NOISE_KEYS[h], h, 3, b"y")) for h in HOLDERS}
    with pytest.raises(ShareCombineError, match="another ciphertext"):
        combine_values(ctx, [crafted], [[honest[h][0] for h in HOLDERS]], HOLDERS, s["fp"], t)
    with pytest.raises(ShareCombineError, match="another ciphertext"):  # nor an owner's raw plane: it is no value they computed
        combine_values(ctx, [s["a"][0][0]], [[honest[h][0] for h in HOLDERS]], HOLDERS, s["fp"], t)


def test_each_holder_checks_both_uploads_itself_and_a_share_picked_after_the_others_is_refused(
        setup: dict[str, Any]) -> None:
    """The well-formedness check at K holders: honest planes pass at every holder; a plane set twice at one position
    fails; and a holder (or relay) that picks its shares after seeing the others', so that they cancel into zeros,
    would pass the malformed upload were it not for the commitments."""
    s = setup
    ctx, scheme, fp = s["ctx"], s["scheme"], s["fp"]
    seed = bytes(range(32))
    bad_a_of = s["a_of"].copy()
    x = np.stack([(bad_a_of == v).astype(np.int64) for v in range(ROWS)])
    x[:, 5] = 1  # position 5 set in both of A's planes: two records at one position
    bad_a = [[scheme.serialize(scheme.encrypt(x[v])) for v in range(ROWS)]]
    bins = list(range(ROWS * COLS))
    for planes, owner, ok in ((s["a"], "a", True), (s["b"], "b", True), (bad_a, "a", False)):
        side = 1 if owner == "b" else 0
        holders = {h: HolderJoinValues(ctx, s["secrets"][h], fp, s["public"], planes if side == 0 else s["a"],
                                       planes if side == 1 else s["b"], bins) for h in HOLDERS}
        shares = {h: holders[h].check_shares(side, owner, seed, holder_noise_source(NOISE_KEYS[h], h, 3, b"c"))
                  for h in HOLDERS}
        commits = {h: check_commitment(h, seed, shares[h]) for h in HOLDERS}
        assert all(check_passes(ctx, scheme, planes, seed, owner, commits, shares, fp) is ok for _ in HOLDERS)
    # the forger: holder 2's "shares" chosen after holders 0 and 1 revealed theirs, so the residues combine to 0
    values = check_values(scheme, bad_a, seed, "a")
    forged = []
    for r, v in enumerate(values):
        _, moduli, parts = ciphertext_parts(ctx, v)
        qs = np.array(moduli, dtype=np.uint64)[:, None]
        got = [DecryptionShare.from_bytes(shares[h][r]) for h in (0, 1)]
        total = parts[0].astype(np.uint64)
        for g in got:
            total = (total + np.frombuffer(g.payload, dtype="<u8").reshape(parts[0].shape)) % qs
        payload = ((qs - total) % qs).astype("<u8").tobytes()
        forged.append(DecryptionShare(2, fp, got[0].ciphertext_digest, payload).to_bytes())
    cheat = {0: shares[0], 1: shares[1], 2: forged}
    # without the commitments the forgery passes the malformed upload ...
    assert all(not combine(ctx, v, [cheat[h][r] for h in HOLDERS], HOLDERS, fp, bound_to_c1=True).any()
               for r, v in enumerate(values))
    # ... with them it is refused, naming the holder
    with pytest.raises(InvalidInputError, match="holder 2 do not match its commitment"):
        check_passes(ctx, scheme, bad_a, seed, "a", commits, cheat, fp)


def test_a_holder_computing_on_its_worker_processes_makes_the_same_shares(setup: dict[str, Any]) -> None:
    """The holder's values on two local worker processes (the CS's evaluator, in blocks) are the in-process ones
    bit for bit, so its shares (keyed noise) are the same bytes."""
    s = setup
    m = next(cells_strategy(ROWS * COLS, 1.0, noise_parties=2))
    bins = list(range(ROWS * COLS))

    def shares(executor: Any) -> list[bytes]:
        with HolderJoinValues(s["ctx"], s["secrets"][1], s["fp"], s["public"], s["a"], s["b"], bins,
                              executor=executor) as hv:
            return hv.shares(m, [0] * m.count, holder_noise_source(NOISE_KEYS[1], 1, 3, b"w"))

    executor = ProcessExecutor(2)
    try:
        assert shares(executor) == shares(None)
    finally:
        executor.close()
