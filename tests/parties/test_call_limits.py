"""Per-caller limits: idle streams and heavy queries do not starve health or a small
query, silent streams are cancelled, oversized requests are refused before they are parsed, bytes that do not
parse are INVALID_ARGUMENT. Real servers over mutual TLS, real gRPC channels."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from parties.wire.v1 import analyst_pb2, common_pb2
from parties.common import limits
from parties.common.config import GRPC_OPTIONS

from .conftest import Cluster

ROOT = Path(__file__).resolve().parents[2]


def _channel(cluster: Cluster, party: str, role: str) -> grpc.Channel:
    tls = cluster.tls(party, role)
    assert tls is not None
    return grpc.secure_channel(cluster.cs.target, tls.channel_credentials(), options=list(GRPC_OPTIONS))


def _silent(stop: threading.Event) -> Iterator[bytes]:
    stop.wait()  # an upload stream that never sends its header
    return
    yield b""  # pragma: no cover


def _range_request(release_id: str, n: int, domain: int) -> bytes:
    req = analyst_pb2.RangeCountsRequest(release_id=release_id,
                                         ranges=[common_pb2.Range(lo=i % domain, hi=i % domain + 1) for i in range(n)])
    return req.SerializeToString()


def _timed(call: "callable[[], object]") -> float:  # type: ignore[valid-type]
    start = time.monotonic()
    call()  # type: ignore[operator]
    return time.monotonic() - start


@pytest.fixture
def limited_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.setattr(limits, "IDLE_STREAM_SECONDS", 3.0)  # silent streams are cancelled after 3 s here
    c = Cluster.start(tmp_path, secure=True)
    try:
        yield c
    finally:
        c.stop(drop_pending_folds=True)


def test_idle_streams_and_heavy_queries_leave_health_and_a_small_query_answering(limited_cluster: Cluster) -> None:
    cluster = limited_cluster
    cluster.open_study(domain_size=1024, owners=("a",), strategy="hier")
    cluster.owner("a").submit("s1", np.arange(1024) % 7)
    release = cluster.computation().run_release("s1", epsilon=1.0)
    heavy = _range_request(release.release_id, 100_000, 1024)
    stop = threading.Event()
    channels = [_channel(cluster, f"o{i % 4}", "data_owner") for i in range(4)]
    analysts = [_channel(cluster, f"heavy-{i % 4}", "analyst") for i in range(4)]
    idle = [channels[i % 4].stream_unary("/dpagg.v1.Computation/SubmitHistogram")
            .future(_silent(stop), timeout=60) for i in range(20)]
    queries = [analysts[i % 4].unary_unary("/dpagg.v1.Analyst/RangeCounts").future(heavy, timeout=60)
               for i in range(16)]
    try:
        time.sleep(0.5)  # let them all reach the server
        small = _channel(cluster, "analyst-small", "analyst")
        health = health_pb2_grpc.HealthStub(small)
        took_health = _timed(lambda: health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10))
        ask = small.unary_unary("/dpagg.v1.Analyst/ListReleases",
                                request_serializer=analyst_pb2.ListReleasesRequest.SerializeToString,
                                response_deserializer=analyst_pb2.ListReleasesResponse.FromString)
        took_small = _timed(lambda: ask(analyst_pb2.ListReleasesRequest(study_id="s1"), timeout=10))
        print(f"health answered in {took_health:.3f} s, ListReleases in {took_small:.3f} s")
        assert took_health < 2.0 and took_small < 2.0
        # Callers past their share were told at once that the server is busy (retryable), not queued forever.
        busy = [f for f in queries if f.done() and f.exception() is not None
                and f.code() == grpc.StatusCode.UNAVAILABLE]
        assert busy and "server busy" in busy[0].details()
        # Silent upload streams are cancelled by the idle deadline (3 s here), freeing their threads.
        end = time.monotonic() + 20
        while not all(f.done() for f in idle) and time.monotonic() < end:
            time.sleep(0.1)
        codes = {f.code() for f in idle}
        assert codes <= {grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE}, codes
        assert grpc.StatusCode.CANCELLED in codes
    finally:
        stop.set()
        for f in queries:
            f.cancel()
        for ch in [*channels, *analysts]:
            ch.close()


def test_bytes_that_do_not_parse_are_invalid_argument_and_name_the_message(secure_cluster: Cluster) -> None:
    ch = _channel(secure_cluster, "analyst-1", "analyst")
    try:
        with pytest.raises(grpc.RpcError) as ei:
            ch.unary_unary("/dpagg.v1.Analyst/ListReleases")(b"\xff\xff\xff\xff\x0f", timeout=10)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # was INTERNAL "Exception deserializing request!"
        assert "not a valid ListReleases message" in ei.value.details()
    finally:
        ch.close()


def _rss_peak_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.slow
def test_eight_57_mib_range_requests_are_refused_unparsed_and_the_server_survives(tmp_path: Path) -> None:
    port_file = tmp_path / "cs.port"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with (tmp_path / "cs.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "parties.cli", "serve-computation", "--data-dir", str(tmp_path / "cs"),
             "--port", "0", "--port-file", str(port_file), "--decryption", "127.0.0.1:1", "--insecure"],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        end = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < end, (tmp_path / "cs.log").read_text()
            time.sleep(0.05)
        target = f"127.0.0.1:{int(port_file.read_text())}"
        # 3.75M ranges, ~57 MiB: a valid message far over the 100,000-range limit
        one = b"\x12\x04\x08\x01\x10\x02"
        big = b"\x0a\x03rel" + one * 10_000_000
        assert 56 * 2**20 < len(big) < 64 * 2**20
        ch = grpc.insecure_channel(target, options=list(GRPC_OPTIONS))
        grpc.channel_ready_future(ch).result(timeout=30)
        before = _rss_peak_kb(proc.pid)
        call = ch.unary_unary("/dpagg.v1.Analyst/RangeCounts")
        futures = [call.future(big, timeout=120) for _ in range(8)]
        codes = [f.exception().code() if f.exception() else grpc.StatusCode.OK for f in futures]  # type: ignore[union-attr]
        after = _rss_peak_kb(proc.pid)
        print(f"computation server peak RSS {before / 1024:.0f} MB before, {after / 1024:.0f} MB after eight "
              f"{len(big) / 2**20:.1f} MiB RangeCounts requests")
        assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 8, codes
        # refused by the transport before it is buffered (the computation server receives at most 17 MiB);
        # before, each was buffered whole and refused by the method's budget
        assert "larger than max" in futures[0].exception().details()  # type: ignore[union-attr]
        assert after < 1024 * 1024, after  # peak RSS under 1 GB (it was 5.74 GB when each was parsed)
        health = health_pb2_grpc.HealthStub(ch)
        assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING
        ch.close()
    finally:
        proc.terminate()
        proc.wait(15)


def test_the_computation_server_receives_at_most_17_mib(secure_cluster: Cluster) -> None:
    """The largest request the computation server serves is a 16 MB part of join pseudonyms: a larger message
    is refused by gRPC before it is buffered (it accepted 64 MiB on every method before)."""
    tls = secure_cluster.tls("analyst-1", "analyst")
    assert tls is not None
    ch = grpc.secure_channel(secure_cluster.cs.target, tls.channel_credentials(), options=list(GRPC_OPTIONS))
    try:
        ranges = ch.unary_unary("/dpagg.v1.Analyst/RangeCounts")
        with pytest.raises(grpc.RpcError) as ei:
            ranges(b"\x0a" + b"\x80\x80\x80\x09" + b"x" * (18 * 2**20), timeout=30)
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in ei.value.details()
    finally:
        ch.close()


def test_the_key_holder_receives_at_most_16_mib_and_each_method_its_own_budget(secure_cluster: Cluster) -> None:
    tls = secure_cluster.tls("cs-1", "computation")
    assert tls is not None
    ch = grpc.secure_channel(secure_cluster.ds.target, tls.channel_credentials(), options=list(GRPC_OPTIONS))
    try:
        get_study = ch.unary_unary("/dpagg.v1.Decryption/GetStudy")
        with pytest.raises(grpc.RpcError) as ei:  # refused by gRPC before it is buffered whole (was 64 MiB)
            get_study(b"\x0a" + b"\x80\x80\x80\x09" + b"x" * (18 * 2**20), timeout=30)
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.RpcError) as ei:  # under 16 MiB but over GetStudy's 64 KiB: refused unparsed
            get_study(b"\x0a\x80\x80\x08" + b"x" * 2**17, timeout=30)
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "budget of 65536 bytes" in ei.value.details()
    finally:
        ch.close()
