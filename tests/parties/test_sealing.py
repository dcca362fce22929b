"""Sealed uploads (parties.common.sealing): the primitives, the key holder's closed set, the CS's front door."""
from __future__ import annotations

import grpc
import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from parties.common.contract import StudyContract
from parties.common.errors import FailedPreconditionError, ServiceError
from parties.common.sealing import (Commitment, SealKeyPair, commitment_statement, is_sealed, open_chunk, seal_chunk,
                                    seal_upload_key, sealed_key_shares, upload_key_from_shares)
from parties.common.signing import SignatureError, generate_signing_key, sign_submission
from parties.decryption.commitments import CommitmentBook

from .conftest import Cluster

PLACE = dict(study_id="s1", owner_id="a", idempotency_key="k", contract_hash="0" * 64)


def test_a_sealed_chunk_opens_only_under_its_key_and_place() -> None:
    key = seal_upload_key(b"\1" * 32, b"\2" * 32, **PLACE)
    assert key == seal_upload_key(b"\1" * 32, b"\2" * 32, **PLACE)  # a retried upload seals alike
    assert key != seal_upload_key(b"\1" * 32, b"\3" * 32, **PLACE)  # another encryption, another key
    sealed = seal_chunk(key, 0, b"chunk bytes", **PLACE)
    assert is_sealed(sealed) and b"chunk bytes" not in sealed
    assert open_chunk(key, 0, sealed, **PLACE) == b"chunk bytes"
    with pytest.raises(InvalidInputError, match="does not open"):
        open_chunk(bytes(32), 0, sealed, **PLACE)
    with pytest.raises(InvalidInputError, match="does not open"):  # moved to another index
        open_chunk(key, 1, sealed, **PLACE)
    with pytest.raises(InvalidInputError, match="does not open"):  # claimed by another owner
        open_chunk(key, 0, sealed, **{**PLACE, "owner_id": "b"})


def test_the_upload_key_needs_every_holders_share() -> None:
    holders = [SealKeyPair.load_or_create(None) for _ in range(3)]
    key = seal_upload_key(b"\1" * 32, b"\2" * 32, **PLACE)
    blobs = sealed_key_shares(key, [h.public_hex for h in holders], **PLACE)
    shares = [h.open_share(b, j, **PLACE) for j, (h, b) in enumerate(zip(holders, blobs))]
    assert upload_key_from_shares(shares) == key
    for j in range(3):  # any K - 1 shares give another key
        assert upload_key_from_shares(s for i, s in enumerate(shares) if i != j) != key
    with pytest.raises(InvalidInputError, match="does not open"):  # holder 1's share is not holder 0's to open
        holders[0].open_share(blobs[1], 0, **PLACE)


def _contract(owners: tuple[str, ...], seal: SealKeyPair) -> tuple[StudyContract, dict[str, tuple[bytes, bytes]]]:
    keys = {o: generate_signing_key() for o in owners}
    contract = StudyContract.create(study_id="s1", domain_size=64, epsilon=1.0, expected_owners=owners,
                                    context_fingerprint="f" * 64, owner_keys={o: k[1] for o, k in keys.items()},
                                    holder_seal_keys=[seal.public_hex])
    return contract, keys


def _commit(contract: StudyContract, seal: SealKeyPair, owner: str, private: bytes, digest: bytes) -> Commitment:
    place = dict(study_id="s1", owner_id=owner, idempotency_key="k", contract_hash=contract.contract_hash)
    shares = sealed_key_shares(seal_upload_key(private, digest, **place), [seal.public_hex], **place)
    statement = commitment_statement("s1", owner, "k", contract.contract_hash, digest, shares)
    return Commitment(owner, "k", digest, shares, sign_submission(private, statement))


def test_the_key_holder_closes_once_refuses_copies_and_forged_commitments(tmp_path: object) -> None:
    seal = SealKeyPair.load_or_create(None)
    contract, keys = _contract(("a", "b", "c"), seal)
    a, b, c = (_commit(contract, seal, o, keys[o][0], bytes([i]) * 32) for i, o in enumerate("abc"))
    book = CommitmentBook(seal, 0, 1)
    # a copy of a's commitment signed by c (c1 digest equal to a's): refused, nothing closed
    copy = _commit(contract, seal, "c", keys["c"][0], a.c1_parts_digest)
    with pytest.raises(FailedPreconditionError, match="same c1"):
        book.close(contract, [a, b, copy])
    forged = Commitment("b", "k", b.c1_parts_digest, b.key_shares, a.signature)
    with pytest.raises(SignatureError):
        book.close(contract, [a, forged])
    assert book.closed("s1") is None
    shares = book.close(contract, [a, b])  # closed without c (forced)
    assert shares == book.close(contract, [a, b])  # the same set again: the same answer
    with pytest.raises(FailedPreconditionError, match="closed on"):
        book.close(contract, [a, b, c])  # nobody joins after the close
    with pytest.raises(FailedPreconditionError, match="closed on"):
        book.close(contract, [a, _commit(contract, seal, "b", keys["b"][0], b"\x09" * 32)])  # nor changes
    other = SealKeyPair.load_or_create(None)
    with pytest.raises(FailedPreconditionError, match="pins seal key"):
        CommitmentBook(other, 0, 1).close(contract, [a])


def test_a_forced_release_closes_on_the_owners_present_and_a_late_upload_is_refused(secure_cluster: Cluster) -> None:
    cluster = secure_cluster
    contract = cluster.open_study(domain_size=64, owners=("a", "b"))
    assert contract.sealed
    cluster.owner("a").submit("s1", np.arange(64) % 3)
    assert cluster.computation().run_release("s1", epsilon=0.5, force=True).state == "DONE"
    assert cluster.cs.handler.sealed.closed_on("s1") == ("a",)
    with pytest.raises(ServiceError) as err:
        cluster.owner("b").submit("s1", np.arange(64) % 3)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "closed on the owners a" in err.value.details
    assert cluster.computation().study_status("s1").submitted_owners == ("a",)


def test_a_fold_between_the_close_and_the_opening_reads_no_sealed_chunk(secure_cluster: Cluster,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A commit's background fold that runs while a release is closing the uploads (closed named, chunks still
    sealed) waits for the opening instead of failing to parse sealed bytes as BFV."""
    cluster = secure_cluster
    contract = cluster.open_study(domain_size=64, owners=("a", "b"))
    cluster.owner("a").submit("s1", np.arange(64) % 3)
    handler = cluster.cs.handler
    handler.folds.wait_idle(10)
    handler.sealed._write(b'["a"]', "s1", "closed.json")  # the state a release leaves while it opens the chunks
    with caplog.at_level("WARNING", logger="dpagg.computation"):
        handler.fold_committed("s1", handler.backend_for(contract))
    assert not [r for r in caplog.records if "running aggregate was not updated" in r.getMessage()]
    assert cluster.computation().run_release("s1", epsilon=0.5, force=True).state == "DONE"
    assert handler.sealed.opened("s1")


def test_a_chunk_that_does_not_open_is_refused_by_owner_and_nothing_is_replaced(secure_cluster: Cluster) -> None:
    """The chunk workers open the sealed chunks (each its share); one owner's chunk broken on the server's disk
    refuses the release naming that owner, and no opened chunk of anyone is installed or left staged."""
    cluster = secure_cluster
    cluster.open_study(domain_size=64, owners=("a", "b"))
    for owner in ("a", "b"):
        cluster.owner(owner).submit("s1", np.arange(64) % 3)
    uploads = cluster.root / "cs" / "uploads" / "s1"
    (chunk,) = (uploads / "b").rglob("0000000.ct") or list((uploads / "b").rglob("*.ct"))[:1]
    before = {p: p.read_bytes() for p in uploads.rglob("*.ct")}
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 1  # the seal's tag no longer verifies
    chunk.write_bytes(bytes(data))
    before[chunk] = bytes(data)
    with pytest.raises(ServiceError) as err:
        cluster.computation().run_release("s1", epsilon=0.5)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "owner 'b'" in err.value.details
    assert {p: p.read_bytes() for p in uploads.rglob("*.ct")} == before  # a's chunks stay sealed too
    assert not [p for p in uploads.rglob("*") if p.name.endswith(".part")]
