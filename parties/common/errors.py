"""Service-level errors and the one table that maps every domain error to a gRPC status code.

Servers apply the table in one place (`ErrorMappingInterceptor`, installed by
`create_server`); servicers and handlers just raise. Clients turn a failed call back
into a `ServiceError` that carries the status code and the server's message.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any, Callable, Iterator

import grpc

from he_partition.core.errors import (
    BudgetExhaustedError,
    DPAggError,
    InvalidInputError,
    MeasurementShapeError,
    PrecisionError,
    WorkerLostError,
)

from .signing import SignatureError
from .tls import AccessDeniedError

__all__ = [
    "CallCancelledError",
    "NotFoundError",
    "PermissionDeniedError",
    "AlreadyExistsError",
    "FailedPreconditionError",
    "QuotaExhaustedError",
    "ServiceError",
    "STATUS_TABLE",
    "status_for",
    "code_of",
    "ErrorMappingInterceptor",
]

log = logging.getLogger("dpagg.errors")


class NotFoundError(DPAggError):
    """An unknown study, release or upload (NOT_FOUND)."""


class PermissionDeniedError(DPAggError):
    """The caller is not one of the parties the study allows, e.g. an unexpected owner id (PERMISSION_DENIED)."""


class AlreadyExistsError(DPAggError):
    """An object with that id already exists with different content (ALREADY_EXISTS)."""


class FailedPreconditionError(DPAggError):
    """The request is valid but the system is not in the state it needs (FAILED_PRECONDITION)."""


class TooLargeForOneMessageError(DPAggError):
    """A reply that would not fit one message; the method that pages it is named (RESOURCE_EXHAUSTED)."""


class QuotaExhaustedError(DPAggError):
    """A party asked for more than its quota, e.g. oblivious evaluations beyond its join quota (RESOURCE_EXHAUSTED)."""


class ServiceError(DPAggError):
    """A gRPC call failed: `code` is the status code, `details` the server's message.

    Raised by every dpagg client. A server that calls another server and gets one
    passes the same code on to its own caller.
    """

    def __init__(self, code: grpc.StatusCode, details: str, *, method: str = "") -> None:
        self.code = code
        self.details = details
        self.method = method
        where = f" ({method})" if method else ""
        super().__init__(f"{code.name}{where}: {details}")

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError, method: str = "") -> "ServiceError":
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        details = err.details() if hasattr(err, "details") else str(err)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "", method=method)


class CallCancelledError(Exception):
    """The client of the running call is gone (cancelled, deadline passed): stop the work."""


#: The one mapping from domain errors to status codes; the first matching class wins.
STATUS_TABLE: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (BudgetExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
    (MeasurementShapeError, grpc.StatusCode.INVALID_ARGUMENT),
    # A ciphertext that fails the decryption integrity check (noise budget, decoded
    # magnitude): made under another key or corrupt. The request carried bad data.
    (PrecisionError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (TooLargeForOneMessageError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (QuotaExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    # A submission whose Ed25519 signature is missing or does not verify: the data cannot be
    # attributed to the owner it names, so the caller is not authenticated for it.
    (SignatureError, grpc.StatusCode.UNAUTHENTICATED),
    # The server's own worker processes could not start or kept dying: try again later, or see the server log.
    (WorkerLostError, grpc.StatusCode.UNAVAILABLE),
    # Work stopped because its client is gone (parties.common.limits.raise_if_cancelled).
    (CallCancelledError, grpc.StatusCode.CANCELLED),
)


#: Which server a relayed refusal came from, by the service of the upstream method ("Decryption/OpenStudy").
_SERVERS = {"Decryption": "the decryption server", "Computation": "the computation server",
            "Analyst": "the analyst service"}


def _upstream(method: str) -> str:
    """`Decryption/OpenStudy` -> `the decryption server (OpenStudy)`: words first, the call for reference."""
    service, _, call = method.partition("/")
    if service in _SERVERS:
        return f"{_SERVERS[service]} ({call})" if call else _SERVERS[service]
    return method or "upstream call"


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message for an exception raised by a handler."""
    if isinstance(exc, ServiceError):
        # An upstream call failed: keep its code so the caller sees e.g. RESOURCE_EXHAUSTED.
        return exc.code, f"{_upstream(exc.method)}: {exc.details}"
    if isinstance(exc, AccessDeniedError):
        # Identity failures carry their own code: UNAUTHENTICATED (no verified identity) or
        # PERMISSION_DENIED (a verified party whose role or id may not do this).
        return exc.code, exc.message
    for cls, code in STATUS_TABLE:
        if isinstance(exc, cls):
            return code, str(exc)
    if isinstance(exc, sqlite3.OperationalError) and "full" in str(exc):
        # SQLITE_FULL: the transaction rolled back, so nothing was stored, charged or decrypted.
        return grpc.StatusCode.FAILED_PRECONDITION, (
            f"the server's storage is full ({exc}): nothing was stored, charged or decrypted; free disk space on "
            "the server and retry")
    if isinstance(exc, NotImplementedError):  # a method this server does not implement stays UNIMPLEMENTED
        return grpc.StatusCode.UNIMPLEMENTED, str(exc) or "method not implemented"
    if isinstance(exc, DPAggError):
        return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"
    return grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__}); see the server log"


def reason_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """A failed call's status code and its server's own words (a ServiceError's details, without the upstream
    prefix `status_for` adds), or `status_for`'s for anything raised before a call: what a relay reports."""
    return (exc.code, exc.details) if isinstance(exc, ServiceError) else status_for(exc)


def code_of(exc: BaseException) -> grpc.StatusCode:
    """The status code an error stands for, whether a server returned it (ServiceError) or a client-side
    check raised it before any call (e.g. InvalidInputError -> INVALID_ARGUMENT)."""
    return status_for(exc)[0]


def _abort(context: grpc.ServicerContext, exc: Exception, method: str) -> None:
    code, message = status_for(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("%s failed", method)
    else:
        log.info("%s -> %s: %s", method, code.name, message)
    context.abort(code, message)


def _wrap_unary(behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return behavior(request, context)
        except Exception as exc:
            if _is_abort(exc, context):
                raise
            _abort(context, exc, method)

    return wrapped


def _wrap_stream(behavior: Callable[..., Iterator[Any]], method: str) -> Callable[..., Iterator[Any]]:
    def wrapped(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from behavior(request, context)
        except Exception as exc:
            if _is_abort(exc, context):
                raise
            _abort(context, exc, method)

    return wrapped


def _is_abort(exc: Exception, context: grpc.ServicerContext) -> bool:
    # context.abort() raises a bare Exception after setting the code; let it through.
    code = getattr(context, "code", lambda: None)()
    return type(exc) is Exception and code not in (None, grpc.StatusCode.OK)


class ErrorMappingInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc ships no types
    """Applies STATUS_TABLE to every RPC of a server: handlers raise, callers get a status."""

    def intercept_service(self, continuation: Callable[..., Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=_wrap_unary(handler.unary_unary, method))
        if handler.stream_unary is not None:
            return handler._replace(stream_unary=_wrap_unary(handler.stream_unary, method))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=_wrap_stream(handler.unary_stream, method))
        if handler.stream_stream is not None:
            return handler._replace(stream_stream=_wrap_stream(handler.stream_stream, method))
        return handler
