"""Three data owners -> release -> analyst range counts, through real gRPC servers and real BFV."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from he_partition.core.noise import discrete_laplace_variance, laplace_scale
from parties.common.errors import ServiceError

from .conftest import Cluster, blocky_histograms


def test_three_owners_release_and_range_counts_cover_the_truth(cluster: Cluster) -> None:
    n = 128
    contract = cluster.open_study(domain_size=n, epsilon=1.0)
    hs = blocky_histograms(n)
    for owner, h in zip(("a", "b", "c"), hs):
        res = cluster.owner(owner).submit("s1", h)
        assert res.committed and not res.duplicate and res.chunk_count == 1
    cs = cluster.computation()
    status = cs.study_status("s1")
    assert status.submitted_owners == ("a", "b", "c") and status.missing_owners == ()
    assert status.contract.contract_hash == contract.contract_hash

    rel = cs.run_release("s1")
    assert rel.state == "DONE" and rel.owners == ("a", "b", "c") and rel.epsilon == 1.0
    summary = rel.summary
    assert summary is not None and summary.domain_size == n
    # Exact privacy arithmetic: gap split 0.2 / 0.8, partition sums have sensitivity c = 1,
    # both servers add one discrete Laplace draw of scale 1/0.8.
    assert summary.epsilon_spent == (("prefix_differences", 0.2), ("partition_sums", 0.8))
    per_sum = 2 * discrete_laplace_variance(laplace_scale(1, 0.8))
    assert summary.sum_variance == (per_sum,) * summary.n_partitions

    analyst = cluster.analyst()
    listed = analyst.list_releases("s1")
    assert [r.release_id for r in listed] == [rel.release_id]
    got = analyst.get_release(rel.release_id)
    assert got.summary == summary and got.owners == ("a", "b", "c") and got.contract_hash == contract.contract_hash

    truth = np.sum(hs, axis=0)
    starts = list(summary.starts) + [n]
    # Ranges aligned with the released partitions carry only DP noise, which the standard error describes.
    ranges = [(0, n)] + [(starts[i], starts[j]) for i, j in [(0, 1), (1, 3), (2, len(starts) - 1)] if j < len(starts)]
    counts = analyst.range_counts(rel.release_id, ranges)
    assert [(c.lo, c.hi) for c in counts] == ranges
    for c in counts:
        k = sum(1 for s in summary.starts if c.lo <= s < c.hi)
        assert c.standard_error == pytest.approx(np.sqrt(k * per_sum), rel=1e-12)
        assert abs(c.value - truth[c.lo:c.hi].sum()) <= 4 * c.standard_error, (c, truth[c.lo:c.hi].sum())

    with pytest.raises(ServiceError) as ei:
        analyst.range_counts(rel.release_id, [(5, 5)])
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT and "range 0 [5, 5)" in ei.value.details
    with pytest.raises(ServiceError) as ei:
        analyst.get_release("rel-nope")
    assert ei.value.code == grpc.StatusCode.NOT_FOUND


def test_release_without_waiting_is_polled_to_done(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64, owners=("a",))
    cluster.owner("a").submit("s1", np.arange(64))
    cs = cluster.computation()
    started = cs.run_release("s1", wait=False)
    assert started.state in ("RUNNING", "DONE")
    done = cs.wait_release(started.release_id, timeout=60)
    assert done.state == "DONE" and done.summary is not None
    assert cs.release_status(started.release_id).summary == done.summary


def test_run_release_request_key_is_idempotent(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.ones(64, dtype=int))
    cs = cluster.computation()
    first = cs.run_release("s1", request_key="once")
    again = cs.run_release("s1", request_key="once")
    assert again.release_id == first.release_id
    assert cluster.decryption().budget("s1").spent == 1.0


def test_health_and_reflection_are_served(cluster: Cluster) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    for target, services in ((cluster.ds.target, ["dpagg.v1.Decryption"]),
                             (cluster.cs.target, ["dpagg.v1.Computation", "dpagg.v1.Analyst"])):
        with grpc.insecure_channel(target) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            for name in ["", *services]:
                resp = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
            refl = reflection_pb2_grpc.ServerReflectionStub(ch)
            replies = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                timeout=5)
            names = {s.name for r in replies for s in r.list_services_response.service}
            assert set(services) <= names and "grpc.health.v1.Health" in names


@pytest.mark.parametrize("strategy", ["hier", "dawa"])
def test_other_strategies_release_through_the_services_and_round_trip_losslessly(cluster: Cluster,
                                                                                 strategy: str) -> None:
    from he_partition.protocol import STRATEGIES

    if strategy not in STRATEGIES:
        pytest.skip(f"core has no {strategy!r} strategy")
    n = 64
    cluster.open_study(domain_size=n, owners=("a", "b"), strategy=strategy)
    hs = blocky_histograms(n, owners=2)
    for owner, h in zip(("a", "b"), hs):
        cluster.owner(owner).submit("s1", h)
    rel = cluster.computation().run_release("s1")
    assert rel.summary is not None and rel.summary.strategy == strategy
    analyst = cluster.analyst()
    got = analyst.get_release(rel.release_id).summary
    assert got == rel.summary  # every field survives the proto round trip (estimator, released values)
    ranges = [(0, n), (3, 17), (10, 60)]
    remote = analyst.range_counts(rel.release_id, ranges)
    assert remote == got.range_counts(ranges)
    assert cluster.decryption().budget("s1").spent == pytest.approx(1.0, abs=1e-12)


def test_stand_alone_analyst_server_reads_the_computation_store(cluster: Cluster) -> None:
    from parties.analyst.client import AnalystClient
    from parties.common.config import AnalystConfig
    from parties.computation.server import create_analyst_server

    cluster.open_study(domain_size=64, owners=("a",))
    cluster.owner("a").submit("s1", np.arange(64))
    rel = cluster.computation().run_release("s1")
    handle = create_analyst_server(AnalystConfig(cluster.root / "cs", insecure=True)).start()
    try:
        with AnalystClient(handle.target, insecure=True) as analyst:
            analyst.wait_ready("dpagg.v1.Analyst")
            assert [r.release_id for r in analyst.list_releases()] == [rel.release_id]
            assert analyst.get_release(rel.release_id).summary == rel.summary
    finally:
        handle.stop()
