"""Typed Python client of the decryption service (used by operators, data owners and the computation server)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from parties.wire.v1 import decryption_pb2, decryption_pb2_grpc
from he_partition.core.errors import InvalidInputError
from he_partition.core.measurements import Measurement

from ..common.client import BaseClient
from ..common.config import RELEASE_TIMEOUT
from ..common.approval import StudyApproval
from ..common.contract import StudyContract
from ..common.errors import FailedPreconditionError, ServiceError
from ..common.receipts import Receipt, ReceiptBook
from ..common.sealing import Commitment
from ..common.convert import (commitments_to_proto, context_from_chunks, contract_from_proto, measurement_to_proto, open_study_request,
                              ranges_to_proto)
from ..common.paging import measurement_requests, read_values
from .forwarding import UploadForwarding

if TYPE_CHECKING:
    from .keyshare.uploads import OwnerC1Parts

log = logging.getLogger("dpagg.decryption.client")

#: Outage a release of the computation server rides out (seconds), and the retry backoff.
OUTAGE_SECONDS = 20.0
OUTAGE_FIRST_DELAY = 0.25
OUTAGE_MAX_DELAY = 4.0

T = TypeVar("T")

__all__ = ["DecryptionClient", "BudgetInfo", "ChargeInfo", "DecryptResult", "DirectChargeInfo"]


@dataclass(frozen=True)
class ChargeInfo:
    """One ledger row as reported by BudgetStatus."""

    charge_id: int
    release_id: str
    kind: str
    epsilon: float
    created_at: str


@dataclass(frozen=True)
class BudgetInfo:
    """A study's privacy budget: total (the contract's epsilon), spent, remaining, and every charge.

    `reserved`: epsilon held by releases that started (their declared epsilon, >= spent);
    a new release must fit in `total - reserved`. `remaining` is `total - spent`.
    """

    study_id: str
    total: float
    spent: float
    remaining: float
    charges: tuple[ChargeInfo, ...]
    reserved: float = 0.0
    #: "" when the ledger's hash chain verifies, else what is broken (decryption is then stopped).
    chain_problem: str = ""
    #: Exactly what a new release may still spend (total - max(spent, reserved), rounded down).
    available: float = 0.0
    #: The key holder's Ed25519 receipt public key (b"" from a server that does not report it).
    receipt_key: bytes = b""
    #: A t-of-N key-share holder: t (0 otherwise), its view of the study's signed charge log (entries verified,
    #: their epsilon) and the log positions it signed.
    key_threshold: int = 0
    charge_log_entries: int = 0
    charge_log_spent: float = 0.0
    charges_signed: tuple[int, ...] = ()


@dataclass(frozen=True)
class DecryptResult:
    """Released integer values of one measurement (both servers' noise included)."""

    values: npt.NDArray[np.int64]
    charge_id: int
    epsilon_remaining: float


@dataclass(frozen=True)
class DirectChargeInfo:
    """What a batch of direct range counts cost (see `DecryptionClient.charge_direct_queries`)."""

    epsilon_charged: float
    epsilon_direct_total: float
    epsilon_remaining: float
    charge_id: int
    already_charged: bool


@dataclass(frozen=True)
class JoinCellsResult:
    """A decrypted join table: noisy cells (row-major), their noise variance, the charge and the budget left."""

    values: npt.NDArray[np.int64]
    variance: float
    epsilon_charged: float
    epsilon_remaining: float


class DecryptionClient(BaseClient):
    """Client of the key holder. Every call has a deadline (`timeout`, seconds); reads retry on UNAVAILABLE.

    Example::

        with DecryptionClient("127.0.0.1:50051") as ds:
            ctx = ds.public_context()
            print(ds.budget("study-1").remaining)
    """

    stub_class = decryption_pb2_grpc.DecryptionStub
    server_role = "decryption"

    #: The computation server's record of the key holder's signed charge receipts (None: not kept). With a
    #: book, every charge's receipt is kept, the newest is shown with the next request of its study, and
    #: `budget` refuses a key holder that reports less spend than the receipts (a rolled-back ledger).
    receipts: ReceiptBook | None = None

    #: How long `decrypt_measurement` keeps retrying an unreachable key holder (a short restart), seconds;
    #: 0 (the default) fails at once. The computation server sets OUTAGE_SECONDS.
    outage_seconds: float = 0.0

    #: The owners' signed c1 parts on their way or delivered (`forward_uploads`; the computation server only).
    _uploads: UploadForwarding | None = None

    def _shown(self, study_id: str) -> decryption_pb2.LedgerReceipt | None:
        r = self.receipts.newest(study_id) if self.receipts is not None else None
        return None if r is None else decryption_pb2.LedgerReceipt(body=r.body, signature=r.signature,
                                                                     public_key=r.public_key)

    def _keep(self, receipt: decryption_pb2.LedgerReceipt) -> None:
        if self.receipts is not None:
            self.receipts.record(receipt.body, receipt.signature, receipt.public_key)

    def public_context(self, *, study_id: str = "", timeout: float | None = None) -> bytes:
        """Download the serialized public BFV context (streamed in chunks) and check its SHA-256 fingerprint.

        With the id of a join study: that study's join key (public, relinearization and rotation keys).
        """
        deadline = self.timeout if timeout is None else timeout

        def fetch() -> bytes:
            return context_from_chunks(self._stub.GetPublicContext(
                decryption_pb2.GetPublicContextRequest(study_id=study_id), timeout=deadline))

        return self._call(fetch, policy=self.retry, method="Decryption/GetPublicContext")

    def decrypt_join_cells(self, *, study_id: str, release_id: str, release_epsilon: float, contract_hash: str,
                           cells: Iterable[bytes], cell_count: int, measurement: Measurement | None = None,
                           timeout: float | None = None) -> JoinCellsResult:
        """Stream one join measurement's ciphertexts for decryption (not retried: the ledger is charged once).

        `measurement` None: the ciphertexts are the table's cells (row-major)."""
        header = decryption_pb2.DecryptJoinCellsHeader(study_id=study_id, release_id=release_id,
                                                       release_epsilon=release_epsilon, contract_hash=contract_hash,
                                                       cell_count=cell_count)
        if measurement is not None:
            header.measurement.CopyFrom(measurement_to_proto(measurement))

        def requests() -> Iterator[decryption_pb2.DecryptJoinCellsRequest]:
            yield decryption_pb2.DecryptJoinCellsRequest(header=header)
            for c in cells:
                yield decryption_pb2.DecryptJoinCellsRequest(cell=c)

        resp = self._unary(lambda req, timeout: self._stub.DecryptJoinCells(req, timeout=timeout), requests(),
                           method="Decryption/DecryptJoinCells", timeout=timeout or RELEASE_TIMEOUT, retry=False)
        return JoinCellsResult(np.asarray(resp.values, dtype=np.int64), resp.variance, resp.epsilon_charged,
                               resp.epsilon_remaining)

    def evaluate_pseudonyms(self, *, study_id: str, owner_id: str, contract_hash: str,
                            elements: Sequence[bytes], first_page: int = 0,
                            timeout: float | None = None) -> list[bytes]:
        """A join owner's blinded identifiers evaluated under the study's OPRF key, in pages of PAGE_ELEMENTS
        numbered from `first_page` (each page one call, retried on UNAVAILABLE: the key holder answers a page sent
        again alike)."""
        from .oprf import PAGE_ELEMENTS

        out: list[bytes] = []
        for page, start in enumerate(range(0, len(elements), PAGE_ELEMENTS), start=first_page):
            request = decryption_pb2.EvaluatePseudonymsRequest(
                study_id=study_id, owner_id=owner_id, contract_hash=contract_hash, page=page,
                blinded_elements=b"".join(elements[start:start + PAGE_ELEMENTS]))

            def call(req: decryption_pb2.EvaluatePseudonymsRequest = request) -> bytes:
                return bytes(self._stub.EvaluatePseudonyms(req, timeout=timeout or self.timeout).evaluated_elements)

            data = self._call(call, policy=self.retry, method="Decryption/EvaluatePseudonyms")
            out.extend(data[i:i + 32] for i in range(0, len(data), 32))
        if len(out) != len(elements):
            raise InvalidInputError(f"the key holder answered {len(out)} elements for {len(elements)}")
        return out

    def evaluate_shared(self, *, study_id: str, owner_id: str, contract_hash: str, page: int, route: Sequence[int],
                        elements: Sequence[bytes], timeout: float | None = None) -> list[bytes]:
        """A key-share holder's answer to one page of a join owner's blinded elements (ristretto255) on `route` (the
        t holders the page goes to): its share, which the owner adds to the route's other answers."""
        request = decryption_pb2.EvaluatePseudonymsRequest(
            study_id=study_id, owner_id=owner_id, contract_hash=contract_hash, page=int(page),
            route=[int(h) for h in route], blinded_elements=b"".join(elements))

        def call(req: decryption_pb2.EvaluatePseudonymsRequest = request) -> bytes:
            return bytes(self._stub.EvaluatePseudonyms(req, timeout=timeout or self.timeout).evaluated_elements)

        data = self._call(call, policy=self.retry, method="Decryption/EvaluatePseudonyms")
        if len(data) != 32 * len(elements):
            raise InvalidInputError(f"the key holder answered {len(data) // 32} elements for {len(elements)}")
        return [data[i:i + 32] for i in range(0, len(data), 32)]

    def join_check_seed(self, *, study_id: str, contract_hash: str, timeout: float | None = None) -> tuple[bytes, int]:
        """(seed, rounds) of a join study's well-formedness check, chosen by the key holder."""
        resp = self._unary(lambda req, timeout: self._stub.JoinCheckSeed(req, timeout=timeout),
                           decryption_pb2.JoinCheckSeedRequest(study_id=study_id, contract_hash=contract_hash),
                           method="Decryption/JoinCheckSeed", timeout=timeout)
        return bytes(resp.seed), int(resp.rounds)

    def check_join_upload(self, *, study_id: str, contract_hash: str, owner_id: str, seed: bytes,
                          residues: Sequence[bytes], timeout: float | None = None) -> bool:
        """Send one owner's check residues; True when the key holder found its upload well formed."""
        req = decryption_pb2.CheckJoinUploadRequest(study_id=study_id, contract_hash=contract_hash, owner_id=owner_id,
                                                    seed=seed, residues=list(residues))
        resp = self._unary(lambda req, timeout: self._stub.CheckJoinUpload(req, timeout=timeout), req,
                           method="Decryption/CheckJoinUpload", timeout=timeout or RELEASE_TIMEOUT)
        return bool(resp.well_formed)

    def open_study(self, *, domain_size: int, epsilon: float, expected_owners: Sequence[str], study_id: str = "",
                   strategy: str = "auto", contribution_bound: int = 1, noise_parties: int = 2,
                   strategy_params_json: str = "", domain_spec: str = "",
                   owner_keys: Mapping[str, str | bytes] | None = None, correlation_leakage: float = 0.0,
                   correlation_source: str = "", max_organizations: int = 1,
                   holder_seal_keys: Sequence[str] = (),
                   noise_tolerates: int | None = None,
                   approval: StudyApproval | None = None,
                   timeout: float | None = None) -> tuple[StudyContract, bool]:
        """Create a study; returns (contract, already_existed). With your own `study_id` retries are idempotent.

        `epsilon` is the study's total budget; `contribution_bound` c multiplies every
        sensitivity; `noise_parties` 2 (default) makes both servers add noise.
        `owner_keys` maps each expected owner to its Ed25519 public key (raw bytes or hex).
        `correlation_leakage` L > 0 (with `correlation_source`, its provenance) makes
        `epsilon` a Bayesian-DP budget for correlated records: every measurement's noise
        and charge are multiplied by 1 + L (see `StudyContract`).
        Only the computation server may call this (operators use `ComputationClient.open_study`).
        `noise_tolerates` None leaves the receiver's default (K - 1 at key-share holders, 0
        here); see `StudyContract.noise_tolerates`. `approval`: the operator's signature on
        the terms, relayed unchanged (parties.common.approval).
        """
        req = open_study_request(
            study_id=study_id, domain_size=domain_size, epsilon=epsilon, strategy=strategy,
            contribution_bound=contribution_bound, noise_parties=noise_parties, expected_owners=expected_owners,
            strategy_params_json=strategy_params_json, domain_spec=domain_spec, owner_keys=owner_keys,
            correlation_leakage=correlation_leakage, correlation_source=correlation_source,
            max_organizations=max_organizations, holder_seal_keys=holder_seal_keys,
            noise_tolerates=noise_tolerates, approval=approval)
        resp = self._unary(self._stub.OpenStudy, req, method="Decryption/OpenStudy", timeout=timeout,
                           retry=bool(study_id))
        return contract_from_proto(resp.contract), resp.already_existed

    def close_uploads(self, contract: StudyContract, commitments: Sequence[Commitment], *,
                      timeout: float | None = None) -> list[bytes]:
        """Close a sealed study's uploads on `commitments`: the owners' upload keys (one key holder: its shares).

        Idempotent: the same set again gets the same answer (retried on transient failures).
        """
        return self.close_upload_shares(contract, commitments, timeout=timeout)

    def close_upload_shares(self, contract: StudyContract, commitments: Sequence[Commitment], *,
                            timeout: float | None = None) -> list[bytes]:
        """This key holder's shares of each committed owner's upload key (`Decryption.CloseUploads`)."""
        req = decryption_pb2.CloseUploadsRequest(study_id=contract.study_id, contract_hash=contract.contract_hash,
                                                 commitments=commitments_to_proto(commitments))
        resp = self._unary(self._stub.CloseUploads, req, method="Decryption/CloseUploads", timeout=timeout,
                           retry=True)
        if len(resp.key_shares) != len(commitments):
            raise FailedPreconditionError(f"the key holder returned {len(resp.key_shares)} upload key shares for "
                                          f"{len(commitments)} commitments")
        return [bytes(s) for s in resp.key_shares]

    def get_study(self, study_id: str, *, timeout: float | None = None) -> StudyContract:
        """The contract of a study (its hash is checked against its fields)."""
        resp = self._unary(self._stub.GetStudy, decryption_pb2.GetStudyRequest(study_id=study_id),
                           method="Decryption/GetStudy", timeout=timeout)
        return contract_from_proto(resp.contract)

    def decrypt_measurement(self, *, study_id: str, release_id: str, release_epsilon: float, measurement: Measurement,
                            chunks: Iterable[bytes], chunk_count: int, contract_hash: str,
                            timeout: float | None = None) -> DecryptResult:
        """Send one noised measurement ciphertext (streamed chunk by chunk) and get its released values.

        Spends `measurement.epsilon` of the study's budget, times 1 + L in a study with
        correlated records (sensitivity `measurement.sensitivity`, add/remove of one
        person with at most c records); the
        server adds its own discrete Laplace draw (noise_parties == 2), which only it knows.

        A key holder that is unreachable (UNAVAILABLE) is retried for up to `outage_seconds`
        (backoff, each retry logged), re-sending the very same chunks, so no noise is redrawn
        for anything the key holder may have seen; if it charged and then died before its reply
        arrived, the re-sent request is answered from that charge with the same draw and not
        charged again. Other failures are not retried. The ledger refuses (RESOURCE_EXHAUSTED) a
        charge that does not fit. `contract_hash` is the hash of the study contract the
        measurement was computed under; the server refuses a measurement under other terms.
        Only the computation server may call this.
        """
        if self._uploads is not None:  # the owners' c1 parts of a signed study arrive first
            self._uploads.wait(study_id)
        header = decryption_pb2.DecryptMeasurementHeader(
            study_id=study_id, release_id=release_id, release_epsilon=release_epsilon, chunk_count=chunk_count,
            contract_hash=contract_hash, newest_receipt=self._shown(study_id),
        )
        sent: list[bytes] = []  # every chunk handed to gRPC so far: a retry re-sends these very bytes
        source = iter(chunks)
        broke: list[Exception] = []  # why this side's chunk stream broke, when it did (gRPC reports only UNKNOWN)

        def chunk_stream() -> Iterator[bytes]:
            yield from list(sent)
            try:
                for c in source:
                    sent.append(c)
                    yield c
            except Exception as exc:
                broke.append(exc)
                raise

        method = "Decryption/DecryptMeasurement"
        deadline = (self.timeout if timeout is None else timeout) + 0.5 * chunk_count

        def call(requests: Iterator[decryption_pb2.DecryptMeasurementRequest],
                 timeout: float) -> tuple[decryption_pb2.DecryptMeasurementResponse, npt.NDArray[np.int64]]:
            try:  # the values come back in pages; the first page carries the charge and the receipt
                return read_values(self._stub.DecryptMeasurement(requests, timeout=timeout), method)
            except grpc.RpcError as err:
                if broke:  # "Exception iterating requests!": name what broke on this side instead
                    raise broke[0] from None
                raise ServiceError.from_rpc_error(err, method) from None

        first, values = self.ride_out_outage(
            lambda: self._unary(call, measurement_requests(header, measurement, chunk_stream()), method=method,
                                timeout=deadline, retry=False),
            release_id, measurement.kind)
        self._keep(first.receipt)
        return DecryptResult(values, int(first.charge_id), float(first.epsilon_remaining))

    def ride_out_outage(self, call: Callable[[], T], release_id: str, what: str,
                        server: str = "decryption server") -> T:
        """`call()`, retried while the server is UNAVAILABLE for up to `outage_seconds` (backoff, each retry logged).

        The caller's `call` must re-send the very same request (same chunks), so a retry never
        makes the server draw noise for anything it may have seen with other bytes.
        """
        waited, delay = 0.0, OUTAGE_FIRST_DELAY
        while True:
            try:
                return call()
            except ServiceError as exc:
                if exc.code != grpc.StatusCode.UNAVAILABLE or waited + delay > self.outage_seconds:
                    raise
                log.warning("%s unreachable during release %s (%s); retrying %s in %.1f s (%.0f of %.0f s of "
                            "outage tolerated), re-sending the same ciphertexts", server, release_id, exc.details,
                            what, delay, waited, self.outage_seconds)
                time.sleep(delay)
                waited += delay
                delay = min(delay * 2, OUTAGE_MAX_DELAY)

    #: How this client names its server in errors and logs.
    server_label = "decryption server"

    def send_uploads(self, study_id: str, contract_hash: str, uploads: Sequence[OwnerC1Parts], *,
                     timeout: float | None = None, planes: bool = False) -> int:
        """Send every owner's signed c1 parts of `study_id` (Decryption.ForwardUploads); returns the chunks it keeps.
        `planes`: a join study's whole planes under the owners' upload signatures, to a key-share holder.

        Retried while the server is UNAVAILABLE for up to `outage_seconds` (`ride_out_outage`).
        Only the computation server may call this."""
        field = "plane" if planes else "c1"

        def requests() -> Iterator[decryption_pb2.ForwardUploadsRequest]:
            for u in uploads:
                for i, part in enumerate(u.parts):
                    yield decryption_pb2.ForwardUploadsRequest(
                        study_id=study_id, contract_hash=contract_hash, owner_id=u.owner_id,
                        idempotency_key=u.idempotency_key, signature=u.signature, index=i, **{field: part})

        deadline = (RELEASE_TIMEOUT if timeout is None else timeout) + 0.1 * sum(len(u.parts) for u in uploads)

        def call() -> int:
            try:
                return int(self._stub.ForwardUploads(requests(), timeout=deadline).chunks)
            except grpc.RpcError as err:
                raise ServiceError.from_rpc_error(err, "Decryption/ForwardUploads") from None

        # an unreachable server is waited for as in a release (the same parts again: it keeps their sum once)
        return self.ride_out_outage(call, study_id, "the owners' c1 parts", self.server_label)

    def forward_uploads(self, contract: StudyContract, uploads: Callable[[], list[OwnerC1Parts]],
                        included: Sequence[tuple[str, str]], *, background: bool = False) -> None:
        """The computation server: send the included owners' signed c1 parts, once per study and set of uploads.

        The key holder of a signed study decrypts only with the owners' aggregate c1 it verified
        itself. `uploads()` builds the parts only when they must travel; with `background` the
        study's next `decrypt_measurement` waits for the forward first, so a refused forward (a
        signature that does not verify, an owner missing) stops the release before any decryption.
        """
        if self._uploads is None:
            self._uploads = UploadForwarding(self._send_uploads)
        self._uploads.forward(contract, uploads, included, background=background)

    def _send_uploads(self, contract: StudyContract, parts: list[OwnerC1Parts]) -> None:
        self.send_uploads(contract.study_id, contract.contract_hash, parts)
        log.info("study %s: c1 parts of %d owners forwarded to the %s (%d bytes)", contract.study_id, len(parts),
                 self.server_label, sum(len(p) for u in parts for p in u.parts))

    def close(self) -> None:
        if self._uploads is not None:
            self._uploads.close()
        super().close()

    def charge_direct_queries(self, *, study_id: str, request_id: str, contract_hash: str,
                              ranges: Sequence[tuple[int, int]], epsilon: float,
                              timeout: float | None = None) -> DirectChargeInfo:
        """Pay for a batch of direct range counts (each answered at DP `epsilon`) before decrypting any.

        The server charges the growth of the heaviest overlap of all the study's answered
        ranges (seed 004), atomically (RESOURCE_EXHAUSTED if it does not fit; nothing is
        written then). Retried on UNAVAILABLE: the call is idempotent per `request_id`.
        Only the computation server may call this.
        """
        req = decryption_pb2.ChargeDirectQueriesRequest(study_id=study_id, request_id=request_id,
                                                        contract_hash=contract_hash, ranges=ranges_to_proto(ranges),
                                                        epsilon=epsilon, newest_receipt=self._shown(study_id))
        resp = self._unary(self._stub.ChargeDirectQueries, req, method="Decryption/ChargeDirectQueries",
                           timeout=timeout)
        self._keep(resp.receipt)
        return DirectChargeInfo(float(resp.epsilon_charged), float(resp.epsilon_direct_total),
                                float(resp.epsilon_remaining), int(resp.charge_id), bool(resp.already_charged))

    def budget(self, study_id: str, *, timeout: float | None = None) -> BudgetInfo:
        """Total, spent and remaining epsilon of a study, with the ledger rows.

        With a receipt book (the computation server): FailedPreconditionError naming the row
        when the ledger's hash chain is broken, and LedgerRolledBackError (FAILED_PRECONDITION)
        when the key holder reports less spend than the newest receipt it signed for the study.
        """
        resp = self._unary(self._stub.BudgetStatus, decryption_pb2.BudgetStatusRequest(study_id=study_id),
                           method="Decryption/BudgetStatus", timeout=timeout)
        if self.receipts is not None:  # the computation server: no release or direct query on a broken ledger
            if resp.chain_problem:  # named before any budget figure computed from the broken rows
                raise FailedPreconditionError(resp.chain_problem)
            self.receipts.check_spend(study_id, resp.epsilon_spent)
        return BudgetInfo(
            resp.study_id, resp.epsilon_total, resp.epsilon_spent, resp.epsilon_remaining,
            tuple(ChargeInfo(c.charge_id, c.release_id, c.kind, c.epsilon, c.created_at) for c in resp.charges),
            resp.epsilon_reserved, resp.chain_problem, resp.epsilon_available, bytes(resp.receipt_public_key),
            int(resp.key_threshold), int(resp.charge_log_entries), float(resp.charge_log_spent),
            tuple(int(i) for i in resp.charges_signed),
        )

    def reconcile_charges(self, study_id: str, receipts: Sequence[Receipt], *,
                          timeout: float | None = None) -> tuple[list[ChargeInfo], float]:
        """Book at this key-share holder the charges other holders' signed `receipts` prove and its ledger lacks.

        Returns (rows booked, the study's spend afterwards). The holder checks every receipt
        (`parties.decryption.receipts.reconcile_charges`); it only ever adds spend. Operators only.
        """
        req = decryption_pb2.ReconcileChargesRequest(study_id=study_id, receipts=[
            decryption_pb2.LedgerReceipt(body=r.body, signature=r.signature, public_key=r.public_key)
            for r in receipts])
        resp = self._unary(self._stub.ReconcileCharges, req, method="Decryption/ReconcileCharges", timeout=timeout)
        return ([ChargeInfo(c.charge_id, c.release_id, c.kind, c.epsilon, c.created_at) for c in resp.booked],
                float(resp.epsilon_spent))
