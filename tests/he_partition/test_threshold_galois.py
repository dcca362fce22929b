"""Collective Galois keys: K = 3 holders' shares sum to SEAL GaloisKeys that rotate under the collective key."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tenseal.sealapi as seal

from he_partition.core.errors import InvalidInputError, ShareCombineError
from he_partition.he.seal_io import seal_bytes
from he_partition.he.threshold.decrypt import combine, decryption_share
from he_partition.he.threshold.galois import collective_galois_keys, galois_elements, holder_galois_share
from he_partition.he.threshold.keys import encrypt_sum, load_seal
from he_partition.he.threshold.wire import key_share_commitment

from .test_threshold import HOLDERS, SEED, make_setup

STEPS = [1, 0]  # a row rotation by one and the column swap


@pytest.fixture(scope="module")
def galois() -> dict[str, Any]:
    s = make_setup()
    ctx = s["ctx"]
    s["elements"] = galois_elements(ctx, STEPS)
    s["shares"] = {h: holder_galois_share(ctx, s["secrets"][h], SEED, s["elements"]) for h in HOLDERS}
    s["gcommits"] = {h: key_share_commitment(h, SEED, b) for h, b in s["shares"].items()}
    s["gk"] = collective_galois_keys(ctx, SEED, s["elements"], s["gcommits"], s["shares"])
    return s


def _rotated(s: dict[str, Any], row: list[int], gk: bytes, step: int) -> bytes:
    ctx = s["ctx"]
    ct = load_seal(seal.Ciphertext, ctx, encrypt_sum(ctx, s["pk"], [row]), "ciphertext")
    ev = seal.Evaluator(ctx.seal_context().data)
    keys = load_seal(seal.GaloisKeys, ctx, gk, "Galois keys")
    if step:
        ev.rotate_rows_inplace(ct, step, keys)
    else:
        ev.rotate_columns_inplace(ct, keys)
    return seal_bytes(ct)


def _threshold_decrypt(s: dict[str, Any], ct: bytes) -> list[int]:
    shares = [decryption_share(s["ctx"], s["secrets"][h], s["fp"], ct) for h in HOLDERS]
    return combine(s["ctx"], ct, shares, HOLDERS, s["fp"]).tolist()


def test_rotations_under_the_collective_keys_decrypt_with_the_k_shares(galois: dict[str, Any]) -> None:
    row = np.random.default_rng(11).integers(0, 1 << 40, 8192).tolist()
    top, bottom = row[:4096], row[4096:]
    assert _threshold_decrypt(galois, _rotated(galois, row, galois["gk"], 1)) == \
        top[1:] + top[:1] + bottom[1:] + bottom[:1]
    assert _threshold_decrypt(galois, _rotated(galois, row, galois["gk"], 0)) == bottom + top
    loaded = load_seal(seal.GaloisKeys, galois["ctx"], galois["gk"], "Galois keys")
    assert all(loaded.has_key(e) for e in galois["elements"]) and not loaded.has_key(5)


def test_a_rogue_galois_key_share_is_refused(galois: dict[str, Any]) -> None:
    ctx, els = galois["ctx"], galois["elements"]
    rogue = dict(galois["shares"])
    rogue[2] = holder_galois_share(ctx, galois["secrets"][2], SEED, els)  # chosen after the others were revealed
    with pytest.raises(InvalidInputError, match="holder 2 does not match its commitment"):
        collective_galois_keys(ctx, SEED, els, galois["gcommits"], rogue)
    missing = {h: b for h, b in galois["shares"].items() if h != 1}
    with pytest.raises(InvalidInputError, match="holder 1 was committed but not revealed"):
        collective_galois_keys(ctx, SEED, els, galois["gcommits"], missing)
    swapped = {0: galois["shares"][1], 1: galois["shares"][0], 2: galois["shares"][2]}
    commits = {h: key_share_commitment(h, SEED, b) for h, b in swapped.items()}
    with pytest.raises(InvalidInputError, match="revealed as holder 0 names holder 1"):
        collective_galois_keys(ctx, SEED, els, commits, swapped)
    with pytest.raises(InvalidInputError, match="not the agreed"):
        collective_galois_keys(ctx, SEED, [els[0]], galois["gcommits"], galois["shares"])
    cut = {h: b[:-8] for h, b in galois["shares"].items()}
    with pytest.raises(InvalidInputError, match="bytes, expected"):
        collective_galois_keys(ctx, SEED, els, {h: key_share_commitment(h, SEED, b) for h, b in cut.items()}, cut)
    with pytest.raises(InvalidInputError, match="distinct odd integers"):
        holder_galois_share(ctx, galois["secrets"][0], SEED, [4])


def test_a_share_over_another_common_polynomial_breaks_rotation_and_the_combine_refuses(galois: dict[str, Any]) -> None:
    """A holder that does not re-randomize to the session's common a (here: another seed) commits and reveals
    honestly, so the reveal check passes; the summed key is then not a key for s, and the rotated ciphertext's
    combined decryption has no noise budget left: refused at combine, not returned as garbage."""
    ctx, els = galois["ctx"], galois["elements"]
    shares = dict(galois["shares"])
    shares[1] = holder_galois_share(ctx, galois["secrets"][1], b"another-seed-0123456789abcdef012", els)
    commits = {h: key_share_commitment(h, SEED, b) for h, b in shares.items()}
    bad = collective_galois_keys(ctx, SEED, els, commits, shares)
    with pytest.raises(ShareCombineError, match="noise budget"):
        _threshold_decrypt(galois, _rotated(galois, list(range(8192)), bad, 1))
