"""Oblivious join pseudonyms through the services: an owner colluding with the computation server runs the dictionary
attack with everything both hold and recovers no identifier beyond the owner's quota of evaluations; the key holder
refuses evaluations past the quota, answers a page sent again alike, and logs every page with the study."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from he_partition.join import oprf
from he_partition.join.protocol import JoinKeyPair, oblivious_pseudonyms, oprf_input, pseudonyms
from parties.common.errors import FailedPreconditionError, ServiceError
from parties.common.join_keys import sign_join_key
from parties.data_owner.join import _key_pair, submit_join

from .conftest import Cluster
from .test_join_services import SHAPE, TERMS, _both, _records


def _open(c: Cluster, study_id: str, **extra: Any) -> Any:
    return c.open_study(study_id=study_id, domain_size=SHAPE[0] * SHAPE[1], epsilon=3.0, owners=("a", "b"),
                        strategy="join", strategy_params_json=json.dumps({**TERMS, **extra}))


def test_an_owner_colluding_with_the_cs_recovers_no_identifier_beyond_its_quota(
        secure_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = secure_cluster
    contract = _open(c, "jo", max_records=[1000, 1000])
    terms = contract.join_terms()
    assert terms.oblivious  # the key holder makes every new join study's pseudonyms oblivious
    quota = terms.evaluation_quota(0)
    assert quota == 1000 + 2 * TERMS["padding_offset"]
    keys: list[bytes] = []  # owner a hands its join key to the computation server
    derive = JoinKeyPair.join_key

    def leak(self: JoinKeyPair, *args: Any, **kwargs: Any) -> bytes:
        keys.append(derive(self, *args, **kwargs))
        return keys[-1]

    monkeypatch.setattr(JoinKeyPair, "join_key", leak)
    a, b, _ = _records()
    out = _both(c, "jo", a, b, tmp_path)
    assert all(getattr(r, "committed", False) for r in out.values()), out
    join_key = keys[0]
    raw = (c.root / "cs" / "join" / "jo" / "b.pseudonyms").read_bytes()  # what the CS holds of owner b
    b_list = {raw[i:i + 32] for i in range(0, len(raw), 32)}
    guesses = [f"cust-{i}@example.org" for i in range(2000)]  # the dictionary: b's 1,000 customers among them
    b_only = set(b) - set(a)
    # Offline, with everything the owner and the CS hold: HMAC pseudonyms (what recovered all of b's customers
    # before) match nothing.
    assert not set(pseudonyms(join_key, guesses)) & b_list
    log = c.ds.handler.evaluations
    used = log.used("jo", "a")
    assert 1000 <= used <= quota and log.used("jo", "b") >= 1000
    assert {(e.owner_id, e.page) for e in log.rows("jo")} == {("a", 0), ("b", 0)}  # one page each, logged
    # Online: owner a asks the key holder for the dictionary. Its own first page again, with other elements: refused.
    ds = c.owner("a").decryption
    assert ds is not None
    inputs = [oprf_input(g) for g in guesses]
    blinds = oprf.blind_scalars(b"attacker" * 4, len(inputs))
    blinded = oprf.blind(inputs, blinds)
    with pytest.raises(ServiceError) as err:
        ds.evaluate_pseudonyms(study_id="jo", owner_id="a", contract_hash=contract.contract_hash,
                               elements=blinded[:10])
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "evaluated once per study" in err.value.details
    # The whole dictionary in a new page: past the quota, refused whole, naming it.
    with pytest.raises(ServiceError) as err:
        ds.evaluate_pseudonyms(study_id="jo", owner_id="a", contract_hash=contract.contract_hash, elements=blinded,
                               first_page=1)
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and f"its quota is {quota}" in err.value.details
    assert log.used("jo", "a") == used
    # A page with a low-order point: INVALID_ARGUMENT, nothing booked (page 1 is answered below).
    with pytest.raises(ServiceError) as err:
        ds.evaluate_pseudonyms(study_id="jo", owner_id="a", contract_hash=contract.contract_hash,
                               elements=[blinded[1000], bytes(32)], first_page=1)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "low-order point" in err.value.details
    assert log.used("jo", "a") == used
    # Page by page until refused: every guess it gets evaluated is one of its quota.
    recovered: set[str] = set()
    page, start, step = 1, 1000, 25  # guesses it does not hold first (a's own are ids 0-999)
    while start < len(guesses):
        chunk = slice(start, start + step)
        try:
            z = ds.evaluate_pseudonyms(study_id="jo", owner_id="a", contract_hash=contract.contract_hash,
                                       elements=blinded[chunk], first_page=page)
        except ServiceError as exc:
            assert exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED and f"its quota is {quota}" in exc.details
            break
        if page == 1:  # the same page again: the same answer, nothing more booked
            before = log.used("jo", "a")
            assert ds.evaluate_pseudonyms(study_id="jo", owner_id="a", contract_hash=contract.contract_hash,
                                          elements=blinded[chunk], first_page=page) == z
            assert log.used("jo", "a") == before
        found = oblivious_pseudonyms(join_key, oprf.finalize(inputs[chunk], blinds[chunk], z))
        recovered |= {g for g, p in zip(guesses[chunk], found) if p in b_list}
        page, start = page + 1, start + step
    assert start < len(guesses)  # the quota ran out before the dictionary did
    assert log.used("jo", "a") <= quota
    assert recovered <= b_only and len(recovered) <= quota - used < len(b_only), (len(recovered), quota - used)
    # Owner b's quota is its own: a's certificate cannot spend it.
    with pytest.raises(ServiceError) as err:
        ds.evaluate_pseudonyms(study_id="jo", owner_id="b", contract_hash=contract.contract_hash,
                               elements=blinded[:1], first_page=7)
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_an_owner_refuses_an_inflated_partner_quota_before_it_sends_anything(secure_cluster: Cluster,
                                                                            tmp_path: Path) -> None:
    """The study's opener declares the colluding owner b 7,000 records against a's 1,000: b's quota of 7,172
    evaluations would let it, with the computation server, test about 6,000 guessed identifiers against a's list
    (200,000 declared recovered all 500 of a's customers b lacks). b has posted its join key, so the code before
    went on to evaluate a's page; now a's client refuses before its key, any page or upload leaves, naming both
    counts and the flag. A study with no declared counts grants b the capacity: refused alike. Run again with a
    bound that covers b's claim, a takes part and both commit (nothing was lost)."""
    c = secure_cluster
    contract = _open(c, "jq", max_records=[1000, 7000])
    allowance = 2 * TERMS["padding_offset"]
    a, b, _ = _records()
    colluder = _key_pair(tmp_path / "b", "jq", "b")  # kept where b's own client finds it on the re-run
    c.owner("b").computation.join_exchange("jq", "b", colluder.public_bytes,
                                           sign_join_key(c.signing_key("b")[0], contract, "b", colluder.public_bytes))

    def refused(study: str, held: list[str]) -> str:
        with pytest.raises(FailedPreconditionError) as err:
            submit_join(c.owner("a"), study, a, idempotency_key="k-a", state_dir=tmp_path / "a", wait_timeout=2,
                        poll_interval=0.05)
        assert "refusing to take part" in str(err.value) and "Nothing was sent" in str(err.value)
        assert c.ds.handler.evaluations.used(study, "a") == 0  # no evaluation page of a's
        # The computation server holds only b's key: no join key, pseudonyms or upload of a's.
        assert sorted(f.name for f in (c.root / "cs" / "join" / study).glob("*")) == held
        assert c.computation().study_status(study).submitted_owners == ()
        return str(err.value)

    text = refused("jq", ["b.x25519", "b.x25519.sig"])
    assert f"{7000 + allowance:,} oblivious evaluations (it declared 7,000 records)" in text, text
    assert f"your bound of {4000 + allowance:,} (4,000 records, the default 4 x your 1,000" in text, text
    assert "--max-partner-records 7000" in text and "max_partner_records=7000" in text, text
    assert not (tmp_path / "a").exists()  # not even a's join key was made
    _open(c, "jq0")  # no declared counts: each owner's quota is the capacity
    text = refused("jq0", [])
    assert "declares no record counts, so its quota is the capacity, 8,192" in text, text
    assert f"--max-partner-records {8192 - allowance}" in text, text
    out = _both(c, "jq", a, b, tmp_path, max_partner_records=7000)  # a accepts b's claim this time
    assert all(getattr(r, "committed", False) for r in out.values()), out
    assert c.ds.handler.evaluations.used("jq", "a") >= len(a)


def test_the_key_holder_refuses_hmac_pseudonyms_for_a_new_join_study(secure_cluster: Cluster) -> None:
    with pytest.raises(ServiceError) as err:
        _open(secure_cluster, "jh", pseudonyms="hmac")
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "oblivious pseudonyms" in err.value.details


def test_a_key_holder_testing_for_torsion_cannot_tell_the_padding_from_the_records() -> None:
    """The key holder's view of an owner's batch: records' blinded elements r H(x) and padding elements t G, sorted. A
    u-coordinate carries a torsion component or not, and 1 times it on the line (X25519 with `line_scalar(1)`)
    removes it: such a test tells a torsion-free element from one with torsion. Every element of the batch is
    torsion-free, so the test tells the padding from the records nowhere; a padding of raw `line_element`s (s^2:
    the decoded point plus the 2-torsion point) would have shown about 3 elements in 4 to it."""
    from parties.data_owner.join import evaluation_batch

    one = oprf.line_scalar((1).to_bytes(32, "little"))

    def torsion_free(u: bytes) -> bool:
        return oprf._multiply(one, u, "an element") == u

    inputs = [oprf_input(f"+44 7700 9{i:05d}") for i in range(200)]
    batch, _, where = evaluation_batch(b"s" * 32, inputs, pads=50)
    padding = set(range(len(batch))) - set(where)
    assert len(padding) == 50 and all(torsion_free(e) for e in batch)
    raw = [oprf.line_element(oprf.hash_to_group(b"pad" + bytes([j]))) for j in range(50)]
    assert sum(not torsion_free(u) for u in raw) > 25  # what the test would have seen of such a padding
