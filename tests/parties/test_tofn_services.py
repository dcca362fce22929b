"""A 2-of-3 key through real services (mutual TLS, gRPC on port 0, real ciphertexts, SQLite): any one holder down
still releases, two down are refused before anything is charged, and no routing of the release overspends."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from parties.common.errors import ServiceError
from parties.decryption.keyshare.charges import ChargeRules, SignedCharge

from .test_threshold_services import HOLDERS, Threshold, _histograms


@pytest.fixture(scope="module")
def tofn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Threshold]:
    """One 2-of-3 deployment for the module's tests (each its own study; a test that stops holders restarts them)."""
    t = Threshold.start(tmp_path_factory.mktemp("tofn"))
    try:
        c = t.computation()
        fp, names, already = c.setup_key(threshold=2)
        assert not already and names == HOLDERS and c.key_threshold == 2
        t.fail_fast_on_stopped_holders()
        yield t
    finally:
        t.stop()


def _wait_forwarded(t: Threshold, study: str) -> None:
    """Wait for the uploads to be closed (every holder's upload-key share) and the c1 parts forwarded."""
    for th in list(t.cs.handler._threads):
        th.join(60)
    t.combiner._await_forward(study)


def _log(t: Threshold, study: str) -> list[SignedCharge]:
    raw = json.loads((t.root / "cs" / "charges" / f"{study}.json").read_text())
    return [SignedCharge.from_dict(d) for d in raw["log"]]


def _rules(t: Threshold) -> ChargeRules:
    """The charge rules from a holder's recorded identity keys (each 32-byte seal key, then 32-byte signing key)."""
    identities = json.loads((t.root / "h1" / "keys" / "deployment.json").read_text())["identities"]
    return ChargeRules({int(i): bytes.fromhex(v)[32:] for i, v in identities.items()}, 2)


def test_setup_fixes_the_deployment_a_study_gets_its_own_shamir_key_and_a_restart_finds_both(tofn: Threshold) -> None:
    digest, names, already = tofn.computation().setup_key(threshold=2)
    assert already
    meta = json.loads((tofn.root / "h2" / "keys" / "deployment.json").read_text())
    assert meta["threshold"] == 2 and len(meta["identities"]) == 3 and meta["identities_sha256"] == digest
    contract = tofn.open_and_submit("s-key")
    key = tofn.holders[1].handler.study_key("s-key")
    assert key is not None and key.fingerprint == contract.context_fingerprint
    assert (tofn.root / "h2" / "keys" / "studies" / "s-key" / "secret.bin").stat().st_mode & 0o777 == 0o600
    tofn.stop_holder(1)
    tofn.start_holder(1)
    assert tofn.holders[1].handler.threshold == 2
    assert tofn.holders[1].handler.study_key("s-key").fingerprint == contract.context_fingerprint
    with pytest.raises(ServiceError, match="deployed with threshold 2 of 3"):
        tofn.computation().setup_key(threshold=3)


def test_any_one_holder_down_releases_and_two_down_are_refused_before_any_charge(tofn: Threshold) -> None:
    tofn.open_and_submit("s1", epsilon=1.0)
    _wait_forwarded(tofn, "s1")
    truth = np.sum(_histograms(), axis=0)
    for down in (0, 1, 2):
        tofn.stop_holder(down)
        try:
            rel = tofn.computation().run_release("s1", epsilon=0.3)
            assert rel.state == "DONE", rel.error_message
            total = rel.summary.range_count(0, len(truth)).value
            assert abs(total - truth.sum()) < 0.1 * truth.sum()  # a noisy release of the data, not noise
            # each value carries the CS's draw and t = 2 holders' shares drawn for t - T = 1: 2 draws' variance
            assert rel.summary.params["holder_noise"] == {"key_holders": 2, "noise_tolerates": 1,
                                                          "holder_variance_factor": 2.0}
        finally:
            tofn.start_holder(down)
    log = _log(tofn, "s1")
    assert _rules(tofn).check_log("s1", log) == pytest.approx(0.9, abs=1e-9)
    sets = [c.entry.participants for c in log]  # two measurements per release, each to the two holders up
    assert sets == [(1, 2), (1, 2), (0, 2), (0, 2), (0, 1), (0, 1)]
    # a fourth release would pass the budget: the computation server refuses it, and so does every holder asked
    # directly (a deviating server) to sign a charge past the budget on the whole log, with any participants
    with pytest.raises(ServiceError, match="RESOURCE_EXHAUSTED"):
        tofn.computation().run_release("s1", epsilon=0.3)
    assert len(_log(tofn, "s1")) == len(log)
    from fractions import Fraction
    from parties.decryption.keyshare.charges import ChargeEntry, dump_log
    entry = ChargeEntry("s1", len(log), log[-1].entry.digest(), "rogue", Fraction(3, 10), (0, 1))
    for c in tofn.combiner.clients:  # the restarted holders: past the channels' reconnect backoff
        c.wait_ready(timeout=60)
    for i in range(3):
        with pytest.raises(ServiceError, match="RESOURCE_EXHAUSTED.*does not fit"):
            tofn.combiner.clients[i].sign_charge("s1", json.dumps(entry.to_dict()), dump_log(log))
        with pytest.raises(ServiceError, match="FAILED_PRECONDITION.*omits charge"):  # a log without the charges
            tofn.combiner.clients[i].sign_charge("s1", json.dumps(ChargeEntry("s1", 0, "", "rogue", Fraction(3, 10),
                                                                              (0, 1)).to_dict()), "[]")
    # two holders down: refused before anything is charged, naming the missing holders
    tofn.open_and_submit("s2", epsilon=1.0)
    _wait_forwarded(tofn, "s2")
    tofn.stop_holder(0)
    tofn.stop_holder(2)
    try:
        with pytest.raises(ServiceError, match="UNAVAILABLE.*needs 2 of 3.*missing: h1, h3.*nothing was charged"):
            tofn.computation().run_release("s2", epsilon=0.5)
        assert not (tofn.root / "cs" / "charges" / "s2.json").exists() or not _log(tofn, "s2")
        assert all(not h.handler.charges.view("s2")["signed"] for h in tofn.holders[1:2])
    finally:
        tofn.start_holder(0)
        tofn.start_holder(2)


def test_direct_queries_with_one_holder_down_are_charged_range_by_range_in_the_log(tofn: Threshold) -> None:
    tofn.open_and_submit("s3", epsilon=1.0)
    _wait_forwarded(tofn, "s3")
    truth = np.sum(_histograms(), axis=0)
    tofn.stop_holder(0)
    try:
        got = tofn.computation().direct_range_counts("s3", [(0, 10), (5, 40), (17, 64)], 0.1, request_key="q1")
        again = tofn.computation().direct_range_counts("s3", [(0, 10), (5, 40), (17, 64)], 0.1, request_key="q1")
    finally:
        tofn.start_holder(0)
    for c, (lo, hi) in zip(got.counts, [(0, 10), (5, 40), (17, 64)]):
        assert abs(c.value - truth[lo:hi].sum()) < 200  # scale c / 0.1 = 10 per draw: the data, not noise
    assert [c.value for c in again.counts] == [c.value for c in got.counts] and again.epsilon_charged == 0
    log = _log(tofn, "s3")
    assert len(log) == 3 and all(c.entry.participants == (1, 2) for c in log)
    assert float(sum(c.entry.epsilon for c in log)) == pytest.approx(0.3)  # each range in full
    with pytest.raises(ServiceError, match="RESOURCE_EXHAUSTED.*each range in full"):
        tofn.computation().direct_range_counts("s3", [(0, 10)] * 8, 0.1)  # 0.8 more does not fit 0.7 left
    assert len(_log(tofn, "s3")) == 3


def test_a_release_and_direct_queries_with_one_holder_down_equal_the_single_key_path_once_the_draws_are_counted(
        tmp_path: Path) -> None:
    """Same data and computation-server seed through one decryption server and through a 2-of-3 key with holder
    h1 stopped (a release, then three direct range counts): for every measurement, the decrypted values minus the
    holder-side noise (the single server's keyed draw; the two participants' keyed shares, recomputed from their
    noise keys, the request label and the participant set) are equal value for value."""
    from he_partition.core.noise_shares import discrete_laplace_share, holder_noise_source

    from .conftest import Cluster
    from .test_threshold_services import OWNERS, DOMAIN, _Spy, _holder_label, _noise_key, _single_holder_draw

    single = Cluster.start(tmp_path / "k1", cs_seed=12, secure=True)
    try:
        spy1 = _Spy(single.cs.handler.decryption)
        single.open_study(study_id="s-eq", domain_size=DOMAIN, epsilon=1.0, owners=OWNERS, strategy="hier")
        for o, h in zip(OWNERS, _histograms()):
            single.owner(o).submit("s-eq", h)
        assert single.computation().run_release("s-eq", epsilon=0.5).state == "DONE"
        single.computation().direct_range_counts("s-eq", [(0, 10), (5, 40), (17, 64)], 0.1)
    finally:
        single.stop(drop_pending_folds=True)
    t = Threshold.start(tmp_path / "t2", cs_seed=12)
    try:
        t.computation().setup_key(threshold=2)
        t.fail_fast_on_stopped_holders()
        spy2 = _Spy(t.combiner)
        t.open_and_submit("s-eq")
        _wait_forwarded(t, "s-eq")
        t.stop_holder(0)
        assert t.computation().run_release("s-eq", epsilon=0.5).state == "DONE"
        t.computation().direct_range_counts("s-eq", [(0, 10), (5, 40), (17, 64)], 0.1)
    finally:
        t.stop()
    assert len(spy1.calls) == len(spy2.calls) >= 5
    drawn = 0
    for (kw1, v1), (kw2, v2) in zip(spy1.calls, spy2.calls):
        assert kw1["measurement"].to_dict() == kw2["measurement"].to_dict()
        m = kw2["measurement"]
        label = b"dp/" + _holder_label(kw2) + b"|participants=1,2"
        own2 = sum(discrete_laplace_share(m.scale, 1, m.count, holder_noise_source(
            _noise_key(tmp_path / "t2" / HOLDERS[j]), j, 3, label)) for j in (1, 2))
        own1 = _single_holder_draw(tmp_path / "k1", kw1)
        assert (v1 - own1).tolist() == (v2 - own2).tolist()
        # The holders' noise is really there: a draw of one value (a direct range count) is 0 with probability
        # about 5 % at this scale, so a short measurement may show none; the run as a whole must.
        assert np.count_nonzero(own2) > 0 or len(own2) < 3
        drawn += int(np.count_nonzero(own2))
    assert drawn > 0


def test_dpagg_budget_shows_each_holders_view_of_the_charge_log(tofn: Threshold) -> None:
    from parties.cli.budgets import HolderView, budget_json, budget_lines
    from parties.decryption.client import DecryptionClient

    tofn.open_and_submit("s4", epsilon=1.0)
    _wait_forwarded(tofn, "s4")
    tofn.stop_holder(2)
    try:
        assert tofn.computation().run_release("s4", epsilon=0.4).state == "DONE"
    finally:
        tofn.start_holder(2)
    views = []
    for name, h in zip(HOLDERS, tofn.holders):
        with DecryptionClient(h.target, tls=tofn.pki.tls("op", "operator")) as c:
            views.append(HolderView(name, h.target, c.budget("s4")))
    lines = budget_lines("s4", views)
    text = "\n".join(lines)
    assert "its view of the signed charge log (2-of-N key): 2 charge(s), 0.4 spent; it signed position(s) 0, 1" in text
    assert "its view of the signed charge log (2-of-N key): 0 charge(s), 0 spent; it signed position(s) none" in text
    assert "the longest view a holder verified has 2 charge(s), 0.4 of 1 spent" in text
    report = budget_json("s4", views)
    assert report["agree"] and report["holders"]["h1"]["charge_log"]["signed"] == [0, 1]


def test_a_charge_short_of_signatures_is_completed_by_the_next_request_not_replaced(tofn: Threshold) -> None:
    """h2 fails while signing the first charge (h1 signed it): the release fails and nothing is decrypted; h1 will
    sign no other entry at that position, so the next request first completes the pending charge with the holders
    that answer, then charges itself after it. The log stays one valid chain."""
    import grpc

    tofn.open_and_submit("s5", epsilon=1.0)
    _wait_forwarded(tofn, "s5")
    client = tofn.combiner.clients[1]
    real = client.sign_charge

    def fail_once(*a: object, **kw: object) -> bytes:
        client.sign_charge = real  # type: ignore[method-assign]
        raise ServiceError(grpc.StatusCode.UNAVAILABLE, "h2 went away while signing")

    client.sign_charge = fail_once  # type: ignore[method-assign]
    failed = tofn.computation().run_release("s5", epsilon=0.4)
    assert failed.state == "FAILED" and "1 of the 2 holder signatures" in failed.error_message
    assert "h2 went away" in failed.error_message and "nothing was decrypted" in failed.error_message
    pending = json.loads((tofn.root / "cs" / "charges" / "s5.json").read_text())["pending"]
    assert pending and pending["entry"]["index"] == 0
    rel = tofn.computation().run_release("s5", epsilon=0.4)
    assert rel.state == "DONE", rel.error_message
    log = _log(tofn, "s5")
    _rules(tofn).check_log("s5", log)
    assert log[0].entry.request == pending["entry"]["request"] and len(log) == 3  # the pending one, then 2


def test_the_computation_server_alone_opens_no_study_at_a_holder_of_a_t_of_n_key(tofn: Threshold) -> None:
    """2 of 3: the CS's own study (an owner whose key it made) is refused by every holder; none stores it."""
    from parties.common.errors import NotFoundError
    from parties.common.signing import generate_signing_key

    from .test_threshold_refusals import _as_computation_server

    seals = [h.handler.seal.public_hex for h in tofn.holders]
    for i in range(len(HOLDERS)):
        with pytest.raises(ServiceError) as err:
            _as_computation_server(tofn, i).open_study(
                study_id="s-ghost", domain_size=64, epsilon=0.25, expected_owners=["ghost"], strategy="gap",
                owner_keys={"ghost": generate_signing_key()[1]}, holder_seal_keys=seals, noise_tolerates=1)
        assert err.value.code.name == "PERMISSION_DENIED" and "no operator approval" in err.value.details
        with pytest.raises(NotFoundError):
            tofn.ledger(i).get_study("s-ghost")


FAILOVER_DOMAIN = 3 * 8192  # three chunks per measurement: a participant can be lost after its first


def _submit_wide(t: Threshold, study: str, epsilon: float) -> np.ndarray:
    """Open `study` over FAILOVER_DOMAIN bins and have every owner submit; the true sums."""
    rng = np.random.default_rng(31)
    hists = [rng.integers(0, 40, size=FAILOVER_DOMAIN).astype(np.int64) for _ in range(3)]
    t.open(study, epsilon=epsilon, domain_size=FAILOVER_DOMAIN)
    for o, h in zip(("a", "b", "c"), hists):
        t.owner(o).submit(study, h)
    _wait_forwarded(t, study)
    return np.sum(hists, axis=0)


def _lose_after_first_share(t: Threshold, i: int, seen: dict[str, Any]) -> None:
    """Holder i's gRPC server stops (no grace: its calls are cut) as soon as its first share of the next measurement
    reached the computation server; the request it was serving is kept in `seen`."""
    client = t.combiner.clients[i]
    real = client.issue_shares

    def losing(**kw: Any) -> Any:
        client.issue_shares = real  # type: ignore[method-assign]
        seen.update(kw)
        on_share = kw["on_share"]

        def first(j: int, share: bytes) -> None:
            on_share(j, share)
            if "lost_after" not in seen:
                seen["lost_after"] = j
                t.holders[i].stop(grace=0)

        return real(**{**kw, "on_share": first})

    client.issue_shares = losing  # type: ignore[method-assign]


def _no_outage_wait(t: Threshold) -> list[float]:
    """No riding out of a holder's outage (a lost participant fails over at once); the windows before."""
    saved = [c.outage_seconds for c in t.combiner.clients]
    for c in t.combiner.clients:
        c.outage_seconds = 0.0
    return saved


def test_a_participant_lost_mid_measurement_fails_over_to_another_t_set_and_nothing_is_overspent(
        tofn: Threshold) -> None:
    """2 of 3, every holder up: the first measurement goes to (h1, h2); h2's server stops after its first share of
    three. The release completes with (h1, h3): the lost measurement is decrypted again under a charge of its own,
    the log stays one valid chain within the budget, and the CS's view, every holder's ledger and the log agree."""
    from fractions import Fraction

    from parties.decryption.keyshare.charges import ChargeEntry, charge_request, dump_log
    from parties.common.contract import canonical_json

    truth = _submit_wide(tofn, "s-fo", epsilon=1.0)
    seen: dict[str, Any] = {}
    saved = _no_outage_wait(tofn)
    _lose_after_first_share(tofn, 1, seen)
    try:
        rel = tofn.computation().run_release("s-fo", epsilon=0.4)
    finally:
        for c, w in zip(tofn.combiner.clients, saved):
            c.outage_seconds = w
        tofn.start_holder(1)
    assert seen.get("lost_after") == 0 and seen["participants"] == [0, 1]
    assert rel.state == "DONE", rel.error_message
    assert abs(rel.summary.range_count(0, FAILOVER_DOMAIN).value - truth.sum()) < 0.05 * truth.sum()
    notes = rel.summary.params["holder_failover"]
    assert len(notes) == 1 and "key-share holder(s) h2 lost during measurement" in notes[0]
    assert "continued with {h1, h3}" in notes[0] and "nothing was decrypted twice without a charge" in notes[0]
    log = _log(tofn, "s-fo")
    total = _rules(tofn).check_log("s-fo", log)  # one valid chain
    first = log[0].entry
    assert first.participants == (0, 1) and log[1].entry.participants == (0, 2)
    assert log[1].entry.epsilon == first.epsilon  # the lost measurement, charged again for its new set
    assert all(c.entry.participants == (0, 2) for c in log[1:])
    # the release's 0.4 (its measurements' float split, exactly) and the re-decrypted measurement, nothing more
    assert abs(total - first.epsilon - Fraction(4, 10)) < Fraction(1, 10**12) and total <= 1
    view = tofn.combiner.budget("s-fo")
    assert view.spent == float(total) and Fraction(repr(view.available)) <= 1 - total
    assert float(1 - total) - view.available < 1e-15
    # every holder's own ledger holds the requests it answered, and none more than the log
    for i in range(3):
        assert sum(Fraction(repr(c.epsilon)) for c in tofn.ledger(i).charges("s-fo")) <= total
    # the routing double's new moves: the lost request's shares from the new set without a charge of its own
    m = seen["measurement"]
    request = charge_request("s-fo", seen["release_id"], float(seen["release_epsilon"]), canonical_json(m.to_dict()))
    assert request == first.request
    for c in tofn.combiner.clients:
        c.wait_ready(timeout=60)
    for i in (0, 2):  # asked under the first charge for the other set: the charge fixed (h1, h2)
        with pytest.raises(ServiceError, match="FAILED_PRECONDITION.*(fixed|not one of them)"):
            tofn.combiner.clients[i].issue_shares(study_id="s-fo", release_id=seen["release_id"],
                                                  release_epsilon=seen["release_epsilon"], measurement=m,
                                                  chunk_count=seen["chunk_count"], contract_hash=seen["contract_hash"],
                                                  charge_log=dump_log(log), participants=[0, 2])
        again = ChargeEntry("s-fo", len(log), log[-1].entry.digest(), request, first.epsilon, (0, 2))
        with pytest.raises(ServiceError, match="FAILED_PRECONDITION.*already charged"):  # a second entry, same request
            tofn.combiner.clients[i].sign_charge("s-fo", json.dumps(again.to_dict()), dump_log(log))
    assert len(_log(tofn, "s-fo")) == len(log)


def test_a_failed_release_holds_nothing_and_every_view_of_what_is_left_agrees(tofn: Threshold) -> None:
    """2 of 3 with h3 down: h2 is lost after its first share and no t-set is left. The release fails naming both,
    with nothing overspent; its charged measurement stays spent and nothing else is held: the CS's budget, each
    holder that verified the log, a direct query's refusal and the next release all see the same exact figure."""
    from fractions import Fraction

    from parties.decryption.client import DecryptionClient

    _submit_wide(tofn, "s-fv", epsilon=1.0)
    saved = _no_outage_wait(tofn)
    tofn.stop_holder(2)
    _lose_after_first_share(tofn, 1, {})
    try:
        failed = tofn.computation().run_release("s-fv", epsilon=0.4)
    finally:
        for c, w in zip(tofn.combiner.clients, saved):
            c.outage_seconds = w
        tofn.start_holder(1)
        tofn.start_holder(2)
    assert failed.state == "FAILED" and failed.error_code == "UNAVAILABLE"
    assert "key-share holder(s) h2 lost during measurement" in failed.error_message
    assert "h3" in failed.error_message and "Nothing was overspent" in failed.error_message
    log = _log(tofn, "s-fv")
    spent = _rules(tofn).check_log("s-fv", log)
    assert len(log) == 1 and spent == log[0].entry.epsilon  # the measurement it charged, nothing more
    for c in tofn.combiner.clients:
        c.wait_ready(timeout=60)
    cs = tofn.combiner.budget("s-fv")
    assert Fraction(repr(cs.spent)) == spent and Fraction(repr(cs.reserved)) == spent  # the failed release holds 0
    assert Fraction(repr(cs.available)) == 1 - spent
    views = []
    for h in tofn.holders:
        with DecryptionClient(h.target, tls=tofn.pki.tls("op", "operator")) as c:
            views.append(c.budget("s-fv"))
    for v in views[:2]:  # h1 and h2 verified the whole log: their view is the CS's, to the bit
        assert (v.charge_log_entries, v.available, v.reserved) == (1, cs.available, cs.reserved)
    assert views[2].charge_log_entries == 0  # h3 was down: its view lags until its next request
    # `dpagg budget` says so: the CS's log (read through the CS) is ahead of h3's view, with what is left exactly
    from parties.cli.budgets import HolderView, budget_json, budget_lines, log_status_line
    cs_log = tofn.computation().charge_log("s-fv")
    assert cs_log == (1, str(spent))
    hv = [HolderView(n, h.target, v) for n, h, v in zip(HOLDERS, tofn.holders, views)]
    text = "\n".join(budget_lines("s-fv", hv, None, cs_log))
    assert "signed charge log: 1 charge(s), 0.1 of 1 spent, 0.9 left" in text and "AHEAD of the view of h3" in text
    assert budget_json("s-fv", hv, None, cs_log)["computation_log"]["ahead_of"] == ["h3"]
    assert log_status_line(1.0, cs_log).startswith("budget: spent 0.1 of 1, 0.9 left")  # `dpagg status`
    assert 1 - spent == Fraction(9, 10)  # the first of the release's two measurements: 0.1
    with pytest.raises(ServiceError, match=r"RESOURCE_EXHAUSTED.*leaves 0\.9 of 1;"):
        tofn.computation().direct_range_counts("s-fv", [(0, 10)] * 10, 0.1)  # 1.0 does not fit
    rest = tofn.computation().run_release("s-fv", epsilon=float(1 - spent))  # exactly what every view leaves
    assert rest.state == "DONE", rest.error_message
    total = _rules(tofn).check_log("s-fv", _log(tofn, "s-fv"))
    assert 1 - Fraction(1, 10**12) < total <= 1
