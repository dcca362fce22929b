"""Data-owner client: validate a histogram, encrypt it under the study's public key, upload it resumably."""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Self, Sequence

import grpc
import numpy as np
import numpy.typing as npt

from he_partition.he.bfv import BfvBackend, context_fingerprint, load_context
from he_partition.core.errors import InvalidInputError
from he_partition.core.backend import split_chunks
from he_partition.core.measurements import MAX_DECODED_MAGNITUDE, owner_encoding
from he_partition.protocol import validate_histogram

from ..common.config import DEFAULT_TIMEOUT, RetryPolicy
from ..common.contract import StudyContract, check_id
from ..common.errors import PermissionDeniedError, ServiceError
from ..common.progress import Progress
from ..common.signing import key_fingerprint, public_key_of, sign_upload
from ..common.sealing import Commitment
from ..decryption.keyshare.uploads import sign_c1_parts, sign_c1_upload
from .encrypted import EncryptedHistogram
from .sealed import c1_parts_of, seal_upload
from ..common.tls import TlsConfig
from ..common.client import is_busy
from ..computation.client import ComputationClient, SubmitResponse, UploadQueued
from ..decryption.client import DecryptionClient
from .resume import UploadCache, counts_digest

__all__ = ["DataOwnerClient", "EncryptedHistogram", "SubmitInterrupted", "SubmitResult", "RESUMABLE_CODES",
           "BUSY_WAIT_SECONDS"]

#: Failures after which an upload is resumed (same idempotency key, only the missing chunks).
RESUMABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED,
                   grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED)

#: How long, by default, an upload keeps coming back to a server that refuses it "server busy" (its upload
#: queue full): seconds from the start of the upload. Such refusals do not count against `max_attempts`.
BUSY_WAIT_SECONDS = 900.0

#: Upload streams one owner sends at once by default (`upload_streams`), and the fewest chunks each must carry:
#: an upload of 128 chunks (2^20 bins) goes over 2 streams, one of 256 or more over 4; a small one over 1.
DEFAULT_STREAMS = 4
MIN_CHUNKS_PER_STREAM = 64


def upload_streams(chunks: int, wanted: int | None = None) -> int:
    """How many streams carry `chunks` chunks: `wanted` if given, else up to DEFAULT_STREAMS with at least
    MIN_CHUNKS_PER_STREAM each; never more streams than chunks."""
    n = wanted if wanted is not None else min(DEFAULT_STREAMS, chunks // MIN_CHUNKS_PER_STREAM)
    return max(1, min(n, chunks))


def _in_parallel(send: Callable[[], SubmitResponse], streams: int) -> SubmitResponse:
    """`send` on `streams` threads at once (each one upload stream that takes chunks from a shared queue).

    The answer of a stream that committed, else of one that ended without error; if every stream failed, the
    first stream's error (a busy refusal of the others is expected and ignored while one stream got through),
    and an error that resuming cannot help wins over any answer.
    """
    if streams <= 1:
        return send()
    answers: list[SubmitResponse | None] = [None] * streams
    errors: list[ServiceError | None] = [None] * streams

    def run(j: int) -> None:
        try:
            answers[j] = send()
        except ServiceError as err:
            errors[j] = err

    threads = [threading.Thread(target=run, args=(j,), name=f"upload-stream-{j}", daemon=True)
               for j in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fatal = next((e for e in errors if e is not None and not is_busy(e) and e.code not in RESUMABLE_CODES), None)
    if fatal is not None:
        raise fatal
    done = [a for a in answers if a is not None]
    committed = next((a for a in done if a.committed), None)
    if committed is not None:
        return committed
    if done:
        return done[0]
    first = next(e for e in errors if e is not None)
    raise first


@dataclass(frozen=True)
class SubmitResult:
    """What one `submit` achieved. `duplicate`: the server already had this upload (nothing was sent)."""

    study_id: str
    owner_id: str
    idempotency_key: str
    committed: bool
    duplicate: bool
    chunk_count: int
    chunks_sent: int
    bytes_sent: int
    attempts: int
    seconds: float
    #: Seconds the upload waited in the server's upload queue, and how often the server refused it as busy.
    queued_seconds: float = 0.0
    busy_refusals: int = 0


class SubmitInterrupted(KeyboardInterrupt):
    """Ctrl-C during an upload: what was sent, and how to resume (a KeyboardInterrupt, so it still stops)."""

    def __init__(self, study_id: str, owner_id: str, idempotency_key: str, sent: int, held_before: int,
                 chunk_count: int) -> None:
        super().__init__(study_id, owner_id, idempotency_key)
        self.study_id, self.owner_id, self.idempotency_key = study_id, owner_id, idempotency_key
        self.sent, self.held_before, self.chunk_count = sent, held_before, chunk_count

    def __str__(self) -> str:
        return (f"interrupted: upload {self.idempotency_key} of owner {self.owner_id} to study {self.study_id} is not "
                f"committed; the server held {self.held_before} of {self.chunk_count} chunk(s) and this run sent "
                f"{self.sent} more (the last may not have arrived). Nothing counts until every chunk is there")


def _check_decodable(hist: npt.NDArray[np.int64], limit: int, what: str, owner_id: str) -> None:
    """Refuse a histogram whose total (the last prefix sum it encrypts) would not decode (see
    `StudyContract.max_records_per_owner`): past the bound the aggregate wraps modulo the plaintext
    modulus and the release comes out wrong with no error anywhere."""
    total = int(np.sum(hist.astype(object))) if hist.size else 0
    if total > limit:
        raise InvalidInputError(
            f"histogram of owner {owner_id} holds {total} records (largest count {int(hist.max())} at bin "
            f"{int(hist.argmax())}), more than {limit} ({what}); decoded values past 2^44 would be wrong. "
            "Check the counts (a unit or overflow error?); nothing was encrypted or sent")


def _counts_of(histogram: Any) -> tuple[Any, int | None]:
    """Accept a plain array or a BoundedHistogram (parties.data_owner.dataset); return (counts, its bound)."""
    if hasattr(histogram, "counts") and hasattr(histogram, "contribution_bound"):
        return histogram.counts, int(histogram.contribution_bound)
    return histogram, None


class DataOwnerClient:
    """One data owner's connection to a study.

    The owner fetches the public context from the decryption server, or with
    `decryption=None` through the computation server's relay (checking its
    fingerprint against the study contract), encrypts locally, and streams ciphertext
    chunks to the computation server. Raw counts never leave this process. Uploads are
    resumable: with the same `idempotency_key` a retry sends only the chunks the server
    lacks, and a retry of a finished upload is a no-op (never counted twice).

    `tls`: this owner's certificate (its id must be `owner_id`), required by servers with
    mutual TLS. `signing_key`: the owner's raw Ed25519 private key (`load_private_key`);
    in a signed study every upload is signed with it over the study id, owner id,
    idempotency key, contract hash and every ciphertext chunk, so nobody else can submit
    data in this owner's name and a release can show whose data it contains.
    `progress`: report encryption and upload on stderr (a bar on a terminal, a line every
    few seconds in a log), or a `parties.common.progress.Progress` to report to.

    Example::

        with DataOwnerClient("hospital-a", computation="cs:50052", decryption="ds:50051") as owner:
            owner.submit("study-1", counts)
    """

    def __init__(self, owner_id: str, *, computation: str | ComputationClient,
                 decryption: str | DecryptionClient | None = None,
                 timeout: float = DEFAULT_TIMEOUT, retry: RetryPolicy = RetryPolicy(),
                 progress: bool | Progress = True, tls: TlsConfig | None = None, signing_key: bytes | None = None,
                 insecure: bool = False, streams: int | None = None) -> None:
        self.owner_id = check_id("owner_id", owner_id)
        if streams is not None and streams < 1:
            raise InvalidInputError(f"streams must be at least 1, got {streams}")
        #: Upload streams at once (None: `upload_streams` picks by the upload's size).
        self.streams = streams
        if tls is not None and (tls.identity.role != "data_owner" or tls.identity.party_id != owner_id):
            raise InvalidInputError(
                f"{tls.cert} is the certificate of {tls.identity.role} {tls.identity.party_id!r}, not of data owner "
                f"{owner_id!r}; use the certificate issued for {owner_id!r}"
            )
        self._own: list[ComputationClient | DecryptionClient] = []
        if isinstance(computation, str):
            computation = ComputationClient(computation, timeout=timeout, retry=retry, tls=tls, insecure=insecure)
            self._own.append(computation)
        if isinstance(decryption, str):
            decryption = DecryptionClient(decryption, timeout=timeout, retry=retry, tls=tls, insecure=insecure)
            self._own.append(decryption)
        self._signing_key = signing_key
        self.computation: ComputationClient = computation
        self.decryption: DecryptionClient | None = decryption
        self.retry = retry
        self.progress = progress
        self._context: tuple[str, BfvBackend] | None = None

    def close(self) -> None:
        """Close the server clients this owner opened from addresses (not those it was given)."""
        for c in self._own:
            c.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- steps --------------------------------------------------------------------------
    def contract(self, study_id: str) -> StudyContract:
        """The study's contract from the computation server (hash checked)."""
        return self.computation.study_status(study_id).contract

    def backend(self, contract: StudyContract) -> BfvBackend:
        """A public-key backend for the study's key; refuses a context whose fingerprint differs from the contract's."""
        if self._context is not None and self._context[0] == contract.context_fingerprint:
            return self._context[1]
        source = self.decryption if self.decryption is not None else self.computation
        data = source.public_context(study_id=contract.study_id)  # the study's own key
        fp = context_fingerprint(data)
        if fp != contract.context_fingerprint:
            raise InvalidInputError(
                f"the decryption server's public key {fp[:16]} is not the key of study {contract.study_id} "
                f"({contract.context_fingerprint[:16]}); are you talking to the right decryption server?"
            )
        ctx = load_context(data)
        if ctx.is_private():
            raise InvalidInputError("the decryption server sent a context with a secret key; refusing to use it")
        backend = BfvBackend(ctx)
        self._context = (fp, backend)
        return backend

    def _parameters(self, enc: EncryptedHistogram) -> Any:
        """A context with the study's BFV parameters (to read the c1 parts of `enc`'s chunks)."""
        if self._context is not None and self._context[0] == enc.context_fingerprint:
            return self._context[1].context
        source = self.decryption if self.decryption is not None else self.computation
        return load_context(source.public_context(study_id=enc.study_id))

    def encrypt(self, study_id: str, histogram: Any, *, progress: bool | None = None) -> EncryptedHistogram:
        """Validate the counts and encrypt them for the study (nothing is sent).

        NaN, infinite, negative or non-integer counts and a wrong length are refused here,
        before anything leaves the machine. A BoundedHistogram whose contribution bound
        differs from the contract's is refused (its noise would be miscalibrated).
        With `progress` (default: the client's) each ciphertext encrypted is reported on
        stderr (a bar on a terminal, a line every few seconds in a log).
        """
        counts, bound = _counts_of(histogram)
        hist = validate_histogram(counts, name=f"histogram of owner {self.owner_id}")
        contract = self.contract(study_id)
        if self.owner_id not in contract.expected_owners:
            raise PermissionDeniedError(
                f"owner {self.owner_id!r} is not expected by study {study_id} (expected: "
                f"{', '.join(contract.expected_owners)}); check the owner id"
            )
        if hist.size != contract.domain_size:
            raise InvalidInputError(
                f"histogram has {hist.size} bins but study {study_id} has domain size {contract.domain_size}"
                + (f" (domain {contract.domain_spec})" if contract.domain_spec else "")
            )
        if bound is not None:
            from .dataset import check_bound_matches

            check_bound_matches(histogram, contract.contribution_bound)
        _check_decodable(hist, contract.max_records_per_owner, f"study {study_id}'s bound for one of its "
                         f"{len(contract.expected_owners)} owner(s)", self.owner_id)
        self._check_signing_key(contract)
        backend = self.backend(contract)
        # What encrypt_histogram encrypts (the prefix encoding), one ciphertext at a time so it can be reported.
        pieces = split_chunks(owner_encoding(hist), backend.slots)
        chunks: list[bytes] = []
        with self._reporter(progress).step(f"encrypting {hist.size:,} bins", total=len(pieces),
                                           unit="ciphertexts") as advance:
            for piece in pieces:
                chunks += [backend.serialize_chunk(c) for c in backend.encrypt(piece).chunks]
                advance(1)
        return EncryptedHistogram(study_id, int(hist.size), contract.context_fingerprint, tuple(chunks),
                                  contract.contract_hash, contract.signed, contract.holder_seal_keys,
                                  contract.seal_threshold)

    def _reporter(self, progress: bool | None) -> Progress:
        """Where long steps are reported: the client's Progress, or stderr when `progress` (default: the client's)."""
        if progress is None and isinstance(self.progress, Progress):
            return self.progress
        return Progress(enabled=bool(self.progress if progress is None else progress))

    def _check_signing_key(self, contract: StudyContract) -> None:
        """A signed study needs this owner's key, and it must be the key the contract lists."""
        if not contract.signed:
            return
        registered = contract.owner_public_key(self.owner_id)
        if self._signing_key is None:
            raise InvalidInputError(
                f"study {contract.study_id} requires signed uploads: pass signing_key= (or `dpagg submit "
                f"--signing-key`) with owner {self.owner_id}'s Ed25519 key"
            )
        mine = public_key_of(self._signing_key)
        if registered != mine:
            raise InvalidInputError(
                f"your signing key {key_fingerprint(mine)} is not the key study {contract.study_id} lists for owner "
                f"{self.owner_id} ({key_fingerprint(registered) if registered else 'none'}); use the key whose "
                "public half you gave the operator"
            )

    def submit(self, study_id: str, histogram: Any, *, idempotency_key: str | None = None,
               progress: bool | None = None, max_attempts: int = 5,
               resume_dir: str | os.PathLike[str] | None = None, busy_wait: float = BUSY_WAIT_SECONDS,
               streams: int | None = None) -> SubmitResult:
        """Encrypt and upload `histogram` (counts per bin, or a BoundedHistogram) to the study.

        Retries (UNAVAILABLE, DEADLINE_EXCEEDED, ...) resume the upload: the server
        reports which chunks it holds and only the others are sent. Keep
        `idempotency_key` to resume from another process after a crash; a fresh key is
        generated otherwise. With `resume_dir` the encrypted chunks are kept there until
        the upload commits, so a later run with the same key and counts sends only the
        chunks the server lacks instead of re-encrypting (a new encryption could not be
        combined with the held chunks). Raises ServiceError with ALREADY_EXISTS if this
        owner already submitted under a different key, and SubmitInterrupted (a
        KeyboardInterrupt) on Ctrl-C during the upload. A busy server queues the upload
        (its place and wait are reported) or refuses it "server busy" when its queue is
        full; such refusals are retried with jittered backoff for up to `busy_wait` seconds.
        """
        counts, bound = _counts_of(histogram)
        hist = validate_histogram(counts, name=f"histogram of owner {self.owner_id}")  # before any network traffic
        _check_decodable(hist, MAX_DECODED_MAGNITUDE // 2, "what any study can decode", self.owner_id)
        key = check_id("idempotency_key", idempotency_key or f"up-{uuid.uuid4().hex[:20]}")
        started = time.monotonic()
        status = self.computation.upload_status(study_id, self.owner_id, key)
        if status.state == "COMMITTED":
            if resume_dir is not None:
                UploadCache(Path(resume_dir), study_id=study_id, owner_id=self.owner_id, idempotency_key=key).clear()
            return SubmitResult(study_id, self.owner_id, key, True, True, status.chunk_count, 0, 0, 0,
                                time.monotonic() - started)
        if status.state == "CONFLICT":
            raise ServiceError(grpc.StatusCode.ALREADY_EXISTS,
                               f"owner {self.owner_id} already submitted to study {study_id} under another "
                               "idempotency key; a study counts one submission per owner",
                               method="Computation/UploadStatus")
        if resume_dir is None:
            enc = self.encrypt(study_id, histogram, progress=progress)
            return self.upload(enc, idempotency_key=key, progress=progress, max_attempts=max_attempts,
                               started=started, busy_wait=busy_wait, streams=streams)
        cache = UploadCache(Path(resume_dir), study_id=study_id, owner_id=self.owner_id, idempotency_key=key)
        digest = counts_digest(np.asarray(counts), bound)
        contract = self.contract(study_id)
        saved = cache.load(digest, contract_hash=contract.contract_hash,
                           context_fingerprint=contract.context_fingerprint)
        if saved is not None:
            self._check_signing_key(contract)
            enc = EncryptedHistogram(study_id, saved.domain_length, saved.context_fingerprint, saved.chunks,
                                     saved.contract_hash, contract.signed, contract.holder_seal_keys,
                                     contract.seal_threshold)
        else:
            enc = self.encrypt(study_id, histogram, progress=progress)
            cache.save(digest, contract_hash=enc.contract_hash, context_fingerprint=enc.context_fingerprint,
                       domain_length=enc.domain_length, chunks=enc.chunks)
        result = self.upload(enc, idempotency_key=key, progress=progress, max_attempts=max_attempts, started=started,
                             busy_wait=busy_wait)
        if result.committed:
            cache.clear()
        return result

    def upload(self, enc: EncryptedHistogram, *, idempotency_key: str, progress: bool | None = None,
               max_attempts: int = 5, only: Sequence[int] | None = None, started: float | None = None,
               busy_wait: float = BUSY_WAIT_SECONDS, streams: int | None = None) -> SubmitResult:
        """Upload already encrypted chunks, resuming until committed. `only` restricts the first attempt
        to some chunk indices (it simulates an interrupted upload in tests and demos).

        `streams` (default `DEFAULT_STREAMS` for an upload of `MIN_CHUNKS_PER_STREAM` chunks per stream or more,
        else 1): upload streams sent at once, each taking the next chunk no stream has taken, so a server
        with several ingest processes receives one owner's chunks on as many cores. A stream the server
        refuses as busy takes nothing more; the others carry the chunks, and what none delivered is sent
        again by the next round.

        Up to `max_attempts` streams are tried on failures in `RESUMABLE_CODES`, each resuming from
        the chunks the server holds (`upload_status`). A "server busy" refusal (the server's upload
        queue is full) is not counted among them: it is retried after a jittered, growing pause
        (the client's RetryPolicy) for as long as `busy_wait` seconds from the start allow. A
        queued stream's place and wait are reported through the progress reporter.
        """
        t0 = time.monotonic() if started is None else started
        give_up = t0 + busy_wait
        k = len(enc.chunks)
        lanes = self.streams if streams is None else streams
        if lanes is not None and lanes < 1:
            raise InvalidInputError(f"streams must be at least 1, got {lanes}")
        signature = c1_signature = b""
        commitment: Commitment | None = None
        c1_parts: list[bytes] | None = None
        if enc.signed:
            if self._signing_key is None:
                raise InvalidInputError(f"study {enc.study_id} requires signed uploads: pass signing_key=")
            self._reporter(progress).say(f"{'sealing and signing' if enc.holder_seal_keys else 'signing'} {k:,} "
                                         f"ciphertext{'s' if k != 1 else ''} ...")  # 1.4 s at 4M bins here: said
            if enc.holder_seal_keys:  # sealed until the key holders close the study (parties.common.sealing)
                c1_parts = c1_parts_of(enc, self._parameters(enc))  # once: the commitment and the c1 signature
                sealed, commitment = seal_upload(enc, self._signing_key, self._parameters(enc),
                                                 owner_id=self.owner_id, idempotency_key=idempotency_key,
                                                 c1_parts=c1_parts)
                enc = replace(enc, chunks=sealed)
            # One signature over the whole upload (every chunk, in index order), so any
            # resumed stream carries the same signature and the server verifies it once complete.
            signature = sign_upload(self._signing_key, study_id=enc.study_id, owner_id=self.owner_id,
                                    idempotency_key=idempotency_key, contract_hash=enc.contract_hash,
                                    chunks=enc.chunks)
        sent_chunks = 0
        sent_bytes = 0
        delay = self.retry.initial_delay
        held: set[int] = set()
        counted = 0
        queued_seconds = 0.0
        busy = 0
        reporter = self._reporter(progress)

        def queued(note: UploadQueued) -> None:
            nonlocal queued_seconds
            if note.waited is None:
                reporter.say(f"upload {idempotency_key}: the server is busy; queued at position {note.place.position} "
                             f"({note.place.running} upload(s) running, {note.place.waiting} waiting)")
            else:
                queued_seconds += note.waited
                reporter.say(f"upload {idempotency_key}: admitted after waiting {note.waited:.1f} s in the queue")

        def result(committed: bool, duplicate: bool, attempts: int) -> SubmitResult:
            return SubmitResult(enc.study_id, self.owner_id, idempotency_key, committed, duplicate, k, sent_chunks,
                                sent_bytes, attempts, time.monotonic() - t0, queued_seconds, busy)

        with reporter.step(f"uploading {len(enc.chunks)} ciphertext{'s' if len(enc.chunks) != 1 else ''} to study {enc.study_id}",
                                           total=enc.nbytes, unit="B") as advance:
            try:
                failures = streams = 0
                while failures < max_attempts:
                    status = self.computation.upload_status(enc.study_id, self.owner_id, idempotency_key)
                    if status.state == "COMMITTED":
                        return result(True, sent_chunks == 0, streams)
                    if status.state == "CONFLICT":
                        raise ServiceError(grpc.StatusCode.ALREADY_EXISTS,
                                           f"owner {self.owner_id} already submitted to study {enc.study_id} under "
                                           "another idempotency key", method="Computation/UploadStatus")
                    if enc.signed and status.c1_signature_wanted and not c1_signature:  # the holders check c1
                        assert self._signing_key is not None
                        if c1_parts is not None:
                            c1_signature = sign_c1_parts(self._signing_key, study_id=enc.study_id,
                                                         owner_id=self.owner_id, idempotency_key=idempotency_key,
                                                         contract_hash=enc.contract_hash, parts=c1_parts).signature
                        else:
                            c1_signature = sign_c1_upload(self._signing_key, self._parameters(enc),
                                                          study_id=enc.study_id, owner_id=self.owner_id,
                                                          idempotency_key=idempotency_key,
                                                          contract_hash=enc.contract_hash, chunks=enc.chunks)
                    held = set(status.received) if status.state == "PARTIAL" else set()
                    todo = [i for i in range(k) if i not in held]
                    if only is not None and streams == 0:
                        todo = [i for i in todo if i in set(only)]
                    already = sum(len(enc.chunks[i]) for i in held)  # held by the server: shown as done
                    if already > counted:
                        advance(already - counted)
                        counted = already

                    pending = deque(todo)
                    taking = threading.Lock()

                    def stream(pending: deque[int] = pending,
                               taking: Any = taking) -> Iterator[tuple[int, bytes]]:
                        nonlocal sent_chunks, sent_bytes, counted
                        while True:  # every stream of this round takes the next chunk nobody has taken
                            with taking:
                                if not pending:
                                    return
                                i = pending.popleft()
                                sent_chunks += 1  # counted when handed to gRPC
                                sent_bytes += len(enc.chunks[i])
                                counted += len(enc.chunks[i])
                                advance(len(enc.chunks[i]))
                            yield i, enc.chunks[i]

                    def send(c1_signature: bytes = c1_signature) -> SubmitResponse:
                        return self.computation.submit_chunks(
                            study_id=enc.study_id, owner_id=self.owner_id, idempotency_key=idempotency_key,
                            domain_length=enc.domain_length, context_fingerprint=enc.context_fingerprint,
                            chunk_count=k, chunks=stream(), contract_hash=enc.contract_hash, signature=signature,
                            c1_signature=c1_signature, commitment=commitment, on_queued=queued)

                    first = streams == 0
                    streams += 1
                    try:
                        resp = _in_parallel(send, 1 if only is not None else upload_streams(len(todo), lanes))
                    except ServiceError as err:
                        pause = random.uniform(0, min(self.retry.max_delay, delay))
                        delay *= self.retry.multiplier
                        if is_busy(err) and time.monotonic() + pause < give_up:
                            busy += 1  # refused before anything was read: not a failed attempt
                            if busy == 1:
                                why = err.details.removeprefix("server busy: ").split("; retry in a moment")[0]
                                reporter.say(f"upload {idempotency_key}: the server is busy ({why}); trying again "
                                             f"for up to {give_up - time.monotonic():.0f} s")
                            time.sleep(pause)
                            continue
                        failures += 1
                        if err.code not in RESUMABLE_CODES or failures >= max_attempts:
                            if is_busy(err):
                                err.details += (f" (refused busy {busy + 1} time(s) in "
                                                f"{time.monotonic() - t0:.0f} s; the wait limit is {busy_wait:g} s)")
                                err.args = (f"{err.code.name} ({err.method}): {err.details}",)
                            raise
                        time.sleep(pause)
                        continue
                    if resp.committed:
                        return result(True, resp.duplicate, streams)
                    if only is not None and first:
                        return result(False, False, streams)
                    failures += 1  # the stream ended without a commit: ask what the server holds, go on
            except KeyboardInterrupt:
                raise SubmitInterrupted(enc.study_id, self.owner_id, idempotency_key, sent_chunks, len(held),
                                        k) from None
        raise ServiceError(grpc.StatusCode.UNAVAILABLE,
                           f"upload {idempotency_key} not committed after {max_attempts} attempts; run the same "
                           "submit again with this idempotency key to resume", method="Computation/SubmitHistogram")

