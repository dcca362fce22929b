"""Signed submissions: canonical digest, round trip, and every kind of tampering or replay is refused."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from he_partition.core.errors import DPAggError, InvalidInputError
from parties.common import signing
from parties.common.signing import SignatureError, StreamHasher

CHUNKS = [b"ciphertext-chunk-0" * 10, b"ciphertext-chunk-1" * 7, b"tail"]
CONTRACT = hashlib.sha256(b"contract of study s1").digest()
BASE = dict(study_id="s1", owner_id="alice", idempotency_key="upload-0001", contract_hash=CONTRACT)


def _digest(chunks: list[bytes] = CHUNKS, **changes: object) -> bytes:
    fields = {**BASE, **changes}
    return signing.submission_digest(ciphertext_digest=signing.stream_digest(chunks), **fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def alice() -> tuple[bytes, bytes]:
    return signing.generate_signing_key()


@pytest.fixture(scope="module")
def bob() -> tuple[bytes, bytes]:
    return signing.generate_signing_key()


def test_digest_follows_the_documented_encoding_exactly() -> None:
    def frame(b: bytes) -> bytes:
        return len(b).to_bytes(8, "big") + b

    stream = hashlib.sha256(frame(b"dpagg/ciphertext-stream/v1"))
    for c in CHUNKS:
        stream.update(frame(c))
    stream.update(b"end" + len(CHUNKS).to_bytes(8, "big") + sum(map(len, CHUNKS)).to_bytes(8, "big"))
    assert signing.stream_digest(CHUNKS) == stream.digest()

    h = hashlib.sha256(frame(b"dpagg/submission-digest/v1"))
    for name, value in [(b"study_id", b"s1"), (b"owner_id", b"alice"), (b"idempotency_key", b"upload-0001"),
                        (b"contract_hash", CONTRACT), (b"ciphertext_digest", stream.digest())]:
        h.update(frame(name) + frame(value))
    assert _digest() == h.digest()
    assert len(_digest()) == signing.DIGEST_SIZE
    # a contract hash given as hex text is the same contract
    assert _digest(contract_hash=CONTRACT.hex()) == _digest()


def test_stream_hasher_matches_the_one_shot_digest_and_can_peek() -> None:
    h = StreamHasher()
    h.update(CHUNKS[0])
    early = h.digest()
    for c in CHUNKS[1:]:
        h.update(memoryview(c))
    assert early == signing.stream_digest(CHUNKS[:1])
    assert h.digest() == signing.stream_digest(CHUNKS)
    assert (h.chunks, h.total_bytes) == (3, sum(map(len, CHUNKS)))
    assert signing.submission_digest(ciphertext_digest=h, **BASE) == _digest()  # type: ignore[arg-type]


def test_round_trip(alice: tuple[bytes, bytes]) -> None:
    private, public = alice
    assert len(private) == signing.KEY_SIZE and len(public) == signing.KEY_SIZE
    assert signing.public_key_of(private) == public
    sig = signing.sign_submission(private, _digest())
    assert len(sig) == signing.SIGNATURE_SIZE
    signing.verify_submission(public, _digest(), sig, owner_id="alice")


@pytest.mark.parametrize("field, value", [
    ("study_id", "s2"),
    ("owner_id", "bob"),
    ("idempotency_key", "upload-0002"),
    ("contract_hash", hashlib.sha256(b"another contract").digest()),
])
def test_any_changed_field_fails(alice: tuple[bytes, bytes], field: str, value: object) -> None:
    private, public = alice
    sig = signing.sign_submission(private, _digest())
    with pytest.raises(SignatureError, match="does not match the submission of owner 'alice'"):
        signing.verify_submission(public, _digest(**{field: value}), sig, owner_id="alice")


@pytest.mark.parametrize("chunks", [
    [CHUNKS[0], CHUNKS[1][:-1] + b"X", CHUNKS[2]],  # one byte flipped
    [CHUNKS[1], CHUNKS[0], CHUNKS[2]],  # reordered
    [CHUNKS[0] + CHUNKS[1], CHUNKS[2]],  # merged: same bytes, other boundaries
    [CHUNKS[0][:5], CHUNKS[0][5:], CHUNKS[1], CHUNKS[2]],  # split
    CHUNKS[:2],  # dropped
    CHUNKS + [b""],  # an empty chunk appended
    CHUNKS + [CHUNKS[0]],  # a chunk replayed
], ids=["flipped", "reordered", "merged", "split", "dropped", "empty-appended", "replayed-chunk"])
def test_any_changed_chunk_or_order_fails(alice: tuple[bytes, bytes], chunks: list[bytes]) -> None:
    private, public = alice
    sig = signing.sign_submission(private, _digest())
    with pytest.raises(SignatureError):
        signing.verify_submission(public, _digest(chunks), sig)


def test_fields_cannot_be_shifted_into_each_other() -> None:
    assert _digest(study_id="s1a", owner_id="lice") != _digest(study_id="s1", owner_id="alice")
    assert _digest(owner_id="alice", idempotency_key="upload-0001") != _digest(
        owner_id="aliceu", idempotency_key="pload-0001")
    assert _digest(study_id="a", owner_id="b") != _digest(study_id="b", owner_id="a")


def test_signature_under_another_owners_key_fails(alice: tuple[bytes, bytes], bob: tuple[bytes, bytes]) -> None:
    # bob signs a submission that claims to be alice's: alice's key (from the contract) rejects it
    sig = signing.sign_submission(bob[0], _digest())
    with pytest.raises(SignatureError, match="another key signed it"):
        signing.verify_submission(alice[1], _digest(), sig, owner_id="alice")
    # and alice's genuine signature does not verify as bob's
    sig = signing.sign_submission(alice[0], _digest())
    with pytest.raises(SignatureError):
        signing.verify_submission(bob[1], _digest(), sig, owner_id="bob")


def test_replay_under_another_study_or_idempotency_key_fails(alice: tuple[bytes, bytes]) -> None:
    private, public = alice
    sig = signing.sign_submission(private, _digest())
    for replay in (_digest(study_id="s1-rerun"), _digest(idempotency_key="upload-0001-again"),
                   _digest(study_id="s2", idempotency_key="upload-0002")):
        with pytest.raises(SignatureError):
            signing.verify_submission(public, replay, sig)


@pytest.mark.parametrize("signature", [b"", b"\x00" * 63, b"\x00" * 64, "not bytes"])
def test_malformed_signatures_raise_signature_error(alice: tuple[bytes, bytes], signature: object) -> None:
    with pytest.raises(SignatureError) as info:
        signing.verify_submission(alice[1], _digest(), signature)  # type: ignore[arg-type]
    assert isinstance(info.value, DPAggError)


def test_malformed_public_key_or_digest_raise_signature_error(alice: tuple[bytes, bytes]) -> None:
    sig = signing.sign_submission(alice[0], _digest())
    with pytest.raises(SignatureError, match="public key must be 32 bytes"):
        signing.verify_submission(alice[1][:31], _digest(), sig)
    with pytest.raises(SignatureError, match="digest must be 32 bytes"):
        signing.verify_submission(alice[1], _digest()[:16], sig)


@pytest.mark.parametrize("changes", [dict(study_id=""), dict(owner_id=7), dict(idempotency_key=None),
                                     dict(contract_hash=b""), dict(contract_hash="not hex")])
def test_bad_fields_are_refused_with_a_named_error(changes: dict[str, object]) -> None:
    with pytest.raises(InvalidInputError, match=next(iter(changes))):
        _digest(**changes)
    with pytest.raises(InvalidInputError, match="ciphertext stream is empty"):
        signing.submission_digest(ciphertext_digest=StreamHasher(), **BASE)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="ciphertext_digest must be 32 bytes"):
        signing.submission_digest(ciphertext_digest=b"short", **BASE)  # type: ignore[arg-type]


def test_private_key_file_is_0600_and_round_trips(tmp_path: Path, alice: tuple[bytes, bytes]) -> None:
    path = signing.save_private_key(tmp_path / "alice.sign.key", alice[0])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert alice[0] not in path.read_bytes()  # PEM, not the raw bytes
    assert signing.load_private_key(path) == alice[0]
    (tmp_path / "junk.key").write_bytes(b"not a key")
    with pytest.raises(InvalidInputError, match="not an unencrypted PEM private key"):
        signing.load_private_key(tmp_path / "junk.key")
    assert len(signing.key_fingerprint(alice[1])) == 16


def test_one_call_helpers_agree_with_the_parts(alice: tuple[bytes, bytes], bob: tuple[bytes, bytes]) -> None:
    sig = signing.sign_upload(alice[0], chunks=iter(CHUNKS), **BASE)  # type: ignore[arg-type]
    assert signing.verify_submission(alice[1], _digest(), sig) is None
    signing.verify_upload(alice[1], sig, chunks=CHUNKS, **BASE)  # type: ignore[arg-type]
    with pytest.raises(SignatureError, match="owner 'alice'"):
        signing.verify_upload(bob[1], sig, chunks=CHUNKS, **BASE)  # type: ignore[arg-type]
    with pytest.raises(SignatureError):
        signing.verify_upload(alice[1], sig, chunks=CHUNKS[::-1], **BASE)  # type: ignore[arg-type]
