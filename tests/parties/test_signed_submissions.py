"""Signed submissions through the real servers: owners sign, the computation server verifies before an
upload counts, keeps the signature, and a release shows (verifiably) whose data it contains."""

from __future__ import annotations

import hashlib

import grpc
import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from parties.common.contract import StudyContract
from parties.common.sealing import Commitment
from parties.common.errors import ServiceError
from parties.common.signing import SignatureError, generate_signing_key, sign_upload, stream_digest

from .conftest import Cluster

FP = "0123456789abcdef" * 4


def _nothing_stored(cluster: Cluster, owner: str, study: str = "s1") -> None:
    store = cluster.cs.handler.store
    assert store.get_submission(study, owner) is None
    assert store.get_upload(study, owner) is None
    assert not [p for p in (cluster.root / "cs" / "uploads" / study / owner).rglob("*.ct")] if (
        cluster.root / "cs" / "uploads" / study / owner).exists() else True


def _sealed(cluster: Cluster, owner: str, contract: StudyContract, chunks: tuple[bytes, ...],
            key: str) -> tuple[tuple[bytes, ...], Commitment | None]:
    """What the owner's client sends for `chunks` in a sealed study: the sealed chunks and its commitment."""
    if not contract.sealed:
        return chunks, None
    from he_partition.he.bfv import load_context
    from parties.data_owner.client import EncryptedHistogram
    from parties.data_owner.sealed import seal_upload

    enc = EncryptedHistogram(contract.study_id, contract.domain_size, contract.context_fingerprint, chunks,
                             contract.contract_hash, True, contract.holder_seal_keys)
    return seal_upload(enc, cluster.signing_key(owner)[0], load_context(cluster.decryption().public_context(study_id=enc.study_id)),
                       owner_id=owner, idempotency_key=key)


def _raw(cluster: Cluster, owner: str, contract: StudyContract, chunks: tuple[bytes, ...], *, key: str,
         signature: bytes, claimed_owner: str | None = None, study: str = "s1") -> object:
    """Stream an upload with the owner's own certificate, bypassing the client's signing (sealed as its client would)."""
    sent, commitment = _sealed(cluster, owner, contract, chunks, key)
    return cluster.computation(owner, "data_owner").submit_chunks(
        study_id=study, owner_id=claimed_owner or owner, idempotency_key=key, domain_length=contract.domain_size,
        context_fingerprint=contract.context_fingerprint, chunk_count=len(chunks), chunks=list(enumerate(sent)),
        contract_hash=contract.contract_hash, signature=signature, commitment=commitment)


def _sign(cluster: Cluster, owner: str, contract: StudyContract, chunks: tuple[bytes, ...], key: str,
          study: str = "s1", private: bytes | None = None) -> bytes:
    sent, _ = _sealed(cluster, owner, contract, chunks, key)
    return sign_upload(private or cluster.signing_key(owner)[0], study_id=study, owner_id=owner,
                       idempotency_key=key, contract_hash=contract.contract_hash, chunks=sent)


def _code(fn: object, *args: object, **kw: object) -> ServiceError:
    with pytest.raises(ServiceError) as ei:
        fn(*args, **kw)  # type: ignore[operator]
    return ei.value


def test_release_lists_every_owners_verifiable_signature(secure_cluster: Cluster) -> None:
    cluster = secure_cluster
    contract = cluster.open_study(domain_size=64, owners=("a", "b"))
    for o in ("a", "b"):
        cluster.owner(o).submit("s1", np.arange(64) % 3, idempotency_key=f"{o}-1")
    store = cluster.cs.handler.store
    for o in ("a", "b"):
        sub = store.get_submission("s1", o)
        assert sub is not None and len(sub.signature) == 64
        chunks = tuple(store.read_chunk(sub, i) for i in range(sub.meta.chunk_count))
        if contract.sealed:  # once the uploads close the stored chunks are the opened form of the verified ones
            cluster.cs.handler.join(timeout=60)
            chunks = tuple(store.read_chunk(sub, i) for i in range(sub.meta.chunk_count))
            chunks = _sealed(cluster, o, contract, chunks, f"{o}-1")[0]
        assert sub.ciphertext_digest == stream_digest(chunks)  # what was verified is what is stored
    rel = cluster.computation().run_release("s1")
    got = cluster.analyst().get_release(rel.release_id)
    assert [s.owner_id for s in got.signatures] == ["a", "b"] == [s.owner_id for s in rel.signatures]
    for sig in got.signatures:
        key = contract.owner_public_key(sig.owner_id)
        assert key is not None and sig.idempotency_key == f"{sig.owner_id}-1"
        sig.verify(key, study_id="s1", contract_hash=contract.contract_hash)
        with pytest.raises(SignatureError):  # the record binds the study and the owner's key
            sig.verify(key, study_id="s2", contract_hash=contract.contract_hash)
        with pytest.raises(SignatureError):
            sig.verify(contract.owner_public_key("b" if sig.owner_id == "a" else "a"), study_id="s1",  # type: ignore[arg-type]
                       contract_hash=contract.contract_hash)
    # the records survive a restart of the computation server
    cluster.restart_cs()
    assert cluster.analyst().get_release(rel.release_id).signatures == got.signatures


def test_unsigned_wrongly_signed_tampered_and_replayed_uploads_are_refused_and_nothing_counts(
        secure_cluster: Cluster) -> None:
    cluster = secure_cluster
    contract = cluster.open_study(domain_size=64, owners=("a", "b"))
    s2 = cluster.open_study(study_id="s2", domain_size=64, owners=("a", "b"))
    a = cluster.owner("a")
    enc = a.encrypt("s1", np.ones(64, dtype=int))
    good = _sign(cluster, "a", contract, enc.chunks, "k1")

    # no signature: refused at the header, before any chunk is stored
    err = _code(_raw, cluster, "a", contract, enc.chunks, key="k1", signature=b"")
    assert err.code == grpc.StatusCode.UNAUTHENTICATED and "requires signed uploads" in err.details
    # signed by another key (b's)
    err = _code(_raw, cluster, "a", contract, enc.chunks, key="k1",
                signature=_sign(cluster, "a", contract, enc.chunks, "k1", private=cluster.signing_key("b")[0]))
    assert err.code == grpc.StatusCode.UNAUTHENTICATED and "does not match" in err.details
    _nothing_stored(cluster, "a")
    # a valid signature replayed under another idempotency key
    err = _code(_raw, cluster, "a", contract, enc.chunks, key="k2", signature=good)
    assert err.code == grpc.StatusCode.UNAUTHENTICATED
    _nothing_stored(cluster, "a")
    # ... or for another study (same owner, same key pair, its own contract hash)
    err = _code(_raw, cluster, "a", s2, enc.chunks, key="k1", signature=good, study="s2")
    assert err.code == grpc.StatusCode.UNAUTHENTICATED
    _nothing_stored(cluster, "a", study="s2")
    # ... or by owner b (b's own certificate, b's name in the header, a's ciphertexts and signature)
    err = _code(_raw, cluster, "b", contract, enc.chunks, key="k1", signature=good)
    assert err.code == grpc.StatusCode.UNAUTHENTICATED
    _nothing_stored(cluster, "b")
    # other (valid) ciphertexts under a's signature: a fresh encryption of the same counts
    other = a.encrypt("s1", np.ones(64, dtype=int))
    assert other.chunks != enc.chunks
    err = _code(_raw, cluster, "a", contract, other.chunks, key="k1", signature=good)
    assert err.code == grpc.StatusCode.UNAUTHENTICATED
    _nothing_stored(cluster, "a")
    assert cluster.computation().study_status("s1").submitted_owners == ()
    running = cluster.cs.handler.running
    assert running is not None and running.current("s1") is None and running.current("s2") is None  # nothing summed

    # the genuine upload goes through, exactly once
    res = _raw(cluster, "a", contract, enc.chunks, key="k1", signature=good)
    assert res.committed  # type: ignore[attr-defined]
    assert cluster.cs.handler.store.get_submission("s1", "a").signature == good  # type: ignore[union-attr]
    assert cluster.computation().study_status("s1").submitted_owners == ("a",)
    assert cluster.cs.handler.folds.wait_idle(60)  # the commit's fold runs in the background
    folded = running.current("s1")
    if contract.sealed:  # sealed chunks are summed only once the key holders close the uploads
        assert folded is None
    else:
        assert folded is not None and folded.uploads == {("a", "k1")}  # only the verified upload is summed


def test_client_side_signing_checks(secure_cluster: Cluster) -> None:
    cluster = secure_cluster
    cluster.open_study(domain_size=64, owners=("a", "b"))
    from parties.data_owner.client import DataOwnerClient

    no_key = DataOwnerClient("a", computation=cluster.cs.target, decryption=cluster.ds.target, progress=False,
                             tls=cluster.tls("a", "data_owner"))
    with pytest.raises(InvalidInputError, match="requires signed uploads"):
        no_key.submit("s1", np.ones(64, dtype=int))
    wrong = DataOwnerClient("a", computation=cluster.cs.target, decryption=cluster.ds.target, progress=False,
                            tls=cluster.tls("a", "data_owner"), signing_key=generate_signing_key()[0])
    with pytest.raises(InvalidInputError, match="not the key study s1 lists for owner a"):
        wrong.submit("s1", np.ones(64, dtype=int))
    for c in (no_key, wrong):
        c.close()
    _nothing_stored(cluster, "a")


def test_resume_with_a_re_encryption_discards_the_partial_upload_it_does_not_match(secure_cluster: Cluster) -> None:
    cluster = secure_cluster
    n = 2 * 8192
    cluster.open_study(domain_size=n, owners=("a",), epsilon=1.0)
    owner = cluster.owner("a")
    h = np.arange(n) % 3
    first = owner.encrypt("s1", h)
    assert not owner.upload(first, idempotency_key="k", only=[0]).committed
    assert cluster.computation().upload_status("s1", "a", "k").received == (0,)
    second = owner.encrypt("s1", h)  # a crashed owner re-encrypts: new ciphertexts, new signature
    res = owner.upload(second, idempotency_key="k")
    assert res.committed and res.chunks_sent == 2 and res.attempts == 2  # chunk 1; after the reset, chunk 0 again
    sub = cluster.cs.handler.store.get_submission("s1", "a")
    assert sub is not None
    cluster.cs.handler.join(timeout=60)  # the uploads close (every owner is in) and the chunks open
    stored = [cluster.cs.handler.store.read_chunk(sub, i) for i in range(2)]
    assert stored == list(second.chunks)  # never a mix of two encryptions under one signature
    rel = cluster.computation().run_release("s1")
    rc = cluster.analyst().range_counts(rel.release_id, [(0, n)])[0]
    assert abs(rc.value - h.sum()) <= 4 * rc.standard_error


def test_a_tls_decryption_server_refuses_unsigned_studies(secure_cluster: Cluster) -> None:
    err = _code(secure_cluster.open_study, domain_size=64, owners=("a",), signed=False)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "owner_keys" in err.details
    assert secure_cluster.ds.handler.ledger.list_studies() == []


def test_signed_contract_canonical_form_binds_the_owner_keys() -> None:
    ka, kb = "11" * 32, "22" * 32
    c = StudyContract.create(study_id="s1", domain_size=8, epsilon=1.0, expected_owners=["b", "a"],
                             context_fingerprint=FP, owner_keys={"b": kb, "a": bytes.fromhex(ka)})
    assert c.signed and c.owner_keys == (("a", ka), ("b", kb))
    text = c.canonical_json()
    assert ('"owner_keys":{"a":"' + ka + '","b":"' + kb + '"}') in text
    assert c.contract_hash == hashlib.sha256(text.encode()).hexdigest()
    assert StudyContract.from_json(text) == c
    swapped = StudyContract.create(study_id="s1", domain_size=8, epsilon=1.0, expected_owners=["a", "b"],
                                   context_fingerprint=FP, owner_keys={"a": kb, "b": ka})
    assert swapped.contract_hash != c.contract_hash
    unsigned = StudyContract.create(study_id="s1", domain_size=8, epsilon=1.0, expected_owners=["a", "b"],
                                    context_fingerprint=FP)
    assert "owner_keys" not in unsigned.canonical_json() and unsigned.contract_hash != c.contract_hash
    from parties.common.convert import contract_from_proto, contract_to_proto

    p = contract_to_proto(c)
    assert contract_from_proto(p) == c
    p.owner_keys["a"] = kb  # swap a key in transit
    with pytest.raises(InvalidInputError, match="contract hash mismatch"):
        contract_from_proto(p)


@pytest.mark.parametrize("keys, text", [
    ({"a": "11" * 32}, "missing: b"),
    ({"a": "11" * 32, "b": "22" * 32, "c": "33" * 32}, "not expected owners: c"),
    ({"a": "11" * 31, "b": "22" * 32}, r"owner_keys\['a'\] must be an Ed25519 public key"),
    ({"a": "zz" * 32, "b": "22" * 32}, "64 hex digits"),
])
def test_owner_keys_must_cover_exactly_the_expected_owners(keys: dict[str, str], text: str) -> None:
    with pytest.raises(InvalidInputError, match=text):
        StudyContract.create(study_id="s1", domain_size=8, epsilon=1.0, expected_owners=["a", "b"],
                             context_fingerprint=FP, owner_keys=keys)


def test_a_signed_release_is_decrypted_with_the_owners_signed_c1(secure_cluster: Cluster) -> None:
    """The single decryption server of a signed study keeps the owners' signed c1 parts (forwarded by the
    computation server once every owner committed) and decrypts every measurement chunk with their sum;
    the computation server adds its noise, pads and flood to c0 only, so the honest chunks carry that c1."""
    from he_partition.he.threshold.c1 import c1_of_vector

    cluster = secure_cluster
    contract = cluster.open_study(domain_size=64, owners=("a", "b"))
    for o in ("a", "b"):
        cluster.owner(o).submit("s1", np.arange(64) % 3)
    sent: list[bytes] = []
    real = cluster.cs.handler.decryption.decrypt_measurement

    def spy(**kw: object) -> object:
        kw["chunks"] = list(kw["chunks"])  # type: ignore[call-overload]
        sent.extend(kw["chunks"])  # type: ignore[arg-type]
        return real(**kw)

    cluster.cs.handler.decryption.decrypt_measurement = spy  # type: ignore[method-assign]
    rel = cluster.computation().run_release("s1", epsilon=0.5)
    assert rel.state == "DONE", rel.error_message
    book = cluster.ds.handler.uploads
    assert book.has("s1") and sent
    ctx = cluster.ds.handler.backend_for(contract).context
    assert all(np.array_equal(c1_of_vector(ctx, c), book.expected("s1", 0)) for c in sent)  # 64 bins: one chunk
    # and c0 is still flooded: the key holder's view of the noise polynomial is uniform on [-2^61, 2^61)
    from he_partition.he.keyholder import residual_view

    be = cluster.ds.handler.backend_for(contract)
    assert np.max(np.abs(residual_view(be, be.deserialize_chunk(sent[0])))) > 2**60
    # a restarted decryption server keeps them (c1/STUDY.npy under its data directory)
    cluster.restart_ds()
    assert cluster.ds.handler.uploads.has("s1")
