"""t-of-N threshold BFV (K = 3, t = 2; K = 5, t = 3) with real SEAL objects: any t decrypt, fewer decrypt nothing."""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError, ShareCombineError
from he_partition.he.threshold.decrypt import combine, combined_phase, decode_phase, decryption_share
from he_partition.he.threshold.c1 import ciphertext_parts
from he_partition.he.threshold.keys import collective_public_key, holder_keygen, key_fingerprint, key_moduli
from he_partition.he.threshold.shamir import (SubShare, check_threshold, deal, lagrange, participant_secret, receive,
                                              subsets, uniform_residues)
from he_partition.he.threshold.wire import DecryptionShare, key_share_commitment

from .test_threshold import SEED, _encrypted_sum, _rows, make_setup


def tofn(s: dict[str, Any], threshold: int) -> dict[int, Any]:
    """Every holder deals to every holder; each keeps S_j (the dealt sub-shares pass through bytes)."""
    ctx, holders = s["ctx"], sorted(s["secrets"])
    dealt = {i: deal(ctx, s["secrets"][i], holders, threshold) for i in holders}
    return {j: receive(ctx, j, holders, threshold,
                       {i: SubShare.from_bytes(ctx, dealt[i][j].to_bytes()) for i in holders}) for j in holders}


@pytest.fixture(scope="module")
def k3() -> dict[str, Any]:
    s = make_setup()
    s["tofn"] = tofn(s, 2)
    return s


@pytest.fixture(scope="module")
def k5() -> dict[str, Any]:
    s = make_setup()
    ctx = s["ctx"]
    for h in (3, 4):
        s["secrets"][h], s["reveals"][h] = holder_keygen(ctx, SEED, h)
    s["commits"] = {h: key_share_commitment(h, SEED, p) for h, p in s["reveals"].items()}
    s["pk"] = collective_public_key(ctx, SEED, s["commits"], s["reveals"])
    s["fp"] = key_fingerprint(s["pk"])
    s["tofn"] = tofn(s, 3)
    return s


def _shares(s: dict[str, Any], ct: bytes, participants: tuple[int, ...]) -> list[bytes]:
    ctx = s["ctx"]
    return [decryption_share(ctx, participant_secret(ctx, s["tofn"][j], participants), s["fp"], ct)
            for j in participants]


@pytest.mark.parametrize("fixture, threshold", [("k3", 2), ("k5", 3)])
def test_every_t_subset_decrypts_exactly_what_all_n_decrypt(fixture: str, threshold: int,
                                                             request: pytest.FixtureRequest) -> None:
    s = request.getfixturevalue(fixture)
    rows = _rows(4, 11)
    ct = _encrypted_sum(s, rows)
    want = np.sum(np.array(rows, dtype=np.int64), axis=0).tolist()
    holders = sorted(s["secrets"])
    n_of_n = combine(s["ctx"], ct, [decryption_share(s["ctx"], s["secrets"][h], s["fp"], ct) for h in holders],
                     holders, s["fp"])
    assert n_of_n.tolist() == want
    for p in subsets(holders, threshold):
        got = combine(s["ctx"], ct, _shares(s, ct, p), list(p), s["fp"])
        assert got.tolist() == want, p


def test_fewer_than_t_decrypt_nothing(k5: dict[str, Any]) -> None:
    """Two of five holders (t = 3): with their own Lagrange weights, with a third set's weights, with no weights
    at all, the combined phase decodes to noise (budget 0) and the combine refuses it."""
    s, ctx = k5, k5["ctx"]
    rows = _rows(2, 12)
    ct = _encrypted_sum(s, rows)
    want = np.sum(np.array(rows, dtype=np.int64), axis=0)
    parms_id, moduli, parts = ciphertext_parts(ctx, ct)
    for pair in itertools.combinations(range(5), 2):
        for weights in (pair, pair + (next(h for h in range(5) if h not in pair),)):
            shares = [DecryptionShare.from_bytes(decryption_share(
                ctx, participant_secret(ctx, s["tofn"][j], weights), s["fp"], ct)) for j in pair]
            plain, budget = decode_phase(ctx, parms_id, combined_phase(parts[0], shares, moduli))
            assert budget == 0, (pair, weights)
        with pytest.raises(ShareCombineError, match="noise budget"):
            combine(ctx, ct, _shares(s, ct, pair), list(pair), s["fp"])
        raw = [DecryptionShare.from_bytes(decryption_share(ctx, s["tofn"][j], s["fp"], ct)) for j in pair]
        assert decode_phase(ctx, parms_id, combined_phase(parts[0], raw, moduli))[1] == 0
    assert want.any()


def test_a_sub_share_set_short_of_t_is_uniform_whatever_the_secret(k3: dict[str, Any]) -> None:
    """t = 2: one sub-share f(x_j) = s + a x_j with a uniform mod q. Dealing the zero secret and the real one,
    the holder's sub-share minus its secret's offset is the same uniform pad distribution; here: a fixed
    secret dealt twice gives unrelated sub-shares (fresh pads), and each is reduced and not the secret."""
    ctx = k3["ctx"]
    sec = k3["secrets"][0]
    a, b = deal(ctx, sec, [0, 1, 2], 2), deal(ctx, sec, [0, 1, 2], 2)
    for j in (0, 1, 2):
        assert not np.array_equal(a[j].values, b[j].values)
        assert not np.array_equal(a[j].values, sec.s_ntt)
        # the difference of two dealings at x_j is (a - a') x_j: uniform, so about half the top bits are set
        q0 = key_moduli(ctx)[0]
        top = (a[j].values[0] >= np.uint64(q0 // 2)).mean()
        assert 0.45 < top < 0.55


def test_uniform_residues_are_in_range_and_balanced() -> None:
    q = (1 << 60) - 93
    v = uniform_residues(q, (4, 50_000))
    assert v.shape == (4, 50_000) and int(v.max()) < q
    counts = np.bincount((v.reshape(-1) // np.uint64(q // 8 + 1)).astype(np.int64), minlength=8)
    assert counts.min() > 0.95 * counts.mean()


def test_lagrange_weights_sum_the_shares_back() -> None:
    q = (1 << 61) - 1
    rng = np.random.default_rng(3)
    secret, a1, a2 = (int(x) for x in rng.integers(0, 1 << 60, 3))
    f = {j: (secret + a1 * (j + 1) + a2 * (j + 1) ** 2) % q for j in range(5)}
    for p in subsets(range(5), 3):
        lam = lagrange(p, [q])
        assert sum(lam[j][0] * f[j] for j in p) % q == secret


def test_refusals_name_the_problem(k3: dict[str, Any]) -> None:
    ctx = k3["ctx"]
    with pytest.raises(InvalidInputError, match="strict majority"):
        check_threshold(1, [0, 1, 2])
    with pytest.raises(InvalidInputError, match="strict majority"):
        check_threshold(4, [0, 1, 2])
    dealt = {i: deal(ctx, k3["secrets"][i], [0, 1, 2], 2) for i in (0, 1, 2)}
    with pytest.raises(InvalidInputError, match="holder 2 has not dealt"):
        receive(ctx, 0, [0, 1, 2], 2, {i: dealt[i][0] for i in (0, 1)})
    with pytest.raises(InvalidInputError, match="recipient 1"):
        receive(ctx, 0, [0, 1, 2], 2, {0: dealt[0][0], 1: dealt[1][1], 2: dealt[2][0]})
    with pytest.raises(InvalidInputError, match="not in the participant set"):
        participant_secret(ctx, k3["tofn"][0], (1, 2))
    with pytest.raises(InvalidInputError, match="sub-share"):
        SubShare.from_bytes(ctx, b"DPTS1" + bytes(20))
