"""A 2-of-3 key closes a sealed study's uploads with any two holders up, through real services (mutual TLS, gRPC on
port 0, real ciphertexts): a holder down from before the close to the end of a release loses nothing, catches up on
the same closed set, and a computation server cannot close two different sets of owners at two pairs of holders."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from parties.common.errors import ServiceError
from parties.common.sealing import open_chunk, upload_key_from_threshold_shares
from parties.common.signing import generate_signing_key

from .sealed_helpers import commitment_of
from .test_threshold_refusals import _as_computation_server
from .test_threshold_services import DOMAIN, HOLDERS, OWNERS, Threshold, _histograms


@pytest.fixture(scope="module")
def tofn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Threshold]:
    """One 2-of-3 deployment for the module's tests (each its own study; a test that stops holders restarts them)."""
    t = Threshold.start(tmp_path_factory.mktemp("tofn-close"))
    try:
        t.computation().setup_key(threshold=2)
        t.fail_fast_on_stopped_holders()
        yield t
    finally:
        t.stop()


def _participants(t: Threshold, study: str) -> list[tuple[int, ...]]:
    raw = json.loads((t.root / "cs" / "charges" / f"{study}.json").read_text())
    return [tuple(d["entry"]["participants"]) for d in raw["log"]]


def _assert_right(rel: object, truth: np.ndarray) -> None:
    """The release estimates the owners' data: every range within 8 standard errors of its noise (not noise alone)."""
    summary = rel.summary  # type: ignore[attr-defined]
    for lo, hi in [(0, DOMAIN), (0, DOMAIN // 2), (DOMAIN // 2, DOMAIN), (5, 37), (40, 41)]:
        got = summary.range_count(lo, hi)
        assert abs(got.value - truth[lo:hi].sum()) <= 8 * got.standard_error + 1, (lo, hi, got, truth[lo:hi].sum())
    assert summary.range_count(0, DOMAIN).standard_error < 0.1 * truth.sum()


@pytest.mark.slow  # about 5 s: two releases, a holder stopped and restarted twice
def test_a_holder_down_from_before_the_close_to_the_end_of_the_release_loses_nothing(tofn: Threshold) -> None:
    contract = tofn.open("s-close", epsilon=1.0)
    assert contract.sealed and contract.seal_threshold == 2  # every holder filled in its t: the owners split 2-of-3
    truth = np.sum(_histograms(), axis=0)
    tofn.stop_holder(2)
    try:
        for o, h in zip(OWNERS, _histograms()):
            tofn.owner(o).submit("s-close", h)  # the last commit closes the uploads, at h1 and h2
        tofn.cs.handler.join(timeout=60)
        assert tofn.cs.handler.sealed.opened("s-close")
        rel = tofn.computation().run_release("s-close", epsilon=0.5)
        assert rel.state == "DONE", rel.error_message
        _assert_right(rel, truth)
    finally:
        tofn.start_holder(2)
    closed = [h.handler.commitments.closed("s-close") for h in tofn.holders]
    assert sorted(closed[0]) == sorted(closed[1]) == sorted(OWNERS) and closed[2] is None  # h3 missed the close
    # h1 down now: a release needs h3, which first closes on the very set h1 and h2 closed on and takes the c1 parts
    tofn.combiner.clients[2].wait_ready(timeout=60)  # past the channel's reconnect backoff
    tofn.stop_holder(0)
    try:
        rel = tofn.computation().run_release("s-close", epsilon=0.4)
        assert rel.state == "DONE", rel.error_message
        _assert_right(rel, truth)
    finally:
        tofn.start_holder(0)
    late = tofn.holders[2].handler.commitments.closed("s-close")
    assert late is not None and sorted(late) == sorted(OWNERS)
    assert all(late[o].same(closed[1][o]) for o in OWNERS)
    assert _participants(tofn, "s-close") == [(0, 1), (0, 1), (1, 2), (1, 2)]  # two measurements per release


def test_a_cs_closing_two_owner_sets_at_two_pairs_of_holders_is_refused(tofn: Threshold, tmp_path: Path) -> None:
    """The deviating CS (the CS's certificate, played by the test) closes owners {a, b} at h1 and h2, opens their
    uploads with the two holders' shares, then asks for a set with c (committing after reading them) at h2 and h3:
    h2 refuses, so the second set never has two holders; h1 refuses too, and h3's one share says nothing."""
    contract = tofn.open("s-fork", epsilon=1.0)
    for o, h in zip(OWNERS[:2], _histograms()[:2]):  # c has not uploaded: the CS closes nothing by itself
        tofn.owner(o).submit("s-fork", h)
    store, sealed = tofn.cs.handler.store, tofn.cs.handler.sealed
    subs = sorted(store.submissions("s-fork"), key=lambda s: s.owner_id)
    first = [sealed.get("s-fork", s.owner_id, s.idempotency_key) for s in subs]
    holders = [_as_computation_server(tofn, i) for i in range(3)]
    got = {j: holders[j].close_upload_shares(contract, first) for j in (0, 1)}
    for n, s in enumerate(subs):  # two holders' shares open the first set's uploads
        key = upload_key_from_threshold_shares({j: got[j][n] for j in got}, 2)
        assert open_chunk(key, 0, store.read_chunk(s, 0), study_id="s-fork", owner_id=s.owner_id,
                          idempotency_key=s.idempotency_key, contract_hash=contract.contract_hash)
    from parties.decryption.keyshare.uploads import OwnerC1Parts
    tofn.signing.setdefault("c", generate_signing_key())
    late = commitment_of(contract, tofn.signing["c"][0], OwnerC1Parts("c", "late", (b"\5" * 64,), b""))
    second = [*first, late]
    for j in (1, 0):
        with pytest.raises(ServiceError) as err:
            holders[j].close_upload_shares(contract, second)
        assert err.value.code.name == "FAILED_PRECONDITION" and "closed on" in err.value.details
    share = holders[2].close_upload_shares(contract, second)[2]  # the one holder outside the first pair
    with pytest.raises(InvalidInputError, match="at least 2 are needed"):
        upload_key_from_threshold_shares({2: share}, 2)
    assert sorted(tofn.holders[0].handler.commitments.closed("s-fork")) == ["a", "b"]
    assert HOLDERS[2] == "h3"


def test_a_close_with_fewer_than_t_holders_up_opens_nothing_and_a_later_one_closes_on_the_same_owners(
        tofn: Threshold) -> None:
    tofn.open("s-short", epsilon=1.0)
    for o, h in zip(OWNERS[:2], _histograms()[:2]):  # c never uploads: the release is forced on a and b
        tofn.owner(o).submit("s-short", h)
    tofn.stop_holder(0)
    tofn.stop_holder(1)
    try:
        with pytest.raises(ServiceError) as err:
            tofn.computation().run_release("s-short", epsilon=0.5, force=True)
        assert "split 2-of-3 and only 1 key-share holder(s) closed" in str(err.value)
        assert "h1" in str(err.value) and "h2" in str(err.value) and "no upload was opened" in str(err.value)
        store = tofn.cs.handler.store
        assert not tofn.cs.handler.sealed.opened("s-short")
        assert all(store.read_chunk(s, 0).startswith(b"dpagg-sealed/") for s in store.submissions("s-short"))
        assert sorted(tofn.holders[2].handler.commitments.closed("s-short")) == ["a", "b"]
    finally:
        tofn.start_holder(0)
        tofn.start_holder(1)
    for c in tofn.combiner.clients:
        c.wait_ready(timeout=60)
    rel = tofn.computation().run_release("s-short", epsilon=0.5, force=True)
    assert rel.state == "DONE", rel.error_message
    _assert_right(rel, np.sum(_histograms()[:2], axis=0))
    assert all(sorted(h.handler.commitments.closed("s-short")) == ["a", "b"] for h in tofn.holders)
