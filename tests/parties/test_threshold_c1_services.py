"""The key-share holders compute on the owners' signed c1 only, through the real services.

K = 3 holders and a computation server in threshold mode over mutual TLS (the fixture of
test_threshold_services.py): real gRPC servers on port 0, real TenSEAL owner uploads, real SQLite
ledgers. A deviating computation server is played by a client holding the CS's certificate.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from he_partition.he.bfv import BfvBackend, _CiphertextCodec, load_context
from parties.common.errors import ServiceError
from parties.computation.threshold.c1_forward import owner_c1_parts
from parties.decryption.keyshare.uploads import OwnerC1Parts

from .test_threshold_refusals import _as_computation_server
from .test_threshold_services import HOLDERS, OWNERS, Threshold, _spent, _Spy, threshold

__all__ = ["threshold"]  # the fixture, imported for these tests


def _honest_request(t: Threshold, study: str) -> dict[str, Any]:
    t.open_and_submit(study)
    spy = _Spy(t.combiner)
    assert t.computation().run_release(study, epsilon=0.5).state == "DONE"
    kw = spy.calls[0][0]
    return {k: kw[k] for k in ("study_id", "release_id", "release_epsilon", "measurement", "chunks", "chunk_count",
                               "contract_hash")}


def _public(t: Threshold, study: str) -> BfvBackend:
    """The public key of `study` (each study has its own collective key)."""
    return BfvBackend(load_context(t.combiner.public_context(study_id=study)))


def _crafted_chunk(t: Threshold, study: str) -> bytes:
    """The chosen ciphertext of tests/he_partition/threshold_attacker.py as a TenSEAL vector: c1 = floor(Delta / 3)."""
    ctx = _public(t, study).context
    codec = _CiphertextCodec(ctx, 8192)
    big_q = int(np.prod(np.array(codec.moduli, dtype=object)))
    t_mod = int(ctx.seal_context().data.first_context_data().parms().plain_modulus().value())
    polys = np.zeros((2, len(codec.moduli), 8192), dtype=np.uint64)
    rng = np.random.default_rng(7)
    for j, q in enumerate(codec.moduli):
        polys[0, j] = rng.integers(0, q, 8192, dtype=np.uint64)
        polys[1, j, 0] = ((big_q // t_mod) // 3) % q
    return codec.vector_bytes(polys)


def _refused(t: Threshold, ask: dict[str, Any], chunks: list[bytes], release: str) -> list[tuple[str, str]]:
    """Every holder's refusal of `ask` under release id `release`, sending `chunks` (none: the header alone)."""
    out = []
    for i in range(len(HOLDERS)):
        with pytest.raises(ServiceError) as err:
            _as_computation_server(t, i).issue_shares(**{**ask, "chunks": chunks, "release_id": release})
        out.append((err.value.code.name, err.value.details))
    return out


def test_the_chosen_ciphertext_attack_gets_nothing_and_nothing_is_charged(threshold: Threshold) -> None:
    ask = _honest_request(threshold, "s-cc")
    spent = [_spent(threshold, i, "s-cc") for i in range(3)]
    assert all(h.handler.holder.uploads.has("s-cc") for h in threshold.holders)  # forwarded before the release
    for code, message in _refused(threshold, ask, [_crafted_chunk(threshold, ask["study_id"])], "rel-crafted"):
        assert code == "INVALID_ARGUMENT" and "header only" in message and "nothing was charged" in message
    assert [_spent(threshold, i, "s-cc") for i in range(3)] == spent
    # what a deviating CS can ask for instead: shares of the signed c1, bound to it; they decrypt no crafted c1
    from he_partition.core.errors import InvalidInputError
    from he_partition.he.threshold.c1 import c1_digest, c1_of_vector
    from he_partition.he.threshold.context import vector_ciphertext
    from he_partition.he.threshold.decrypt import combine
    from he_partition.he.threshold.wire import DecryptionShare

    got = [_as_computation_server(threshold, i).issue_shares(**{**ask, "chunks": (), "release_id": "rel-2"})
           for i in range(3)]
    signed = c1_of_vector(_public(threshold, ask["study_id"]).context, ask["chunks"][0])  # the honest chunk's c1: the owners' sum
    assert all(DecryptionShare.from_bytes(g.shares[0]).ciphertext_digest == c1_digest(signed) for g in got)
    fp = bytes.fromhex(threshold.holders[0].handler.study_key(ask["study_id"]).fingerprint)
    with pytest.raises(InvalidInputError, match="for another ciphertext"):
        combine(threshold.combiner._template, vector_ciphertext(_crafted_chunk(threshold, ask["study_id"])),
                [g.shares[0] for g in got], [0, 1, 2], fp, bound_to_c1=True)


def _no_early_forward(t: Threshold, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CS sends the c1 parts when the last owner commits; these tests forward (or not) themselves."""
    monkeypatch.setattr(t.cs.handler, "forward_when_complete", lambda study_id: None)


def test_a_study_whose_uploads_were_never_forwarded_gets_no_share(threshold: Threshold,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ask = _honest_request(threshold, "s-cc0")
    _no_early_forward(threshold, monkeypatch)
    contract = threshold.open_and_submit("s-cc1")  # submitted, never released: nothing forwarded
    for code, message in _refused(threshold, {**ask, "study_id": "s-cc1", "contract_hash": contract.contract_hash},
                                  [], "rel-unforwarded"):
        assert code == "FAILED_PRECONDITION" and "no owners' signed c1 parts" in message
    assert all(_spent(threshold, i, "s-cc1") == 0 for i in range(3))


def _parts(t: Threshold, study: str) -> dict[str, OwnerC1Parts]:
    h = t.cs.handler
    h.submissions_to_include(h.study(study), force=False, action="forward")  # the uploads close and open
    out = {}
    for s in h.store.submissions(study):
        sig = h.c1_signatures.get(study, s.meta.owner_id, s.meta.idempotency_key)
        out[s.meta.owner_id] = owner_c1_parts(_public(t, study).context, s, h.store.read_chunk, sig)
    return out


def test_forged_swapped_or_dropped_owner_parts_are_refused_through_the_services(
        threshold: Threshold, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_early_forward(threshold, monkeypatch)
    contract = threshold.open_and_submit("s-fw")
    p = _parts(threshold, "s-fw")
    h1 = _as_computation_server(threshold, 0)

    def forward(uploads: list[OwnerC1Parts]) -> tuple[str, str]:
        with pytest.raises(ServiceError) as err:
            h1.send_uploads("s-fw", contract.contract_hash, uploads)
        return err.value.code.name, err.value.details

    forged = OwnerC1Parts("a", p["a"].idempotency_key, p["a"].parts, bytes(64))
    code, message = forward([forged, p["b"], p["c"]])
    assert code == "UNAUTHENTICATED" and "owner 'a'" in message
    swapped = OwnerC1Parts("a", p["b"].idempotency_key, p["b"].parts, p["b"].signature)
    code, message = forward([swapped, p["b"], p["c"]])  # not what owner a committed to before the uploads closed
    assert code == "FAILED_PRECONDITION" and "committed" in message
    code, message = forward([p["a"], p["b"]])
    assert code == "FAILED_PRECONDITION" and "missing ['c']" in message
    assert not threshold.holders[0].handler.holder.uploads.has("s-fw")
    assert h1.send_uploads("s-fw", contract.contract_hash, [p[o] for o in OWNERS]) == 1  # the honest parts


def test_a_cs_holding_a_forged_c1_signature_cannot_release_and_nothing_is_charged(
        threshold: Threshold, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_early_forward(threshold, monkeypatch)  # else the genuine parts may travel before the forgery is kept
    threshold.open_and_submit("s-forged")
    sub = next(s for s in threshold.cs.handler.store.submissions("s-forged") if s.meta.owner_id == "b")
    threshold.cs.handler.c1_signatures.keep("s-forged", "b", sub.meta.idempotency_key, bytes(64))
    with pytest.raises(ServiceError) as err:
        threshold.computation().run_release("s-forged", epsilon=0.5)
    assert err.value.code.name == "UNAUTHENTICATED" and "owner 'b'" in err.value.details
    assert "signature over its c1 parts does not verify" in err.value.details
    assert all(_spent(threshold, i, "s-forged") == 0 for i in range(3))


def test_a_cs_that_drops_an_owner_from_the_aggregate_gets_shares_that_do_not_decrypt_it(
        threshold: Threshold) -> None:
    from he_partition.core.errors import InvalidInputError
    from he_partition.he.threshold.context import vector_ciphertext
    from he_partition.he.threshold.decrypt import combine

    ask = _honest_request(threshold, "s-drop")
    h = threshold.cs.handler
    be = _public(threshold, "s-drop")
    be.noise_in_c0 = True
    two = [be.deserialize_chunk(h.store.read_chunk(s, 0)) for s in h.store.submissions("s-drop")
           if s.meta.owner_id != "c"]
    chunk = be.serialize_chunk(two[0] + two[1] + np.arange(8192).tolist())  # noise on c0, owner c left out
    got = [_as_computation_server(threshold, i).issue_shares(**{**ask, "chunks": (), "release_id": "rel-drop"})
           for i in range(3)]
    fp = bytes.fromhex(threshold.holders[0].handler.study_key(ask["study_id"]).fingerprint)
    with pytest.raises(InvalidInputError, match="for another ciphertext"):  # the shares are of all three owners' c1
        combine(threshold.combiner._template, vector_ciphertext(chunk), [g.shares[0] for g in got], [0, 1, 2], fp,
                bound_to_c1=True)


def test_a_restarted_holder_keeps_the_expected_c1_and_the_next_release_is_done(threshold: Threshold) -> None:
    threshold.open_and_submit("s-restart")
    assert threshold.computation().run_release("s-restart", epsilon=0.25).state == "DONE"
    threshold.stop_holder(1)
    threshold.start_holder(1)
    assert threshold.holders[1].handler.holder.uploads.has("s-restart")  # from its data directory
    threshold.combiner.clients[1].wait_ready(timeout=15)
    assert threshold.computation().run_release("s-restart", epsilon=0.25).state == "DONE"  # not forwarded again


def test_the_parts_travel_when_the_last_owner_commits(threshold: Threshold) -> None:
    import time

    threshold.open_and_submit("s-early")  # no release yet: the CS sends the parts once every owner is in
    deadline = time.monotonic() + 30
    while not all(h.handler.holder.uploads.has("s-early") for h in threshold.holders) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(h.handler.holder.uploads.has("s-early") for h in threshold.holders)
    assert threshold.computation().run_release("s-early", epsilon=0.5).state == "DONE"
