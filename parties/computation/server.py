"""Build and run the computation server (hosting the analyst service in the same process by default).

Why the analyst service lives here: the computation server assembles every release and
stores its summary, so hosting the read-only analyst queries next to that store needs
no copy and no extra trust; the decryption server stays a minimal key holder that
analysts never reach. `dpagg serve-analyst` can serve the same store from a separate
process (read-only) when analysts must be isolated from the upload endpoint.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from parties.wire.v1 import analyst_pb2_grpc, computation_pb2_grpc
from he_partition.core.errors import InvalidInputError
from he_partition.execution import make_executor

from ..analyst.handler import AnalystHandler
from ..analyst.servicer import SERVICE_NAME as ANALYST_SERVICE
from ..analyst.servicer import AnalystServicer
from ..common.access import AccessPolicy
from ..common.config import AnalystConfig, ComputationConfig
from ..common.limits import ANALYST_MAX_RECEIVE, COMPUTATION_MAX_RECEIVE, CallLimits, server_options
from ..common.server import ServerHandle, ServiceBinding, create_server
from ..common.util import lock_data_dir, noise_source
from ..common.receipts import ReceiptBook
from ..decryption.client import OUTAGE_SECONDS, DecryptionClient
from .handler import ComputationHandler
from .servicer import SERVICE_NAME, ComputationServicer
from .store import ComputationStore
from .store_sqlite import SqliteComputationStore

__all__ = ["create_computation_server", "serve_computation", "create_analyst_server", "serve_analyst"]

log = logging.getLogger("dpagg.computation")

#: The key holder's signed charge receipts, one JSON line each (parties.common.receipts).
RECEIPTS_FILE = "ledger_receipts.jsonl"


def create_computation_server(config: ComputationConfig, *, store: ComputationStore | None = None,
                              durable: bool = True) -> ServerHandle:
    """Open the store in `config.data_dir` and build the server (not started).

    The decryption server is contacted lazily (first study, first upload), so the two
    servers can start in any order. With `config.tls` this server requires mutual TLS
    from its callers, checks their roles, and presents the same certificate to the
    decryption server.
    """
    unlock = lock_data_dir(config.data_dir, "computation server")
    try:
        st = store or SqliteComputationStore(config.data_dir, durable=durable)
    except BaseException:
        unlock()
        raise
    ds: Any
    if config.holders:  # threshold mode: K key-share holders, each charged and asked for shares
        from .threshold.decryption import ThresholdDecryption, parse_holders

        ds = ThresholdDecryption(parse_holders(config.holders), tls=config.tls, insecure=config.insecure,
                                 data_dir=config.data_dir, outage_seconds=OUTAGE_SECONDS)
    else:
        ds = DecryptionClient(config.decryption_target, tls=config.tls, insecure=config.insecure)
        ds.receipts = ReceiptBook(config.data_dir / RECEIPTS_FILE)  # the second record of spend (ledger rollback)
        ds.outage_seconds = OUTAGE_SECONDS  # a release rides out a short restart of the key holder
    if config.noise_seed is not None:
        log.warning("computation server noise is SEEDED (%d): predictable, for tests only", config.noise_seed)
    try:
        executor = make_executor(config.executor, workers=config.chunk_workers, cluster=config.cluster,
                                 node_ip=config.ray_node_ip)
    except BaseException:
        st.close()
        ds.close()
        unlock()
        raise
    handler = ComputationHandler(st, ds, noise_source(config.noise_seed), data_dir=config.data_dir, executor=executor)
    policy = AccessPolicy(config.tls is not None, server=f"computation server ({config.data_dir})")
    services: list[ServiceBinding] = [
        (computation_pb2_grpc.add_ComputationServicer_to_server, ComputationServicer(handler, policy), SERVICE_NAME)]
    if config.serve_analyst:
        services.append((analyst_pb2_grpc.add_AnalystServicer_to_server,
                         AnalystServicer(AnalystHandler(st), policy), ANALYST_SERVICE))
    closers: list[Callable[[], None]] = [lambda: handler.folds.close(5.0), st.close, ds.close,
                                         lambda: handler.join(5.0), executor.close, unlock, handler.stopping.set]
    try:
        if config.ingest_processes:
            if store is not None and not isinstance(store, SqliteComputationStore):
                raise InvalidInputError("ingest processes share the data directory's SQLite store; this server "
                                        "was given another store")
            server, port = _with_ingest(config, handler, services, closers, durable)
        else:
            server, port = create_server(services, host=config.host, port=config.port,
                                         max_workers=config.max_workers,
                                         limits=CallLimits.for_pool(config.max_workers, config.upload_queue),
                                         credentials=config.tls.server_credentials() if config.tls is not None
                                         else None, options=server_options(COMPUTATION_MAX_RECEIVE))
    except BaseException:
        for close in reversed(closers):
            close()
        raise
    return ServerHandle(server, port, config.host, handler, closers,  # closed last to first
                        starters=[executor.start])  # the workers serve every fold, release and direct query


def _with_ingest(config: ComputationConfig, handler: ComputationHandler, services: list[ServiceBinding],
                 closers: list[Callable[[], None]], durable: bool) -> tuple[Any, int]:
    """The coordinator on its private socket, and `config.ingest_processes` fronts on the public port.

    Appends to `closers` what to undo (fronts first, then the socket, then the port claim, as they run last to
    first); returns the coordinator's server and the public port.
    """
    from .ingest.forwarding import ForwardedPeer
    from .ingest.front import FrontSpec
    from .ingest.fronts import IngestFronts, claim_port, coordinator_handler, coordinator_socket, new_token

    if config.port:
        closers.append(claim_port(config.host, config.port))
    address, remove = coordinator_socket()
    closers.append(remove)
    token = new_token()

    def on_commit(study_id: str) -> None:  # what the coordinator's own upload path does after a commit
        contract = handler.study(study_id)
        handler.folds.request(study_id, handler.backend_for(contract))
        handler.forward_when_complete(study_id)

    def prepare(study_id: str) -> None:  # the contract and the study key's public context, kept on disk
        contract = handler.study(study_id)
        if not contract.is_join:
            handler.backend_for(contract)

    bindings = [*services, (lambda _s, srv: srv.add_generic_rpc_handlers((coordinator_handler(on_commit, prepare),)),
                            None, "dpagg.computation.ingest.Coordinator")]
    server, _ = create_server(bindings, address=address, max_workers=config.max_workers,
                              limits=CallLimits.for_pool(config.max_workers, config.upload_queue),
                              options=server_options(COMPUTATION_MAX_RECEIVE), outer_interceptors=(ForwardedPeer(token),))
    fronts = IngestFronts(FrontSpec(index=0, data_dir=config.data_dir, host=config.host, port=config.port,
                                    coordinator=address, token=token, tls=config.tls, durable=durable,
                                    max_workers=config.max_workers, upload_queue=config.upload_queue),
                          config.ingest_processes)
    port = fronts.start()
    if not config.port:
        try:
            closers.append(claim_port(config.host, port))
        except BaseException:
            fronts.close()
            raise
    closers.append(fronts.close)
    server._dpagg_coordinator = address  # tests call the private socket directly (and must be refused)
    server._dpagg_fronts = fronts
    return server, port


def serve_computation(config: ComputationConfig, *, port_file: str | None = None) -> None:
    handle = create_computation_server(config)
    log.info("computation server listening on %s%s as %s; data dir %s; decryption server %s; analyst service %s",
             handle.target, f" through {config.ingest_processes} ingest process(es)" if config.ingest_processes else "", f"{config.tls.identity.role} {config.tls.identity.party_id!r} (mutual TLS)"
             if config.tls else "INSECURE: no TLS, no identities", config.data_dir,
             config.decryption_target or "key-share holders " + ", ".join(config.holders),
             "on" if config.serve_analyst else "off")
    handle.serve(port_file=port_file)


def create_analyst_server(config: AnalystConfig) -> ServerHandle:
    """A stand-alone analyst server over a computation server's data directory (opened read-only)."""
    st = SqliteComputationStore(config.data_dir, read_only=True)
    handler = AnalystHandler(st)
    policy = AccessPolicy(config.tls is not None, server=f"analyst server ({config.data_dir})")
    server, port = create_server(
        [(analyst_pb2_grpc.add_AnalystServicer_to_server, AnalystServicer(handler, policy), ANALYST_SERVICE)],
        host=config.host, port=config.port, max_workers=config.max_workers,
        credentials=config.tls.server_credentials() if config.tls is not None else None,
        options=server_options(ANALYST_MAX_RECEIVE))
    return ServerHandle(server, port, config.host, handler, [st.close])


def serve_analyst(config: AnalystConfig, *, port_file: str | None = None) -> None:
    handle = create_analyst_server(config)
    log.info("analyst server listening on %s (data %s)", handle.target, config.data_dir)
    handle.serve(port_file=port_file)
