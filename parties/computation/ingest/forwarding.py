"""Calls an ingest process passes on to its coordinator: raw bytes, the caller's verified identity with them.

An ingest process (a front) terminates the caller's mutual-TLS connection, so only it sees the
caller's CA-verified certificate. When it forwards a call over the coordinator's private Unix
socket it adds three metadata entries: the front token (a random secret the coordinator made at
start and handed to its own fronts through their spawn pipes), the caller's certificate as the
TLS stack gave it, and the caller's address. The coordinator's `ForwardedPeer` interceptor
refuses any call without the token (UNAUTHENTICATED) and shows the handlers a context whose
`auth_context()` holds the forwarded certificate, so the role checks, the per-caller limits and
every "for its own id only" rule run unchanged on the caller, not on the front. A caller cannot
inject these entries: the front drops every incoming `dpagg-front-*` entry before it adds its
own, and the coordinator's socket is reachable only through the file system (a 0700 directory
of the server's user).

Messages travel as the bytes the caller sent (no parse, no copy into protobuf objects), and so do
the replies, their initial and trailing metadata (an upload's place in the queue) and the status.
A call the caller cancels is cancelled at the coordinator; the caller's deadline goes with it.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, Callable, Iterator

import grpc

__all__ = ["ForwardedPeer", "Forwarder", "TOKEN_METADATA", "PEER_CERT_METADATA", "PEER_ADDRESS_METADATA",
           "service_methods"]

log = logging.getLogger("dpagg.computation")

TOKEN_METADATA = "dpagg-front-token"
PEER_CERT_METADATA = "dpagg-front-peer-cert-bin"
PEER_ADDRESS_METADATA = "dpagg-front-peer"
_OWN_PREFIX = "dpagg-front-"
#: Metadata gRPC itself manages on each hop; never copied from one call to the next.
_TRANSPORT_KEYS = ("user-agent", "content-type", "te", "grpc-", ":")

#: A method's shape: (requests stream, responses stream).
Shape = tuple[bool, bool]


def service_methods(*descriptors: Any) -> dict[str, Shape]:
    """'/package.Service/Method' -> (client streaming, server streaming), for every method of the services."""
    return {f"/{s.full_name}/{m.name}": (m.client_streaming, m.server_streaming)
            for s in descriptors for m in s.methods}


def _application(metadata: Any) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in (metadata or ()) if not k.startswith(_TRANSPORT_KEYS) and not k.startswith(_OWN_PREFIX)]


class _ForwardedContext:
    """A servicer context that answers `auth_context()` and `peer()` for the front's caller (all else: the call's)."""

    def __init__(self, context: Any, pem: bytes | None, peer: str) -> None:
        self._context = context
        self._pem = pem
        self._peer = peer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_pem_cert": [self._pem]} if self._pem else {}

    def peer(self) -> str:
        return self._peer or self._context.peer()

    def invocation_metadata(self) -> tuple[Any, ...]:
        return tuple(m for m in self._context.invocation_metadata() if not m[0].startswith(_OWN_PREFIX))


class ForwardedPeer(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc ships no type information here
    """The coordinator's socket: only calls carrying the front token run, as the caller the front vouches for."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    def _context(self, context: Any) -> _ForwardedContext:
        entries = list(context.invocation_metadata() or ())
        md = dict(entries)
        token = md.get(TOKEN_METADATA, "")
        once = all(sum(1 for k, _ in entries if k == key) <= 1 for key in (TOKEN_METADATA, PEER_CERT_METADATA))
        if not once or not hmac.compare_digest(token.encode() if isinstance(token, str) else bytes(token),
                                               self._token):
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "this is a computation server's private coordinator socket: only its own ingest "
                          "processes may call it; call the server's public port")
        pem = md.get(PEER_CERT_METADATA)
        return _ForwardedContext(context, bytes(pem) if pem else None, str(md.get(PEER_ADDRESS_METADATA, "")))

    def intercept_service(self, continuation: Callable[..., Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        kind = next(k for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
                    if getattr(handler, k) is not None)
        behavior = getattr(handler, kind)

        def run(request: Any, context: Any) -> Any:
            return behavior(request, self._context(context))

        def run_stream(request: Any, context: Any) -> Iterator[Any]:
            yield from behavior(request, self._context(context))

        return handler._replace(**{kind: run_stream if kind.endswith("_stream") else run})


class Forwarder:
    """The front's side: a method handler per forwarded method that passes the call to the coordinator as is."""

    def __init__(self, channel: grpc.Channel, token: str) -> None:
        self._channel = channel
        self._token = token

    def metadata(self, context: Any) -> list[tuple[str, Any]]:
        """The caller's own metadata, then the token, its certificate and its address (for the coordinator)."""
        md = _application(context.invocation_metadata())
        md.append((TOKEN_METADATA, self._token))
        try:
            pems = (context.auth_context() or {}).get("x509_pem_cert") or []
        except Exception:  # noqa: BLE001 - an insecure port has no auth data
            pems = []
        if len(pems) == 1:
            md.append((PEER_CERT_METADATA, bytes(pems[0])))
        md.append((PEER_ADDRESS_METADATA, context.peer()))
        return md

    def handler(self, method: str, shape: Shape) -> grpc.RpcMethodHandler:
        streams_in, streams_out = shape
        if not streams_in and not streams_out:
            return grpc.unary_unary_rpc_method_handler(self._unary(self._channel.unary_unary(method), method))
        if streams_in and not streams_out:
            return grpc.stream_unary_rpc_method_handler(self._unary(self._channel.stream_unary(method), method))
        if not streams_in:
            return grpc.unary_stream_rpc_method_handler(self._stream(self._channel.unary_stream(method), method))
        return grpc.stream_stream_rpc_method_handler(self._stream(self._channel.stream_stream(method), method))

    def _unary(self, call: Any, method: str) -> Callable[[Any, Any], Any]:
        def forward(request: Any, context: Any) -> Any:
            future = call.future(request, timeout=context.time_remaining(), metadata=self.metadata(context))
            context.add_callback(future.cancel)
            try:
                head = _application(future.initial_metadata())
                if head:
                    context.send_initial_metadata(head)
                reply = future.result()
            except grpc.RpcError as exc:
                _relay_error(context, exc, method)
            context.set_trailing_metadata(_application(future.trailing_metadata()))
            return reply
        return forward

    def _stream(self, call: Any, method: str) -> Callable[[Any, Any], Iterator[Any]]:
        def forward(request: Any, context: Any) -> Iterator[Any]:
            replies = call(request, timeout=context.time_remaining(), metadata=self.metadata(context))
            context.add_callback(replies.cancel)
            try:
                head = _application(replies.initial_metadata())
                if head:
                    context.send_initial_metadata(head)
                yield from replies
            except grpc.RpcError as exc:
                _relay_error(context, exc, method)
            context.set_trailing_metadata(_application(replies.trailing_metadata()))
        return forward


def _relay_error(context: Any, exc: grpc.RpcError, method: str) -> None:
    """End the caller's call with the coordinator's status, message and trailing metadata."""
    code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
    details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE and not context.is_active():
        code, details = grpc.StatusCode.CANCELLED, "the client is gone"
    elif code == grpc.StatusCode.UNAVAILABLE:
        log.warning("%s: the coordinator did not answer: %s", method, details)
    trailing = exc.trailing_metadata() if callable(getattr(exc, "trailing_metadata", None)) else None
    if trailing:
        context.set_trailing_metadata(_application(trailing))
    context.abort(code, details or "")
