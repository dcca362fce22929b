"""Per-caller limits of every dpagg server: concurrency per identity and per RPC, idle-stream deadlines,
work abandoned by its client, and a message-size budget per RPC checked before a message is parsed.

gRPC's synchronous server runs each call on one thread of a fixed pool, so one authenticated
caller holding every thread (idle upload streams, heavy range queries) starves everyone,
health checks included. `CallLimiter` is the first interceptor of every server:

- health and reflection bypass it, and `HEALTH_RESERVE` threads of the pool are never
  given to other calls, so a busy server still answers its health check;
- every other call of an authenticated caller takes a slot: at most `slots` at once, at
  most `per_caller` per identity (the party of its verified certificate) and at most
  `per_method[m]` per heavy method; the computation server calling the key holder
  (`EXEMPT_ROLES`) and the callers of an insecure test server (no identities) are not
  limited; a call past a limit is refused at once with UNAVAILABLE
  ("server busy", retryable) and takes no further thread time;
- an upload (`QUEUED_METHODS`) that finds its method's slots (or every slot) taken waits its
  turn instead, in a first-come first-served queue (`_Slots.admit`): at most `queue_len[m]`
  calls wait, at most one per caller (so one owner's many streams cannot push the others
  back), each for at most `queue_wait` seconds and never past its own deadline. A waiting call
  holds a thread, but one of its own: the server's pool has one thread more per place in the
  queue (`CallLimits.queue_threads`, added by `create_server`), so the queue takes nothing
  from `slots`, health (`HEALTH_RESERVE`) or small calls; a waiting call holds no slot until
  it is admitted. A queued caller is told its place at once (initial metadata `dpagg-queue`:
  position, waiting, running) and, once admitted, how long it waited (trailing metadata
  `dpagg-queue-waited`). What still refuses, with "server busy" (retried by the owner's
  client within its wait limit): the queue full ("queue full (N waiting)"), a second waiting
  call of one caller, a caller already at its own limit of running calls, and the wait bound.
  The disk an upload fills is checked by the upload itself (RESOURCE_EXHAUSTED,
  `parties.computation.uploads`); memory by the number of running uploads (a waiting upload
  is not read: gRPC's flow control holds its sender) (docs/scaling.md, "A crowd of owners
  uploading at once");
- a request stream that sends nothing for `idle_seconds` is cancelled (CANCELLED);
- a call whose client is gone before it starts is skipped; long loops call
  `raise_if_cancelled()` to stop work nobody waits for;
- each request message is parsed only after its size passed the method's budget
  (`MESSAGE_BUDGETS`): an oversized one is refused with RESOURCE_EXHAUSTED before any parse,
  and bytes that do not parse as the request message are INVALID_ARGUMENT (not INTERNAL).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import grpc
from google.protobuf.message import DecodeError

from .errors import CallCancelledError
from .tls import peer_identity

__all__ = ["CallLimiter", "CallLimits", "MESSAGE_BUDGETS", "HEALTH_RESERVE", "QUEUED_METHODS", "QUEUE_WAIT_SECONDS", "UPLOAD_QUEUE_PLACES",
           "QUEUE_METADATA", "QUEUE_WAITED_METADATA", "QueuePlace", "raise_if_cancelled",
           "CallCancelledError", "server_options", "DECRYPTION_MAX_RECEIVE", "ANALYST_MAX_RECEIVE",
           "COMPUTATION_MAX_RECEIVE"]

log = logging.getLogger("dpagg.limits")

MiB = 1024 * 1024

#: Threads of every server's pool kept for health checks and reflection.
HEALTH_RESERVE = 2

#: A request stream that sends no message for this long is cancelled (seconds).
IDLE_STREAM_SECONDS = 30.0

#: Largest request message per method, bytes (checked before parsing). Methods not listed
#: keep the server-wide gRPC limit (MAX_MESSAGE_BYTES), e.g. a join's pseudonym upload.
MESSAGE_BUDGETS: dict[str, int] = {
    # 100,000 ranges of two int64 varints each are < 2.5 MB; a 57 MiB batch of ranges is refused unparsed.
    "/dpagg.v1.Analyst/RangeCounts": 4 * MiB,
    "/dpagg.v1.Analyst/ListReleases": 64 * 1024,
    "/dpagg.v1.Analyst/GetRelease": 64 * 1024,
    "/dpagg.v1.Analyst/GetReleasePages": 64 * 1024,
    "/dpagg.v1.Analyst/GetReleaseArrow": 64 * 1024,
    "/dpagg.v1.Computation/DirectRangeCounts": 2 * MiB,
    "/dpagg.v1.Computation/OpenStudy": 1 * MiB,
    "/dpagg.v1.Computation/UploadStatus": 64 * 1024,
    "/dpagg.v1.Computation/StudyStatus": 64 * 1024,
    "/dpagg.v1.Computation/LedgerReceipts": 64 * 1024,
    "/dpagg.v1.Computation/RunRelease": 64 * 1024,
    "/dpagg.v1.Computation/ReleaseStatus": 64 * 1024,
    "/dpagg.v1.Computation/GetPublicContext": 64 * 1024,
    # one ciphertext chunk (~370 KB) or the header per message
    "/dpagg.v1.Computation/SubmitHistogram": 8 * MiB,
    # one part of a join owner's sorted pseudonyms: at most 500,000 x 32 bytes (parties.data_owner.join)
    "/dpagg.v1.Computation/JoinPlacement": 17 * MiB,
    "/dpagg.v1.Computation/JoinExchange": 64 * 1024,
    "/dpagg.v1.Decryption/OpenStudy": 1 * MiB,
    "/dpagg.v1.Decryption/GetStudy": 64 * 1024,
    "/dpagg.v1.Decryption/GetPublicContext": 64 * 1024,
    "/dpagg.v1.Decryption/BudgetStatus": 64 * 1024,
    # up to a few thousand receipts (~0.5 KB each) of charges another holder booked
    "/dpagg.v1.Decryption/ReconcileCharges": 4 * MiB,
    "/dpagg.v1.Decryption/ChargeDirectQueries": 2 * MiB,
    # one page of a join owner's blinded identifiers: at most 32,768 x 32 bytes (parties.decryption.oprf)
    "/dpagg.v1.Decryption/EvaluatePseudonyms": 1 * MiB + 4096,
    # a header with up to 1M partition starts, or one ciphertext chunk
    "/dpagg.v1.Decryption/DecryptMeasurement": 16 * MiB,
    # key-share holders: the same stream as DecryptMeasurement; a setup round with K key shares
    "/dpagg.v1.Decryption/IssueShares": 16 * MiB,
    # one holder's join Galois key share (about 10 MB at the join's parameters) or a round with K smaller parts
    "/dpagg.v1.Decryption/KeySetup": 12 * MiB,
    "/dpagg.v1.Computation/SetupKey": 64 * 1024,
}

#: The most any one request message of the key holder's service may be (a DecryptMeasurement header
#: with 1M partition starts, one ciphertext chunk, one join cell): gRPC refuses larger ones before
#: they are buffered whole. The stand-alone analyst server needs only RangeCounts' budget.
DECRYPTION_MAX_RECEIVE = 16 * MiB
ANALYST_MAX_RECEIVE = 4 * MiB
#: The computation server's largest request message: a part of a join owner's pseudonyms (16 MB). Every list
#: that grows with the domain travels in pages or chunks, so a larger message is refused before it is buffered.
COMPUTATION_MAX_RECEIVE = 17 * MiB


def server_options(max_receive: int) -> tuple[tuple[str, int], ...]:
    """GRPC_OPTIONS with `grpc.max_receive_message_length` at most `max_receive` (for servers that never need
    64 MiB)."""
    from . import config

    return tuple((k, min(max_receive, v) if k == "grpc.max_receive_message_length" else v)
                 for k, v in config.GRPC_OPTIONS)


#: Methods whose calls hold a thread long (streams, big batches): each gets a share of the pool.
HEAVY_METHODS = ("/dpagg.v1.Computation/SubmitHistogram", "/dpagg.v1.Analyst/RangeCounts",
                 "/dpagg.v1.Computation/DirectRangeCounts", "/dpagg.v1.Analyst/GetRelease",
                 "/dpagg.v1.Analyst/GetReleasePages", "/dpagg.v1.Analyst/GetReleaseArrow",
                 # a page of a join owner's blinded identifiers: 32,768 scalar multiplications at the key holder
                 "/dpagg.v1.Decryption/EvaluatePseudonyms")

#: Heavy methods whose calls wait their turn (FIFO) when the method's slots are taken, instead of being
#: refused at once: an owner's upload refused mid-crowd is an owner who has to come back.
QUEUED_METHODS = ("/dpagg.v1.Computation/SubmitHistogram",)

#: The longest a call waits in its method's queue (seconds); it is refused "server busy" after that.
QUEUE_WAIT_SECONDS = 120.0

#: Places in the upload queue by default: each is a thread of its own beside the pool, idle while it waits.
UPLOAD_QUEUE_PLACES = 64

#: Initial metadata of a queued call: "position=P;waiting=W;running=R" (P = 1 is next).
QUEUE_METADATA = "dpagg-queue"
#: Trailing metadata of a call admitted from the queue: seconds it waited ("%.3f").
QUEUE_WAITED_METADATA = "dpagg-queue-waited"

#: Callers the slot limits do not refuse: the computation server calling the key holder (its
#: calls queue as before: a refused DecryptMeasurement would fail a release).
EXEMPT_ROLES = ("computation",)

_EXEMPT_PREFIXES = ("/grpc.health.", "/grpc.reflection.")


_current = threading.local()


def raise_if_cancelled() -> None:
    """Raise CallCancelledError when the gRPC call this thread serves has ended; a no-op outside a call."""
    context = getattr(_current, "context", None)
    if context is not None and not context.is_active():
        raise CallCancelledError("the client is gone; work stopped")


@dataclass
class CallLimits:
    """The limits of one server, derived from its thread pool (`for_pool`)."""

    slots: int
    per_caller: int
    per_method: dict[str, int] = field(default_factory=dict)
    idle_seconds: float = IDLE_STREAM_SECONDS
    budgets: dict[str, int] = field(default_factory=lambda: dict(MESSAGE_BUDGETS))
    #: How many calls of a method may wait for one of its slots (methods not listed: none, refused at once).
    queue_len: dict[str, int] = field(default_factory=dict)
    queue_wait: float = QUEUE_WAIT_SECONDS

    def queue_threads(self, services: Iterable[str]) -> int:
        """Threads a server hosting `services` (full names) adds to its pool for the calls waiting in its queues."""
        hosted = tuple(f"/{name}/" for name in services)
        return sum(n for method, n in self.queue_len.items() if method.startswith(hosted))

    @classmethod
    def for_pool(cls, max_workers: int, queue_places: int = UPLOAD_QUEUE_PLACES) -> "CallLimits":
        """`HEALTH_RESERVE` threads kept for health; one caller gets at most half the rest, each heavy
        method a third (so two heavy methods together still leave room for small calls). A queued
        method gets `queue_places` places to wait, each a thread beside the pool (`queue_threads`)."""
        slots = max(1, max_workers - HEALTH_RESERVE)
        heavy = max(1, slots // 3)
        return cls(slots, max(1, slots // 2), {m: heavy for m in HEAVY_METHODS}, idle_seconds=IDLE_STREAM_SECONDS,
                   queue_len={m: max(0, queue_places) for m in QUEUED_METHODS}, queue_wait=QUEUE_WAIT_SECONDS)


@dataclass(frozen=True)
class Admission:
    """How `_Slots.admit` ended: admitted (`refused` empty) or why not; `gone`: the client left while it waited."""

    refused: str = ""
    waited: float = 0.0
    queued: bool = False
    gone: bool = False


@dataclass(frozen=True)
class QueuePlace:
    """A call's place when it joined its method's queue: `position` 1 is next; `running`: calls holding a slot."""

    position: int
    waiting: int
    running: int

    def metadata(self) -> str:
        return f"position={self.position};waiting={self.waiting};running={self.running}"

    @classmethod
    def parse(cls, text: str) -> "QueuePlace | None":
        """The place a server sent as `QUEUE_METADATA`, or None when the text is not one."""
        try:
            fields = dict(part.split("=", 1) for part in text.split(";"))
            return cls(int(fields["position"]), int(fields["waiting"]), int(fields["running"]))
        except (KeyError, ValueError):
            return None


class _Slots:
    def __init__(self, limits: CallLimits) -> None:
        self.limits = limits
        self._lock = threading.Condition(threading.Lock())
        self._total = 0  # running calls (a waiting call holds a queue thread, not a slot)
        self._by_caller: Counter[str] = Counter()  # running
        self._by_method: Counter[str] = Counter()  # running only
        self._queues: dict[str, deque[tuple[object, str]]] = {}  # (ticket, caller), first come first

    def take(self, caller: str, method: str) -> str:
        """"" when a slot was taken (or `caller` is not limited), else why not."""
        lim = self.limits
        if not caller:
            return ""
        with self._lock:
            if self._total >= lim.slots:
                return f"all {lim.slots} call slots are busy"
            if self._by_caller[caller] >= lim.per_caller:
                return f"caller {caller} already has {lim.per_caller} calls running"
            cap = lim.per_method.get(method)
            if cap is not None and self._by_method[method] >= cap:
                return f"{cap} {method.rsplit('/', 1)[-1]} calls are already running"
            self._take_locked(caller, method)
            return ""

    def admit(self, caller: str, method: str, *, active: Callable[[], bool],
              on_queued: Callable[[QueuePlace], None] = lambda place: None,
              clock: Callable[[], float] = time.monotonic) -> Admission:
        """Take a slot as `take` does, but when `method` is queued and its slots (or every slot) are taken,
        wait for one in its FIFO queue on a thread of the queue's own (see the module docstring). `active()`
        is polled while waiting (the client gone or past its deadline: leave the queue); `on_queued` is told
        the place once, outside the lock."""
        lim = self.limits
        room = lim.queue_len.get(method, 0)
        cap = lim.per_method.get(method)
        if not caller or room <= 0 or cap is None:
            return Admission(self.take(caller, method))
        name = method.rsplit("/", 1)[-1]
        ticket = object()

        def free() -> bool:
            return (self._by_method[method] < cap and self._total < lim.slots
                    and self._by_caller[caller] < lim.per_caller)

        with self._lock:
            queue = self._queues.setdefault(method, deque())
            if self._by_caller[caller] >= lim.per_caller:
                return Admission(f"caller {caller} already has {lim.per_caller} calls running")
            running = self._by_method[method]
            if not queue and free():  # nobody waits before it
                self._take_locked(caller, method)
                return Admission()
            if any(c == caller for _, c in queue):
                return Admission(f"{running} {name} calls are running and caller {caller} already waits for one "
                                 "(one place in the queue per caller)")
            if len(queue) >= room:
                return Admission(f"{running} {name} calls are running; queue full ({len(queue)} waiting)")
            queue.append((ticket, caller))  # waits on a queue thread: holds no slot yet
            place = QueuePlace(len(queue), len(queue), running)
        start = clock()
        log.info("%s from %s queued at position %d (%d running)", method, caller, place.position, running)
        try:
            on_queued(place)
        except Exception:  # noqa: BLE001 - the client left before it was told; the loop below sees it
            pass
        with self._lock:
            admitted = False
            try:
                while True:
                    waited = clock() - start
                    if queue[0][0] is ticket and free():
                        queue.popleft()
                        self._take_locked(caller, method)
                        admitted = True
                        self._lock.notify_all()  # the next in line may have a free slot too
                        return Admission(waited=waited, queued=True)
                    if not active():
                        return Admission("the client left while it waited", waited, queued=True, gone=True)
                    if waited >= lim.queue_wait:
                        return Admission(f"waited {waited:.0f} s for one of {cap} {name} slots "
                                         f"(queue limit {lim.queue_wait:g} s)", waited, queued=True)
                    self._lock.wait(min(0.25, lim.queue_wait - waited))
            finally:
                if not admitted:
                    queue.remove(next(e for e in queue if e[0] is ticket))
                    self._lock.notify_all()

    def _take_locked(self, caller: str, method: str) -> None:
        self._total += 1
        self._by_caller[caller] += 1
        self._by_method[method] += 1

    def give(self, caller: str, method: str) -> None:
        if not caller:
            return
        with self._lock:
            self._total -= 1
            self._by_caller[caller] -= 1
            self._by_method[method] -= 1
            self._lock.notify_all()  # a queued call may take the slot


class _Watchdog:
    """Cancels request streams that stay silent longer than their idle limit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, tuple[Any, list[float], float]] = {}
        self._thread: threading.Thread | None = None

    def watch(self, key: int, context: Any, last: list[float], idle: float) -> None:
        with self._lock:
            self._streams[key] = (context, last, idle)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dpagg-idle-watchdog", daemon=True)
                self._thread.start()

    def forget(self, key: int) -> None:
        with self._lock:
            self._streams.pop(key, None)

    def _run(self) -> None:
        while True:
            time.sleep(0.25)
            now = time.monotonic()
            with self._lock:
                idle = [(k, c, i) for k, (c, last, i) in self._streams.items() if now - last[0] > i]
                for k, _, _ in idle:
                    self._streams.pop(k, None)
            for _, context, seconds in idle:
                log.warning("cancelling a request stream that sent nothing for %.0f s", seconds)
                try:
                    context.cancel()
                except Exception:  # the call ended meanwhile
                    pass


_WATCHDOG = _Watchdog()


def _caller(context: Any) -> str:
    """The caller's verified identity, or "" when the slot limits do not apply to it."""
    identity = peer_identity(context)
    if identity is None or identity.role in EXEMPT_ROLES:
        return ""
    return f"{identity.role} {identity.party_id!r}"


def _parse(deserialize: Callable[[bytes], Any] | None, data: bytes, method: str, budget: int,
           context: Any) -> Any:
    name = method.rsplit("/", 1)[-1]
    if len(data) > budget:
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"a {name} request message is {len(data)} bytes, over this method's budget of {budget} "
                      "bytes; it was not parsed. Split the request")
    if deserialize is None:
        return data
    try:
        return deserialize(data)
    except (DecodeError, ValueError, TypeError) as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"the {len(data)}-byte request is not a valid {name} message ({type(exc).__name__}); "
                      "send the dpagg.v1 protobuf message the method expects")


class CallLimiter(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc ships no type information here
    """Applies `CallLimits` to every RPC of a server (see the module docstring)."""

    def __init__(self, limits: CallLimits) -> None:
        self.limits = limits
        self._slots = _Slots(limits)

    def intercept_service(self, continuation: Callable[..., Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_EXEMPT_PREFIXES):
            return handler
        deserialize = handler.request_deserializer
        budget = self.limits.budgets.get(method, 1 << 62)
        streaming = handler.request_streaming
        kind = next(k for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
                    if getattr(handler, k) is not None)
        behavior = getattr(handler, kind)
        returns_stream = kind.endswith("_stream")

        def admitted(request: Any, context: Any) -> Any:
            if not context.is_active():  # the client left while the call waited for a thread
                context.abort(grpc.StatusCode.CANCELLED, "the client is gone; nothing was done")
            caller = _caller(context)
            admission = self._slots.admit(
                caller, method, active=context.is_active,
                on_queued=lambda place: context.send_initial_metadata(((QUEUE_METADATA, place.metadata()),)))
            if admission.gone:
                context.abort(grpc.StatusCode.CANCELLED, "the client is gone; nothing was done")
            if admission.refused:
                log.warning("%s from %s refused: %s", method, caller, admission.refused)
                context.abort(grpc.StatusCode.UNAVAILABLE, f"server busy: {admission.refused}; retry in a moment")
            if admission.queued:
                context.set_trailing_metadata(((QUEUE_WAITED_METADATA, f"{admission.waited:.3f}"),))
            return caller

        def requests_of(raw: Iterator[bytes], context: Any) -> Iterator[Any]:
            last = [time.monotonic()]
            key = id(context)
            _WATCHDOG.watch(key, context, last, self.limits.idle_seconds)
            try:
                for data in raw:
                    last[0] = time.monotonic()
                    yield _parse(deserialize, data, method, budget, context)
            finally:
                _WATCHDOG.forget(key)

        def run(request: Any, context: Any) -> Any:
            caller = admitted(request, context)
            _current.context = context
            try:
                req = requests_of(request, context) if streaming else _parse(deserialize, request, method,
                                                                               budget, context)
                return behavior(req, context)
            finally:
                _current.context = None
                self._slots.give(caller, method)

        def run_stream(request: Any, context: Any) -> Iterator[Any]:
            caller = admitted(request, context)
            _current.context = context
            try:
                req = requests_of(request, context) if streaming else _parse(deserialize, request, method,
                                                                               budget, context)
                yield from behavior(req, context)
            finally:
                _current.context = None
                self._slots.give(caller, method)

        return handler._replace(request_deserializer=None, **{kind: run_stream if returns_stream else run})
