"""Thin gRPC servicer of the analyst service."""

from __future__ import annotations

from typing import Iterator

import grpc

from parties.wire.v1 import analyst_pb2, analyst_pb2_grpc, common_pb2

from ..common.access import AccessPolicy
from ..common.convert import range_counts_to_proto, ranges_from_proto, signatures_to_proto, summary_to_proto
from ..common.errors import TooLargeForOneMessageError
from ..common.limits import raise_if_cancelled
from ..common.paging import INLINE_JSON_BYTES, arrow_pages, summary_pages
from .handler import AnalystHandler

__all__ = ["AnalystServicer", "SERVICE_NAME"]

SERVICE_NAME = analyst_pb2.DESCRIPTOR.services_by_name["Analyst"].full_name


_READERS = ("analyst", "operator")


class AnalystServicer(analyst_pb2_grpc.AnalystServicer):
    """Read-only; callers must be analysts or operators (checked first in every method)."""

    def __init__(self, handler: AnalystHandler, policy: AccessPolicy | None = None) -> None:
        self.handler = handler
        self.policy = policy if policy is not None else AccessPolicy()

    def ListReleases(self, request: analyst_pb2.ListReleasesRequest,
                     context: grpc.ServicerContext) -> analyst_pb2.ListReleasesResponse:
        self.policy.require(context, _READERS, action="list releases")
        infos = []
        for item in self.handler.list_releases(request.study_id):
            infos.append(analyst_pb2.ReleaseInfo(release_id=item.release_id, study_id=item.study_id,
                                                 epsilon=item.epsilon, domain_size=item.domain_size,
                                                 partitions=item.partitions, created_at=item.finished_at))
        return analyst_pb2.ListReleasesResponse(releases=infos)

    def GetRelease(self, request: analyst_pb2.GetReleaseRequest,
                   context: grpc.ServicerContext) -> analyst_pb2.GetReleaseResponse:
        self.policy.require(context, _READERS, action="read a release")
        if not self.handler.fits_one_message(request.release_id):  # decided before the summary is parsed
            raise TooLargeForOneMessageError(
                f"release {request.release_id} is too large for one message (a stored summary over "
                f"{INLINE_JSON_BYTES:,} bytes): read it with GetReleaseArrow (the Python SDK's get_release does), "
                "or ask RangeCounts")
        rec, summary = self.handler.release(request.release_id)
        return analyst_pb2.GetReleaseResponse(summary=summary_to_proto(
            summary, release_id=rec.release_id, study_id=rec.study_id, owners=rec.owners,
            contract_hash=rec.contract_hash, created_at=rec.finished_at, owner_signatures=rec.signatures))

    def GetReleasePages(self, request: analyst_pb2.GetReleaseRequest,
                        context: grpc.ServicerContext) -> Iterator[analyst_pb2.ReleaseSummaryPage]:
        self.policy.require(context, _READERS, action="read a release")
        rec, summary = self.handler.release(request.release_id)
        yield from summary_pages(summary, release_id=rec.release_id, study_id=rec.study_id, owners=rec.owners,
                                 contract_hash=rec.contract_hash, created_at=rec.finished_at,
                                 owner_signatures=rec.signatures, check=raise_if_cancelled)

    def GetReleaseArrow(self, request: analyst_pb2.GetReleaseRequest,
                        context: grpc.ServicerContext) -> Iterator[analyst_pb2.ReleaseArrowPage]:
        self.policy.require(context, _READERS, action="read a release")
        rec, files = self.handler.arrow_files(request.release_id)
        release = common_pb2.ReleaseSummary(release_id=rec.release_id, study_id=rec.study_id, owners=list(rec.owners),
                                            contract_hash=rec.contract_hash, created_at=rec.finished_at,
                                            owner_signatures=signatures_to_proto(rec.signatures))
        yield from arrow_pages(release, files, check=raise_if_cancelled)

    def RangeCounts(self, request: analyst_pb2.RangeCountsRequest,
                    context: grpc.ServicerContext) -> analyst_pb2.RangeCountsResponse:
        self.policy.require(context, _READERS, action="ask range counts")
        counts = self.handler.range_counts(request.release_id, ranges_from_proto(request.ranges))
        return analyst_pb2.RangeCountsResponse(counts=range_counts_to_proto(counts))
