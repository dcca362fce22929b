"""A key holder's record of the owners' signed c1 parts: the expected c1 of every chunk.

Kept by every key-share holder and by the single decryption server (for signed studies): both
take a measurement chunk's c1 from here, never from the computation server.

The computation server forwards, once per study, each owner's c1 parts (one per upload chunk,
`he_partition.he.threshold.c1.c1_bytes`) with the owner's Ed25519 signature over them
(`c1_statement`, domain-separated from the submission signature). `UploadC1Book.accept`
verifies every signature against the owner keys in the holder's own copy of the contract,
requires exactly the contract's owners (one dropped, a duplicate or a stranger is refused) and
keeps, per chunk, the sum of their parts: the c1 every honest measurement chunk carries
(the CS adds its noise to c0 only). `check` refuses any other c1, before the holder charges
its ledger or computes a share. A holder that was forwarded nothing refuses too.

What it cannot check: an owner that encrypts false data, or a c1 the owner itself chose
(an owner signs what it sends; a chosen c1 from an owner only harms the release it is in,
since the CS adds the other owners' c1 parts and only the aggregate is decrypted).
"""
from __future__ import annotations

import hashlib
import hmac
import io
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from he_partition.core.errors import InvalidInputError
from he_partition.he.threshold.c1 import (C1_MISMATCH, C1Part, aggregate_c1, c1_bytes, c1_from_bytes, c1_of_vector,
                                          c1_stream_digest, check_c1)

from ...common.contract import StudyContract
from ...common.sealing import Commitment
from ...common.errors import FailedPreconditionError
from ...common.signing import SignatureError, sign_submission, verify_submission
from ...common.util import write_file_atomic

__all__ = ["OwnerC1Parts", "UploadC1Book", "c1_statement", "sign_c1_parts", "sign_c1_upload"]

_TAG = b"dpagg/c1-parts-digest/v1"


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def c1_statement(study_id: str, owner_id: str, idempotency_key: str, contract_hash: str, parts_digest: bytes) -> bytes:
    """The 32-byte digest an owner signs over its c1 parts (study, owner, upload key, contract, `c1_stream_digest`)."""
    h = hashlib.sha256(_frame(_TAG))
    for name, value in ((b"study_id", study_id.encode()), (b"owner_id", owner_id.encode()),
                        (b"idempotency_key", idempotency_key.encode()), (b"contract_hash", contract_hash.encode()),
                        (b"c1_parts_digest", bytes(parts_digest))):
        h.update(_frame(name) + _frame(value))
    return h.digest()


@dataclass(frozen=True)
class OwnerC1Parts:
    """One owner's c1 parts (chunk order) and its signature over them, as the CS forwards them."""

    owner_id: str
    idempotency_key: str
    parts: Sequence[bytes]  # a tuple, or an upload read from the store chunk by chunk (a join's planes)
    signature: bytes


def sign_c1_parts(private: bytes, *, study_id: str, owner_id: str, idempotency_key: str, contract_hash: str,
                  parts: Sequence[bytes]) -> OwnerC1Parts:
    """Data-owner side: sign the c1 parts of its upload chunks (`threshold.c1.c1_bytes` of each, in order)."""
    digest = c1_statement(study_id, owner_id, idempotency_key, contract_hash, c1_stream_digest(parts))
    return OwnerC1Parts(owner_id, idempotency_key, tuple(bytes(p) for p in parts), sign_submission(private, digest))


def sign_c1_upload(private: bytes, ctx: Any, *, study_id: str, owner_id: str, idempotency_key: str,
                   contract_hash: str, chunks: Sequence[bytes]) -> bytes:
    """Data-owner side: the signature over the c1 parts of its serialized upload chunks (SubmitHeader.c1_signature)."""
    parts = [c1_bytes(c1_of_vector(ctx, c)) for c in chunks]
    return sign_c1_parts(private, study_id=study_id, owner_id=owner_id, idempotency_key=idempotency_key,
                         contract_hash=contract_hash, parts=parts).signature


class UploadC1Book:
    """Per study: the expected aggregate c1 of every chunk, from the contract's owners' verified parts."""

    def __init__(self, ctx: Any, directory: Path | None = None) -> None:
        self.ctx = ctx
        #: Where the expected aggregates are kept across restarts (one .npy per study); None: memory only.
        self.directory = Path(directory) if directory is not None else None
        data = ctx.seal_context().data.first_context_data()
        self.moduli = [int(m.value()) for m in data.parms().coeff_modulus()]
        self.n = int(data.parms().poly_modulus_degree())
        self._expected: dict[str, list[C1Part]] = {}
        self._lock = threading.Lock()

    def accept(self, contract: StudyContract, uploads: Iterable[OwnerC1Parts],
               closed: Mapping[str, Commitment] | None = None) -> int:
        """Verify every owner's parts and keep their per-chunk sum; returns the chunk count.

        A sealed study (`StudyContract.sealed`) takes exactly the owners of the set this holder
        closed (`CommitmentBook.close`), each with the c1 parts whose digest it committed to;
        another study takes every owner of the contract. Refuses (FailedPreconditionError) an
        unsigned study, a sealed study not closed here, a missing, duplicate or unknown owner,
        parts other than the committed ones; (SignatureError) a signature that does not verify
        under the contract's key for that owner; (InvalidInputError) parts of the wrong count,
        size or range.
        """
        if not contract.signed:
            raise FailedPreconditionError(f"study {contract.study_id} lists no owner keys: a key-share holder cannot "
                                          "check c1 against signed uploads, so it decrypts signed studies only")
        keys = dict(contract.owner_keys)
        got = list(uploads)
        names = [u.owner_id for u in got]
        digests = {id(u): c1_stream_digest(u.parts) for u in got}  # once per owner: the commitment and the signature
        if contract.sealed:
            if closed is None:
                raise FailedPreconditionError(f"study {contract.study_id}'s uploads were never closed at this key "
                                              f"holder, so no c1 is committed: {C1_MISMATCH} cannot be ruled out")
            if sorted(names) != sorted(closed) or len(set(names)) != len(names):
                missing = sorted(set(closed) - set(names))
                extra = sorted(set(names) - set(closed))
                dup = sorted({n for n in names if names.count(n) > 1})
                raise FailedPreconditionError(f"study {contract.study_id}'s uploads closed on the commitments of "
                                              f"{sorted(closed)}; the forwarded c1 parts must come from each of them "
                                              f"once (missing {missing}, not in the closed set {extra}, duplicated "
                                              f"{dup}): {C1_MISMATCH}, refused")
            for u in got:
                c = closed[u.owner_id]
                if u.idempotency_key != c.idempotency_key or not hmac.compare_digest(digests[id(u)],
                                                                                     c.c1_parts_digest):
                    raise FailedPreconditionError(f"owner {u.owner_id!r}'s forwarded c1 parts are not the ones it "
                                                  f"committed to before the uploads closed: {C1_MISMATCH}, refused")
        elif sorted(names) != sorted(contract.expected_owners) or len(set(names)) != len(names):
            missing = sorted(set(contract.expected_owners) - set(names))
            extra = sorted(set(names) - set(contract.expected_owners))
            dup = sorted({n for n in names if names.count(n) > 1})
            raise FailedPreconditionError(f"study {contract.study_id}: the forwarded c1 parts must come from every "
                                          f"owner of the contract once (missing {missing}, unknown {extra}, "
                                          f"duplicated {dup}): {C1_MISMATCH} cannot be checked, refused")
        chunks = -(-contract.domain_size // self.n)
        per_owner = []
        for u in got:
            if len(u.parts) != chunks:
                raise InvalidInputError(f"owner {u.owner_id!r} forwarded {len(u.parts)} c1 parts, the study has "
                                        f"{chunks} chunks")
            digest = c1_statement(contract.study_id, u.owner_id, u.idempotency_key, contract.contract_hash,
                                  digests[id(u)])
            try:
                verify_submission(bytes.fromhex(keys[u.owner_id]), digest, u.signature, owner_id=u.owner_id)
            except SignatureError:
                raise SignatureError(f"owner {u.owner_id!r}'s signature over its c1 parts does not verify under the "
                                     f"contract's key for that owner (forged, or another owner's parts): the "
                                     "forwarded parts are refused; nothing was charged or decrypted") from None
            per_owner.append([c1_from_bytes(p, self.moduli, self.n) for p in u.parts])  # views, not copies
        expected = [aggregate_c1((o[i] for o in per_owner), self.moduli) for i in range(chunks)]
        with self._lock:
            self._expected[contract.study_id] = expected
            if self.directory is not None:
                self.directory.mkdir(parents=True, exist_ok=True)
                buf = io.BytesIO()
                np.save(buf, np.stack(expected))
                write_file_atomic(self.directory / f"{contract.study_id}.npy", buf.getvalue())
        return chunks

    def _load(self, study_id: str) -> list[C1Part] | None:
        with self._lock:
            expected = self._expected.get(study_id)
            if expected is None and self.directory is not None and (self.directory / f"{study_id}.npy").exists():
                expected = list(np.load(self.directory / f"{study_id}.npy").astype(np.uint64))
                self._expected[study_id] = expected
        return expected

    def expected(self, study_id: str, chunk: int) -> C1Part:
        """The expected aggregate c1 of chunk `chunk` (FailedPrecondition when nothing was forwarded for the study)."""
        expected = self._load(study_id)
        if expected is None:
            raise FailedPreconditionError(f"study {study_id}: no owners' signed c1 parts were forwarded to this "
                                          f"key holder, so it has no c1 to decrypt with or compute shares on: nothing "
                                          "was charged or decrypted")
        if not 0 <= int(chunk) < len(expected):
            raise InvalidInputError(f"chunk {chunk} is outside the study's {len(expected)} chunks")
        return expected[int(chunk)]

    def has(self, study_id: str) -> bool:
        """True when this holder keeps the expected c1 of `study_id` (forwarded before, here or before a restart)."""
        return self._load(study_id) is not None

    def check(self, study_id: str, ciphertexts: Sequence[bytes], chunk_index: Sequence[int]) -> None:
        """Refuse (FailedPrecondition: nothing forwarded; InvalidInput naming C1_MISMATCH) unless every
        ciphertext (SEAL bytes) carries the expected aggregate c1 of its chunk."""
        expected = self._load(study_id)
        if expected is None:
            raise FailedPreconditionError(f"study {study_id}: no owners' signed c1 parts were forwarded to this "
                                          f"holder, so {C1_MISMATCH} cannot be ruled out: nothing was charged or "
                                          "decrypted")
        if len(ciphertexts) != len(chunk_index):
            raise InvalidInputError(f"{len(ciphertexts)} ciphertexts for {len(chunk_index)} chunk positions")
        for raw, i in zip(ciphertexts, chunk_index):
            if not 0 <= int(i) < len(expected):
                raise InvalidInputError(f"chunk {i} is outside the study's {len(expected)} chunks")
            check_c1(self.ctx, raw, expected[int(i)], chunk=int(i))
