"""A join key made by the key setup's rounds (`HolderSetup`: key, Galois and relinearization rounds, test product)
at the join's parameters, N-of-N and 2-of-3, then a join value decrypted by the holders that computed it."""
from __future__ import annotations

import secrets
from typing import Any

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError, ShareCombineError
from he_partition.he.join_scheme import JoinParams, JoinScheme
from he_partition.he.threshold.galois import galois_elements
from he_partition.he.threshold.relin import join_context
from he_partition.he.threshold.decrypt import decryption_share
from he_partition.he.threshold.relin import collective_relin_keys, relin_round_one, relin_round_two
from he_partition.he.threshold.setup import HolderSetup, SetupRelay, setup_test_product
from he_partition.he.threshold.shamir import participant_secret
from he_partition.he.threshold.wire import key_share_commitment
from he_partition.join.holders import (HolderJoinValues, combine_values, noised_for_holders,
                                       rotation_steps)
from he_partition.join.protocol import joint_totals
from he_partition.join.release import cells_strategy
from he_partition.core.noise import KeyedRandom

HOLDERS = [0, 1, 2]
VERSION = 2


def _relay_round(relay: SetupRelay, holders: dict[int, HolderSetup], what: str, step: Any) -> dict[int, bytes]:
    for h, hs in holders.items():
        relay.submit(what, h, step(hs))
    return relay.collected(what)


def _join_rounds(relay: SetupRelay, holders: dict[int, HolderSetup]) -> None:
    """The Galois round and both relinearization rounds, each commit-then-reveal through the relay."""
    ctx = relay.ctx
    elements = galois_elements(ctx, rotation_steps(8192))
    c = _relay_round(relay, holders, "Galois key commitment", lambda hs: hs.commit_galois(elements))
    r = _relay_round(relay, holders, "Galois key share", lambda hs: hs.reveal_galois(c))
    assert len({hs.build_galois(r) for hs in holders.values()}) == 1
    c1 = _relay_round(relay, holders, "relinearization round-1 commitment", lambda hs: hs.commit_relin_one())
    r1 = _relay_round(relay, holders, "relinearization round-1 part", lambda hs: hs.reveal_relin_one(c1))
    c2 = _relay_round(relay, holders, "relinearization round-2 commitment", lambda hs: hs.commit_relin_two(r1))
    r2 = _relay_round(relay, holders, "relinearization round-2 part", lambda hs: hs.reveal_relin_two(c2))
    assert len({hs.build_relin(r2) for hs in holders.values()}) == 1


def _setup(threshold: int | None) -> tuple[SetupRelay, dict[int, HolderSetup]]:
    ctx = join_context(VERSION)
    session = secrets.token_bytes(16)
    holders = {h: HolderSetup(ctx, session, h, HOLDERS, threshold) for h in HOLDERS}
    relay = SetupRelay(ctx, session, HOLDERS)
    c = _relay_round(relay, holders, "seed commitment", lambda hs: hs.commit_seed())
    r = _relay_round(relay, holders, "seed contribution", lambda hs: hs.reveal_seed(c))
    c = _relay_round(relay, holders, "key-share commitment", lambda hs: hs.commit_key(r))
    r = _relay_round(relay, holders, "key share", lambda hs: hs.reveal_key(c))
    assert len({hs.build_key(r) for hs in holders.values()}) == 1
    if threshold is not None:  # t-of-N: the join's keys need every s_i, so before the dealing replaces them
        with pytest.raises(InvalidInputError, match="this step needs 'relin built'"):
            holders[0].product_share((0, 1))
        _join_rounds(relay, holders)
        dealt = {h: hs.deal_subshares() for h, hs in holders.items()}
        for j, hs in holders.items():
            hs.receive_subshares({i: dealt[i][j] for i in HOLDERS})
    fp = holders[0].fingerprint
    ct = relay.test_ciphertext(holders[0].public_key, holders[0].seed)
    sets = [tuple(HOLDERS)] if threshold is None else [(0, 1), (0, 2), (1, 2)]
    values: list[int] = []
    for p in sets:
        values += relay.combine_test(ct, {h: holders[h].test_share(ct, p if threshold else None) for h in p}, fp,
                                     list(p)).tolist()
    for hs in holders.values():
        hs.confirm(values)
    if threshold is None:
        with pytest.raises(InvalidInputError, match="this step needs 'relin built'"):
            holders[0].product_share()
        _join_rounds(relay, holders)
    return relay, holders


def _product_check(relay: SetupRelay, holders: dict[int, HolderSetup], sets: list[tuple[int, ...]]) -> None:
    h0 = holders[0]
    product = setup_test_product(relay.ctx, h0.public_key, h0.seed, h0.relin_keys)
    got: list[int] = []
    for p in sets:
        shares = {h: holders[h].product_share(p if h0.threshold else None) for h in p}
        got += relay.combine_test(product, shares, h0.fingerprint, list(p)).tolist()
    with pytest.raises(InvalidInputError, match="already"):
        holders[0].product_share(sets[0] if h0.threshold else None)
    for hs in holders.values():
        hs.confirm_product(got)


def _join_value(relay: SetupRelay, holders: dict[int, HolderSetup], p: tuple[int, ...]) -> None:
    """A 2 x 2 join over one group under the set-up keys, decrypted by the holders `p` that computed it."""
    ctx, h0 = relay.ctx, holders[0]
    scheme = JoinScheme.from_keys(JoinParams.for_version(VERSION), h0.public_key, h0.relin_keys, h0.galois_keys)
    rng = np.random.default_rng(5)
    a_of, b_of = rng.integers(-1, 2, scheme.slots), rng.integers(-1, 2, scheme.slots)
    a = [[scheme.serialize(scheme.encrypt((a_of == v).astype(np.int64))) for v in range(2)]]
    b = [[scheme.serialize(scheme.encrypt((b_of == v).astype(np.int64))) for v in range(2)]]
    truth = [int(np.sum((a_of == i) & (b_of == j))) for i in range(2) for j in range(2)]
    m = next(cells_strategy(4, 1.0, noise_parties=2))
    totals = joint_totals(scheme, [[scheme.deserialize(c) for c in g] for g in a],
                          [[scheme.deserialize(c) for c in g] for g in b])
    values = [noised_for_holders(scheme, v, 0) for v in totals]
    shares = {}
    for h in p:
        secret = holders[h].secret
        assert secret is not None
        if h0.threshold is not None:
            secret = participant_secret(ctx, secret, p)
        shares[h] = HolderJoinValues(ctx, secret, h0.fingerprint, scheme.public_bytes(), a, b, [0, 1, 2, 3]).shares(
            m, [0] * 4, KeyedRandom(bytes([h + 1]) * 32, b"test"))
    got = combine_values(ctx, values, [[shares[h][v] for h in p] for v in range(4)], list(p), h0.fingerprint,
                         scheme.plain_modulus)
    assert got.tolist() == truth


def test_an_n_of_n_setup_makes_a_join_key_whose_values_the_holders_decrypt() -> None:
    relay, holders = _setup(None)
    _product_check(relay, holders, [tuple(HOLDERS)])
    assert {hs.relin_state for hs in holders.values()} == {"relin checked"}
    _join_value(relay, holders, tuple(HOLDERS))


def test_a_2_of_3_setup_makes_the_join_keys_before_its_dealing_and_any_two_decrypt() -> None:
    relay, holders = _setup(2)
    with pytest.raises(InvalidInputError, match="active t-of-N key has none"):
        holders[0].commit_galois([3])
    _product_check(relay, holders, [(0, 1), (0, 2), (1, 2)])
    _join_value(relay, holders, (0, 2))


def test_relinearization_rounds_refuse_a_changed_commitment_a_rogue_part_and_keys_that_do_not_relinearize() -> None:
    ctx = join_context(VERSION)
    session = secrets.token_bytes(16)
    holders = {h: HolderSetup(ctx, session, h, HOLDERS) for h in HOLDERS}
    relay = SetupRelay(ctx, session, HOLDERS)
    with pytest.raises(InvalidInputError, match="no collective key yet"):
        holders[0].commit_relin_one()
    c = _relay_round(relay, holders, "seed commitment", lambda hs: hs.commit_seed())
    r = _relay_round(relay, holders, "seed contribution", lambda hs: hs.reveal_seed(c))
    c = _relay_round(relay, holders, "key-share commitment", lambda hs: hs.commit_key(r))
    r = _relay_round(relay, holders, "key share", lambda hs: hs.reveal_key(c))
    for hs in holders.values():
        hs.build_key(r)
    ct = relay.test_ciphertext(holders[0].public_key, holders[0].seed)
    got = relay.combine_test(ct, {h: hs.test_share(ct) for h, hs in holders.items()}, holders[0].fingerprint)
    for hs in holders.values():
        hs.confirm(got.tolist())
    c1 = _relay_round(relay, holders, "r1 commitment", lambda hs: hs.commit_relin_one())
    with pytest.raises(InvalidInputError, match="relayed relinearization round-1 commitment of holder 1 is not"):
        holders[1].reveal_relin_one({**c1, 1: bytes(32)})
    r1 = _relay_round(relay, holders, "r1 part", lambda hs: hs.reveal_relin_one(c1))
    with pytest.raises(InvalidInputError, match="holder 2 does not match its commitment"):
        holders[0].commit_relin_two({**r1, 2: r1[1]})
    c2 = _relay_round(relay, holders, "r2 commitment", lambda hs: hs.commit_relin_two(r1))
    r2 = _relay_round(relay, holders, "r2 part", lambda hs: hs.reveal_relin_two(c2))
    for hs in holders.values():
        hs.build_relin(r2)
    # a product that does not equal the test vector squared (as keys that do not relinearize would give): dropped
    with pytest.raises(InvalidInputError, match="not kept"):
        holders[0].confirm_product([0] * 8192)
    assert holders[0].relin_keys == b"" and holders[0].relin_state == "failed"
    with pytest.raises(InvalidInputError, match="this step needs 'relin built'"):
        holders[0].product_share()
    # holder 1's round-2 part made from another round 1 (its commitment honest): the key builds, SEAL loads it, and
    # the test product's combine is refused for its noise budget
    h1 = holders[1]
    assert h1.secret is not None
    other = relin_round_one(ctx, h1.secret, h1.seed)
    mixed = {**r1, 1: other.share}
    bad = {**r2, 1: relin_round_two(ctx, h1.secret, other, h1.seed,
                                    {h: key_share_commitment(h, h1.seed, b) for h, b in mixed.items()}, mixed)}
    rk = collective_relin_keys(ctx, h1.seed, (c1, r1), {h: key_share_commitment(h, h1.seed, b) for h, b in bad.items()},
                               bad)
    product = setup_test_product(ctx, h1.public_key, h1.seed, rk)
    shares = {}
    for h, hs in holders.items():
        assert hs.secret is not None
        shares[h] = decryption_share(ctx, hs.secret, hs.fingerprint, product)
    with pytest.raises(ShareCombineError, match="noise budget"):
        relay.combine_test(product, shares, h1.fingerprint)
