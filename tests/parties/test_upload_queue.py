"""Uploads wait their turn: more uploads than upload slots all land (queued first come first served, a full queue
refused "server busy" and retried by the owner's client), one caller holds one place in the queue, a waiting call
whose client left gives its place up. Real servers over mutual TLS; `_Slots` alone for the ordering rules."""

from __future__ import annotations

import io
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import grpc
import numpy as np
import pytest

from parties.common.config import GRPC_OPTIONS
from parties.common.limits import HEALTH_RESERVE, UPLOAD_QUEUE_PLACES, CallLimits, QueuePlace, _Slots
from parties.common.progress import Progress
from parties.computation.server import create_computation_server
from parties.data_owner.client import DataOwnerClient, SubmitResult

from .conftest import FAST_RETRY, Cluster

UPLOAD = "/dpagg.v1.Computation/SubmitHistogram"


def test_the_queue_waits_on_threads_of_its_own_and_takes_no_slot(tmp_path: Path) -> None:
    """A waiting upload holds a queue thread, not one of the pool's slots: the pool keeps every slot for running
    calls and health, and only a server hosting the upload method adds the queue's threads."""
    for workers in (3, 4, 8, 16, 64):
        lim = CallLimits.for_pool(workers)
        assert lim.queue_len[UPLOAD] == UPLOAD_QUEUE_PLACES and lim.slots == max(1, workers - HEALTH_RESERVE)
        assert lim.queue_threads(["dpagg.v1.Computation"]) == UPLOAD_QUEUE_PLACES
        assert lim.queue_threads(["dpagg.v1.Decryption", "dpagg.v1.Analyst"]) == 0
    slots = _Slots(CallLimits(slots=2, per_caller=2, per_method={UPLOAD: 2}, queue_len={UPLOAD: 3}, queue_wait=5.0))
    assert not slots.admit("owner a", UPLOAD, active=lambda: True).refused
    assert not slots.admit("owner b", UPLOAD, active=lambda: True).refused  # every slot taken now
    order: list[str] = []
    waiting = [_admit_in_thread(slots, f"owner {c}", order, [], threading.Event()) for c in "cde"]
    time.sleep(0.2)
    assert slots._total == 2 and len(slots._queues[UPLOAD]) == 3  # three wait, none holds a slot
    slots.give("owner a", UPLOAD)
    slots.give("owner b", UPLOAD)
    time.sleep(0.3)
    assert order == ["owner c", "owner d"] and slots._total == 2
    slots.give("owner c", UPLOAD)
    waiting[2].join(5)
    assert order == ["owner c", "owner d", "owner e"]


def _limits() -> CallLimits:
    return CallLimits(slots=10, per_caller=5, per_method={UPLOAD: 1}, queue_len={UPLOAD: 2}, queue_wait=5.0)


def _admit_in_thread(slots: _Slots, caller: str, order: list[str], places: list[QueuePlace],
                     active: threading.Event) -> threading.Thread:
    def run() -> None:
        got = slots.admit(caller, UPLOAD, active=lambda: not active.is_set(), on_queued=places.append)
        order.append(caller if not got.refused else f"{caller}: {got.refused}")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_waiting_calls_are_admitted_first_come_first_served_and_one_caller_holds_one_place() -> None:
    slots = _Slots(_limits())
    assert not slots.admit("owner a", UPLOAD, active=lambda: True).refused  # holds the one upload slot
    order: list[str] = []
    places: list[QueuePlace] = []
    never = threading.Event()
    b = _admit_in_thread(slots, "owner b", order, places, never)
    time.sleep(0.1)
    c = _admit_in_thread(slots, "owner c", order, places, never)
    time.sleep(0.1)
    assert [p.position for p in places] == [1, 2] and places[1].running == 1
    # a second stream of a waiting caller is refused (it would push the others back), and so is a third caller
    again = slots.admit("owner b", UPLOAD, active=lambda: True)
    assert "one place in the queue per caller" in again.refused
    full = slots.admit("owner d", UPLOAD, active=lambda: True)
    assert "queue full (2 waiting)" in full.refused
    slots.give("owner a", UPLOAD)
    b.join(5)
    assert order == ["owner b"]
    slots.give("owner b", UPLOAD)
    c.join(5)
    assert order == ["owner b", "owner c"]


def test_a_waiting_call_whose_client_left_gives_its_place_up() -> None:
    slots = _Slots(_limits())
    assert not slots.admit("owner a", UPLOAD, active=lambda: True).refused
    gone = threading.Event()
    order: list[str] = []
    t = _admit_in_thread(slots, "owner b", order, [], gone)
    time.sleep(0.1)
    gone.set()
    t.join(5)
    assert order == ["owner b: the client left while it waited"]
    # its place and thread are free again: two more callers can wait
    assert slots._total == 1 and not slots._queues[UPLOAD]


@pytest.fixture
def small_pool_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A secure cluster whose computation server has a pool of 8 threads (2 upload slots) and 2 places to wait."""
    c = Cluster.start(tmp_path, secure=True)
    c.cs.stop()
    config = replace(Cluster._cs_config(tmp_path, c.pki, c.ds.target, 0, 12), max_workers=8, upload_queue=2)
    c.cs = create_computation_server(config).start()
    try:
        yield c
    finally:
        c.stop(drop_pending_folds=True)


def _held_streams(cluster: Cluster, owners: list[str], stop: threading.Event) -> list[grpc.Future]:
    """Upload streams that send nothing until `stop`: they hold the upload slots."""
    def silent() -> Iterator[bytes]:
        stop.wait()
        return
        yield b""  # pragma: no cover

    futures = []
    for owner in owners:
        tls = cluster.tls(owner, "data_owner")
        assert tls is not None
        ch = grpc.secure_channel(cluster.cs.target, tls.channel_credentials(), options=list(GRPC_OPTIONS))
        cluster.clients.append(ch)
        futures.append(ch.stream_unary(UPLOAD).future(silent(), timeout=60))
    return futures


def test_more_uploads_than_slots_all_land_queued_or_retried(small_pool_cluster: Cluster) -> None:
    """On the former code the uploads that found the 2 slots held were refused at once and failed after 5 quick
    tries; now 2 wait in the queue and are told their place, and the 2 refused "queue full" come back until
    they get in."""
    cluster = small_pool_cluster
    owners = ["a", "b", "c", "d"]
    cluster.open_study(domain_size=256, owners=owners + ["x", "y"])
    stop = threading.Event()
    held = _held_streams(cluster, ["x", "y"], stop)
    time.sleep(0.3)
    logs = {o: io.StringIO() for o in owners}
    results: dict[str, SubmitResult | BaseException] = {}

    def submit(owner: str) -> None:
        client = DataOwnerClient(owner, computation=cluster.cs.target, decryption=cluster.ds.target,
                                 retry=replace(FAST_RETRY, max_delay=0.3),
                                 progress=Progress(logs[owner], interactive=False),
                                 tls=cluster.tls(owner, "data_owner"), signing_key=cluster.signing_key(owner)[0])
        try:
            results[owner] = client.submit("s1", np.arange(256) % 5, busy_wait=60)
        except BaseException as exc:  # noqa: BLE001 - reported below
            results[owner] = exc
        finally:
            client.close()

    threads = [threading.Thread(target=submit, args=(o,), daemon=True) for o in owners]
    for t in threads:
        t.start()
    end = time.monotonic() + 20
    while (sum("queued at position" in log.getvalue() for log in logs.values()) < 2
           or sum("trying again" in log.getvalue() for log in logs.values()) < 2):
        assert time.monotonic() < end, {o: log.getvalue() for o, log in logs.items()}
        time.sleep(0.05)
    # the queue is full now: a fifth upload is refused at once, "server busy ... queue full", which clients retry
    late = _held_streams(cluster, ["x"], threading.Event())[0]
    with pytest.raises(grpc.RpcError) as refused:
        late.result(timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "server busy" in refused.value.details() and "queue full (2 waiting)" in refused.value.details()
    time.sleep(1.0)
    stop.set()  # the held streams end (no header: refused), their slots free up
    for t in threads:
        t.join(60)
    for f in held:
        assert f.exception(timeout=10) is not None
    failed = {o: r for o, r in results.items() if not isinstance(r, SubmitResult)}
    assert not failed and len(results) == len(owners), failed
    done = [r for r in results.values() if isinstance(r, SubmitResult)]
    assert all(r.committed for r in done)
    print({o: (r.queued_seconds, r.busy_refusals) for o, r in results.items() if isinstance(r, SubmitResult)})
    assert sum(r.queued_seconds > 1.0 for r in done) >= 2  # two waited in the queue while the slots were held
    assert sum(r.busy_refusals > 0 for r in done) >= 2  # two found it full and came back
    assert sum("admitted after waiting" in log.getvalue() for log in logs.values()) >= 2
    status = cluster.computation().study_status("s1")
    assert set(owners) <= set(status.submitted_owners)


def test_an_upload_the_disk_cannot_hold_is_refused_before_anything_is_stored(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the queue does not bound is refused by size: the data directory must hold the whole upload, the
    uploads in flight and a reserve (here a reserve no disk has)."""
    from parties.common.errors import ServiceError
    from parties.computation import uploads

    cluster.open_study(domain_size=64, owners=("a",))
    monkeypatch.setattr(uploads, "DISK_RESERVE_BYTES", 1 << 62)
    owner = cluster.owner("a")
    with pytest.raises(ServiceError) as refused:
        owner.submit("s1", np.arange(64) % 3, idempotency_key="up-disk")
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "disk has" in refused.value.details and "nothing of it was stored" in refused.value.details.lower()
    assert owner.computation.upload_status("s1", "a", "up-disk").state == "NONE"
    monkeypatch.setattr(uploads, "DISK_RESERVE_BYTES", 0)  # space again: the same submit lands
    assert owner.submit("s1", np.arange(64) % 3, idempotency_key="up-disk").committed
