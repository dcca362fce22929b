"""Collective key setup as a protocol: honest run with real SEAL, K = 3; cheats and a missing holder stop it."""
from __future__ import annotations

import secrets

import numpy as np
import pytest
import tenseal as ts

from he_partition.core.errors import InvalidInputError
from he_partition.he.bfv import generate_secret_context
from he_partition.he.threshold.context import collective_context
from he_partition.he.threshold.decrypt import combine, decryption_share
from he_partition.he.threshold.keys import holder_keygen
from he_partition.he.threshold.setup import HolderSetup, SetupRelay, common_seed, test_vector
from he_partition.he.threshold.wire import key_share_commitment

HOLDERS = [0, 1, 2]


@pytest.fixture(scope="module")
def ctx() -> ts.Context:
    return generate_secret_context()


def _start(ctx: ts.Context, threshold: int | None = None) -> tuple[bytes, dict[int, HolderSetup], SetupRelay]:
    session = secrets.token_bytes(16)
    return (session, {h: HolderSetup(ctx, session, h, HOLDERS, threshold) for h in HOLDERS},
            SetupRelay(ctx, session, HOLDERS))


def _through_round_3(ctx: ts.Context, threshold: int | None = None) -> tuple[bytes, dict[int, HolderSetup], SetupRelay]:
    session, holders, relay = _start(ctx, threshold)
    for h, hs in holders.items():
        relay.submit("seed commitment", h, hs.commit_seed())
    for h, hs in holders.items():
        relay.submit("seed contribution", h, hs.reveal_seed(relay.collected("seed commitment")))
    for h, hs in holders.items():
        relay.submit("key-share commitment", h, hs.commit_key(relay.collected("seed contribution")))
    return session, holders, relay


def test_honest_setup_builds_one_key_every_holder_agrees_on_and_decrypts_the_test_vector(ctx: ts.Context) -> None:
    session, holders, relay = _through_round_3(ctx)
    for h, hs in holders.items():
        relay.submit("key share", h, hs.reveal_key(relay.collected("key-share commitment")))
    fps = {h: hs.build_key(relay.collected("key share")) for h, hs in holders.items()}
    assert len(set(fps.values())) == 1 and len(fps[0]) == 32
    seed = common_seed(session, relay.collected("seed contribution"))
    assert all(hs.seed == seed for hs in holders.values())
    ct = relay.test_ciphertext(holders[0].public_key, seed)
    shares = {h: hs.test_share(ct) for h, hs in holders.items()}
    got = relay.combine_test(ct, shares, fps[0])
    for hs in holders.values():
        hs.confirm(got.tolist())
        assert hs.state == "active"
    with pytest.raises(InvalidInputError, match="is at 'active'; this step needs 'key revealed'"):
        holders[0].test_share(ct)  # one test share per session
    # the collective key works for owners through TenSEAL
    vec = ts.bfv_vector(collective_context(ctx, holders[0].public_key), [7, 8, 9])
    from he_partition.he.threshold.context import vector_ciphertext

    raw = vector_ciphertext(vec.serialize())
    out = combine(ctx, raw, [decryption_share(ctx, holders[h].secret, fps[0], raw) for h in HOLDERS], HOLDERS, fps[0])
    assert out[:3].tolist() == [7, 8, 9]


def test_a_wrong_test_decryption_does_not_activate_the_key(ctx: ts.Context) -> None:
    session, holders, relay = _through_round_3(ctx)
    for h, hs in holders.items():
        relay.submit("key share", h, hs.reveal_key(relay.collected("key-share commitment")))
    fp = holders[0].build_key(relay.collected("key share"))
    ct = relay.test_ciphertext(holders[0].public_key, holders[0].seed)
    holders[0].test_share(ct)
    wrong = test_vector(holders[0].seed, 8192, 562949952847873)
    wrong[5] += 1
    with pytest.raises(InvalidInputError, match="does not equal the test vector"):
        holders[0].confirm(wrong)
    assert holders[0].state == "failed" and len(fp) == 32


def test_a_holder_revealing_a_different_key_share_is_refused(ctx: ts.Context) -> None:
    _, holders, relay = _through_round_3(ctx)
    for h, hs in holders.items():
        relay.submit("key share", h, hs.reveal_key(relay.collected("key-share commitment")))
    reveals = relay.collected("key share")
    reveals[2] = holder_keygen(ctx, holders[2].seed, 2)[1]  # chosen after seeing the others' p_i
    for h in (0, 1):
        with pytest.raises(InvalidInputError, match="holder 2 does not match its commitment"):
            holders[h].build_key(reveals)
    assert not holders[0].public_key


def test_a_holder_revealing_a_different_seed_contribution_is_refused(ctx: ts.Context) -> None:
    _, holders, relay = _start(ctx)
    for h, hs in holders.items():
        relay.submit("seed commitment", h, hs.commit_seed())
    contributions = {h: hs.reveal_seed(relay.collected("seed commitment")) for h, hs in holders.items()}
    contributions[1] = secrets.token_bytes(32)  # the last revealer tries to choose the common seed
    with pytest.raises(InvalidInputError, match="seed contribution of holder 1 does not match its commitment"):
        holders[0].commit_key(contributions)
    assert holders[0].state == "seed revealed" and holders[0].secret is None


def test_a_relay_that_changes_a_holders_own_commitment_is_caught(ctx: ts.Context) -> None:
    _, holders, relay = _start(ctx)
    commits = {h: hs.commit_seed() for h, hs in holders.items()}
    commits[0] = bytes(32)
    with pytest.raises(InvalidInputError, match="relayed seed commitment of holder 0 is not the one it sent"):
        holders[0].reveal_seed(commits)


def test_a_missing_holder_stops_the_setup(ctx: ts.Context) -> None:
    _, holders, relay = _start(ctx)
    for h in (0, 1):
        relay.submit("seed commitment", h, holders[h].commit_seed())
    with pytest.raises(InvalidInputError, match="holder 2 has not sent its seed commitment: setup stopped"):
        relay.collected("seed commitment")
    partial = dict(relay.rounds["seed commitment"])
    with pytest.raises(InvalidInputError, match="holder 2 has not sent its seed commitment: setup stopped"):
        holders[0].reveal_seed(partial)  # a holder refuses a partial set whatever the relay does
    assert holders[0].state == "seed committed"
    # a holder missing later (round 4) stops it as well: no key is built from two shares
    _, holders, relay = _through_round_3(ctx)
    for h in (0, 1):
        relay.submit("key share", h, holders[h].reveal_key(relay.collected("key-share commitment")))
    with pytest.raises(InvalidInputError, match="holder 2 has not sent its key share"):
        holders[0].build_key(dict(relay.rounds["key share"]))
    with pytest.raises(InvalidInputError, match="key share from holder 7, which is not in this setup"):
        holders[0].build_key({**relay.rounds["key share"], 2: b"x", 7: b"y"})


def test_steps_out_of_order_are_refused(ctx: ts.Context) -> None:
    _, holders, _ = _start(ctx)
    with pytest.raises(InvalidInputError, match="holder 0 is at 'new'; this step needs 'key committed'"):
        holders[0].reveal_key({h: bytes(32) for h in HOLDERS})
    with pytest.raises(InvalidInputError, match="no collective key yet"):
        holders[0].test_share(b"")
    assert key_share_commitment(0, b"s" * 16, b"p") != key_share_commitment(1, b"s" * 16, b"p")


def _active(ctx: ts.Context) -> tuple[dict[int, HolderSetup], SetupRelay]:
    session, holders, relay = _through_round_3(ctx)
    for h, hs in holders.items():
        relay.submit("key share", h, hs.reveal_key(relay.collected("key-share commitment")))
    fps = {h: hs.build_key(relay.collected("key share")) for h, hs in holders.items()}
    ct = relay.test_ciphertext(holders[0].public_key, holders[0].seed)
    got = relay.combine_test(ct, {h: hs.test_share(ct) for h, hs in holders.items()}, fps[0])
    for hs in holders.values():
        hs.confirm(got.tolist())
    return holders, relay


def test_the_optional_galois_rounds_build_one_set_of_keys_every_holder_agrees_on(ctx: ts.Context) -> None:
    import tenseal.sealapi as seal

    from he_partition.he.seal_io import seal_bytes
    from he_partition.he.threshold.galois import galois_elements
    from he_partition.he.threshold.keys import encrypt_sum, load_seal

    holders, relay = _active(ctx)
    elements = galois_elements(ctx, [1])
    with pytest.raises(InvalidInputError, match="this step needs 'galois committed'"):
        holders[0].reveal_galois({})
    for h, hs in holders.items():
        relay.submit("Galois key commitment", h, hs.commit_galois(elements))
    with pytest.raises(InvalidInputError, match="one per setup"):
        holders[0].commit_galois(elements)
    commits = relay.collected("Galois key commitment")
    with pytest.raises(InvalidInputError, match="relayed Galois key commitment of holder 1 is not the one it sent"):
        holders[1].reveal_galois({**commits, 1: bytes(32)})
    for h, hs in holders.items():
        relay.submit("Galois key share", h, hs.reveal_galois(commits))
    reveals = relay.collected("Galois key share")
    rogue = {**reveals, 2: reveals[0]}
    with pytest.raises(InvalidInputError, match="holder 2 does not match its commitment"):
        holders[1].build_galois(rogue)
    digests = {h: hs.build_galois(reveals) for h, hs in holders.items()}
    assert len(set(digests.values())) == 1 and holders[0].state == "active"
    row = list(range(8192))
    ct = load_seal(seal.Ciphertext, ctx, encrypt_sum(ctx, holders[0].public_key, [row]), "ciphertext")
    seal.Evaluator(ctx.seal_context().data).rotate_rows_inplace(
        ct, 1, load_seal(seal.GaloisKeys, ctx, holders[2].galois_keys, "Galois keys"))
    raw = seal_bytes(ct)
    fp = holders[0].fingerprint
    out = combine(ctx, raw, [decryption_share(ctx, holders[h].secret, fp, raw) for h in HOLDERS], HOLDERS, fp)
    assert out.tolist() == row[1:4096] + row[:1] + row[4097:] + row[4096:4097]


def _tofn_through_dealing(ctx: ts.Context, threshold: int = 2) -> tuple[dict[int, HolderSetup], SetupRelay, bytes]:
    _, holders, relay = _through_round_3(ctx, threshold)
    for h, hs in holders.items():
        relay.submit("key share", h, hs.reveal_key(relay.collected("key-share commitment")))
    fps = {h: hs.build_key(relay.collected("key share")) for h, hs in holders.items()}
    dealt = {h: hs.deal_subshares() for h, hs in holders.items()}
    for j, hs in holders.items():
        hs.receive_subshares({i: dealt[i][j] for i in HOLDERS})
    return holders, relay, fps[0]


def test_a_t_of_n_setup_tests_every_participant_set_and_then_any_two_decrypt() -> None:
    ctx = generate_secret_context()
    holders, relay, fp = _tofn_through_dealing(ctx)
    seed = holders[0].seed
    ct = relay.test_ciphertext(holders[0].public_key, seed)
    values: list[int] = []
    for p in [(0, 1), (0, 2), (1, 2)]:
        shares = {h: holders[h].test_share(ct, p) for h in p}
        values += relay.combine_test(ct, shares, fp, p).tolist()
    with pytest.raises(InvalidInputError, match="is at 'test share issued'"):
        holders[0].test_share(ct, (0, 1))  # one test share per set
    for hs in holders.values():
        hs.confirm(values)
        assert hs.state == "active"
    from he_partition.he.threshold.context import vector_ciphertext
    from he_partition.he.threshold.shamir import participant_secret

    raw = vector_ciphertext(ts.bfv_vector(collective_context(ctx, holders[0].public_key), [7, 8, 9]).serialize())
    for p in [(0, 1), (1, 2), (0, 2)]:
        out = combine(ctx, raw, [decryption_share(ctx, participant_secret(ctx, holders[h].secret, p), fp, raw)
                                 for h in p], list(p), fp)
        assert out[:3].tolist() == [7, 8, 9]


def test_a_t_of_n_setup_refuses_a_foreign_set_a_repeat_and_inconsistent_dealing() -> None:
    ctx = generate_secret_context()
    holders, relay, fp = _tofn_through_dealing(ctx)
    ct = relay.test_ciphertext(holders[0].public_key, holders[0].seed)
    with pytest.raises(InvalidInputError, match="a set of 2 holders that holds it"):
        holders[0].test_share(ct, (1, 2))
    holders[0].test_share(ct, (0, 1))
    with pytest.raises(InvalidInputError, match="already"):
        holders[0].test_share(ct, (0, 1))
    # a dealer that sends holder 2 a sub-share off its polynomial: the set (1, 2) or (0, 2) decrypts noise
    bad_holders, bad_relay, bad_fp = _tofn_through_dealing(ctx)
    share2 = bad_holders[2]._tofn_share
    assert share2 is not None
    object.__setattr__(share2, "s_ntt", (share2.s_ntt + 1) % share2.s_ntt.max())
    bad_ct = bad_relay.test_ciphertext(bad_holders[0].public_key, bad_holders[0].seed)
    from he_partition.core.errors import ShareCombineError
    with pytest.raises(ShareCombineError):
        bad_relay.combine_test(bad_ct, {h: bad_holders[h].test_share(bad_ct, (1, 2)) for h in (1, 2)}, bad_fp, (1, 2))
    h = holders[1]
    h.state = "active"  # an active t-of-N key keeps S_j only: no Galois (or relinearization) rounds then
    with pytest.raises(InvalidInputError, match="N-of-N shares"):
        h.commit_galois([3])
    with pytest.raises(InvalidInputError, match="strict majority"):
        HolderSetup(ctx, secrets.token_bytes(16), 0, HOLDERS, 1)


def test_a_relay_choosing_the_test_ciphertext_gets_no_test_share(ctx: ts.Context) -> None:
    """The test share is the one share a holder issues without a contract; a relay that sends its own ciphertext
    there (c1 = floor(Delta / 3), `threshold_attacker.crafted_ciphertext`) would read s_i whole from it, then confirm
    the test vector (it knows the seed) and know the key it activates. A holder shares only the setup's own test
    ciphertext (p + Delta m, a), which every party computes from the public key and the seed."""
    from he_partition.he.threshold.wire import DecryptionShare

    from .threshold_attacker import N, crafted_ciphertext, secret_coefficients, secret_from_crafted_share

    session, holders, relay = _through_round_3(ctx)
    for h, hs in holders.items():
        relay.submit("key share", h, hs.reveal_key(relay.collected("key-share commitment")))
    for hs in holders.values():
        hs.build_key(relay.collected("key share"))
    crafted, c1 = crafted_ciphertext(ctx)
    try:
        raw = holders[0].test_share(crafted)
    except InvalidInputError as refused:
        assert "test ciphertext" in str(refused)
    else:
        payload = np.frombuffer(DecryptionShare.from_bytes(raw).payload, dtype="<u8").reshape(-1, N).astype(np.uint64)
        recovered = secret_from_crafted_share(ctx, payload, c1)
        assert recovered != secret_coefficients(ctx, holders[0].secret), "the relay read holder 0's s_i whole"
    # the setup's own test ciphertext is shared, and decrypts to the test vector
    ct = relay.test_ciphertext(holders[0].public_key, holders[0].seed)
    got = relay.combine_test(ct, {h: hs.test_share(ct) for h, hs in holders.items()}, holders[0].fingerprint)
    assert got.tolist() == test_vector(holders[0].seed, 8192, 562949952847873)
