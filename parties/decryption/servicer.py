"""Thin gRPC servicer of the decryption service: decode the request, call the handler, encode the reply."""

from __future__ import annotations

from typing import Iterator

import grpc

from parties.wire.v1 import decryption_pb2, decryption_pb2_grpc
from he_partition.core.errors import InvalidInputError
from he_partition.join import oprf

from ..common.errors import FailedPreconditionError

from ..common.access import ANY_ROLE, AccessPolicy
from ..common.contract import check_id
from ..common.convert import (commitments_from_proto, context_to_chunks, contract_to_proto, measurement_from_proto,
                              open_study_kwargs, ranges_from_proto)
from ..common.paging import read_measurement_header, values_replies
from ..common.sealing import Commitment
from .handler import DecryptionHandler
from .keyshare.uploads import OwnerC1Parts
from .ledger import Charge
from .receipts import ReceiptSigner

__all__ = ["DecryptionServicer", "SERVICE_NAME"]

SERVICE_NAME = decryption_pb2.DESCRIPTOR.services_by_name["Decryption"].full_name


class DecryptionServicer(decryption_pb2_grpc.DecryptionServicer):
    """Errors raised here or in the handler become status codes in `ErrorMappingInterceptor`.

    Every method checks the caller's role first (`AccessPolicy`), before it reads the
    request stream or touches the ledger. Only the computation server (role
    ``computation``, and one of `computation_ids` when given) may open studies and ask for
    decryptions.
    """

    def __init__(self, handler: DecryptionHandler, policy: AccessPolicy | None = None,
                 computation_ids: tuple[str, ...] = (), receipts: ReceiptSigner | None = None) -> None:
        self.handler = handler
        #: Signs a receipt for every charge; checks the receipt a request shows (ledger rollback).
        self.receipts = receipts if receipts is not None else ReceiptSigner.load_or_create(None)
        self.policy = policy if policy is not None else AccessPolicy()
        self.computation_ids = tuple(computation_ids) or None

    def _computation_only(self, context: grpc.ServicerContext, action: str) -> None:
        self.policy.require(context, ["computation"], self.computation_ids, action=action)

    def _check_receipt(self, study_id: str, shown: decryption_pb2.LedgerReceipt) -> None:
        """Refuse, before anything is charged or decrypted, a ledger older than the receipt the caller shows."""
        self.receipts.check(self.handler.ledger, study_id, shown.body, shown.signature)

    def _receipt(self, charge: Charge | None) -> decryption_pb2.LedgerReceipt | None:
        if charge is None:
            return None
        body, signature = self.receipts.issue(self.handler.ledger, charge)
        return decryption_pb2.LedgerReceipt(body=body, signature=signature, public_key=self.receipts.public_key)

    def GetPublicContext(self, request: decryption_pb2.GetPublicContextRequest,
                         context: grpc.ServicerContext) -> Iterator[decryption_pb2.PublicContextChunk]:
        self.policy.require(context, ANY_ROLE, action="download the public context")
        data, fingerprint = self.handler.public_key_for(request.study_id)
        yield from context_to_chunks(data, fingerprint)

    def OpenStudy(self, request: decryption_pb2.OpenStudyRequest,
                  context: grpc.ServicerContext) -> decryption_pb2.OpenStudyResponse:
        self._computation_only(context, "open a study at the decryption server")
        contract, existed = self.handler.open_study(**open_study_kwargs(request))
        return decryption_pb2.OpenStudyResponse(contract=contract_to_proto(contract), already_existed=existed)

    def CloseUploads(self, request: decryption_pb2.CloseUploadsRequest,
                     context: grpc.ServicerContext) -> decryption_pb2.CloseUploadsResponse:
        self._computation_only(context, "close a study's uploads")
        commitments = commitments_from_proto(request.commitments)
        shares, holder = self._close_uploads(request.study_id, request.contract_hash, commitments)
        return decryption_pb2.CloseUploadsResponse(key_shares=shares, holder=holder)

    def _close_uploads(self, study_id: str, contract_hash: str, commitments: list[Commitment]) -> tuple[list[bytes], int]:
        return self.handler.close_uploads(study_id, contract_hash, commitments), 0

    def GetStudy(self, request: decryption_pb2.GetStudyRequest,
                 context: grpc.ServicerContext) -> decryption_pb2.GetStudyResponse:
        self.policy.require(context, ANY_ROLE, action="read a study contract")
        return decryption_pb2.GetStudyResponse(contract=contract_to_proto(self.handler.get_study(request.study_id)))

    def DecryptMeasurement(self, request_iterator: Iterator[decryption_pb2.DecryptMeasurementRequest],
                           context: grpc.ServicerContext) -> Iterator[decryption_pb2.DecryptMeasurementResponse]:
        self._computation_only(context, "ask for a decryption")
        header, measurement = read_measurement_header(request_iterator, "DecryptMeasurement")
        contract = self.handler.get_study(header.study_id)
        check_id("release_id", header.release_id)
        self._check_receipt(header.study_id, header.newest_receipt)
        # Validate the header against the contract before reading ciphertexts, so a bad
        # request costs no memory and nothing is charged or decrypted.
        self.handler.check_measurement(contract, measurement, int(header.chunk_count),
                                       contract_hash=header.contract_hash, release_id=header.release_id,
                                       release_epsilon=float(header.release_epsilon))
        # A signed study: the owners' aggregate c1 of every measured chunk, verified when the computation
        # server forwarded their signed parts (FAILED_PRECONDITION when it did not); each chunk is
        # decrypted with it, never with the c1 it arrives with.
        signed_c1 = self.handler.signed_c1(contract, measurement)
        if self.handler.decrypt_pool is not None:  # local decrypt workers load the key while the chunks arrive
            self.handler.decrypt_pool.warm(int(header.chunk_count))
        # Enough chunks: each goes to the key holder's local workers as it arrives (parsed, flooded, checked and
        # decrypted there, once); their values and integrity outcomes stay in this process until the charge
        # (`DecryptionHandler.decrypt_measurement`).
        pipeline = self.handler.decrypt_pipeline(int(header.chunk_count), contract)
        chunks: list[bytes] = []
        signed: list[bytes] = []  # in-process: what is decrypted, the chunks or their c0 with the owners' c1
        checked: list[object] = []
        try:
            for msg in request_iterator:
                if msg.WhichOneof("part") != "chunk":
                    raise InvalidInputError("only ciphertext chunks may follow the DecryptMeasurement header")
                if len(chunks) >= header.chunk_count:
                    raise InvalidInputError(f"more than the announced {header.chunk_count} ciphertext chunks")
                j = len(chunks)
                data = msg.chunk  # read once: each read of a bytes field is a copy of its own
                chunks.append(data)
                if pipeline is not None:
                    pipeline.submit(data, None if signed_c1 is None else signed_c1[j])
                    refused = pipeline.failed()  # bytes a worker could not parse end the stream here (public)
                    if refused is not None:
                        raise refused.with_traceback(None) from None
                    continue
                signed.append(data if signed_c1 is None else self.handler.with_signed_c1(data, j, signed_c1[j]))
                # Parse and flood each chunk as it arrives, while the sender encrypts the next one (its integrity
                # check, a function of the secret key, runs after the charge).
                checked.append(self.handler.checked_chunk(signed[j], j, contract))
        except Exception as exc:  # chunks that reached this server are recorded, refused or not
            if pipeline is not None:
                pipeline.discard()
            if chunks:
                self.handler.record_refusal(header.study_id, header.release_id, measurement.kind, chunks, exc)
            raise
        result = self.handler.decrypt_measurement(
            study_id=header.study_id, release_id=header.release_id, release_epsilon=header.release_epsilon,
            measurement=measurement, chunks=chunks, contract_hash=header.contract_hash,
            checked=None if pipeline is not None else checked, signed=None if pipeline is not None else signed,
            pipeline=pipeline,
        )
        yield from values_replies(result.values, charge_id=result.charge.charge_id if result.charge else 0,
                                  epsilon_remaining=result.epsilon_remaining, receipt=self._receipt(result.charge))

    def DecryptJoinCells(self, request_iterator: Iterator[decryption_pb2.DecryptJoinCellsRequest],
                         context: grpc.ServicerContext) -> decryption_pb2.DecryptJoinCellsResponse:
        self._computation_only(context, "ask for a join decryption")
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("part") != "header":
            raise InvalidInputError("DecryptJoinCells must start with a header message")
        header = first.header
        contract = self.handler.get_study(header.study_id)
        terms = contract.join_terms()
        measurement = measurement_from_proto(header.measurement) if header.HasField("measurement") else None
        expected = measurement.count if measurement is not None else terms.rows * terms.cols
        if header.cell_count != expected:
            raise InvalidInputError(f"cell_count {header.cell_count}: "
                                    + (f"this {measurement.kind} measurement has {expected} values"
                                       if measurement is not None else
                                       f"a {terms.rows} x {terms.cols} table has {expected} cells"))
        cells: list[bytes] = []
        for msg in request_iterator:
            if msg.WhichOneof("part") != "cell" or len(cells) >= header.cell_count:
                raise InvalidInputError(f"only the announced {header.cell_count} cell ciphertexts may follow the header")
            cells.append(msg.cell)
        r = self.handler.decrypt_join_cells(study_id=header.study_id, release_id=header.release_id,
                                            release_epsilon=header.release_epsilon,
                                            contract_hash=header.contract_hash, cells=cells,
                                            measurement=measurement)
        return decryption_pb2.DecryptJoinCellsResponse(values=r.values.tolist(), variance=r.variance,
                                                       epsilon_charged=r.epsilon_charged,
                                                       epsilon_remaining=r.epsilon_remaining)

    def JoinCheck(self, request: decryption_pb2.JoinCheckRequest,
                  context: grpc.ServicerContext) -> decryption_pb2.JoinCheckResponse:
        self._computation_only(context, "run a join check")
        raise FailedPreconditionError("JoinCheck is the key-share holders' check of a join among themselves; the "
                                      "single decryption server checks joins with JoinCheckSeed and CheckJoinUpload")

    def JoinShares(self, request: decryption_pb2.JoinSharesRequest,
                   context: grpc.ServicerContext) -> Iterator[decryption_pb2.IssueSharesResponse]:
        self._computation_only(context, "ask for join value shares")
        raise FailedPreconditionError("JoinShares is a key-share holder's: the single decryption server decrypts a "
                                      "join's values itself (DecryptJoinCells)")

    def EvaluatePseudonyms(self, request: decryption_pb2.EvaluatePseudonymsRequest,
                           context: grpc.ServicerContext) -> decryption_pb2.EvaluatePseudonymsResponse:
        """gRPC: one page of a join owner's blinded identifiers, evaluated under the study's OPRF key (a data owner
        of the study, for its own id; `DecryptionHandler.evaluate_pseudonyms` checks the quota and logs the page)."""
        caller = self.policy.require(context, ["data_owner"], action="evaluate join pseudonyms")
        self.policy.same_party(caller, request.owner_id, what="owner_id of the request")
        if request.route:
            raise InvalidInputError("this decryption server holds the whole OPRF key of its studies: a request names "
                                    "no route of key-share holders; nothing was evaluated")
        data = bytes(request.blinded_elements)
        if len(data) % oprf.ELEMENT_BYTES:
            raise InvalidInputError(f"blinded_elements must be a whole number of {oprf.ELEMENT_BYTES}-byte elements")
        elements = [data[i:i + oprf.ELEMENT_BYTES] for i in range(0, len(data), oprf.ELEMENT_BYTES)]
        evaluated, used, quota = self.handler.evaluate_pseudonyms(
            study_id=request.study_id, owner_id=request.owner_id, contract_hash=request.contract_hash,
            page=int(request.page), elements=elements)
        return decryption_pb2.EvaluatePseudonymsResponse(evaluated_elements=b"".join(evaluated),
                                                         evaluations_used=used, evaluation_quota=quota)

    def JoinCheckSeed(self, request: decryption_pb2.JoinCheckSeedRequest,
                      context: grpc.ServicerContext) -> decryption_pb2.JoinCheckSeedResponse:
        self._computation_only(context, "ask for a join check seed")
        seed, rounds = self.handler.join_check_seed(study_id=request.study_id, contract_hash=request.contract_hash)
        return decryption_pb2.JoinCheckSeedResponse(seed=seed, rounds=rounds)

    def CheckJoinUpload(self, request: decryption_pb2.CheckJoinUploadRequest,
                        context: grpc.ServicerContext) -> decryption_pb2.CheckJoinUploadResponse:
        self._computation_only(context, "check a join upload")
        ok = self.handler.check_join_upload(study_id=request.study_id, contract_hash=request.contract_hash,
                                            owner_id=request.owner_id, seed=request.seed,
                                            residues=list(request.residues))
        return decryption_pb2.CheckJoinUploadResponse(well_formed=ok)

    def ChargeDirectQueries(self, request: decryption_pb2.ChargeDirectQueriesRequest,
                            context: grpc.ServicerContext) -> decryption_pb2.ChargeDirectQueriesResponse:
        """gRPC: pay for a batch of direct range counts (computation server only).

        Privacy: spends budget as `DecryptionHandler.charge_direct_queries` (epsilon per
        range, sensitivity c, neighbouring relation add/remove of one person with at most
        c records); draws no noise, so nobody knows noise from it.
        """
        self._computation_only(context, "pay for direct range counts")
        self.handler.get_study(request.study_id)
        self._check_receipt(request.study_id, request.newest_receipt)
        r = self.handler.charge_direct_queries(study_id=request.study_id, request_id=request.request_id,
                                               contract_hash=request.contract_hash,
                                               ranges=ranges_from_proto(request.ranges), epsilon=request.epsilon)
        return decryption_pb2.ChargeDirectQueriesResponse(
            epsilon_charged=r.epsilon, epsilon_direct_total=r.spent_direct, epsilon_remaining=r.remaining,
            charge_id=r.charge.charge_id if r.charge else 0, already_charged=r.already_charged,
            receipt=self._receipt(r.charge))

    def BudgetStatus(self, request: decryption_pb2.BudgetStatusRequest,
                     context: grpc.ServicerContext) -> decryption_pb2.BudgetStatusResponse:
        self.policy.require(context, ["computation", "operator", "analyst"], action="read a study's budget")
        report = self.handler.budget(request.study_id)
        return decryption_pb2.BudgetStatusResponse(
            study_id=report.study_id, epsilon_total=report.total, epsilon_spent=report.spent,
            epsilon_remaining=report.remaining, epsilon_reserved=report.reserved, chain_problem=report.chain_problem,
            epsilon_available=report.available, receipt_public_key=self.receipts.public_key,
            charges=[decryption_pb2.LedgerCharge(charge_id=c.charge_id, release_id=c.release_id, kind=c.kind,
                                                 epsilon=c.epsilon, created_at=c.created_at)
                     for c in report.charges],
        )

    def ReconcileCharges(self, request: decryption_pb2.ReconcileChargesRequest,
                         context: grpc.ServicerContext) -> decryption_pb2.ReconcileChargesResponse:
        self.policy.require(context, ["operator"], action="reconcile a ledger")
        raise FailedPreconditionError("this decryption server holds the whole key (K = 1): there are no other key "
                                      "holders whose charges it could lack; nothing was booked")

    def KeySetup(self, request: decryption_pb2.KeySetupRequest,
                 context: grpc.ServicerContext) -> decryption_pb2.KeySetupResponse:
        self._computation_only(context, "run a collective key setup")
        raise FailedPreconditionError("this decryption server holds the whole key (K = 1): it runs no collective "
                                      "key setup; start key-share holders with --key-share NAME --holders ...")

    def SignCharge(self, request: decryption_pb2.SignChargeRequest,
                   context: grpc.ServicerContext) -> decryption_pb2.SignChargeResponse:
        self._computation_only(context, "ask for a charge signature")
        raise FailedPreconditionError("this decryption server holds the whole key (K = 1): it charges its own ledger "
                                      "and signs no t-of-N charge log; nothing was signed")

    def IssueShares(self, request_iterator: Iterator[decryption_pb2.DecryptMeasurementRequest],
                    context: grpc.ServicerContext) -> Iterator[decryption_pb2.IssueSharesResponse]:
        self._computation_only(context, "ask for decryption shares")
        raise FailedPreconditionError("this decryption server holds the whole key (K = 1): it decrypts with "
                                      "DecryptMeasurement and issues no key shares")

    def ForwardUploads(self, request_iterator: Iterator[decryption_pb2.ForwardUploadsRequest],
                       context: grpc.ServicerContext) -> decryption_pb2.ForwardUploadsResponse:
        """gRPC: the owners' signed c1 parts of one study (computation server only), verified and summed per chunk.

        The key holder then decrypts (or, a key-share holder, computes shares on) that study's
        measurement chunks with this aggregate c1 only. Charges and decrypts nothing.
        """
        self._computation_only(context, "forward the owners' c1 parts")
        study = contract_hash = ""
        owners: dict[str, tuple[str, bytes, list[bytes]]] = {}
        for msg in request_iterator:
            study = study or msg.study_id
            contract_hash = contract_hash or msg.contract_hash
            if (msg.study_id, msg.contract_hash) != (study, contract_hash):
                raise InvalidInputError("ForwardUploads carries parts of one study under one contract")
            key, sig, parts = owners.setdefault(msg.owner_id, (msg.idempotency_key, bytes(msg.signature), []))
            if (msg.idempotency_key, bytes(msg.signature)) != (key, sig) or int(msg.index) != len(parts):
                raise InvalidInputError(f"owner {msg.owner_id!r}'s c1 parts must come in chunk order under one "
                                        "upload key and signature")
            parts.append(bytes(msg.c1))
        if not study:
            raise InvalidInputError("ForwardUploads needs at least one c1 part")
        chunks = self._accept_uploads(study, contract_hash, [
            OwnerC1Parts(o, key, tuple(parts), sig) for o, (key, sig, parts) in owners.items()])
        return decryption_pb2.ForwardUploadsResponse(chunks=chunks)

    def _accept_uploads(self, study_id: str, contract_hash: str, uploads: list[OwnerC1Parts]) -> int:
        return self.handler.accept_uploads(study_id, contract_hash, uploads)
