"""Joins at K = 3 key-share holders through real services, 3-of-3 and 2-of-3: the join's collective keys set up
at open-study (key, Galois and relinearization rounds and a test product, relayed by the computation server), the
owners' signed planes forwarded to the holders, their check among themselves, and each value decrypted from
shares the holders computed themselves; a relay that deviates, a malformed upload and an early share request are
refused."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from he_partition.he.bfv import context_fingerprint
from he_partition.he.join_scheme import JoinScheme
from parties.common.errors import ServiceError
from tests.parties.conftest import FAST_RETRY
from tests.parties.test_join_services import SHAPE, TERMS, _both, _records
from tests.parties.test_threshold_services import HOLDERS, Threshold, threshold

__all__ = ["threshold"]  # the 3-of-3 fixture, imported for the tests here

VERSION = 2  # the join scheme version new join studies use


@pytest.fixture(params=[0, 2], ids=["3-of-3", "2-of-3"])
def holders(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Threshold]:
    t = Threshold.start(tmp_path)
    try:
        t.computation().setup_key(threshold=request.param)
        yield t
    finally:
        t.stop()


def test_the_holders_set_up_a_join_key_that_every_holder_files_alike(holders: Threshold) -> None:
    fp = holders.combiner.setup_study_key("s-jk", VERSION)
    keys = [h.handler.store.study("s-jk") for h in holders.holders]
    assert all(k is not None and k.join_version == VERSION and k.fingerprint == fp for k in keys)
    assert keys[0] is not None
    assert context_fingerprint(keys[0].context) == fp
    # the key reloads from the holder's files (after a restart) as it was filed
    store = holders.holders[1].handler.store
    store._cache.clear()
    again = store.study("s-jk")
    assert again is not None and again.fingerprint == fp and again.secret.to_bytes() == keys[1].secret.to_bytes()
    # what the owners encrypt under: the join's public key with the collective Galois and relinearization keys
    scheme = JoinScheme.from_public(keys[0].context)
    assert len(scheme.serialize(scheme.encrypt(np.arange(8)))) > 0


def test_a_relay_that_changes_a_galois_share_or_mixes_the_kinds_of_setup_stops_it(holders: Threshold) -> None:
    from he_partition.he.threshold.setup import study_session

    c = holders.combiner.clients[0]
    session = study_session("s-jx", b"\x07" * 16)
    got = c.key_setup("commit_seed", session, HOLDERS, threshold=holders.combiner.tofn() or 0)
    assert got.state == "seed committed"
    with pytest.raises(ServiceError) as err:  # a join step in a study key's setup
        c.key_setup("commit_galois", session, HOLDERS)
    assert err.value.code.name == "INVALID_ARGUMENT" and "belongs to a join key's setup" in err.value.details
    with pytest.raises(ServiceError) as err:  # an unknown join scheme version
        c.key_setup("commit_seed", session, HOLDERS, threshold=holders.combiner.tofn() or 0, join_version=99)
    assert err.value.code.name == "INVALID_ARGUMENT" and "99" in err.value.details


def _open_join(t: Threshold, study_id: str = "j1") -> Any:
    from parties.common.signing import generate_signing_key

    for o in "ab":
        t.signing.setdefault(o, generate_signing_key())
    contract, _ = t.computation().open_study(
        study_id=study_id, domain_size=SHAPE[0] * SHAPE[1], epsilon=3.0, expected_owners=["a", "b"],
        strategy="join", owner_keys={o: t.signing[o][1] for o in "ab"}, strategy_params_json=json.dumps(TERMS))
    return contract


def _submit_both(t: Threshold, study_id: str, a: dict[str, int], b: dict[str, int], tmp: Path) -> dict[str, Any]:
    """Both owners' submit_join in threads, their pseudonyms from the three holders (each owner's own channels)."""
    from parties.decryption.client import DecryptionClient

    def holders(owner: str) -> list[Any]:
        got = [DecryptionClient(h.target, retry=FAST_RETRY, tls=t.pki.tls(owner, "data_owner")) for h in t.holders]
        t.clients.extend(got)
        return got

    return _both(t, study_id, a, b, tmp, key_holders=holders)


def test_a_join_released_by_three_holders_that_each_compute_and_check_it(threshold: Threshold,
                                                                         tmp_path: Path) -> None:
    """3-of-3 through real services: the join's keys set up at open-study, pseudonyms from the holders' shared
    OPRF key, the planes forwarded under the owners' signatures, checked by the holders among themselves, and each
    value decrypted from shares the holders computed themselves; each holder's ledger charged once."""
    contract = _open_join(threshold)
    assert contract.is_join and len(contract.holder_seal_keys) == 3 and not contract.seals_uploads
    assert context_fingerprint(threshold.combiner.public_context(study_id="j1")) == contract.context_fingerprint
    a, b, truth = _records()
    out = _submit_both(threshold, "j1", a, b, tmp_path)
    assert all(getattr(r, "committed", False) for r in out.values()), out
    _a_dictionary_gets_no_evaluation(threshold, contract)
    release = threshold.computation().run_release("j1", epsilon=2.5)
    assert release.state == "DONE"
    summary = release.summary
    table = np.array(summary.sums).reshape(SHAPE)
    sd = np.sqrt(summary.sum_variance[0])
    assert np.all(np.abs(table - truth) <= 8 * sd), (table, truth)
    # the holders' noise accounted for: the CS's draw and the three holders' shares (K/(K - T) = 3 draws)
    assert summary.params["holder_noise"] == {"key_holders": 3, "noise_tolerates": 2, "holder_variance_factor": 3.0}
    from he_partition.core.measurements import PartitionSums
    one_draw = PartitionSums(SHAPE[0] * SHAPE[1], 2.5, 1, starts=tuple(range(SHAPE[0] * SHAPE[1]))).noise_variance
    assert summary.sum_variance[0] == pytest.approx(4 * one_draw)
    for i in range(3):
        charges = [(c.kind, c.epsilon) for c in threshold.ledger(i).charges("j1")]
        assert charges == [("join_padding", 0.5), ("partition_sums", 2.5)], charges
    # the release spent the study's budget: each holder erased its key share and the owners' planes
    for h in threshold.holders:
        assert h.handler.store.study("j1") is None
        assert not (threshold.root / h.handler.name / "join_planes" / "j1").exists()


def _a_dictionary_gets_no_evaluation(t: Threshold, contract: Any) -> None:
    """Owner a, colluding with the CS, asks the holders for a dictionary of guesses after its submission: its
    answered page again with other elements, or a page past its quota's positions: every holder refuses, and
    each holder's book still holds a's one page."""
    from he_partition.join import oprf, toprf
    from he_partition.join.protocol import oprf_input
    from parties.decryption.client import DecryptionClient

    guesses = toprf.blind([oprf_input(f"cust-{i}@example.org") for i in range(64)], oprf.blind_scalars(b"g" * 32, 64))
    for i, h in enumerate(t.holders):
        c = DecryptionClient(h.target, retry=FAST_RETRY, tls=t.pki.tls("a", "data_owner"))
        t.clients.append(c)
        for page, code in ((0, "FAILED_PRECONDITION"), (1, "RESOURCE_EXHAUSTED")):
            with pytest.raises(ServiceError) as err:
                c.evaluate_shared(study_id="j1", owner_id="a", contract_hash=contract.contract_hash, page=page,
                                  route=[0, 1, 2], elements=guesses)
            assert err.value.code.name == code, (i, page, err.value)
        assert [(r.owner_id, r.page) for r in h.handler.evaluations.rows("j1") if r.owner_id == "a"] == [("a", 0)]


def test_a_malformed_upload_is_refused_by_the_holders_naming_its_owner(threshold: Threshold, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.parties.test_join_wellformed_services import _tamper

    contract = _open_join(threshold, "jm")
    _tamper(monkeypatch, SHAPE[1], "two-hot")  # owner b puts one record in two cells
    a, b, _ = _records()
    out = _submit_both(threshold, "jm", a, b, tmp_path)
    assert all(getattr(r, "committed", False) for r in out.values()), out
    with pytest.raises(ServiceError) as err:
        threshold.computation().run_release("jm", epsilon=2.5)
    assert err.value.code.name == "FAILED_PRECONDITION" and "owner b is not well formed" in str(err.value)
    assert "owner a" not in str(err.value)
    for i in range(3):  # nothing charged beyond the padding, nothing shared
        assert [c.kind for c in threshold.ledger(i).charges("jm")] == ["join_padding"]
    # A CS that restarts the check, to grind for a seed under which b's planes pass, gets the same seed: each
    # holder's contribution is fixed by its noise key and the planes it holds.
    from parties.decryption.keyshare.client import KeyShareClient
    from tests.parties.conftest import CS_ID

    cs = KeyShareClient(HOLDERS[0], threshold.holders[0].target, retry=FAST_RETRY,
                        tls=threshold.pki.tls(CS_ID, "computation"))
    threshold.clients.append(cs)
    commits = {cs.join_check("jm", contract.contract_hash, "seed_commit", None, [0, 1, 2]) for _ in range(2)}
    assert len(commits) == 1


def test_a_holder_shares_no_join_value_before_its_own_check_passed(threshold: Threshold) -> None:
    from he_partition.core.measurements import PartitionSums
    from parties.decryption.keyshare.client import KeyShareClient
    from tests.parties.conftest import CS_ID

    contract = _open_join(threshold, "jn")
    cs = KeyShareClient(HOLDERS[0], threshold.holders[0].target, retry=FAST_RETRY,
                        tls=threshold.pki.tls(CS_ID, "computation"))
    threshold.clients.append(cs)
    m = PartitionSums(SHAPE[0] * SHAPE[1], 2.5, 1, starts=tuple(range(SHAPE[0] * SHAPE[1])))
    with pytest.raises(ServiceError) as err:  # a CS that asks for shares with no planes and no check
        cs.join_shares(study_id="jn", release_id="r1", release_epsilon=2.5, contract_hash=contract.contract_hash,
                       measurement=m, participants=[0, 1, 2])
    assert err.value.code.name == "FAILED_PRECONDITION" and "holds no join planes" in err.value.details
    # planes the CS made up (no owner signed them), or in a non-owner's name: refused as they stream in, none kept
    from parties.decryption.keyshare.uploads import OwnerC1Parts

    made_up = [OwnerC1Parts(o, f"k-{o}", [b"\x01" * 64] * n, b"\x00" * 64) for o, n in (("a", 4), ("b", 3))]
    for planes, code in ((made_up, "UNAUTHENTICATED"), ([made_up[0], OwnerC1Parts("x", "k-x", [b"1"], b"")],
                                                         "FAILED_PRECONDITION")):
        with pytest.raises(ServiceError) as err:
            cs.send_uploads("jn", contract.contract_hash, planes, planes=True)
        assert err.value.code.name == code, err.value
    assert not (threshold.root / HOLDERS[0] / "join_planes" / "jn").exists()
    assert not any((threshold.root / HOLDERS[0] / "join_planes" / ".incoming").iterdir())
    assert [c.kind for c in threshold.ledger(0).charges("jn")] == ["join_padding"]


@pytest.mark.parametrize("holders", [2], indirect=True, ids=["2-of-3"])
def test_a_2_of_3_join_releases_with_one_holder_stopped_from_before_the_uploads(holders: Threshold,
                                                                                 tmp_path: Path) -> None:
    """Holder h2 stops once the study is open (its key set up by all three) and stays down through the uploads,
    the owners' pseudonyms (their pages go to the two holders up), the check and the release: the two others
    check the planes, each measurement is charged in the signed log with them as participants, and their shares
    combine to the table."""
    holders.fail_fast_on_stopped_holders()
    _open_join(holders)
    holders.stop_holder(1)
    a, b, truth = _records()
    out = _submit_both(holders, "j1", a, b, tmp_path)
    assert all(getattr(r, "committed", False) for r in out.values()), out
    release = holders.computation().run_release("j1", epsilon=2.5)
    assert release.state == "DONE"
    summary = release.summary
    table = np.array(summary.sums).reshape(SHAPE)
    assert np.all(np.abs(table - truth) <= 8 * np.sqrt(summary.sum_variance[0])), (table, truth)
    for i in (0, 2):
        assert [(c.kind, c.epsilon) for c in holders.ledger(i).charges("j1")] == [("join_padding", 0.5),
                                                                                 ("partition_sums", 2.5)]
    log_ = holders.combiner.charges.log("j1")
    assert [(c.entry.participants, float(c.entry.epsilon)) for c in log_] == [((0, 2), 2.5)]
    budget = holders.combiner.budget("j1")  # the signed log's spend plus the padding each holder booked at open
    assert budget.spent == pytest.approx(3.0) and budget.remaining == pytest.approx(0.0)
