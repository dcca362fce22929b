"""Ingest processes behind the computation server's one port: uploads stored by the processes that took them, the
release the numpy oracle's, the caller's identity carried to the coordinator, and the port and the coordinator's
socket closed to everyone else (docs/scaling.md, "Ingest on several processes")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from parties.common.config import ComputationConfig
from parties.common.errors import FailedPreconditionError, ServiceError
from parties.computation.ingest.forwarding import PEER_CERT_METADATA, TOKEN_METADATA
from parties.computation.server import create_computation_server
from parties.wire.v1 import computation_pb2

from he_partition.core.errors import InvalidInputError

from .conftest import OPERATOR_ID, Cluster, blocky_histograms, status_of
from .test_running_aggregate import Sent, _manifest, assert_cs_view_is_the_oracle
from .test_scale_out import N  # three chunks


def test_uploads_through_ingest_processes_are_stored_there_and_release_the_oracle_values(tmp_path: Path) -> None:
    cluster = Cluster.start(tmp_path, ingest=2)
    hs = blocky_histograms(N)
    coordinator_uploads: list[str] = []
    real_open = cluster.cs.handler.open_upload

    def counting(**kw: Any) -> Any:
        coordinator_uploads.append(kw["owner_id"])
        return real_open(**kw)

    cluster.cs.handler.open_upload = counting
    try:
        assert cluster.cs.server._dpagg_fronts.alive() == 2
        cluster.open_study(domain_size=N, epsilon=2.0)
        for owner, h in zip("abc", hs):  # a's three chunks go over three streams at once, across the processes
            assert cluster.owner(owner).submit("s1", h, streams=3 if owner == "a" else None).committed
        assert coordinator_uploads == []  # every chunk was received, parsed and stored by an ingest process
        assert [s.owner_id for s in cluster.cs.handler.store.submissions("s1")] == ["a", "b", "c"]  # committed once
        assert cluster.cs.handler.folds.wait_idle(60)
        assert sorted(o for o, _ in _manifest(cluster)["uploads"]) == ["a", "b", "c"]  # each commit was folded
        sent = Sent(cluster)
        rec = cluster.computation().run_release("s1", epsilon=1.0)
        assert rec.state == "DONE", rec.error_message
        assert_cs_view_is_the_oracle(cluster, sent, hs, seed=12)

        # A stream the front does not take (no header first) goes to the coordinator whole; its refusal comes back.
        channel = grpc.insecure_channel(cluster.cs.target)
        submit = channel.stream_unary("/dpagg.v1.Computation/SubmitHistogram",
                                      request_serializer=computation_pb2.SubmitHistogramRequest.SerializeToString,
                                      response_deserializer=computation_pb2.SubmitHistogramResponse.FromString)
        with pytest.raises(grpc.RpcError) as rpc:
            submit(iter([computation_pb2.SubmitHistogramRequest(chunk=computation_pb2.CiphertextChunk(index=0))]),
                   timeout=30)
        assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "header" in (rpc.value.details() or "")
        channel.close()
    finally:
        cluster.stop()
    assert cluster.cs.server._dpagg_fronts.alive() == 0  # stopping the server ended its ingest processes


def test_the_caller_not_the_ingest_process_is_checked_and_the_coordinator_socket_wants_the_token(
        tmp_path: Path) -> None:
    cluster = Cluster.start(tmp_path, secure=True, ingest=1)
    coordinator_uploads: list[str] = []
    real_open = cluster.cs.handler.open_upload
    cluster.cs.handler.open_upload = lambda **kw: coordinator_uploads.append(kw["owner_id"]) or real_open(**kw)
    try:
        contract = cluster.open_study(domain_size=64)
        assert contract.sealed and contract.signed  # as deployed: sealed, signed uploads, c1 parts signed
        hs = blocky_histograms(64)
        for owner, h in zip("abc", hs):
            assert cluster.owner(owner).submit("s1", h).committed
        assert coordinator_uploads == []
        executor = cluster.cs.handler.executor
        calls: list[str] = []
        real_call = executor.call
        executor.call = lambda key, method, args: calls.append(method) or real_call(key, method, args)
        rec = cluster.computation().run_release("s1", epsilon=0.5)
        assert rec.state == "DONE", rec.error_message
        assert "open" in calls  # the chunk workers opened the sealed chunks, not the server process
        chunk_dir = tmp_path / "cs" / "uploads" / "s1"
        files = [p.name for p in chunk_dir.rglob("*") if p.is_file()]
        assert files and not [n for n in files if n.endswith(".part")]  # every staged file was installed
        with pytest.raises(ServiceError) as exc:  # an owner is not an operator, through the front
            cluster.computation("a", "data_owner").run_release("s1", epsilon=0.5)
        assert status_of(exc) == grpc.StatusCode.PERMISSION_DENIED

        # The owner forges the forwarding metadata on the public port: the front drops it.
        assert cluster.pki is not None
        op_pem = (cluster.pki.dir / f"{OPERATOR_ID}.crt").read_bytes()
        tls = cluster.tls("a", "data_owner")
        assert tls is not None
        channel = grpc.secure_channel(cluster.cs.target, tls.channel_credentials(),
                                      options=tls.channel_options())
        run = channel.unary_unary("/dpagg.v1.Computation/RunRelease",
                                  request_serializer=computation_pb2.RunReleaseRequest.SerializeToString,
                                  response_deserializer=computation_pb2.ReleaseStatusResponse.FromString)
        with pytest.raises(grpc.RpcError) as rpc:
            run(computation_pb2.RunReleaseRequest(study_id="s1", epsilon=0.5), timeout=30,
                metadata=((TOKEN_METADATA, "guess"), (PEER_CERT_METADATA, op_pem)))
        assert rpc.value.code() == grpc.StatusCode.PERMISSION_DENIED
        channel.close()

        # A local process that reaches the coordinator's socket without the token: refused before any handler.
        private = grpc.insecure_channel(cluster.cs.server._dpagg_coordinator)
        run = private.unary_unary("/dpagg.v1.Computation/RunRelease",
                                  request_serializer=computation_pb2.RunReleaseRequest.SerializeToString,
                                  response_deserializer=computation_pb2.ReleaseStatusResponse.FromString)
        with pytest.raises(grpc.RpcError) as rpc:
            run(computation_pb2.RunReleaseRequest(study_id="s1", epsilon=0.5), timeout=30,
                metadata=((TOKEN_METADATA, "0" * 64), (PEER_CERT_METADATA, op_pem)))
        assert rpc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        private.close()
        assert cluster.computation().study_status("s1").contract.study_id == "s1"  # the operator, forwarded
    finally:
        cluster.stop()


def test_a_second_server_cannot_share_the_ingest_processes_port(tmp_path: Path) -> None:
    cluster = Cluster.start(tmp_path, ingest=1)
    try:
        cluster.open_study(domain_size=64)
        port = cluster.cs.port
        plain = ComputationConfig(tmp_path / "other", cluster.ds.target, port=port, insecure=True)
        with pytest.raises(InvalidInputError, match="in use"):
            create_computation_server(plain)
        fronted = ComputationConfig(tmp_path / "third", cluster.ds.target, port=port, insecure=True,
                                    ingest_processes=1)
        with pytest.raises(FailedPreconditionError, match=f"port {port}"):
            create_computation_server(fronted)
        assert cluster.computation().study_status("s1").contract.study_id == "s1"  # still serving
    finally:
        cluster.stop()


def test_an_ingest_process_that_dies_is_started_again_and_uploads_go_on(tmp_path: Path) -> None:
    import os
    import signal
    import time

    cluster = Cluster.start(tmp_path, ingest=2)
    try:
        fronts = cluster.cs.server._dpagg_fronts
        cluster.open_study(domain_size=64, owners=("a", "b"))
        assert cluster.owner("a").submit("s1", blocky_histograms(64)[0]).committed
        dead = fronts._procs[0][0]
        os.kill(dead.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (fronts._procs[0][0] is dead or fronts.alive() < 2):
            time.sleep(0.2)
        assert fronts._procs[0][0] is not dead and fronts.alive() == 2  # the watcher started it again
        assert cluster.owner("b").submit("s1", blocky_histograms(64)[1]).committed
        assert cluster.computation().run_release("s1", epsilon=1.0).state == "DONE"
    finally:
        cluster.stop()
