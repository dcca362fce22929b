"""Bad uploads and requests: each answered with the right status code, and nothing stored."""

from __future__ import annotations

import re

from pathlib import Path

import grpc
import numpy as np
import pytest

from he_partition.he.bfv import BfvBackend, generate_secret_context, load_context, public_context_bytes
from he_partition.core.errors import InvalidInputError
from he_partition.core.measurements import owner_encoding
from parties.common.errors import PermissionDeniedError, ServiceError, code_of

from .conftest import Cluster


def _nothing_stored(cluster: Cluster, study: str = "s1", owner: str = "a") -> None:
    store = cluster.cs.handler.store
    assert store.get_submission(study, owner) is None
    assert store.get_upload(study, owner) is None
    up = Path(cluster.root / "cs" / "uploads" / study / owner)
    assert not up.exists() or not any(p.suffix == ".ct" for p in up.rglob("*"))


def _raw_upload(cluster: Cluster, *, chunks: list[bytes], study: str = "s1", owner: str = "a",
                domain_length: int = 64, fingerprint: str | None = None, key: str = "k1") -> object:
    known = cluster.ds.handler.ledger.list_studies()
    fp = fingerprint if fingerprint is not None else next(
        (c.context_fingerprint for c in known if c.study_id == study), cluster.ds.handler.fingerprint)
    contract_hash = next((c.contract_hash for c in known if c.study_id == study), "0" * 64)
    return cluster.computation().submit_chunks(study_id=study, owner_id=owner, idempotency_key=key,
                                               domain_length=domain_length, context_fingerprint=fp,
                                               chunk_count=len(chunks), chunks=list(enumerate(chunks)),
                                               contract_hash=contract_hash)


def _code(fn: object, *args: object, **kw: object) -> ServiceError:
    with pytest.raises(ServiceError) as ei:
        fn(*args, **kw)  # type: ignore[operator]
    return ei.value


def test_wrong_domain_length(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64)
    be = BfvBackend(load_context(cluster.ds.handler.public_key_for("s1")[0]))
    chunk = be.serialize_chunk(be.encrypt(np.zeros(65)).chunks[0])
    err = _code(_raw_upload, cluster, chunks=[chunk], domain_length=65)  # refused by the server
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "65 bins" in err.details and "64" in err.details
    _nothing_stored(cluster)


def test_wrong_domain_length_at_the_client_raises_before_upload(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64)
    with pytest.raises(InvalidInputError, match="65 bins but study s1 has domain size 64"):
        cluster.owner("a").submit("s1", np.ones(65, dtype=int))
    _nothing_stored(cluster)


def test_bytes_that_are_not_a_ciphertext(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64)
    err = _code(_raw_upload, cluster, chunks=[b"definitely not a ciphertext"])
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "not a valid ciphertext" in err.details
    _nothing_stored(cluster)


def test_bad_chunk_after_good_ones_discards_the_whole_upload(cluster: Cluster) -> None:
    cluster.open_study(domain_size=8192 + 10)
    be = BfvBackend(load_context(cluster.ds.handler.public_key_for("s1")[0]))
    good = be.serialize_chunk(be.encrypt(np.zeros(8192)).chunks[0])
    err = _code(_raw_upload, cluster, chunks=[good, b"\x00" * 100], domain_length=8192 + 10)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    _nothing_stored(cluster)


def test_ciphertext_under_another_key_is_caught_by_the_header_fingerprint(cluster: Cluster) -> None:
    """An honest mistake: the owner encrypted with another public key and says so in the header."""
    cluster.open_study(domain_size=64)
    other = generate_secret_context()
    other_public = public_context_bytes(other)
    be = BfvBackend(load_context(other_public))
    chunk = be.serialize_chunk(be.encrypt(owner_encoding(np.ones(64, dtype=int))).chunks[0])
    from he_partition.he.bfv import context_fingerprint

    err = _code(_raw_upload, cluster, chunks=[chunk], fingerprint=context_fingerprint(other_public))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "re-encrypt" in err.details
    _nothing_stored(cluster)


def test_foreign_key_ciphertext_with_a_forged_fingerprint_fails_the_decryption_integrity_check(
        cluster: Cluster) -> None:
    """A malicious owner can claim the right fingerprint: the computation server cannot tell (it has no
    secret key), so the ciphertext is stored; the decryption server's noise-budget check then refuses the
    release at its first measurement, after that measurement's charge (the check reads the secret key)."""
    cluster.open_study(domain_size=64, owners=("a", "b"))
    cluster.owner("b").submit("s1", np.ones(64, dtype=int))
    be = BfvBackend(load_context(public_context_bytes(generate_secret_context())))
    chunk = be.serialize_chunk(be.encrypt(owner_encoding(np.ones(64, dtype=int))).chunks[0])
    res = _raw_upload(cluster, chunks=[chunk])
    assert res.committed  # type: ignore[attr-defined]
    err = _code(cluster.computation().run_release, "s1")
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "another key" in err.details
    assert err.details.startswith("the decryption server (DecryptMeasurement): ")
    rel_id = cluster.computation().study_status("s1").release_ids[-1]
    st = cluster.computation().release_status(rel_id)
    assert st.state == "FAILED" and st.error_code == "INVALID_ARGUMENT" and st.summary is None
    # The integrity check runs after the charge: the first measurement is paid, and no error text carries a value.
    assert [c.kind for c in cluster.decryption().budget("s1").charges] == ["prefix_differences"]
    assert not re.search(r"\d{4,}|e[+-]\d", err.details + (st.error_message or ""))
    assert cluster.analyst().list_releases("s1") == []


def test_unknown_study(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64)
    err = _code(_raw_upload, cluster, chunks=[b"x"], study="nope")
    assert err.code == grpc.StatusCode.NOT_FOUND and "nope" in err.details
    err = _code(cluster.owner("a").submit, "nope", np.ones(64, dtype=int))
    assert err.code == grpc.StatusCode.NOT_FOUND
    for call in (cluster.computation().study_status, cluster.computation().run_release,
                 cluster.decryption().budget):
        assert _code(call, "nope").code == grpc.StatusCode.NOT_FOUND
    assert cluster.cs.handler.store.get_study("nope") is None


def test_unknown_owner(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64)
    be = BfvBackend(load_context(cluster.ds.handler.public_key_for("s1")[0]))
    chunk = be.serialize_chunk(be.encrypt(np.zeros(64)).chunks[0])
    err = _code(_raw_upload, cluster, chunks=[chunk], owner="mallory")
    assert err.code == grpc.StatusCode.PERMISSION_DENIED and "mallory" in err.details
    _nothing_stored(cluster, owner="mallory")
    with pytest.raises(PermissionDeniedError) as ei:  # the client checks the contract before encrypting
        cluster.owner("mallory").submit("s1", np.ones(64, dtype=int))
    assert code_of(ei.value) == grpc.StatusCode.PERMISSION_DENIED


def test_duplicate_submission_is_idempotent_and_a_second_key_is_refused(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64, owners=("a",))
    owner = cluster.owner("a")
    first = owner.submit("s1", np.ones(64, dtype=int), idempotency_key="key-1")
    assert first.committed and not first.duplicate
    again = owner.submit("s1", np.ones(64, dtype=int), idempotency_key="key-1")
    assert again.committed and again.duplicate and again.bytes_sent == 0
    # Re-streaming the same upload is a no-op too.
    enc = owner.encrypt("s1", np.ones(64, dtype=int))
    resp = _raw_upload(cluster, chunks=list(enc.chunks), key="key-1")
    assert resp.committed and resp.duplicate  # type: ignore[attr-defined]
    err = _code(owner.submit, "s1", np.full(64, 5), idempotency_key="key-2")
    assert err.code == grpc.StatusCode.ALREADY_EXISTS
    err = _code(_raw_upload, cluster, chunks=list(enc.chunks), key="key-2")
    assert err.code == grpc.StatusCode.ALREADY_EXISTS and "key-1" in err.details
    assert len(cluster.cs.handler.store.submissions("s1")) == 1
    rel = cluster.computation().run_release("s1")
    assert rel.summary is not None and rel.owners == ("a",)
    assert abs(sum(rel.summary.sums) - 64) < 60  # counted once (64), not twice (128); noise sd ~ 15


def test_release_before_all_owners_is_a_failed_precondition(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64, owners=("a", "b"))
    cs = cluster.computation()
    err = _code(cs.run_release, "s1")
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and "no data owner" in err.details
    cluster.owner("a").submit("s1", np.ones(64, dtype=int))
    err = _code(cs.run_release, "s1")
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and "b" in err.details
    assert cluster.decryption().budget("s1").charges == ()
    forced = cs.run_release("s1", force=True)
    assert forced.state == "DONE" and forced.owners == ("a",)


@pytest.mark.parametrize("bad", [[1.0, float("nan")] + [0.0] * 62, [1, -1] + [0] * 62, [0.5] + [0] * 63])
def test_nan_negative_or_fractional_counts_are_refused_at_the_client(cluster: Cluster, bad: list[float]) -> None:
    cluster.open_study(domain_size=64)
    with pytest.raises(InvalidInputError, match="bin 1|bin 0"):
        cluster.owner("a").submit("s1", np.asarray(bad))
    _nothing_stored(cluster)
    assert cluster.computation().upload_status("s1", "a", "any").state == "NONE"


def test_the_client_refuses_to_encrypt_for_a_study_that_does_not_expect_it(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64)
    with pytest.raises(PermissionDeniedError, match="not expected"):
        cluster.owner("zed").encrypt("s1", np.ones(64, dtype=int))


def test_open_study_validation_names_the_bad_value(cluster: Cluster) -> None:
    cs = cluster.computation()
    for kw, text in (({"epsilon": -1.0}, "epsilon must be > 0"), ({"domain_size": 0}, "domain_size"),
                     ({"expected_owners": ["a", "a"]}, "duplicates"), ({"expected_owners": ["../x"]}, "owner id"),
                     ({"strategy": "magic"}, "unknown strategy"), ({"noise_parties": 3}, "noise_parties"),
                     ({"strategy_params_json": '{"bogus": 1}'}, "'bogus'")):
        args = {"study_id": "sx", "domain_size": 64, "epsilon": 1.0, "expected_owners": ["a"], **kw}
        err = _code(cs.open_study, **args)
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT and text in err.details, (kw, err.details)
