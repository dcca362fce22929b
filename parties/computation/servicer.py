"""Thin gRPC servicer of the computation service."""

from __future__ import annotations

from typing import Iterator

import grpc

from parties.wire.v1 import computation_pb2, computation_pb2_grpc, decryption_pb2
from he_partition.he.bfv import context_fingerprint
from he_partition.core.errors import InvalidInputError

from ..common.access import ANY_ROLE, AccessPolicy
from ..common.paging import summary_is_inline
from ..common.convert import (context_to_chunks, contract_to_proto, open_study_kwargs, range_counts_to_proto,
                              ranges_from_proto, summary_to_proto)
from .direct import DirectQueries
from .handler import ComputationHandler
from .uploads import UploadOutcome, receive_upload
from .store import ReleaseProgress, ReleaseRecord, ReleaseState

__all__ = ["ComputationServicer", "SERVICE_NAME", "release_to_proto"]

SERVICE_NAME = computation_pb2.DESCRIPTOR.services_by_name["Computation"].full_name



def release_to_proto(rec: ReleaseRecord,
                     progress: ReleaseProgress | None = None) -> computation_pb2.ReleaseStatusResponse:
    resp = computation_pb2.ReleaseStatusResponse(
        release_id=rec.release_id, study_id=rec.study_id, state=rec.state,
        epsilon=rec.epsilon, owners=list(rec.owners), error_code=rec.error_code, error_message=rec.error_message,
        seconds=rec.seconds, bytes_to_decryption=rec.bytes_to_decryption,
    )
    if progress is not None and rec.state == ReleaseState.RUNNING:
        resp.progress.CopyFrom(computation_pb2.ReleaseProgress(
            phase=progress.phase, measurements_done=progress.measurements_done,
            measurement_kind=progress.measurement_kind, chunks_sent=progress.chunks_sent,
            chunks_total=progress.chunks_total, measurement_seconds=progress.measurement_seconds))
    if rec.summary_ref and not summary_is_inline(rec.stored_summary_bytes):  # too large for one reply: in pages
        resp.summary_paged = True
    elif (summary := rec.summary) is not None:
        resp.summary.CopyFrom(summary_to_proto(summary, release_id=rec.release_id, study_id=rec.study_id,
                                               owners=rec.owners, contract_hash=rec.contract_hash,
                                               created_at=rec.finished_at, owner_signatures=rec.signatures))
    return resp


def submit_response(o: UploadOutcome) -> computation_pb2.SubmitHistogramResponse:
    return computation_pb2.SubmitHistogramResponse(committed=o.committed, duplicate=o.duplicate,
                                                   received_chunks=list(o.received), chunk_count=o.chunk_count,
                                                   bytes_received=o.bytes_received)


class ComputationServicer(computation_pb2_grpc.ComputationServicer):
    """Every method checks the caller's role first (`AccessPolicy`), before it reads or stores anything.

    Operators open studies and run releases; a data owner uploads only under its own
    certificate id, and only to studies that list it.
    """

    def __init__(self, handler: ComputationHandler, policy: AccessPolicy | None = None) -> None:
        self.handler = handler
        self.direct = DirectQueries(handler)
        self.policy = policy if policy is not None else AccessPolicy()

    def GetPublicContext(self, request: decryption_pb2.GetPublicContextRequest,
                         context: grpc.ServicerContext) -> Iterator[decryption_pb2.PublicContextChunk]:
        self.policy.require(context, ANY_ROLE, action="download the public context")
        data = self.handler.public_context(request.study_id)
        yield from context_to_chunks(data, context_fingerprint(data))

    def JoinExchange(self, request: computation_pb2.JoinExchangeRequest,
                     context: grpc.ServicerContext) -> computation_pb2.JoinExchangeResponse:
        caller = self.policy.require(context, ["data_owner"], action="exchange join keys")
        self.policy.same_party(caller, request.owner_id, what="owner_id of the request")
        contract = self.handler.study(request.study_id)
        peer, signature = self.handler.joins.exchange(contract, request.owner_id, bytes(request.public_key),
                                                      bytes(request.signature))
        self.handler.joins.prefetch(contract, self.handler.public_context)  # the uploads will need the join key
        return computation_pb2.JoinExchangeResponse(peer_public_key=peer, peer_signature=signature)

    def JoinPlacement(self, request: computation_pb2.JoinPlacementRequest,
                      context: grpc.ServicerContext) -> computation_pb2.JoinPlacementResponse:
        caller = self.policy.require(context, ["data_owner"], action="post pseudonyms for a join")
        self.policy.same_party(caller, request.owner_id, what="owner_id of the request")
        contract = self.handler.study(request.study_id)
        ready, positions, capacity = self.handler.joins.placement(contract, request.owner_id,
                                                                  bytes(request.pseudonyms), part=request.part,
                                                                  parts=request.parts)
        return computation_pb2.JoinPlacementResponse(ready=ready, positions=positions, capacity=capacity)

    def OpenStudy(self, request: decryption_pb2.OpenStudyRequest,
                  context: grpc.ServicerContext) -> decryption_pb2.OpenStudyResponse:
        self.policy.require(context, ["operator"], action="open a study")
        contract, existed = self.handler.open_study(**open_study_kwargs(request))
        return decryption_pb2.OpenStudyResponse(contract=contract_to_proto(contract), already_existed=existed)

    def SubmitHistogram(self, request_iterator: Iterator[computation_pb2.SubmitHistogramRequest],
                        context: grpc.ServicerContext) -> computation_pb2.SubmitHistogramResponse:
        caller = self.policy.require(context, ["data_owner"], action="submit a histogram")
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("part") != "header":
            raise InvalidInputError("SubmitHistogram must start with a header message")
        h = first.header
        self.policy.same_party(caller, h.owner_id, what="owner_id of the upload header")
        return submit_response(receive_upload(self.handler.open_upload, h, request_iterator))

    def UploadStatus(self, request: computation_pb2.UploadStatusRequest,
                     context: grpc.ServicerContext) -> computation_pb2.UploadStatusResponse:
        caller = self.policy.require(context, ["data_owner", "operator"], action="read an upload's status")
        if caller is not None and caller.role == "data_owner":
            self.policy.same_party(caller, request.owner_id, what="owner_id of the request")
        o = self.handler.upload_status(request.study_id, request.owner_id, request.idempotency_key)
        return computation_pb2.UploadStatusResponse(
            state=o.state, received_chunks=list(o.received), chunk_count=o.chunk_count,
            c1_signature_wanted=self.handler.wants_c1_signatures(request.study_id))

    def StudyStatus(self, request: computation_pb2.StudyStatusRequest,
                    context: grpc.ServicerContext) -> computation_pb2.StudyStatusResponse:
        self.policy.require(context, ANY_ROLE, action="read a study's status")
        s = self.handler.study_state(request.study_id)
        return computation_pb2.StudyStatusResponse(contract=contract_to_proto(s.contract),
                                                   submitted_owners=list(s.submitted), missing_owners=list(s.missing),
                                                   release_ids=list(s.release_ids),
                                                   key_holders=len(self.handler.key_holder_addresses()),
                                                   holders_per_measurement=self.handler.key_holders)

    def LedgerReceipts(self, request: computation_pb2.LedgerReceiptsRequest,
                       context: grpc.ServicerContext) -> computation_pb2.LedgerReceiptsResponse:
        self.policy.require(context, ["operator", "analyst"], action="read a study's ledger receipts")
        addresses = dict(self.handler.key_holder_addresses())
        view = getattr(self.handler.decryption, "charge_log_view", None)
        entries, spent = (view(request.study_id) if view is not None else None) or (0, "")
        return computation_pb2.LedgerReceiptsResponse(charge_log_entries=entries, charge_log_spent=spent, holders=[
            computation_pb2.HolderReceipts(holder=name, address=addresses.get(name, ""), receipts=[
                decryption_pb2.LedgerReceipt(body=r.body, signature=r.signature, public_key=r.public_key)
                for r in receipts])
            for name, receipts in self.handler.ledger_receipts(request.study_id)])

    def RunRelease(self, request: computation_pb2.RunReleaseRequest,
                   context: grpc.ServicerContext) -> computation_pb2.ReleaseStatusResponse:
        self.policy.require(context, ["operator"], action="run a release")
        rec = self.handler.run_release(request.study_id, epsilon=request.epsilon, force=request.force,
                                       wait=request.wait, request_key=request.request_key,
                                       spend_rest=request.spend_rest)
        return release_to_proto(rec)

    def ReleaseStatus(self, request: computation_pb2.ReleaseStatusRequest,
                      context: grpc.ServicerContext) -> computation_pb2.ReleaseStatusResponse:
        self.policy.require(context, ["operator", "computation", "analyst"], action="read a release's status")
        rec = self.handler.release(request.release_id)
        return release_to_proto(rec, self.handler.release_progress(rec.release_id))

    def DirectRangeCounts(self, request: computation_pb2.DirectRangeCountsRequest,
                          context: grpc.ServicerContext) -> computation_pb2.DirectRangeCountsResponse:
        self.policy.require(context, ["analyst", "operator"], action="ask direct range counts (spends budget)")
        a = self.direct.answer(request.study_id, ranges_from_proto(request.ranges), request.epsilon,
                               force=request.force, request_key=request.request_key)
        return computation_pb2.DirectRangeCountsResponse(
            request_id=a.request_id, counts=range_counts_to_proto(a.counts), epsilon_charged=a.epsilon_charged,
            epsilon_sequential=a.epsilon_sequential, epsilon_remaining=a.epsilon_remaining, owners=list(a.owners))

    def SetupKey(self, request: computation_pb2.SetupKeyRequest,
                 context: grpc.ServicerContext) -> computation_pb2.SetupKeyResponse:
        """Threshold mode: fix the holders' deployment, t and identity keys (operators only; idempotent); each
        study's key is set up when it is opened."""
        self.policy.require(context, ["operator"], action="fix the key-share holders' deployment")
        from ..common.errors import FailedPreconditionError
        from .threshold.decryption import ThresholdDecryption

        holders = self.handler.decryption
        if not isinstance(holders, ThresholdDecryption):
            raise FailedPreconditionError("this computation server has one decryption server (--decryption), which "
                                          "makes its own key; setup-key is for key-share holders (--holder)")
        fingerprint, already = holders.setup_key(int(request.threshold))
        return computation_pb2.SetupKeyResponse(fingerprint=fingerprint, holders=holders.names,
                                                already_active=already, threshold=holders.threshold or holders.k)
