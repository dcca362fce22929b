"""One ingest process: takes upload streams on the shared public port, forwards every other call to the coordinator.

A front opens the computation server's SQLite store and chunk files (the coordinator holds the
data directory's lock; its fronts work under it) and serves the Computation and Analyst services on
the public port with SO_REUSEPORT. `SubmitHistogram` of an aggregate study runs here, from the
header's checks to the commit (`parties.computation.uploads`, the code the coordinator runs):
each chunk is parsed under the study's public key, checked and stored by this process; after a
commit the coordinator is told (`Committed`), which folds the owner into the running aggregate and
starts what a complete study needs. The records an upload leaves beside its chunks (a sealed
study's commitment, an owner's c1 signature) are files of the data directory, which the coordinator
reads. Join uploads, which need the coordinator's join state, are forwarded whole, as is every
other call (`forwarding.Forwarder`), and so is an upload whose study the coordinator could not
fetch (it answers with the reason).
"""

from __future__ import annotations

import json
import logging
import multiprocessing.connection
import os
import threading
from functools import partial
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import grpc

from he_partition.he.bfv import BfvBackend, load_context
from parties.wire.v1 import analyst_pb2, computation_pb2

from ...common.access import AccessPolicy
from ...common.contract import StudyContract
from ...common.limits import COMPUTATION_MAX_RECEIVE, CallLimits, server_options
from ...common.server import create_server
from ...common.tls import TlsConfig
from ..store_sqlite import SqliteComputationStore
from ..sealed_uploads import SealedUploads
from ..threshold.c1_forward import C1Signatures
from ..handler import kept_context
from ..servicer import submit_response
from ..uploads import open_upload, receive_upload
from .forwarding import TOKEN_METADATA, Forwarder, service_methods

__all__ = ["FrontSpec", "run_front", "COMMITTED_METHOD", "PREPARE_METHOD"]

log = logging.getLogger("dpagg.computation")

#: The coordinator's one method of its own (on its private socket only): an owner committed at a front.
COMMITTED_METHOD = "/dpagg.computation.ingest.Coordinator/Committed"
#: ... and the one that fetches a study's contract and public key for the fronts (kept on disk).
PREPARE_METHOD = "/dpagg.computation.ingest.Coordinator/Prepare"
SUBMIT_METHOD = "/dpagg.v1.Computation/SubmitHistogram"


@dataclass(frozen=True)
class FrontSpec:
    """What a front needs, sent through its spawn pipe (the token never appears in an argument list or the
    environment)."""

    index: int
    data_dir: Path
    host: str
    port: int
    coordinator: str
    token: str
    tls: TlsConfig | None
    durable: bool
    max_workers: int
    upload_queue: int


class _Forward(Exception):
    """This upload needs the coordinator: forward the stream whole."""


class _Folds:
    def request(self, study_id: str, backend: Any) -> None:  # the coordinator folds when told of the commit
        pass


class FrontUploads:
    """What an upload needs of its server (`uploads.UploadHost`), in a front: the shared store, the public
    contexts the coordinator kept on disk, and a link to tell the coordinator of each commit."""

    joins: Any = None  # join uploads go to the coordinator whole

    def __init__(self, store: SqliteComputationStore, data_dir: Path, committed: Any,
                 prepare: Any = None) -> None:
        self.store = store
        self.prepare = prepare
        self.data_dir = data_dir
        self.folds = _Folds()
        # Both keep their records in files of the data directory, where the coordinator reads them.
        self.c1_signatures = C1Signatures(data_dir / "c1_signatures")
        self.sealed = SealedUploads(data_dir / "sealed")
        self._committed = committed
        self._backends: dict[str, BfvBackend] = {}
        self._lock = threading.Lock()

    def study(self, study_id: str) -> StudyContract:
        contract = self.store.get_study(study_id)
        if contract is None:
            raise _Forward(study_id)
        return contract

    def backend_for(self, contract: StudyContract) -> BfvBackend:
        want = contract.context_fingerprint
        with self._lock:
            backend = self._backends.get(want)
        if backend is not None:
            return backend
        data = kept_context(self.data_dir, want)  # what the coordinator kept on disk
        if data is None:
            raise _Forward(contract.study_id)  # the coordinator fetches it from the key holder
        ctx = load_context(data)
        if ctx.is_private():
            raise _Forward(contract.study_id)
        backend = BfvBackend(ctx)
        with self._lock:
            self._backends[want] = backend
        return backend

    def public_context(self, study_id: str = "") -> bytes:
        raise _Forward(study_id)

    def forward_when_complete(self, study_id: str) -> None:
        self._committed(study_id)


class FrontServicer:
    """SubmitHistogram at the front (aggregate studies); forwarded whole otherwise."""

    def __init__(self, uploads: FrontUploads, forwarder: Forwarder, policy: AccessPolicy) -> None:
        self.uploads = uploads
        self.policy = policy
        self._forward = forwarder.handler(SUBMIT_METHOD, (True, False)).stream_unary

    def SubmitHistogram(self, request_iterator: Iterator[computation_pb2.SubmitHistogramRequest],  # noqa: N802
                        context: grpc.ServicerContext) -> Any:
        caller = self.policy.require(context, ["data_owner"], action="submit a histogram")
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("part") != "header":
            return self._forward_all(first, request_iterator, context)
        h = first.header
        contract = self._ready(h.study_id)
        if contract is None:
            return self._forward_all(first, request_iterator, context)
        self.policy.same_party(caller, h.owner_id, what="owner_id of the upload header")
        return submit_response(receive_upload(partial(open_upload, self.uploads), h, request_iterator))

    def _ready(self, study_id: str) -> StudyContract | None:
        """The study's contract when this process can take its upload (an aggregate study whose public key is on
        disk, asking the coordinator to fetch them once); None: forward the upload whole."""
        for attempt in range(2):
            contract = self.uploads.store.get_study(study_id)
            if contract is not None and contract.is_join:
                return None
            if contract is not None:
                try:
                    self.uploads.backend_for(contract)
                    return contract
                except _Forward:
                    pass
            if attempt or self.uploads.prepare is None or not self.uploads.prepare(study_id):
                return None
        return None

    def _forward_all(self, first: Any, rest: Iterator[Any], context: Any) -> Any:
        def raw() -> Iterator[bytes]:
            if first is not None:
                yield first.SerializeToString()
            for msg in rest:
                yield msg.SerializeToString()
        reply = self._forward(raw(), context)
        return computation_pb2.SubmitHistogramResponse.FromString(reply)


class _Routes(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Every Computation and Analyst method: SubmitHistogram here, the others forwarded."""

    def __init__(self, local: dict[str, grpc.RpcMethodHandler], forwarder: Forwarder) -> None:
        self._local = local
        self._shapes = service_methods(computation_pb2.DESCRIPTOR.services_by_name["Computation"],
                                       analyst_pb2.DESCRIPTOR.services_by_name["Analyst"])
        self._forwarded = {m: forwarder.handler(m, shape) for m, shape in self._shapes.items() if m not in local}

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        return self._local.get(method) or self._forwarded.get(method)


def _coordinator_call(channel: grpc.Channel, token: str, method: str, what: str) -> Any:
    """A call of one of the coordinator's own methods; returns whether it answered OK (a failure is logged)."""
    call = channel.unary_unary(method)

    def ask(study_id: str) -> bool:
        try:
            call(json.dumps({"study_id": study_id}).encode(), timeout=60.0, metadata=((TOKEN_METADATA, token),))
            return True
        except grpc.RpcError as exc:
            log.warning("study %s: %s (%s)", study_id, what,
                        exc.details() if callable(getattr(exc, "details", None)) else exc)
            return False
    return ask


def build_front(spec: FrontSpec) -> tuple[grpc.Server, int, Any]:
    """The front's server (not started), its bound port and what to close after it stops."""
    store = SqliteComputationStore(spec.data_dir, durable=spec.durable)
    channel = grpc.insecure_channel(spec.coordinator, options=list(server_options(COMPUTATION_MAX_RECEIVE)))
    forwarder = Forwarder(channel, spec.token)
    policy = AccessPolicy(spec.tls is not None, server=f"computation server ingest process {spec.index}")
    uploads = FrontUploads(
        store, spec.data_dir,
        _coordinator_call(channel, spec.token, COMMITTED_METHOD,
                          "the coordinator was not told of a commit; its next fold or release adds the owner"),
        _coordinator_call(channel, spec.token, PREPARE_METHOD,
                          "the coordinator could not fetch the study's terms or key; the upload goes to it whole"))
    servicer = FrontServicer(uploads, forwarder, policy)
    local = {SUBMIT_METHOD: grpc.stream_unary_rpc_method_handler(
        servicer.SubmitHistogram, request_deserializer=computation_pb2.SubmitHistogramRequest.FromString,
        response_serializer=computation_pb2.SubmitHistogramResponse.SerializeToString)}
    routes = _Routes(local, forwarder)
    names = [computation_pb2.DESCRIPTOR.services_by_name["Computation"].full_name,
             analyst_pb2.DESCRIPTOR.services_by_name["Analyst"].full_name]
    options = [o for o in server_options(COMPUTATION_MAX_RECEIVE) if o[0] != "grpc.so_reuseport"]
    options.append(("grpc.so_reuseport", 1))  # the coordinator's own fronts share the port (see fronts.py)
    server, port = create_server(
        [(lambda _s, srv: srv.add_generic_rpc_handlers((routes,)), None, names[0]),
         (lambda _s, srv: None, None, names[1])],
        host=spec.host, port=spec.port, max_workers=spec.max_workers,
        limits=CallLimits.for_pool(spec.max_workers, spec.upload_queue),
        credentials=spec.tls.server_credentials() if spec.tls is not None else None, options=options)

    def close() -> None:
        channel.close()
        store.close()
    return server, port, close


def run_front(spec: FrontSpec, conn: multiprocessing.connection.Connection) -> None:
    """A front process's main: build, report the bound port (or the error) through `conn`, serve until told to
    stop (a message or the pipe's end: the coordinator stopped or died)."""
    from he_partition.execution.heap import return_big_blocks_to_the_os

    logging.basicConfig(level=os.environ.get("DPAGG_LOG_LEVEL", "INFO"),
                        format=f"%(asctime)s ingest-{spec.index} %(name)s %(levelname)s %(message)s")
    return_big_blocks_to_the_os()
    try:
        server, port, close = build_front(spec)
        server.start()
    except BaseException as exc:  # noqa: BLE001 - reported to the coordinator, which says it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("port", port))
    try:
        conn.recv()  # a stop message, or EOFError when the coordinator is gone
    except (EOFError, OSError):
        pass
    server.stop(5.0).wait()
    close()
    conn.close()
    os._exit(0)  # no thread of a stopped front keeps the process

