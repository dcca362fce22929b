"""Typed Python client of the computation service (operator actions and the low-level upload stream)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import grpc

from parties.wire.v1 import analyst_pb2, analyst_pb2_grpc, computation_pb2, computation_pb2_grpc, decryption_pb2
from he_partition.core.summary import RangeCount, Summary

from ..common.sealing import Commitment
from ..common.client import BaseClient
from ..common.config import RELEASE_TIMEOUT
from ..common.approval import approve_study
from ..common.contract import StudyContract
from ..common.convert import (approval_to_proto, context_from_chunks, contract_from_proto, open_study_kwargs,
                              open_study_request, range_counts_from_proto, ranges_to_proto, signatures_from_proto,
                              summary_from_proto)
from ..common.errors import ServiceError
from ..common.limits import QUEUE_METADATA, QUEUE_WAITED_METADATA, QueuePlace
from he_partition.core.errors import InvalidInputError
from ..common.receipts import Receipt, parse_receipt
from ..common.signing import OwnerSignature
from .store import ReleaseProgress

__all__ = ["ComputationClient", "StudyStatus", "UploadStatus", "SubmitResponse", "UploadQueued", "ReleaseStatus",
           "DirectAnswers"]

_UPLOAD_STATES = computation_pb2.UploadStatusResponse.State
_RELEASE_STATES = computation_pb2.ReleaseStatusResponse.State


@dataclass(frozen=True)
class StudyStatus:
    """A study's contract, who submitted, who is missing, and its release ids."""

    contract: StudyContract
    submitted_owners: tuple[str, ...]
    missing_owners: tuple[str, ...]
    release_ids: tuple[str, ...]
    #: K, the server's key holders (1: a single decryption server), and how many answer each measurement (t of a
    #: t-of-N key, else K); 0 when the server does not say.
    key_holders: int = 0
    holders_per_measurement: int = 0

    @property
    def t_of_n(self) -> bool:
        """True when the study's key is t-of-N: any t of the K holders answer a measurement (t < K)."""
        return 0 < self.holders_per_measurement < self.key_holders


@dataclass(frozen=True)
class UploadStatus:
    """`state` is NONE, PARTIAL, COMMITTED or CONFLICT; `received` the chunk indices the server holds."""

    state: str
    received: tuple[int, ...]
    chunk_count: int
    #: The server forwards c1 parts to key-share holders: send `c1_signature` with a signed upload.
    c1_signature_wanted: bool = False


@dataclass(frozen=True)
class SubmitResponse:
    """Result of one upload stream."""

    committed: bool
    duplicate: bool
    received: tuple[int, ...]
    chunk_count: int
    bytes_received: int


@dataclass(frozen=True)
class UploadQueued:
    """The server queued an upload stream for a free upload slot: its place when it joined (`place`), and once
    admitted how many seconds it waited (`waited`; None while it still waits)."""

    place: QueuePlace
    waited: float | None = None


def _metadata(pairs: Any, key: str) -> str:
    for k, v in pairs or ():
        if k == key:
            return str(v)
    return ""


@dataclass(frozen=True)
class ReleaseStatus:
    """A release: `state` RUNNING, DONE (then `summary` is set) or FAILED (then `error_code`/`error_message`)."""

    release_id: str
    study_id: str
    state: str
    epsilon: float
    owners: tuple[str, ...]
    error_code: str
    error_message: str
    summary: Summary | None
    seconds: float
    bytes_to_decryption: int = 0
    #: DONE releases of signed studies: each included owner's signature on its submission.
    signatures: tuple[OwnerSignature, ...] = ()
    #: RUNNING releases: how far the server has got (None from a server that does not report it, or once done).
    progress: ReleaseProgress | None = None

    def raise_for_failure(self) -> None:
        """Raise the release's error as a ServiceError if it FAILED."""
        if self.state == "FAILED":
            code = getattr(grpc.StatusCode, self.error_code, grpc.StatusCode.UNKNOWN)
            raise ServiceError(code, self.error_message, method="Computation/RunRelease")


def _progress(resp: computation_pb2.ReleaseStatusResponse) -> ReleaseProgress | None:
    if not resp.HasField("progress") or not resp.progress.phase:
        return None
    p = resp.progress
    return ReleaseProgress(phase=p.phase, measurements_done=p.measurements_done, measurement_kind=p.measurement_kind,
                           chunks_sent=p.chunks_sent, chunks_total=p.chunks_total,
                           measurement_seconds=p.measurement_seconds)


def _release(resp: computation_pb2.ReleaseStatusResponse, summary: Summary | None = None,
             signatures: tuple[OwnerSignature, ...] = ()) -> ReleaseStatus:
    """The release of a reply; `summary`/`signatures`: those read in pages when the reply has none inline."""
    if resp.HasField("summary"):
        summary, signatures = summary_from_proto(resp.summary), signatures_from_proto(resp.summary.owner_signatures)
    return ReleaseStatus(
        release_id=resp.release_id, study_id=resp.study_id, state=_RELEASE_STATES.Name(resp.state),
        epsilon=resp.epsilon, owners=tuple(resp.owners), error_code=resp.error_code,
        error_message=resp.error_message, summary=summary, seconds=resp.seconds,
        bytes_to_decryption=resp.bytes_to_decryption, signatures=signatures, progress=_progress(resp),
    )


@dataclass(frozen=True)
class DirectAnswers:
    """Answers of one batch: noisy counts with the standard error of their noise, and what they cost.

    `epsilon_charged` is what the decryption server's ledger charged for the batch (the
    growth of the heaviest overlap of all answered ranges; 0.0 for a repeated request
    key); `epsilon_sequential` what plain sequential composition would have charged.
    """

    request_id: str
    study_id: str
    epsilon: float
    counts: tuple[RangeCount, ...]
    epsilon_charged: float
    epsilon_sequential: float
    epsilon_remaining: float
    owners: tuple[str, ...]

    def to_json(self) -> str:
        d: dict[str, Any] = {
            "request_id": self.request_id, "study_id": self.study_id, "epsilon": self.epsilon,
            "counts": [[c.lo, c.hi, c.value, c.standard_error] for c in self.counts],
            "epsilon_charged": self.epsilon_charged, "epsilon_sequential": self.epsilon_sequential,
            "epsilon_remaining": self.epsilon_remaining, "owners": list(self.owners),
        }
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DirectAnswers":
        d = json.loads(text)
        return cls(d["request_id"], d["study_id"], float(d["epsilon"]),
                   tuple(RangeCount(int(a), int(b), float(v), float(se)) for a, b, v, se in d["counts"]),
                   float(d["epsilon_charged"]), float(d["epsilon_sequential"]), float(d["epsilon_remaining"]),
                   tuple(d["owners"]))


class ComputationClient(BaseClient):
    """Client of the computation server. Every call has a deadline; idempotent calls retry on UNAVAILABLE.

    Example::

        with ComputationClient("127.0.0.1:50052") as cs:
            contract, _ = cs.open_study(study_id="s1", domain_size=100, epsilon=1.0, expected_owners=["a", "b"])
            ...  # owners submit (DataOwnerClient)
            release = cs.run_release("s1")
            print(release.summary.range_count(10, 20))
    """

    stub_class = computation_pb2_grpc.ComputationStub
    server_role = "computation"
    #: The collective key's threshold t after `setup_key` (N for an N-of-N key; 0 before).
    key_threshold: int = 0

    def __init__(self, target: str, *, approval_key: bytes | None = None, **kwargs: Any) -> None:
        """`approval_key`: the operator's raw Ed25519 approval key that `open_study` signs studies with (None:
        studies go unsigned, which only key holders without pinned approval keys accept). The rest: BaseClient."""
        super().__init__(target, **kwargs)
        self.approval_key = approval_key

    def open_study(self, *, domain_size: int, epsilon: float, expected_owners: Sequence[str], study_id: str = "",
                   strategy: str = "auto", contribution_bound: int = 1, noise_parties: int = 2,
                   strategy_params_json: str = "", domain_spec: str = "",
                   owner_keys: Mapping[str, str | bytes] | None = None, correlation_leakage: float = 0.0,
                   correlation_source: str = "", max_organizations: int = 1,
                   noise_tolerates: int | None = None,
                   approval_key: bytes | None = None,
                   timeout: float | None = None) -> tuple[StudyContract, bool]:
        """Open a study (forwarded to the decryption server, which owns contracts and the ledger).

        `approval_key`: the operator's raw Ed25519 approval key (`load_private_key` of a `dpagg keygen`
        file); the terms are signed with it (parties.common.approval) and every key holder that pins
        its public half checks the signature before it opens anything. Default: the key this client
        was made with (`ComputationClient(..., approval_key=...)`); key holders with TLS refuse a
        study without one.

        `epsilon` is the study's total privacy budget; every release spends from it.
        `owner_keys` maps every expected owner to its Ed25519 public key (raw or hex; see
        `parties.common.signing.generate_signing_key`): servers with mutual TLS require it,
        and then count only uploads those keys signed. Needs an operator certificate.

        Correlated records: `correlation_leakage` L > 0 (the maximum leakage coefficient of
        a Gaussian correlation model of the records, seed 003) makes `epsilon` a
        Bayesian-DP budget under that model; every measurement's noise scale is then
        multiplied by 1 + L (`contract.noise_multiplier`). Build both arguments with
        `he_partition.methods.bayesian.correlation_terms(W, tau)`:
        `cs.open_study(..., **correlation_terms(W, tau))`.
        Returns (contract, already_existed). Without `study_id` one is generated here, so
        the call is safe to retry.
        `noise_tolerates` T (threshold mode, K key-share holders): how many holders may
        collude with this server while the holders' noise still gives one full discrete
        Laplace draw; the holders' noise variance is then K/(K - T) draws'. None: K - 1
        with K holders, 0 with the single decryption server (see `StudyContract`).
        """
        req = open_study_request(
            study_id=study_id or f"study-{uuid.uuid4().hex[:16]}", domain_size=domain_size, epsilon=epsilon,
            strategy=strategy, contribution_bound=contribution_bound, noise_parties=noise_parties,
            expected_owners=expected_owners, strategy_params_json=strategy_params_json, domain_spec=domain_spec,
            owner_keys=owner_keys, correlation_leakage=correlation_leakage, correlation_source=correlation_source,
            max_organizations=max_organizations, noise_tolerates=noise_tolerates)
        key = approval_key if approval_key is not None else self.approval_key
        if key is not None:  # signed as the key holders will read the request
            req.approval.CopyFrom(approval_to_proto(approve_study(key, **open_study_kwargs(req))))
        resp = self._unary(self._stub.OpenStudy, req, method="Computation/OpenStudy", timeout=timeout)
        return contract_from_proto(resp.contract), resp.already_existed

    def study_status(self, study_id: str, *, timeout: float | None = None) -> StudyStatus:
        """A study's contract, which owners have submitted and which are missing, and its release ids.

        Raises ServiceError NOT_FOUND for an unknown study. Any party with a certificate of
        the deployment may ask (the contract is what owners check before they encrypt).
        """
        resp = self._unary(self._stub.StudyStatus, computation_pb2.StudyStatusRequest(study_id=study_id),
                           method="Computation/StudyStatus", timeout=timeout)
        return StudyStatus(contract_from_proto(resp.contract), tuple(resp.submitted_owners),
                           tuple(resp.missing_owners), tuple(resp.release_ids), int(resp.key_holders),
                           int(resp.holders_per_measurement))

    def ledger_receipts(self, study_id: str, *, timeout: float | None = None) -> list[tuple[str, list[Receipt]]]:
        """Every signed ledger receipt this server keeps for the study: (holder name, receipts) per key holder,
        "" naming the single decryption server. Signatures are not checked here: check each against the key of
        the holder whose ledger it is compared with (`parties.common.receipts.verify_receipt`). Operators and
        analysts."""
        resp = self._unary(self._stub.LedgerReceipts, computation_pb2.LedgerReceiptsRequest(study_id=study_id),
                           method="Computation/LedgerReceipts", timeout=timeout)
        out = []
        for h in resp.holders:
            kept = []
            for r in h.receipts:
                try:
                    kept.append(parse_receipt(r.body, r.signature, r.public_key))
                except (ValueError, KeyError, TypeError):
                    continue  # not a receipt: it proves nothing
            out.append((h.holder, kept))
        return out

    def charge_log(self, study_id: str, *, timeout: float | None = None) -> tuple[int, str]:
        """With a t-of-N key, (charges, their epsilon as an exact decimal: a Fraction's text) of this server's copy
        of the study's signed charge log; (0, "") otherwise or from an older server. Operators and analysts."""
        resp = self._unary(self._stub.LedgerReceipts, computation_pb2.LedgerReceiptsRequest(study_id=study_id),
                           method="Computation/LedgerReceipts", timeout=timeout)
        return int(resp.charge_log_entries), str(resp.charge_log_spent)

    def key_holders(self, study_id: str, *, timeout: float | None = None) -> list[tuple[str, str]]:
        """(name, HOST:PORT) of each key holder this server asks, in its order; one ("", target) for the single
        decryption server. The addresses are the server's own: they may not resolve from the caller's machine (a
        compose service name). From the LedgerReceipts reply (an older server sends no addresses: ""). Operators
        and analysts."""
        resp = self._unary(self._stub.LedgerReceipts, computation_pb2.LedgerReceiptsRequest(study_id=study_id),
                           method="Computation/LedgerReceipts", timeout=timeout)
        return [(h.holder, h.address) for h in resp.holders]

    def public_context(self, *, study_id: str = "", timeout: float | None = None) -> bytes:
        """The decryption server's public context, relayed by this server (fingerprint-checked on arrival);
        with a join study's id, that study's join key.

        Check it against the study contract's `context_fingerprint` before encrypting
        (`DataOwnerClient.backend` does): the relay must not be able to swap keys unnoticed.
        """
        deadline = self.timeout if timeout is None else timeout
        return self._call(lambda: context_from_chunks(self._stub.GetPublicContext(
            decryption_pb2.GetPublicContextRequest(study_id=study_id), timeout=deadline)), policy=self.retry,
            method="Computation/GetPublicContext")

    def join_exchange(self, study_id: str, owner_id: str, public_key: bytes, signature: bytes = b"", *,
                      timeout: float | None = None) -> tuple[bytes, bytes]:
        """Post this owner's X25519 key (and its signature) for a join study; the other owner's key and
        signature, or (b"", b"") until it has posted. Check the signature before using the key."""
        resp = self._unary(self._stub.JoinExchange,
                           computation_pb2.JoinExchangeRequest(study_id=study_id, owner_id=owner_id,
                                                               public_key=public_key, signature=signature),
                           method="Computation/JoinExchange", timeout=timeout)
        return bytes(resp.peer_public_key), bytes(resp.peer_signature)

    def join_placement(self, study_id: str, owner_id: str, pseudonyms: bytes = b"", *, part: int = 0,
                       parts: int = 0, timeout: float | None = None) -> tuple[bool, list[int], int]:
        """Post (or, with b"", poll) this owner's pseudonyms, or part `part` of `parts` of them; (ready, positions
        in posted order, capacity)."""
        resp = self._unary(self._stub.JoinPlacement,
                           computation_pb2.JoinPlacementRequest(study_id=study_id, owner_id=owner_id,
                                                                pseudonyms=pseudonyms, part=part, parts=parts),
                           method="Computation/JoinPlacement", timeout=timeout)
        return bool(resp.ready), list(resp.positions), int(resp.capacity)

    def upload_status(self, study_id: str, owner_id: str, idempotency_key: str, *,
                      timeout: float | None = None) -> UploadStatus:
        """Where one owner's upload stands: NONE, PARTIAL (with the chunk indices the server holds), COMMITTED,
        or CONFLICT (this owner committed under another idempotency key)."""
        resp = self._unary(self._stub.UploadStatus,
                           computation_pb2.UploadStatusRequest(study_id=study_id, owner_id=owner_id,
                                                               idempotency_key=idempotency_key),
                           method="Computation/UploadStatus", timeout=timeout)
        return UploadStatus(_UPLOAD_STATES.Name(resp.state), tuple(resp.received_chunks), resp.chunk_count,
                            bool(resp.c1_signature_wanted))

    def submit_chunks(self, *, study_id: str, owner_id: str, idempotency_key: str, domain_length: int,
                      context_fingerprint: str, chunk_count: int, chunks: Iterable[tuple[int, bytes]],
                      contract_hash: str, signature: bytes = b"", c1_signature: bytes = b"",
                      commitment: Commitment | None = None, timeout: float | None = None,
                      on_queued: Callable[[UploadQueued], None] | None = None) -> SubmitResponse:
        """One upload stream: the header, then (index, ciphertext bytes) pairs. Not retried here.

        When the server's upload slots are taken the stream waits in its queue (`parties.common.limits`);
        `on_queued` is then told the place as soon as the server sends it, and the wait once admitted.

        `contract_hash`: the study's contract hash; `signature`: the owner's signature of the
        whole upload (`parties.common.signing.sign_upload`), required in signed studies.
        `commitment`: in a sealed study, the owner's commitment (the chunks are then sealed;
        `parties.common.sealing`).
        Most callers want `DataOwnerClient.submit`, which encrypts, signs, resumes and retries.
        """
        header = computation_pb2.SubmitHeader(study_id=study_id, owner_id=owner_id, idempotency_key=idempotency_key,
                                              domain_length=domain_length, context_fingerprint=context_fingerprint,
                                              chunk_count=chunk_count, contract_hash=contract_hash,
                                              signature=signature, c1_signature=c1_signature)
        if commitment is not None:
            header.c1_parts_digest = commitment.c1_parts_digest
            header.key_shares.extend(commitment.key_shares)
            header.commitment_signature = commitment.signature

        def requests() -> Iterator[computation_pb2.SubmitHistogramRequest]:
            yield computation_pb2.SubmitHistogramRequest(header=header)
            for index, data in chunks:
                yield computation_pb2.SubmitHistogramRequest(
                    chunk=computation_pb2.CiphertextChunk(index=index, data=data))

        def call(req: Iterator[computation_pb2.SubmitHistogramRequest], timeout: float) -> Any:
            if on_queued is None:
                return self._stub.SubmitHistogram(req, timeout=timeout)
            future = self._stub.SubmitHistogram.future(req, timeout=timeout)
            try:
                place = QueuePlace.parse(_metadata(future.initial_metadata(), QUEUE_METADATA))
                if place is not None:
                    on_queued(UploadQueued(place))
                answer = future.result()
                waited = _metadata(future.trailing_metadata(), QUEUE_WAITED_METADATA)
                if place is not None and waited:
                    on_queued(UploadQueued(place, float(waited)))
                return answer
            except BaseException:
                future.cancel()  # Ctrl-C or a failing callback: the stream does not go on without us
                raise

        deadline = (self.timeout if timeout is None else timeout) + 1.0 * chunk_count
        resp = self._unary(call, requests(), method="Computation/SubmitHistogram", timeout=deadline, retry=False)
        return SubmitResponse(resp.committed, resp.duplicate, tuple(resp.received_chunks), resp.chunk_count,
                              resp.bytes_received)

    def setup_key(self, *, threshold: int = 0, timeout: float | None = None) -> tuple[str, tuple[str, ...], bool]:
        """Threshold mode: have the computation server fix the key-share holders' deployment.

        `threshold` t > 0: t-of-N keys (any t of the N holders release; t > N/2). Returns
        (the digest of every holder's identity keys, holder names, already_fixed); `key_threshold`
        then holds t (N for N-of-N). Each study's collective key is set up when the study is
        opened. Idempotent: a deployment is reported, not replaced (another t is refused). Needs
        an operator certificate.
        """
        resp = self._unary(self._stub.SetupKey, computation_pb2.SetupKeyRequest(threshold=int(threshold)),
                           method="Computation/SetupKey", timeout=timeout or 300.0, retry=True)
        self.key_threshold = int(resp.threshold)
        return resp.fingerprint, tuple(resp.holders), bool(resp.already_active)

    def run_release(self, study_id: str, *, epsilon: float | str = "rest", force: bool = False, wait: bool = True,
                    request_key: str = "", timeout: float | None = None) -> ReleaseStatus:
        """Run a release of the study, spending `epsilon` (> 0), or "rest": exactly what is left of its budget.

        Privacy: the released summary is `epsilon`-DP under add/remove of one person who
        contributes at most the contract's contribution bound c records (sensitivities
        include c); with noise_parties == 2 each server adds its own discrete Laplace draw,
        known only to itself, that alone gives `epsilon`. The decryption server's ledger
        is charged before anything is decrypted.

        With `wait` the call blocks until the summary is stored (deadline RELEASE_TIMEOUT
        unless `timeout` is given) and failures raise ServiceError with the server's code:
        FAILED_PRECONDITION (owners missing; pass force=True to release without them),
        RESOURCE_EXHAUSTED (budget). A `request_key` is generated so retries after
        UNAVAILABLE never start a second release.
        """
        rest = isinstance(epsilon, str)
        if rest and epsilon != "rest":
            raise InvalidInputError(f"epsilon must be a number > 0 or the word 'rest', got {epsilon!r}")
        req = computation_pb2.RunReleaseRequest(study_id=study_id, epsilon=0.0 if rest else float(epsilon),
                                                spend_rest=rest, force=force, wait=wait,
                                                request_key=request_key or f"req-{uuid.uuid4().hex[:16]}")
        if timeout is None:
            timeout = RELEASE_TIMEOUT if wait else self.timeout
        return self._release(self._unary(self._stub.RunRelease, req, method="Computation/RunRelease",
                                         timeout=timeout), timeout)

    def direct_range_counts(self, study_id: str, ranges: Sequence[tuple[int, int]], epsilon: float, *,
                            force: bool = False, request_key: str = "",
                            timeout: float | None = None) -> DirectAnswers:
        """Noisy counts of `ranges` ([lo, hi) each) straight from the encrypted aggregate; spends budget.

        Privacy: each answer is epsilon-DP (add/remove of one person with at most c
        records; both servers add a discrete Laplace draw of scale c/epsilon, each known
        only to its server). The study is charged the growth of the heaviest overlap of
        all ranges answered so far (seed 004's max-clique rule), not the plain sum, and
        before anything is decrypted (RESOURCE_EXHAUSTED when it does not fit). For many
        queries over one release, a summary (`run_release` + analyst range counts) costs
        nothing per query; this is for a few exact-range answers.

        Retried on UNAVAILABLE only with a `request_key` (a retry then returns the stored
        answers and charges nothing).
        """
        req = computation_pb2.DirectRangeCountsRequest(study_id=study_id, ranges=ranges_to_proto(ranges),
                                                       epsilon=epsilon, force=force, request_key=request_key)
        resp = self._unary(self._stub.DirectRangeCounts, req, method="Computation/DirectRangeCounts",
                           timeout=timeout, retry=bool(request_key))
        return DirectAnswers(resp.request_id, study_id, float(epsilon), tuple(range_counts_from_proto(resp.counts)),
                             float(resp.epsilon_charged), float(resp.epsilon_sequential),
                             float(resp.epsilon_remaining), tuple(resp.owners))

    def release_status(self, release_id: str, *, timeout: float | None = None) -> ReleaseStatus:
        """A release's state (RUNNING, DONE or FAILED with its status code and message), epsilon, owners, and
        its summary once DONE. Raises ServiceError NOT_FOUND for an unknown release id."""
        return self._release(self._unary(self._stub.ReleaseStatus,
                                         computation_pb2.ReleaseStatusRequest(release_id=release_id),
                                         method="Computation/ReleaseStatus", timeout=timeout), timeout)

    def _release(self, resp: computation_pb2.ReleaseStatusResponse, timeout: float | None) -> ReleaseStatus:
        """The release of a reply; a summary too large for one message is read in pages of its Arrow files
        (Analyst.GetReleaseArrow, hosted by the same server)."""
        if not resp.summary_paged or resp.HasField("summary"):
            return _release(resp)
        from ..analyst.client import read_release

        stub = analyst_pb2_grpc.AnalystStub(self._channel)
        rel = read_release(stub, resp.release_id, lambda fn: self._unary(
            fn, analyst_pb2.GetReleaseRequest(release_id=resp.release_id), method="Analyst/GetReleaseArrow",
            timeout=max(timeout or 0.0, RELEASE_TIMEOUT)))
        return _release(resp, rel.summary, rel.signatures)

    def wait_release(self, release_id: str, *, timeout: float = RELEASE_TIMEOUT, poll: float = 0.2,
                     on_poll: Callable[[ReleaseStatus], None] | None = None) -> ReleaseStatus:
        """Poll until the release is DONE (returned) or FAILED (raised as ServiceError); `on_poll` sees each status."""
        end = time.monotonic() + timeout
        while True:
            st = self.release_status(release_id)
            if on_poll is not None:
                on_poll(st)
            if st.state != "RUNNING":
                st.raise_for_failure()
                return st
            if time.monotonic() > end:
                raise ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   f"release {release_id} still running after {timeout:g} s",
                                   method="Computation/ReleaseStatus")
            time.sleep(poll)
