"""Threshold BFV with real SEAL objects (K = 3): collective key, decryption shares, combine, refusals."""
from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tenseal.sealapi as seal

from he_partition.core.errors import InvalidInputError, ShareCombineError
from he_partition.he.bfv import FLOOD_BITS, generate_secret_context, seal_ciphertext_bytes
from he_partition.he.threshold.decrypt import combine, decryption_share
from he_partition.he.threshold.keys import (HolderSecret, collective_public_key, encrypt_sum, holder_keygen,
                                            key_fingerprint, load_seal, seal_version)
from he_partition.he.threshold.wire import key_share_commitment

SEED = b"threshold-test-seed-0123456789ab"
HOLDERS = [0, 1, 2]


def make_setup() -> dict[str, Any]:
    """K = 3 holders' secrets and key shares, the collective key and its fingerprint (also used by other tests)."""
    ctx = generate_secret_context()
    secrets_, reveals = {}, {}
    for h in HOLDERS:
        secrets_[h], reveals[h] = holder_keygen(ctx, SEED, h)
    commits = {h: key_share_commitment(h, SEED, p) for h, p in reveals.items()}
    pk_bytes = collective_public_key(ctx, SEED, commits, reveals)
    return {"ctx": ctx, "secrets": secrets_, "reveals": reveals, "commits": commits, "pk": pk_bytes,
            "fp": key_fingerprint(pk_bytes)}


@pytest.fixture(scope="module")
def setup() -> dict[str, Any]:
    return make_setup()


def _encrypted_sum(s: dict[str, Any], rows: list[list[int]], flood: bool = True) -> bytes:
    """Sum of the owners' encryptions under the collective key, plus the project's 2^61 flood."""
    ctx = s["ctx"]
    sealctx = ctx.seal_context().data
    raw_sum = encrypt_sum(ctx, s["pk"], rows)
    if not flood:
        return raw_sum
    total = load_seal(seal.Ciphertext, ctx, raw_sum, "sum")
    ev = seal.Evaluator(sealctx)
    data = sealctx.get_context_data(total.parms_id())
    moduli = [int(m.value()) for m in data.parms().coeff_modulus()]
    n = int(total.poly_modulus_degree())
    r = [secrets.randbits(FLOOD_BITS + 1) - (1 << FLOOD_BITS) for _ in range(n)]
    polys = np.zeros((2, len(moduli), n), dtype=np.uint64)
    for j, q in enumerate(moduli):
        polys[0, j] = np.array([x % q for x in r], dtype=np.uint64)
    raw = seal_ciphertext_bytes(seal_version(ctx), list(total.parms_id()), polys, ntt=False)
    ev.add_inplace(total, load_seal(seal.Ciphertext, ctx, raw, "flood"))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "o")
        total.save(path)
        return Path(path).read_bytes()


def _rows(count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(v) for v in rng.integers(0, 1 << 20, 8192)] for _ in range(count)]


def test_sum_of_ten_owners_with_flood_decrypts_exactly(setup: dict[str, Any]) -> None:
    rows = _rows(10, 1)
    ct = _encrypted_sum(setup, rows)
    shares = [decryption_share(setup["ctx"], setup["secrets"][h], setup["fp"], ct) for h in HOLDERS]
    got = combine(setup["ctx"], ct, shares, HOLDERS, setup["fp"])
    assert got.tolist() == np.sum(np.array(rows, dtype=np.int64), axis=0).tolist()


def test_missing_or_wrong_holder_secret_does_not_decrypt(setup: dict[str, Any]) -> None:
    rows = _rows(2, 2)
    ct = _encrypted_sum(setup, rows, flood=False)
    expected = np.sum(np.array(rows, dtype=np.int64), axis=0).tolist()
    other, _ = holder_keygen(setup["ctx"], SEED, 2)  # a fresh s_2' not in the collective key
    shares = [decryption_share(setup["ctx"], setup["secrets"][h], setup["fp"], ct) for h in (0, 1)]
    shares.append(decryption_share(setup["ctx"], other, setup["fp"], ct))
    with pytest.raises(ShareCombineError, match="0 bits of noise budget"):
        combine(setup["ctx"], ct, shares, HOLDERS, setup["fp"])  # refused at combine, not decoded to garbage
    assert combine(setup["ctx"], ct, shares, HOLDERS, setup["fp"], min_budget=0).tolist() != expected


def test_holder_secret_round_trips_and_refuses_malformed_bytes(setup: dict[str, Any]) -> None:
    sec = setup["secrets"][1]
    back = HolderSecret.from_bytes(setup["ctx"], sec.to_bytes())
    assert back.holder == 1 and np.array_equal(back.s_ntt, sec.s_ntt)
    # a real secret: its NTT form looks uniform (a zero or dangling-memory key would not, and would
    # still 'decrypt' exactly while hiding nothing)
    assert all(len(set(row.tolist())) > 8000 for row in sec.s_ntt)
    with pytest.raises(InvalidInputError, match="holder secret"):
        HolderSecret.from_bytes(setup["ctx"], b"garbage")
    with pytest.raises(InvalidInputError, match="shape"):
        HolderSecret.from_bytes(setup["ctx"], sec.to_bytes()[:-8])


def test_rogue_or_mislabelled_key_share_is_refused(setup: dict[str, Any]) -> None:
    rogue = dict(setup["reveals"])
    rogue[2] = holder_keygen(setup["ctx"], SEED, 2)[1]  # chosen after seeing the others' shares
    with pytest.raises(InvalidInputError, match="holder 2 does not match its commitment"):
        collective_public_key(setup["ctx"], SEED, setup["commits"], rogue)
    swapped = {0: setup["reveals"][1], 1: setup["reveals"][0], 2: setup["reveals"][2]}
    commits = {h: key_share_commitment(h, SEED, p) for h, p in swapped.items()}
    with pytest.raises(InvalidInputError, match="revealed as holder 0 names holder 1"):
        collective_public_key(setup["ctx"], SEED, commits, swapped)


def test_combine_refuses_shares_of_another_ciphertext_and_malformed_ciphertexts(setup: dict[str, Any]) -> None:
    ctx, fp = setup["ctx"], setup["fp"]
    ct1 = _encrypted_sum(setup, _rows(1, 3), flood=False)
    ct2 = _encrypted_sum(setup, _rows(1, 4), flood=False)
    shares = [decryption_share(ctx, setup["secrets"][h], fp, ct1) for h in HOLDERS]
    shares[1] = decryption_share(ctx, setup["secrets"][1], fp, ct2)
    with pytest.raises(InvalidInputError, match="holder 1 is for another ciphertext"):
        combine(ctx, ct1, shares, HOLDERS, fp)
    with pytest.raises(InvalidInputError, match="not a valid ciphertext"):
        decryption_share(ctx, setup["secrets"][0], fp, b"\x5e\xa1not a ciphertext")


@pytest.mark.statistical
def test_a_share_alone_is_uniform_whatever_the_data_and_fewer_shares_do_not_decrypt(setup: dict[str, Any]) -> None:
    """The view of the combiner holding K - 1 shares, and of anyone holding one share, carries no data.

    Datasets A and B (the key-holder tests' pair: equal partition sums, mass at each partition's first
    vs last bin). A share's residues mod each prime are uniform for both and indistinguishable from
    each other (KS tests; false alarm below 1e-9 each); the combine of 2 of the 3 shares matches the
    true slots no more than chance (1/t per slot): fails if holder 2's s_i were zero or leaked into the
    others'. What the smudging hides (the data-dependent noise, at 2^-40.4 per ciphertext) is below any
    test's power; the sampler's exactness is tested in test_threshold_wire.py.
    """
    from scipy import stats

    ctx, fp = setup["ctx"], setup["fp"]
    a = [0] * 8192
    b = [0] * 8192
    for s in range(0, 8192, 64):
        a[s], b[s + 63] = 50, 50
    moduli = [int(m.value()) for m in ctx.seal_context().data.first_context_data().parms().coeff_modulus()]
    views = []
    for x in (a, b):
        ct = _encrypted_sum(setup, [x])
        raw = decryption_share(ctx, setup["secrets"][0], fp, ct)
        h = np.frombuffer(raw[-8 * len(moduli) * 8192:], dtype="<u8").reshape(len(moduli), 8192)
        views.append(np.concatenate([h[j].astype(np.float64) / q for j, q in enumerate(moduli)]))
        for v in views[-1:]:
            assert stats.kstest(v, stats.uniform(loc=0, scale=1).cdf).pvalue > 1e-9
        partial = combine(ctx, ct, [decryption_share(ctx, setup["secrets"][h_], fp, ct) for h_ in (0, 1)], [0, 1],
                          fp, min_budget=0)
        assert int(np.count_nonzero(partial == np.array(x))) < 10
    assert stats.ks_2samp(views[0], views[1]).pvalue > 1e-9


def test_threshold_decryption_equals_single_key_decryption_of_the_same_plaintexts(setup: dict[str, Any]) -> None:
    """The K = 3 path and today's single-key TenSEAL path give the same slots for the same owners' rows."""
    import tenseal as ts

    rows = _rows(3, 5)
    ct = _encrypted_sum(setup, rows)
    shares = [decryption_share(setup["ctx"], setup["secrets"][h], setup["fp"], ct) for h in HOLDERS]
    threshold = combine(setup["ctx"], ct, shares, HOLDERS, setup["fp"]).tolist()
    single_ctx = generate_secret_context()
    total = ts.bfv_vector(single_ctx, rows[0])
    for row in rows[1:]:
        total = total + ts.bfv_vector(single_ctx, row)
    assert threshold == total.decrypt()


def test_owners_encrypt_through_unmodified_tenseal_under_the_collective_key(setup: dict[str, Any]) -> None:
    """A public TenSEAL context carrying the collective key: ts.bfv_vector encrypts, the K = 3 combine decrypts."""
    import tenseal as ts

    from he_partition.he.threshold.context import collective_context, vector_ciphertext

    public = collective_context(setup["ctx"], setup["pk"])
    assert public.is_public() and not public.has_relin_keys()
    rows = _rows(10, 6)
    total = ts.bfv_vector(public, rows[0])
    for row in rows[1:]:
        total = total + ts.bfv_vector(public, row)
    ct = vector_ciphertext(bytes(total.serialize()))
    shares = [decryption_share(setup["ctx"], setup["secrets"][h], setup["fp"], ct) for h in HOLDERS]
    got = combine(setup["ctx"], ct, shares, HOLDERS, setup["fp"])
    assert got.tolist() == np.sum(np.array(rows, dtype=np.int64), axis=0).tolist()
    with pytest.raises(InvalidInputError, match="exactly one ciphertext"):
        vector_ciphertext(b"\x0a\x02\x80\x40")
