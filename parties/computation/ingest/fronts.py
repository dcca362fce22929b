"""The coordinator's side of the ingest processes: its private socket, its fronts, and its claim on the port.

Who may share the public port. SO_REUSEPORT lets a socket join a port's group only if every
socket in it set the option and belongs to the same user. So a stray server that binds normally
is refused as before ("is the port in use?"), and the coordinator also takes an exclusive claim
on the port for this server before any front binds (`claim_port`: an abstract Unix socket named
after the address, which the kernel gives to one process only and frees when it dies): a second
computation server started with ingest processes on the same address stops there, naming the
port. What shares the port is then the fronts this coordinator spawned, with the token only they
hold; every call they forward carries it (`forwarding.ForwardedPeer`).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import multiprocessing.connection
import secrets
import shutil
import socket
import tempfile
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import grpc

from he_partition.execution.spawning import without_user_main

from ...common.errors import FailedPreconditionError
from .front import COMMITTED_METHOD, PREPARE_METHOD, FrontSpec, run_front

__all__ = ["IngestFronts", "claim_port", "coordinator_socket", "coordinator_handler", "START_TIMEOUT"]

log = logging.getLogger("dpagg.computation")

#: Seconds a front may take to import, open the store and bind (a loaded host).
START_TIMEOUT = 120.0


def coordinator_socket() -> tuple[str, Callable[[], None]]:
    """A fresh private directory (0700) for the coordinator's socket: its gRPC address and its removal."""
    directory = Path(tempfile.mkdtemp(prefix="dpagg-cs-"))
    return f"unix:{directory / 'coordinator.sock'}", lambda: shutil.rmtree(directory, ignore_errors=True)


def claim_port(host: str, port: int) -> Callable[[], None]:
    """Hold `host:port` for this computation server alone (FAILED_PRECONDITION if another one holds it)."""
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(f"\0dpagg-computation-ingest/{host}:{port}")
    except OSError:
        claim.close()
        raise FailedPreconditionError(
            f"port {port} on {host} is served by another computation server's ingest processes; stop it, or give "
            "this server another --port") from None
    return claim.close


def coordinator_handler(on_commit: Callable[[str], None], prepare: Callable[[str], None]) -> grpc.GenericRpcHandler:
    """The coordinator's own methods, for its ingest processes: `Committed` (a front stored and committed an
    owner's upload: fold it, and start what a complete study needs) and `Prepare` (a front met a study it has no
    contract or public key of on disk: fetch both from the key holder, as the coordinator's own first upload
    would). Each takes {"study_id": ...} as JSON and answers nothing; an error goes back as its status."""

    def study_of(request: bytes) -> str:
        return str(json.loads(request.decode())["study_id"])

    def committed(request: bytes, context: Any) -> bytes:
        on_commit(study_of(request))
        return b""

    def prepared(request: bytes, context: Any) -> bytes:
        prepare(study_of(request))
        return b""

    service = COMMITTED_METHOD.rsplit("/", 1)[0].lstrip("/")
    return grpc.method_handlers_generic_handler(service, {
        COMMITTED_METHOD.rsplit("/", 1)[1]: grpc.unary_unary_rpc_method_handler(committed),
        PREPARE_METHOD.rsplit("/", 1)[1]: grpc.unary_unary_rpc_method_handler(prepared)})


class IngestFronts:
    """N front processes on the public port; a dead one is started again (`watch`), all end with `close`."""

    def __init__(self, spec: FrontSpec, count: int) -> None:
        if count < 1:
            raise ValueError("at least one ingest process")
        self.spec = spec
        self.count = count
        self.port = spec.port
        self._procs: list[tuple[Any, multiprocessing.connection.Connection] | None] = [None] * count
        self._stop = threading.Event()
        self._ctx = multiprocessing.get_context("spawn")
        self._watcher: threading.Thread | None = None

    def _spawn(self, index: int) -> tuple[Any, multiprocessing.connection.Connection]:
        ours, theirs = self._ctx.Pipe()
        proc = self._ctx.Process(target=run_front, args=(replace(self.spec, index=index, port=self.port), theirs),
                                 name=f"dpagg-ingest-{index}", daemon=True)
        with without_user_main():
            proc.start()
        theirs.close()
        return proc, ours

    def _bound(self, index: int, proc: Any, conn: multiprocessing.connection.Connection) -> int:
        if not conn.poll(START_TIMEOUT):
            proc.kill()
            raise FailedPreconditionError(f"ingest process {index} did not start within {START_TIMEOUT:.0f} s")
        try:
            kind, value = conn.recv()
        except EOFError:
            raise FailedPreconditionError(f"ingest process {index} ended while starting (exit code "
                                          f"{proc.exitcode}); see its log") from None
        if kind != "port":
            proc.join(5.0)
            raise FailedPreconditionError(f"ingest process {index} could not serve: {value}")
        return int(value)

    def start(self) -> int:
        """Start every front; returns the port they share (the first one binds it when the port is 0)."""
        try:
            first = self._spawn(0)
            self._procs[0] = first
            self.port = self._bound(0, *first)
            rest = [(i, self._spawn(i)) for i in range(1, self.count)]
            for i, pc in rest:
                self._procs[i] = pc
                self._bound(i, *pc)
        except BaseException:
            self.close()
            raise
        self._watcher = threading.Thread(target=self._watch, name="ingest-watch", daemon=True)
        self._watcher.start()
        return self.port

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            for i, pc in enumerate(self._procs):
                if pc is None or pc[0].is_alive() or self._stop.is_set():
                    continue
                log.warning("ingest process %d ended (exit code %s); starting it again", i, pc[0].exitcode)
                try:
                    new = self._spawn(i)
                    self._procs[i] = new
                    self._bound(i, *new)
                except Exception as exc:  # noqa: BLE001 - the other fronts keep serving; tried again next round
                    log.error("ingest process %d did not start again: %s", i, exc)

    def alive(self) -> int:
        return sum(1 for pc in self._procs if pc is not None and pc[0].is_alive())

    def close(self, grace: float = 10.0) -> None:
        """Tell every front to stop (each finishes its calls for up to 5 s), then end any that did not."""
        self._stop.set()
        for pc in self._procs:
            if pc is not None:
                try:
                    pc[1].send("stop")
                except (OSError, EOFError, BrokenPipeError):
                    pass
        for pc in self._procs:
            if pc is None:
                continue
            pc[0].join(grace)
            if pc[0].is_alive():
                pc[0].kill()
                pc[0].join(2.0)
            pc[1].close()


def new_token() -> str:
    return secrets.token_hex(32)
