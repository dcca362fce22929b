"""A deviating combiner's chosen ciphertext against a holder's share, and the holder's defence.

A holder cannot tell a measurement ciphertext's noise without s: with c1 chosen as floor(Delta / 3)
one share reveals the holder's whole s_i (`threshold_attacker.crafted_ciphertext`), its DP share
and smudging notwithstanding (the library primitive `decryption_share` still does: the first test).
The defence is in the holder (`parties.decryption.keyshare.holder.ThresholdHolder` with an
`UploadC1Book`): the owners sign their upload chunks' c1 parts, the holder keeps the per-chunk
sum over the contract's owners, the CS adds its noise to c0 only (`BfvBackend.noise_in_c0`), and
the holder refuses any other c1 before it charges its ledger or computes a share.
Real SEAL (K = 3 collective key), real TenSEAL owner uploads, real SQLite ledgers.
"""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from he_partition.core.noise_shares import discrete_laplace_share, holder_noise_source
from he_partition.he.bfv import BfvBackend
from he_partition.he.threshold.c1 import C1_MISMATCH, c1_bytes, c1_of_vector
from he_partition.he.threshold.context import collective_context, vector_ciphertext
from he_partition.he.threshold.decrypt import combine, decryption_share
from he_partition.he.threshold.wire import DecryptionShare
from parties.common.contract import StudyContract
from parties.common.errors import FailedPreconditionError
from parties.common.signing import SignatureError, generate_signing_key
from parties.decryption.keyshare.holder import ShareRequest, ThresholdHolder
from parties.decryption.keyshare.uploads import OwnerC1Parts, UploadC1Book, sign_c1_parts

from .test_threshold import HOLDERS, make_setup
from .threshold_attacker import N, crafted_ciphertext, secret_coefficients, secret_from_crafted_share

T = 562949952847873
DOMAIN = 500
OWNERS = ("a", "b", "c")


@pytest.fixture(scope="module")
def setup() -> dict[str, Any]:
    s = make_setup()
    keys = {o: generate_signing_key() for o in OWNERS}
    contract = StudyContract(study_id="cc", domain_size=DOMAIN, epsilon=1.0, expected_owners=OWNERS,
                             context_fingerprint=s["fp"].hex(), strategy="hier",
                             owner_keys={o: keys[o][1].hex() for o in OWNERS})
    public = BfvBackend(collective_context(s["ctx"], s["pk"]))
    rng = np.random.default_rng(29)
    hists = {o: rng.integers(0, 50, DOMAIN).astype(np.int64) for o in OWNERS}
    uploads = {o: public.encrypt(hists[o]) for o in OWNERS}
    parts = {o: sign_c1_parts(keys[o][0], study_id="cc", owner_id=o, idempotency_key=f"up-{o}",
                              contract_hash=contract.contract_hash,
                              parts=[c1_bytes(c1_of_vector(s["ctx"], public.serialize_chunk(c)))
                                     for c in uploads[o].chunks])
             for o in OWNERS}
    aggregate = uploads["a"]
    for o in OWNERS[1:]:
        aggregate = public.add(aggregate, uploads[o])
    return {**s, "keys": keys, "contract": contract, "public": public, "hists": hists, "parts": parts,
            "uploads": uploads, "aggregate": aggregate}


def _holder(s: dict[str, Any], tmp: Path, h: int, book: UploadC1Book | None) -> ThresholdHolder:
    holder = ThresholdHolder(s["ctx"], s["secrets"][h], len(HOLDERS), s["fp"], bytes([h + 1]) * 32,
                             tmp / f"holder{h}.sqlite", uploads=book)
    holder.register_study(s["contract"])
    return holder


def _book(s: dict[str, Any], parts: list[OwnerC1Parts] | None = None) -> UploadC1Book:
    book = UploadC1Book(s["ctx"])
    book.accept(s["contract"], parts if parts is not None else [s["parts"][o] for o in OWNERS])
    return book


def _request(s: dict[str, Any], ct: bytes, release: str = "r1") -> ShareRequest:
    c = s["contract"]
    return ShareRequest(study_id=c.study_id, contract_hash=c.contract_hash, release_id=release, release_epsilon=1.0,
                        kind="partition_sums", epsilon=1.0, sensitivity=1, slots=DOMAIN, key_fingerprint=s["fp"],
                        ciphertext=ct)


def _measured(s: dict[str, Any], noise: np.ndarray, *, c0_only: bool) -> bytes:
    """The CS's measurement chunk: aggregate + slot noise (+ flood), as SEAL bytes."""
    be: BfvBackend = s["public"]
    be.noise_in_c0 = c0_only
    try:
        (_, chunk), = be.noised_chunks(s["aggregate"], noise, keep=[0])
    finally:
        be.noise_in_c0 = False
    return vector_ciphertext(be.serialize_chunk(chunk))


def _no_share_and_no_charge(holder: ThresholdHolder) -> None:
    assert holder.ledger.charges("cc") == []
    assert holder._db.execute("SELECT COUNT(*) FROM threshold_shares").fetchone()[0] == 0


def test_the_attack_recovers_the_secret_share_it_targets(setup: dict[str, Any]) -> None:
    """The attacker double works: against the library primitive's share it recovers s_0 exactly."""
    ctx = setup["ctx"]
    ct, c1 = crafted_ciphertext(ctx)
    noise = discrete_laplace_share(Fraction(20), 3, N, holder_noise_source(b"k" * 32, 0, 3, b"crafted"))
    raw = decryption_share(ctx, setup["secrets"][0], setup["fp"], ct, dp_noise=noise)
    payload = np.frombuffer(DecryptionShare.from_bytes(raw).payload, dtype="<u8").reshape(-1, N).astype(np.uint64)
    guess = secret_from_crafted_share(ctx, payload, c1)
    truth = secret_coefficients(ctx, setup["secrets"][0])
    assert set(truth) <= {-1, 0, 1} and guess == truth


def test_a_holder_refuses_or_hides_its_secret_against_a_crafted_ciphertext(setup: dict[str, Any],
                                                                           tmp_path: Path) -> None:
    """The property the defence must give, at the holder: no share of a crafted c1, nothing charged."""
    holder = _holder(setup, tmp_path, 1, _book(setup))
    ct, c1 = crafted_ciphertext(setup["ctx"], seed=2)
    try:
        raw = holder.request_share(_request(setup, ct))
    except InvalidInputError as exc:
        assert C1_MISMATCH in str(exc)
        _no_share_and_no_charge(holder)
        return  # refused: the property holds
    payload = np.frombuffer(DecryptionShare.from_bytes(raw).payload, dtype="<u8").reshape(-1, N).astype(np.uint64)
    guess = secret_from_crafted_share(setup["ctx"], payload, c1)
    truth = secret_coefficients(setup["ctx"], setup["secrets"][1])
    assert sum(g == s for g, s in zip(guess, truth)) < N // 2 + 4 * int(np.sqrt(N))


def test_every_holder_refuses_the_crafted_c1_even_with_the_aggregate_c0(setup: dict[str, Any],
                                                                       tmp_path: Path) -> None:
    """A CS that keeps an honest c0 and swaps in its c1 (or re-encrypts its noise: a fresh c1) gets no share."""
    book = _book(setup)
    holders = [_holder(setup, tmp_path, h, book) for h in HOLDERS]
    ct, _ = crafted_ciphertext(setup["ctx"], seed=3)
    fresh = _measured(setup, np.zeros(N, dtype=np.int64), c0_only=False)  # today's K = 1 form: fresh encryption
    for h in holders:
        for bad in (ct, fresh):
            with pytest.raises(InvalidInputError, match=C1_MISMATCH):
                h.request_share(_request(setup, bad))
        _no_share_and_no_charge(h)


def test_an_honest_measurement_with_noise_on_c0_is_shared_and_decrypts(setup: dict[str, Any],
                                                                      tmp_path: Path) -> None:
    book = _book(setup)
    holders = [_holder(setup, tmp_path, h, book) for h in HOLDERS]
    cs_noise = np.random.default_rng(5).integers(-40, 40, N).astype(np.int64)
    ct = _measured(setup, cs_noise, c0_only=True)
    req = _request(setup, ct)
    shares = [h.request_share(req) for h in holders]
    got = combine(setup["ctx"], ct, shares, HOLDERS, setup["fp"])
    total = sum(setup["hists"][o] for o in OWNERS) + cs_noise[:DOMAIN]
    # the holders' DP shares sum to one discrete Laplace draw of scale 1 per measured slot
    assert np.median(np.abs(got[:DOMAIN] - total)) < 10
    assert all(len(h.ledger.charges("cc")) == 1 for h in holders)


def test_forged_swapped_or_missing_owner_parts_are_refused(setup: dict[str, Any], tmp_path: Path) -> None:
    p = setup["parts"]
    book = UploadC1Book(setup["ctx"])
    forged = OwnerC1Parts("a", p["a"].idempotency_key, p["a"].parts, bytes(64))
    with pytest.raises(SignatureError):
        book.accept(setup["contract"], [forged, p["b"], p["c"]])
    mallory = generate_signing_key()[0]
    chosen = sign_c1_parts(mallory, study_id="cc", owner_id="a", idempotency_key="up-a",
                           contract_hash=setup["contract"].contract_hash, parts=p["b"].parts)
    with pytest.raises(SignatureError):  # parts signed by a key that is not owner a's in the contract
        book.accept(setup["contract"], [chosen, p["b"], p["c"]])
    swapped = OwnerC1Parts("a", p["b"].idempotency_key, p["b"].parts, p["b"].signature)
    with pytest.raises(SignatureError):  # owner b's parts and signature forwarded as owner a's
        book.accept(setup["contract"], [swapped, p["b"], p["c"]])
    with pytest.raises(FailedPreconditionError, match="missing \\['c'\\]"):
        book.accept(setup["contract"], [p["a"], p["b"]])
    with pytest.raises(FailedPreconditionError, match="duplicated"):
        book.accept(setup["contract"], [p["a"], p["b"], p["b"]])
    holder = _holder(setup, tmp_path, 0, book)  # nothing accepted: the holder refuses every request
    with pytest.raises(FailedPreconditionError, match=C1_MISMATCH):
        holder.request_share(_request(setup, _measured(setup, np.zeros(N, dtype=np.int64), c0_only=True)))
    _no_share_and_no_charge(holder)


def test_a_cs_that_drops_an_owner_from_the_aggregate_is_refused(setup: dict[str, Any], tmp_path: Path) -> None:
    """The signed parts are all in, but the measured ciphertext sums only two owners: its c1 differs."""
    be: BfvBackend = setup["public"]
    book = _book(setup)
    holder = _holder(setup, tmp_path, 2, book)
    partial = be.add(setup["uploads"]["a"], setup["uploads"]["b"])  # owner c dropped
    be.noise_in_c0 = True
    try:
        (_, chunk), = be.noised_chunks(partial, np.zeros(N, dtype=np.int64), keep=[0])
    finally:
        be.noise_in_c0 = False
    with pytest.raises(InvalidInputError, match=C1_MISMATCH):
        holder.request_share(_request(setup, vector_ciphertext(be.serialize_chunk(chunk))))
    _no_share_and_no_charge(holder)
