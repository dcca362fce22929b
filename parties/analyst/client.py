"""Typed Python client of the analyst service (hosted by the computation server)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import grpc

from parties.wire.v1 import analyst_pb2, analyst_pb2_grpc
from he_partition.core.summary import RangeCount, RangeCounts, Summary

from ..common.client import BaseClient
from ..common.convert import range_counts_from_proto, ranges_to_proto, signatures_from_proto
from ..common.errors import ServiceError
from ..common.paging import summary_from_arrow_pages, summary_from_pages
from ..common.signing import OwnerSignature
from ..data_owner.domain import DomainSpec
from .value_ranges import RangeSpec, has_value_ranges, resolve_ranges, summary_domain

__all__ = ["AnalystClient", "ReleaseInfo", "Release", "read_release"]


@dataclass(frozen=True)
class ReleaseInfo:
    """One line of ListReleases."""

    release_id: str
    study_id: str
    epsilon: float
    domain_size: int
    partitions: int
    created_at: str


@dataclass(frozen=True)
class Release:
    """A released summary with where it came from. Querying it locally spends no budget.

    `signatures` (signed studies): each owner's signature on the submission the release
    contains; check them against the contract's owner keys with `OwnerSignature.verify`.
    """

    release_id: str
    study_id: str
    owners: tuple[str, ...]
    contract_hash: str
    created_at: str
    summary: Summary
    signatures: tuple[OwnerSignature, ...] = ()

    @property
    def domain(self) -> DomainSpec | None:
        """The study's domain as the release records it (its bins' values), or None when it records none."""
        return summary_domain(self.summary)

    def to_pandas(self, *, confidence: float | None = None) -> Any:
        """The released partitions as a DataFrame labelled with the values of their bins (`Summary.to_pandas`
        with this release's domain; `confidence` adds interval columns). Post-processing: spends no budget."""
        return self.summary.to_pandas(self.domain, confidence=confidence)

    def plot(self, ax: Any = None, *, confidence: float | None = None) -> Any:
        """`Summary.plot` with the x axis in this release's values (matplotlib is optional)."""
        return self.summary.plot(ax, domain=self.domain, confidence=confidence)


def read_release(stub: Any, release_id: str, call: Callable[[Callable[..., Any]], Any]) -> Release:
    """A release's summary read as its Arrow files with GetReleaseArrow on `stub` (an Analyst stub), or with
    GetReleasePages from a server that predates it; `call(fn)` runs `fn(request, timeout=...)` with the
    caller's deadline and retry policy."""

    def fetch(request: Any, timeout: float | None = None) -> tuple[Any, Summary]:
        method = "Analyst/GetReleaseArrow"
        try:
            try:
                return summary_from_arrow_pages(stub.GetReleaseArrow(request, timeout=timeout), method)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
            method = "Analyst/GetReleasePages"
            return summary_from_pages(stub.GetReleasePages(request, timeout=timeout), method)
        except grpc.RpcError as err:
            raise ServiceError.from_rpc_error(err, method) from None

    s, summary = call(fetch)
    return Release(s.release_id, s.study_id, tuple(s.owners), s.contract_hash, s.created_at, summary,
                   signatures_from_proto(s.owner_signatures))


class AnalystClient(BaseClient):
    """Read-only queries; every call has a deadline and retries on UNAVAILABLE.

    Example (the analyst files `dpagg certs --out pki --party alice:analyst` wrote; the README's study)::

        from dpagg import AnalystClient, TlsConfig

        with AnalystClient("localhost:50052", tls=TlsConfig.in_directory("pki", "alice")) as an:
            latest = an.list_releases("ages")[0]  # newest first
            for rc in an.range_counts(latest.release_id, [(0, 10), (10, 50)]):
                print(rc.lo, rc.hi, rc.value, "+-", rc.standard_error)
    """

    stub_class = analyst_pb2_grpc.AnalystStub
    server_role = "computation"  # the analyst service runs in the computation server (or serve-analyst on its data)

    def list_releases(self, study_id: str = "", *, timeout: float | None = None) -> list[ReleaseInfo]:
        """Finished releases, newest first (of one study, or all).

        A study with no finished release and an unknown study both give [] (the analyst
        service knows releases, not studies); `ComputationClient.study_status` raises
        NOT_FOUND for an unknown study, which is how `dpagg query --list` tells them apart.
        """
        resp = self._unary(self._stub.ListReleases, analyst_pb2.ListReleasesRequest(study_id=study_id),
                           method="Analyst/ListReleases", timeout=timeout)
        return [ReleaseInfo(r.release_id, r.study_id, r.epsilon, r.domain_size, r.partitions, r.created_at)
                for r in resp.releases]

    def get_release(self, release_id: str, *, timeout: float | None = None) -> Release:
        """The full summary of a finished release (partitions, noisy sums, noise variances), read in pages of its
        Arrow files; its `to_pandas()` uses their columns without a copy."""
        return read_release(self._stub, release_id, lambda fn: self._unary(
            fn, analyst_pb2.GetReleaseRequest(release_id=release_id), method="Analyst/GetReleaseArrow",
            timeout=timeout))

    def range_counts(self, release_id: str, ranges: Iterable[RangeSpec], *, confidence: float | None = None,
                     domain: DomainSpec | None = None, timeout: float | None = None) -> RangeCounts:
        """Estimated counts over ranges, each with the standard error of its DP noise.

        A range is a pair (lo, hi) of bin indices (half-open [lo, hi)), the text "LO:HI" of one, or
        a range of the study's values: "age=20:40" (or a `ValueRange`), the values [20, 40), whose
        ends must be bin edges of the domain the release records (`Release.domain`; pass `domain`
        for a release that records none). Value ranges and `confidence` fetch the release's
        summary (one more call); the answers then carry its domain, so `to_pandas()` labels them.

        With `confidence` (e.g. 0.95) each answer also carries ci_lo, ci_hi: an interval that
        contains the true count in at least that share of releases, over the noise (the bias
        of spreading a count evenly inside a partition is not covered), and interval_method
        ("exact", "chernoff" or "bound"); it is computed here from the release's summary
        (`Summary.interval`). Post-processing of the release: spends no budget. The result is
        a list with `to_pandas()`.
        """
        asked = list(ranges)
        release: Release | None = None
        if confidence is not None or has_value_ranges(asked):
            release = self.get_release(release_id, timeout=timeout)
            domain = domain if domain is not None else release.domain
        bins = resolve_ranges(asked, domain, f"release {release_id}")
        req = analyst_pb2.RangeCountsRequest(release_id=release_id, ranges=ranges_to_proto(bins))
        resp = self._unary(self._stub.RangeCounts, req, method="Analyst/RangeCounts", timeout=timeout)
        counts = range_counts_from_proto(resp.counts)
        if confidence is not None:
            assert release is not None
            cis = [release.summary.interval(c.lo, c.hi, confidence) for c in counts]
            counts = RangeCounts(RangeCount(c.lo, c.hi, c.value, c.standard_error, ci.lo, ci.hi, ci.confidence,
                                            ci.method) for c, ci in zip(counts, cis))
        counts.domain = domain
        return counts
