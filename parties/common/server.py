"""Server bootstrap shared by every role: `create_server(...) -> (server, port)` and a separate `serve()`."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from he_partition.core.errors import InvalidInputError

from . import config
from he_partition.execution.heap import return_big_blocks_to_the_os
from .errors import ErrorMappingInterceptor
from .limits import CallLimiter, CallLimits

__all__ = ["ServiceBinding", "ServerHandle", "create_server", "serve", "write_port_file"]

log = logging.getLogger("dpagg.server")

#: (add_XServicer_to_server function, servicer instance, full service name)
ServiceBinding = tuple[Callable[[Any, grpc.Server], None], Any, str]


#: Server reflection v1 (what current tools ask first); grpcio-reflection here ships only v1alpha, whose
#: messages are the same on the wire, so v1 is served by the v1alpha servicer under the v1 name.
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


def _enable_reflection(names: Sequence[str], server: grpc.Server) -> None:
    from grpc_reflection.v1alpha import reflection_pb2

    all_names = (*names, reflection.SERVICE_NAME, REFLECTION_V1)
    reflection.enable_server_reflection(all_names, server)
    servicer = reflection.ReflectionServicer(all_names)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(REFLECTION_V1, {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString),
    }),))


class _HealthServicer(health.HealthServicer):  # type: ignore[misc]
    """Standard health checking, with `List` answered (the library's raises NotImplementedError)."""

    def List(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC method name)
        with self._lock:
            statuses = dict(self._server_status)
        return health_pb2.HealthListResponse(
            statuses={name: health_pb2.HealthCheckResponse(status=s) for name, s in statuses.items()})


def create_server(
    services: Sequence[ServiceBinding],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    max_workers: int = 8,
    options: Iterable[tuple[str, Any]] | None = None,
    credentials: grpc.ServerCredentials | None = None,
    limits: CallLimits | None = None,
    address: str | None = None,
    outer_interceptors: Sequence[grpc.ServerInterceptor] = (),
) -> tuple[grpc.Server, int]:
    """Build (not start) a gRPC server hosting `services`, plus health checking and reflection.

    Every RPC goes through `ErrorMappingInterceptor`, the one place where domain errors
    become status codes. Port 0 binds any free port; the bound port is returned.
    With `credentials` (``TlsConfig.server_credentials()``: mutual TLS, client certificate
    required) the port is secure and a client without a certificate from the deployment's
    CA fails the handshake before any RPC runs; without them it is plaintext (callers
    choose that explicitly: the configs refuse to build a server without TLS unless
    ``insecure=True``). `options` default to the deployment's GRPC_OPTIONS.

    `limits` (default: `CallLimits.for_pool(max_workers)`) bound what one caller can hold:
    concurrency per identity and per heavy RPC, idle request streams, message size per RPC
    (parties.common.limits); health keeps threads of its own. `address` replaces host:port (a computation
    server's coordinator listens on a Unix socket, `unix:PATH`); `outer_interceptors` run before the limits
    (the coordinator's `ForwardedPeer`, which tells them who the caller is).
    """
    limits = limits or CallLimits.for_pool(max_workers)
    queue_threads = limits.queue_threads(name for _, _, name in services)
    server = grpc.server(  # the calls waiting in an upload queue wait on threads of their own
        futures.ThreadPoolExecutor(max_workers=max_workers + queue_threads, thread_name_prefix="dpagg-rpc"),
        interceptors=(*outer_interceptors, CallLimiter(limits), ErrorMappingInterceptor()),
        options=list(config.GRPC_OPTIONS if options is None else options),
    )
    health_servicer = _HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = []
    for add, servicer, name in services:
        add(servicer, server)
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        names.append(name)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    _enable_reflection((*names, health.SERVICE_NAME), server)
    address = address or f"{host}:{port}"
    try:
        bound = (server.add_secure_port(address, credentials) if credentials is not None
                 else server.add_insecure_port(address))
    except RuntimeError as exc:
        raise InvalidInputError(f"cannot listen on {address}: {exc}; is the port in use?") from exc
    if bound == 0:
        raise InvalidInputError(f"cannot listen on {address}; is the port in use or the host wrong?")
    server._dpagg_health = health_servicer  # kept for a graceful shutdown
    return server, bound


@dataclass
class ServerHandle:
    """A built server with its bound port and what must be closed after it stops.

    `handler` is the role's transport-neutral handler (tests and the demo use it directly).
    `starters` run in a background thread once the server starts serving (the computation
    server's chunk workers do their imports there, not in the first release).
    """

    server: grpc.Server
    port: int
    host: str
    handler: Any = None
    closers: list[Callable[[], None]] = field(default_factory=list)
    starters: list[Callable[[], None]] = field(default_factory=list)
    _stopped: bool = False
    _started: bool = False

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> "ServerHandle":
        self.server.start()
        self._run_starters()
        return self

    def _run_starters(self) -> None:
        if self._started or not self.starters:
            return
        self._started = True

        def run() -> None:
            for start in self.starters:
                try:
                    start()
                except Exception:  # noqa: BLE001 - a head start only: first use starts what is missing
                    log.exception("starting in the background failed; it is retried when first needed")

        threading.Thread(target=run, name="server-starters", daemon=True).start()

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving (in-flight calls get `grace` seconds), then close stores. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        health_servicer = getattr(self.server, "_dpagg_health", None)
        if health_servicer is not None:
            health_servicer.enter_graceful_shutdown()
        self.server.stop(grace).wait()
        for close in reversed(self.closers):
            close()

    def _close_all(self) -> None:
        for close in reversed(self.closers):
            close()

    def serve(self, *, port_file: str | Path | None = None, stop_event: threading.Event | None = None) -> None:
        """Run until SIGINT/SIGTERM (see `serve`).

        Without `stop_event` this is a server process: once it has stopped serving and closed its stores,
        the process ends there, whatever its threads are still doing (a call whose client left, a release
        thread): a stopped server must not keep gigabytes and a core for minutes.
        """
        code = 1
        try:
            serve(self.server, on_stop=self._close_all, stop_event=stop_event, on_start=self._run_starters,
                  on_listening=(lambda: write_port_file(port_file, self.port)) if port_file else None)
            code = 0
        except BaseException:
            if stop_event is not None:
                raise
            log.exception("the server stopped with an error")
        finally:
            self._stopped = True
        if stop_event is None:  # the process ends here, even when stopping failed: no thread keeps it alive
            logging.shutdown()
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(code)

    def __enter__(self) -> "ServerHandle":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_port_file(path: str | Path, port: int) -> None:
    """Write the bound port atomically (tests and scripts start servers on port 0 and read it)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(f"{port}\n")
    tmp.replace(p)


class _StopSignals:
    """SIGINT and SIGTERM for a server process, noted without taking any lock.

    A Python signal handler runs in the main thread between two bytecodes, wherever that thread is. The
    handler this replaces called `threading.Event.set`, whose lock is a plain (non-reentrant) Lock: a
    signal arriving while the main thread held it, on its way into or out of `Event.wait`, deadlocked the
    process for good (the flaky "server still alive 20 s after SIGTERM"). This one only records the
    signal number; the main thread polls it. A second signal exits at once (`os._exit` takes no lock).
    """

    def __init__(self) -> None:
        self.signum = 0

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.signum:  # a second signal: stop waiting for in-flight calls
            os.write(2, f"second signal {signum}: exiting without a graceful shutdown\n".encode())
            os._exit(1)
        self.signum = signum


def serve(server: grpc.Server, *, grace: float = 5.0, on_stop: Callable[[], None] | None = None,
          stop_event: threading.Event | None = None, on_start: Callable[[], None] | None = None,
          on_listening: Callable[[], None] | None = None) -> None:
    """Start `server` and block until SIGINT/SIGTERM (or `stop_event`), then stop gracefully.

    Health is switched to NOT_SERVING first so load balancers drain, in-flight calls get
    `grace` seconds, then `on_stop` runs (close stores). `on_listening` (writing the port
    file) runs once the signal handlers are in place, so a signal sent as soon as the port is
    known is a graceful stop, never the default action.
    """
    stop = stop_event or threading.Event()
    if stop_event is None:  # a server process: ciphertext-sized blocks go back to the system when freed
        return_big_blocks_to_the_os()
    signals = _StopSignals() if threading.current_thread() is threading.main_thread() else None
    if signals is not None:
        signals.install()
    if on_listening is not None:
        on_listening()
    server.start()
    if on_start is not None:
        on_start()
    try:
        if signals is None:
            stop.wait()
        else:
            while not (signals.signum or stop.wait(0.2)):
                pass
            if signals.signum:
                log.info("signal %d: shutting down (in-flight calls get %.1f s)", signals.signum, grace)
    finally:
        health_servicer = getattr(server, "_dpagg_health", None)
        if health_servicer is not None:
            health_servicer.enter_graceful_shutdown()
        server.stop(grace).wait()
        if on_stop is not None:
            on_stop()
        log.info("server stopped")
