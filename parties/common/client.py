"""What every typed client shares: the channel, deadlines, retries with backoff, and error translation."""

from __future__ import annotations

import random
import time
from typing import Any, Callable, ClassVar, Self, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from he_partition.core.errors import DPAggError

from .config import DEFAULT_TIMEOUT, GRPC_OPTIONS, RetryPolicy
from .errors import ServiceError
from .tls import TlsConfig, server_role_name

__all__ = ["BaseClient", "call_with_retry", "is_busy"]

T = TypeVar("T")


def is_busy(error: ServiceError) -> bool:
    """The server refused the call for load ("server busy": all its call slots taken), not because it is down."""
    return error.code == grpc.StatusCode.UNAVAILABLE and error.details.startswith("server busy")


def call_with_retry(fn: Callable[[], T], *, policy: RetryPolicy, method: str,
                    sleep: Callable[[float], None] = time.sleep, budget: float | None = None,
                    clock: Callable[[], float] = time.monotonic) -> T:
    """Run `fn` (one RPC) and retry it on the policy's codes with exponential backoff.

    A "server busy" refusal is retried beyond the policy's attempts for as long as `budget`
    seconds (the call's deadline) allow: a busy server frees slots within a heavy call's time,
    so giving up after a fixed count only fails the caller sooner. Only use it for calls that
    are safe to repeat (reads, and writes with an idempotency key). Any failure is raised as
    `ServiceError`.
    """
    delay = policy.initial_delay
    give_up = None if budget is None else clock() + budget
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except grpc.RpcError as err:
            error = ServiceError.from_rpc_error(err, method)
            wait = random.uniform(0, min(policy.max_delay, delay))
            busy_time_left = (give_up is not None and is_busy(error) and policy.attempts > 1
                              and clock() + wait < give_up)
            if error.code.name not in policy.retry_codes or (attempt >= policy.attempts and not busy_time_left):
                if is_busy(error):
                    error.details += f" (after {attempt} attempt(s); the server is up but busy)"
                elif error.code == grpc.StatusCode.UNAVAILABLE:
                    error.details += f" (after {attempt} attempt(s); is the server running and reachable?)"
                    error.args = (f"{error.code.name} ({method}): {error.details}",)
                raise error from None
            sleep(wait)
            delay *= policy.multiplier


def _connection_failed(details: str) -> bool:
    """gRPC's wording when no connection (TCP or TLS) could be made, as opposed to a server's UNAVAILABLE."""
    return "failed to connect" in details or "Socket closed" in details or "handshake" in details.lower()


class BaseClient:
    """A channel to one dpagg server with per-call deadlines and retries on UNAVAILABLE.

    Use as a context manager, or call `close()`. `timeout` is the default deadline of
    each call in seconds; every method also takes its own `timeout`. `tls` (this party's
    certificate, key and the deployment CA) makes the channel mutual TLS, which every
    server outside a test setup requires: the server checks the certificate's role and
    id on every call, and this client checks the server's: its certificate must carry
    the DNS name `<server_role>.dpagg` (`server_role_name`), which `dpagg certs` puts only
    in certificates of that server role, so a party holding any other certificate of the
    same CA cannot pose as the server. A plaintext channel needs `insecure=True` (only an
    `--insecure` server accepts it); without `tls` and without it the client refuses.
    """

    #: The generated stub class of the service this client talks to.
    stub_class: ClassVar[type[Any] | None] = None
    #: The role the server must hold ("decryption", "computation"), or "" to check only the CA and host name.
    server_role: ClassVar[str] = ""

    def __init__(self, target: str, *, timeout: float = DEFAULT_TIMEOUT, retry: RetryPolicy = RetryPolicy(),
                 channel: grpc.Channel | None = None, tls: TlsConfig | None = None, insecure: bool = False) -> None:
        if not target and channel is None:
            raise ValueError("target must be host:port of a dpagg server")
        if tls is None and not insecure and channel is None:
            raise DPAggError(
                f"no TLS configuration for {target}: pass tls=TlsConfig(...) (this party's certificate, key and the "
                "deployment CA), or insecure=True for a plaintext test setup"
            )
        self.target = target
        self.timeout = timeout
        self.retry = retry
        self.tls = tls
        if channel is None:
            if tls is not None:
                role_name = [("grpc.ssl_target_name_override", server_role_name(self.server_role))] \
                    if self.server_role else tls.channel_options()
                channel = grpc.secure_channel(target, tls.channel_credentials(), options=[*GRPC_OPTIONS, *role_name])
            else:
                channel = grpc.insecure_channel(target, options=list(GRPC_OPTIONS))
            self._owns_channel = True
        else:
            self._owns_channel = False
        self._channel = channel
        self._health = health_pb2_grpc.HealthStub(self._channel)
        stub_class = type(self).stub_class
        self._stub: Any = stub_class(self._channel) if stub_class is not None else None

    @property
    def channel(self) -> grpc.Channel:
        """The gRPC channel this client calls on."""
        return self._channel

    def close(self) -> None:
        """Close the channel (if this client opened it); `with Client(...) as c:` does it for you."""
        if self._owns_channel:
            self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, rpc: Callable[..., T], request: Any, *, method: str, timeout: float | None = None,
               retry: bool = True) -> T:
        """One unary call with a deadline; retried on UNAVAILABLE when `retry` (idempotent calls)."""
        deadline = self.timeout if timeout is None else timeout
        policy = self.retry if retry else RetryPolicy(attempts=1)
        return self._call(lambda: rpc(request, timeout=deadline), policy=policy, method=method, budget=deadline)

    def _call(self, fn: Callable[[], T], *, policy: RetryPolicy, method: str, budget: float | None = None) -> T:
        """`call_with_retry`; when the connection does not come up, say which certificate, CA or name failed."""
        try:
            return call_with_retry(fn, policy=policy, method=method, budget=budget)
        except ServiceError as exc:
            if exc.code == grpc.StatusCode.UNAVAILABLE and self.target and _connection_failed(exc.details):
                from .tls_diagnose import diagnose

                name = server_role_name(self.server_role) if self.server_role else ""
                cause = diagnose(self.target, self.tls, server_name=name, role=self.server_role)
                if cause:
                    exc.details = f"cannot reach {self.target}: {cause}"
                    exc.args = (f"{exc.code.name} ({method}): {exc.details}",)
            raise

    def wait_ready(self, service: str = "", timeout: float = 30.0) -> None:
        """Block until the server's health check reports SERVING for `service` ("" = the whole server)."""
        end = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < end:
            try:
                resp = self._health.Check(health_pb2.HealthCheckRequest(service=service),
                                          timeout=max(0.1, min(2.0, end - time.monotonic())))
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as err:
                last = err
            time.sleep(0.05)
        detail = f": {last.details()}" if isinstance(last, grpc.RpcError) else ""
        raise ServiceError(grpc.StatusCode.UNAVAILABLE,
                           f"{self.target} did not become healthy within {timeout:g} s{detail}; is it running?",
                           method="grpc.health.v1.Health/Check")
