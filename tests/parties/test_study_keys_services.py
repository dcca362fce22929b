"""A key per study at the key-share holders, through real services (3-of-3 and 2-of-3, mutual TLS, gRPC on port 0,
real ciphertexts, SQLite): the key shares of one study open that study only, and a ciphertext of one study replayed
into another decrypts to nothing.

The attackers: the computation server with a colluding owner that recovered one study's whole key (here: every
holder's share read from the holders' key stores, standing in for a key recovered in a study closed on the
colluder), and the same pair replaying another study's ciphertext, scaled by 1024, as the colluder's upload in a
study closed on the colluder alone.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import tenseal as ts

from he_partition.core.measurements import owner_encoding
from he_partition.he.bfv import generate_secret_context, load_context
from he_partition.he.threshold.context import vector_ciphertext
from he_partition.he.threshold.decrypt import combine, decryption_share
from he_partition.he.threshold.keys import HolderSecret
from he_partition.he.threshold.shamir import participant_secret
from parties.common.errors import ServiceError
from parties.common.signing import generate_signing_key

from .conftest import approved
from .test_threshold_services import HOLDERS, Threshold

DOMAIN = 16
OWNERS = ("a", "b")


@pytest.fixture(scope="module", params=[0, 2], ids=["3-of-3", "2-of-3"])
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Threshold]:
    t = Threshold.start(tmp_path_factory.mktemp(f"studykeys{request.param}"))
    try:
        t.computation().setup_key(threshold=request.param)
        yield t
    finally:
        t.stop()


def _open(t: Threshold, study: str, owners: tuple[str, ...] = OWNERS) -> Any:
    return t.open(study, owners, domain_size=DOMAIN)


def _recovered_shares(t: Threshold, study: str) -> dict[int, HolderSecret]:
    """Every holder's share of the key `study` is under, as its key store keeps it: the study's own key where the
    holder files one, else the collective key every study shared before keys were made per study."""
    ctx = generate_secret_context()
    out = {}
    for i, name in enumerate(HOLDERS):
        keys = t.root / name / "keys"
        own = keys / "studies" / study / "secret.bin"
        out[i] = HolderSecret.from_bytes(ctx, (own if own.exists() else keys / "threshold_secret.bin").read_bytes())
    return out


def _decrypt_with(t: Threshold, shares: dict[int, HolderSecret], fingerprint: str, chunk: bytes) -> np.ndarray:
    """What the holders' shares decrypt `chunk` to, combined as the combiner does (no integrity check: the attacker
    reads whatever comes out). 2-of-3: the Lagrange-weighted shares of holders 0 and 1."""
    ctx = generate_secret_context()
    threshold = t.combiner.tofn()
    members = [0, 1] if threshold else [0, 1, 2]
    fp = bytes.fromhex(fingerprint)
    ct = vector_ciphertext(chunk)
    secrets_ = {i: participant_secret(ctx, shares[i], tuple(members)) if threshold else shares[i] for i in members}
    parts = [decryption_share(ctx, secrets_[i], fp, ct) for i in members]
    return np.asarray(combine(ctx, ct, parts, members, fp, min_budget=0), dtype=np.int64)


def test_one_studys_key_shares_do_not_decrypt_another_studys_uploads(deployment: Threshold) -> None:
    t = deployment
    colluded = _open(t, "k-colluded", ("a",))
    other = _open(t, "k-other", OWNERS)
    hist = np.arange(DOMAIN, dtype=np.int64) % 7 + 1
    upload = t.owner("b").encrypt("k-other", hist).chunks[0]  # owner b's ciphertext: what the CS holds opened
    truth = np.asarray(owner_encoding(hist), dtype=np.int64)
    # the study's own key shares decrypt its upload (the shares read are the real ones)
    own = _decrypt_with(t, _recovered_shares(t, "k-other"), other.context_fingerprint, upload)
    assert np.array_equal(own[:truth.size], truth)
    # the colluded study's whole key does not: every slot at chance
    stolen = _decrypt_with(t, _recovered_shares(t, "k-colluded"), colluded.context_fingerprint, upload)
    assert np.mean(stolen[:truth.size] == truth) < 0.25
    assert colluded.context_fingerprint != other.context_fingerprint


def test_another_studys_ciphertext_replayed_in_a_colluders_study_gives_nothing(
        deployment: Threshold, monkeypatch: pytest.MonkeyPatch) -> None:
    t = deployment
    _open(t, "r-victim", OWNERS)
    _open(t, "r-colluder", ("x",))
    hist = np.arange(DOMAIN, dtype=np.int64) % 5 + 2
    victim = t.owner("a").encrypt("r-victim", hist)  # the victim's upload, as the CS holds it opened
    ctx = load_context(t.computation().public_context(study_id="r-victim"))
    replayed = tuple((ts.bfv_vector_from(ctx, c) * 1024).serialize() for c in victim.chunks)
    colluder = t.owner("x")
    real = colluder.encrypt
    monkeypatch.setattr(colluder, "encrypt", lambda study, h, **kw: dataclasses.replace(real(study, h, **kw),
                                                                                          chunks=replayed))
    colluder.submit("r-colluder", np.zeros(DOMAIN, dtype=np.int64))
    # the deviating combiner reads whatever the shares combine to: no integrity or magnitude check
    import parties.computation.threshold.decryption as relay
    real_combine = relay.combine
    monkeypatch.setattr(relay, "combine", lambda *a, **kw: real_combine(*a, **{**kw, "min_budget": 0}))
    monkeypatch.setattr(relay, "refuse_implausible", lambda values: None)
    try:
        rel = t.computation().run_release("r-colluder", epsilon=1.0)
    except ServiceError as refused:  # nothing released
        assert "r-colluder" in str(refused) or "decod" in str(refused), refused
        return
    got = np.array([round(rel.summary.range_count(i, i + 1).value / 1024) for i in range(DOMAIN)])
    assert np.mean(got == hist) < 0.25, got  # 1024 x the victim's bins do not come out


def test_a_study_opened_directly_at_a_holder_without_its_own_key_is_refused(deployment: Threshold) -> None:
    """A CS that skips the study's key setup (to open it under a key another study has) gets no study."""
    combiner = deployment.combiner
    seals = [c.key_setup("status", b"", combiner.names).seal_public_key for c in combiner.clients]
    with pytest.raises(ServiceError, match="no key for study"):
        terms: dict[str, Any] = dict(study_id="k-nokey", domain_size=DOMAIN, epsilon=1.0, expected_owners=["a"],
                                     strategy="hier", noise_tolerates=1 if combiner.tofn() else 2,
                                     owner_keys={"a": generate_signing_key()[1]})
        # even with the operator's approval (what it asks is refused for the key, not the terms)
        combiner.clients[0].open_study(**terms, holder_seal_keys=seals, approval=approved(**terms))


def test_a_study_that_spent_its_budget_loses_its_key_shares(deployment: Threshold, tmp_path: Path) -> None:
    t = deployment
    _open(t, "k-ends", OWNERS)
    for o in OWNERS:
        t.owner(o).submit("k-ends", np.ones(DOMAIN, dtype=np.int64))
    assert all((t.root / n / "keys" / "studies" / "k-ends" / "secret.bin").exists() for n in HOLDERS)
    assert t.computation().run_release("k-ends", epsilon=0.5).state == "DONE"
    assert all((t.root / n / "keys" / "studies" / "k-ends").exists() for n in HOLDERS)  # half spent: kept
    assert t.computation().run_release("k-ends", epsilon="rest").state == "DONE"
    participants = [n for i, n in enumerate(HOLDERS) if (t.root / n / "keys" / "studies" / "k-ends").exists()]
    # the holders that answered the last measurement erased their share once it was issued
    assert len(participants) <= (3 - (t.combiner.tofn() or 3)), participants


def test_a_legacy_collective_key_keeps_the_studies_opened_under_it(tmp_path: Path) -> None:
    """Holders that set up one collective key before keys were made per study (their key stores written here as that
    code wrote them, the study opened in their ledgers under that key) keep releasing that study after the upgrade;
    a study opened afterwards gets its own key."""
    import json
    import secrets

    from he_partition.he.bfv import context_fingerprint
    from he_partition.he.threshold.context import collective_context_bytes
    from he_partition.he.threshold.setup import HolderSetup, SetupRelay
    from parties.common.util import write_private_file

    from .test_threshold_services import OWNERS as ALL, DOMAIN as WIDE, _histograms

    ctx, session, ids = generate_secret_context(), secrets.token_bytes(16), [0, 1, 2]
    setups, relay = {h: HolderSetup(ctx, session, h, ids) for h in ids}, SetupRelay(ctx, session, ids)
    for name, call in (("c", lambda s: s.commit_seed()), ("r", lambda s: s.reveal_seed(relay.collected("c"))),
                       ("k", lambda s: s.commit_key(relay.collected("r"))),
                       ("p", lambda s: s.reveal_key(relay.collected("k")))):
        for h, s in setups.items():
            relay.submit(name, h, call(s))
    for s in setups.values():
        s.build_key(relay.collected("p"))
    public = setups[0].public_key
    legacy = context_fingerprint(collective_context_bytes(public))
    for i, name in enumerate(HOLDERS):
        keys = tmp_path / name / "keys"
        write_private_file(keys / "threshold_secret.bin", setups[i].secret.to_bytes())
        (keys / "collective_key.bin").write_bytes(public)
        (keys / "collective.json").write_text(json.dumps({"holders": list(HOLDERS), "index": i, "fingerprint": legacy}))
    t = Threshold.start(tmp_path)
    try:
        assert all(h.handler.active.fingerprint == legacy for h in t.holders)
        t.computation().setup_key()  # records the deployment (N-of-N, as the legacy key); the legacy key stays
        for o in ALL:
            t.signing.setdefault(o, generate_signing_key())
        terms = dict(study_id="s-legacy", domain_size=WIDE, epsilon=1.0, expected_owners=list(ALL), strategy="hier",
                     owner_keys={o: t.signing[o][1].hex() for o in ALL}, noise_tolerates=2,
                     holder_seal_keys=tuple(h.handler.seal.public_hex for h in t.holders))
        for h in t.holders:  # opened before the upgrade, under the one collective key
            h.handler.require_active().open_study(**terms, key_fingerprint=legacy, approval=approved(**terms))
        contract = t.open_and_submit("s-legacy")  # the CS finds it at every holder: no new key
        assert contract.context_fingerprint == legacy
        rel = t.computation().run_release("s-legacy", epsilon=1.0)
        truth = np.sum(_histograms(), axis=0)
        assert rel.state == "DONE" and abs(rel.summary.range_count(0, WIDE).value - truth.sum()) < 0.1 * truth.sum()
        assert t.open_and_submit("s-new").context_fingerprint not in (legacy, contract.context_fingerprint)
        assert all(h.handler.active is not None for h in t.holders)  # a legacy study's end keeps the shared key
    finally:
        t.stop()
