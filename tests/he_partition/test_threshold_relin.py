"""Collective relinearization keys at the join's parameters: K = 3 holders' two rounds make SEAL RelinKeys."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tenseal.sealapi as seal

from he_partition.core.errors import InvalidInputError, ShareCombineError
from he_partition.he.join_scheme import JoinParams, JoinScheme, _context, join_plain_modulus
from he_partition.he.seal_io import seal_bytes
from he_partition.he.threshold.decrypt import combine, decryption_share
from he_partition.he.threshold.keys import (HolderSecret, key_fingerprint,
                                            key_moduli, load_seal, secret_plaintext_bytes)
from he_partition.he.threshold.relin import (collective_relin_keys, join_context, relin_round_one, relin_round_two,
                                             round_one_sum)
from he_partition.he.threshold.shamir import deal, participant_secret, receive

from .join_keys import commit, holder_keys, relin_rounds

SEED = b"relin-test-seed-0123456789abcdef"
HOLDERS = [0, 1, 2]
VERSION = 2


def _commit(parts: dict[int, bytes]) -> dict[int, bytes]:
    return commit(SEED, parts)


def _rounds(ctx: Any, secrets_: dict[int, HolderSecret], seeds: dict[int, bytes] | None = None) -> dict[str, Any]:
    """Both rounds, every holder honest unless `seeds` gives one another common seed."""
    return relin_rounds(ctx, SEED, secrets_, seeds)


@pytest.fixture(scope="module")
def relin() -> dict[str, Any]:
    ctx = join_context(VERSION)
    secrets_, pk = holder_keys(ctx, SEED, HOLDERS)
    return {"ctx": ctx, "secrets": secrets_, "pk": pk, "fp": key_fingerprint(pk), **_rounds(ctx, secrets_)}


def _scheme(s: dict[str, Any], rk: bytes, secret: bytes | None = None) -> JoinScheme:
    """The join scheme under the collective public key and `rk` (no Galois keys); `secret` to measure noise."""
    params = JoinParams.for_version(VERSION)
    ctx = s["ctx"]
    sk = load_seal(seal.SecretKey, ctx, secret, "secret") if secret is not None else None
    return JoinScheme(params, _context(params), load_seal(seal.PublicKey, ctx, s["pk"], "public key"),
                      load_seal(seal.RelinKeys, ctx, rk, "relinearization keys"), seal.GaloisKeys(), sk)


def _product(s: dict[str, Any], rk: bytes) -> tuple[bytes, list[int]]:
    """A relinearized product of two fresh ciphertexts under the collective key, and the expected slots (centred)."""
    js = _scheme(s, rk)
    rng = np.random.default_rng(3)
    a, b = rng.integers(-1000, 1000, js.slots), rng.integers(-1000, 1000, js.slots)
    prod = js._relinearized(js.multiply_accumulate(None, js.encrypt(a), js.encrypt(b)))
    assert prod.size() == 2
    t = js.plain_modulus
    want = (a * b) % t
    return seal_bytes(prod), np.where(want > t // 2, want - t, want).tolist()


def _centred(values: Any, t: int) -> list[int]:
    v = np.asarray(values, dtype=np.int64) % t
    return np.where(v > t // 2, v - t, v).tolist()


def test_a_product_relinearized_with_the_collective_key_decrypts_with_the_k_shares(relin: dict[str, Any]) -> None:
    """N-of-N (K = 3 additive shares) and 2-of-3 (Shamir participant shares of the same s) both decode a * b."""
    ctx, t = relin["ctx"], join_plain_modulus(VERSION)
    ct, want = _product(relin, relin["rk"])
    shares = [decryption_share(ctx, relin["secrets"][h], relin["fp"], ct) for h in HOLDERS]
    assert _centred(combine(ctx, ct, shares, HOLDERS, relin["fp"]), t) == want
    dealt = {i: deal(ctx, relin["secrets"][i], HOLDERS, 2) for i in HOLDERS}
    tofn = {j: receive(ctx, j, HOLDERS, 2, {i: dealt[i][j] for i in HOLDERS}) for j in HOLDERS}
    pair = (0, 2)
    shares = [decryption_share(ctx, participant_secret(ctx, tofn[j], pair), relin["fp"], ct) for j in pair]
    assert _centred(combine(ctx, ct, shares, list(pair), relin["fp"]), t) == want


def test_relinearizing_under_the_collective_key_costs_at_most_a_bit_of_budget(relin: dict[str, Any]) -> None:
    """Read with s = sum s_i as one secret key (a measuring instrument, as in benchmarks/threshold_relin.py):
    the key's error (s e0 + u e1 + e2, about K sqrt(N) times a SEAL key's) stays far below the product's noise."""
    ctx = relin["ctx"]
    moduli = key_moduli(ctx)
    qs = np.array(moduli, dtype=np.uint64)[:, None]
    s = sum((relin["secrets"][h].s_ntt for h in HOLDERS), np.zeros_like(relin["secrets"][0].s_ntt)) % qs
    raw = secret_plaintext_bytes(ctx, HolderSecret(0, s), list(ctx.seal_context().data.key_parms_id()), len(moduli))
    js = _scheme(relin, relin["rk"], raw)
    a = js.encrypt(np.arange(js.slots))
    prod = js.multiply_accumulate(None, a, a)
    budget = js.noise_budget(prod)
    assert budget > 80 and js.noise_budget(js._relinearized(prod)) >= budget - 1


def test_a_rogue_relinearization_part_is_refused(relin: dict[str, Any]) -> None:
    ctx, secrets_ = relin["ctx"], relin["secrets"]
    c1, r1, c2, r2 = relin["c1"], relin["r1"], relin["c2"], relin["r2"]
    late = dict(r1)
    late[2] = relin_round_one(ctx, secrets_[2], SEED).share  # chosen after the others were revealed
    with pytest.raises(InvalidInputError, match="holder 2 does not match its commitment"):
        round_one_sum(ctx, SEED, c1, late)
    with pytest.raises(InvalidInputError, match="holder 2 does not match its commitment"):
        collective_relin_keys(ctx, SEED, (c1, late), c2, r2)
    rogue2 = dict(r2)
    rogue2[0] = r2[1]
    with pytest.raises(InvalidInputError, match="holder 0 does not match its commitment"):
        collective_relin_keys(ctx, SEED, (c1, r1), c2, rogue2)
    with pytest.raises(InvalidInputError, match="holder 1 was committed but not revealed"):
        collective_relin_keys(ctx, SEED, (c1, r1), c2, {h: b for h, b in r2.items() if h != 1})
    swapped = {0: r1[1], 1: r1[0], 2: r1[2]}
    with pytest.raises(InvalidInputError, match="revealed as holder 0 names holder 1"):
        round_one_sum(ctx, SEED, _commit(swapped), swapped)
    cut = {h: b[:-8] for h, b in r1.items()}
    with pytest.raises(InvalidInputError, match="bytes, expected"):
        round_one_sum(ctx, SEED, _commit(cut), cut)
    with pytest.raises(InvalidInputError, match="not a relinearization round-1 part"):
        round_one_sum(ctx, SEED, _commit(r2), r2)  # a round-2 part offered as round 1
    state = relin_round_one(ctx, secrets_[0], SEED)
    with pytest.raises(InvalidInputError, match="do not hold holder 0's own round-1 part"):
        relin_round_two(ctx, secrets_[0], state, SEED, c1, r1)  # a relay that dropped this holder's part
    mine = {**r1, 0: state.share}
    relin_round_two(ctx, secrets_[0], state, SEED, _commit(mine), mine)
    with pytest.raises(InvalidInputError, match="already used for a round 2"):
        relin_round_two(ctx, secrets_[0], state, SEED, _commit(mine), mine)


def test_a_part_over_another_common_polynomial_breaks_relinearization_and_the_combine_refuses(
        relin: dict[str, Any]) -> None:
    """What commit-then-reveal cannot see: a holder that commits honestly to a malformed round-1 part (here over
    another seed's a_j). The key builds and SEAL loads it, but it does not relinearize: the product's combined
    decryption has no noise budget left and is refused, never returned."""
    ctx = relin["ctx"]
    bad = _rounds(ctx, relin["secrets"], seeds={1: b"another-seed-0123456789abcdef012"})
    ct, _ = _product(relin, bad["rk"])
    shares = [decryption_share(ctx, relin["secrets"][h], relin["fp"], ct) for h in HOLDERS]
    with pytest.raises(ShareCombineError, match="noise budget"):
        combine(ctx, ct, shares, HOLDERS, relin["fp"])
