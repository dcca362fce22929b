"""The join's oblivious pseudonyms: RFC 9497's OPRF (mode 0x00), its group operations on Curve25519's x-line.

An owner's pseudonym of an identifier x is a function of F(k, x) = SHA-512(len(x) || x ||
len(N) || N || "Finalize"), N = k H(x), where H hashes into the prime-order group of
Curve25519 and k is a key only the key holder has (one per join study, `study_key`). The owner
never learns k and the key holder never learns x: the owner sends B = r H(x) for a fresh scalar
r (`blind`), the key holder answers k B (`blind_evaluate`), the owner unblinds r^-1 k B = k H(x)
and hashes it (`finalize`). B is a uniformly random group element whatever x is, so the key
holder learns only how many evaluations it answered. Without k, no party can compute F of a
guessed identifier; with k (the key holder), no party holds the identifiers. So an owner that
colludes with the computation server can test a guessed identifier only by spending one of the
evaluations the key holder grants it (its quota: parties/decryption/oprf.py).

**The group and its encoding.** RFC 9497's ristretto255-SHA512 suite, with its elements written
as Montgomery u-coordinates instead of ristretto255 encodings, so that every scalar
multiplication is one X25519 call (libsodium's, through PyNaCl: 44 us here, against 93 us for
libsodium's ristretto255 multiplication, which the protocol needs three of per identifier):
- H(x) is RFC 9380's hash_to_ristretto255 (RFC 9497's HashToGroup, `hash_to_group`), written
  as u = s^2 mod p for its encoding s (`line_element`). The ristretto255 decoding of s has
  Edwards y = (1 - s^2) / (1 + s^2), so u = (1 + y) / (1 - y) = 1 / s^2; s^2 is the same point
  plus the 2-torsion point (0, 0), which the multiplications below remove.
- A scalar t becomes the X25519 scalar c = 2^254 + 8m with c = +-t mod the group order
  (`line_scalar`): X25519 clamps c to itself, and as a multiple of 8 it removes any torsion
  component of its input; on u-coordinates t and -t act alike. Every t has such a c but zero and
  the multiples 8j of 8 with 0 < j <= 2^252 - order (about 2^124), and their negatives: a
  fraction of about 2^-126 of the scalars, which a uniform blind or key never hits in practice.
- So the u-coordinates of the prime-order points, with X25519 as the scalar multiplication, are
  the ristretto255 group (up to the sign, which u-coordinates forget): the protocol's algebra,
  its hiding (B is uniform over that group) and its assumptions are RFC 9497's. Only the bytes of
  N differ from the RFC's: its test vectors hold for N read on the x-line (tests).
- The key holder refuses an element that is not a canonical u-coordinate, or is one of the
  low-order points (`LOW_ORDER_U`: X25519's product would be the identity), before it books
  the page (`check_elements`). It does not test whether a u lies on
  the curve rather than its twist (a Python square test would cost three times the
  multiplication): Curve25519 is twist-secure, and with c a multiple of 8 such an input tells
  its sender nothing about k; the sender only spends its own quota on a useless value.

Big batches (`MIN_POOLED_ELEMENTS` elements or more: an owner's blind and finalize, a key
holder's page of evaluations) run in local worker processes (`OprfPool`, one per core up to 16,
spawned at a process's first big batch and reused until it exits): between libsodium's calls Python holds the GIL,
so threads barely scale past two cores. The workers compute the same functions on slices of
the batch, so the results are byte-identical to the in-process path's. Smaller batches, and
every batch on a one-core host, run in this process (a few threads: the libsodium calls
release the GIL).

Where the key goes: the key holder's `blind_evaluate` hands its study key to its own pool's
workers, local processes it spawned on its host, as an argument of each task through the
pool's pipes; a worker holds it only while it evaluates a task, and it never crosses a network.
The owners' blinds stay likewise in their own processes. Workers are spawned (never forked:
the processes that call these batches run gRPC servers and channels), without re-running the
caller's `__main__` (`he_partition.execution.spawning`), and each ends when its parent does.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import sys
import threading
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Sequence, TypeVar

from ..core.errors import InvalidInputError, WorkerLostError
from ..execution.spawning import end_with_parent, usable_cores, without_user_main

__all__ = ["ELEMENT_BYTES", "SCALAR_BYTES", "OUTPUT_BYTES", "CONTEXT", "FIELD_PRIME", "GROUP_ORDER", "LOW_ORDER_U",
           "BASE_U", "derive_key", "study_key", "hash_to_group", "hash_to_scalar", "line_element", "line_scalar",
           "random_element", "blind", "check_elements", "blind_evaluate", "finalize", "evaluate", "blind_scalars",
           "OprfPool", "default_pool", "default_workers", "MIN_POOLED_ELEMENTS"]

log = logging.getLogger("dpagg.oprf")

ELEMENT_BYTES = 32
SCALAR_BYTES = 32
OUTPUT_BYTES = 64
#: contextString of RFC 9497, section 3.1: "OPRFV1-" || I2OSP(mode, 1) || "-" || identifier (mode 0x00: OPRF).
CONTEXT = b"OPRFV1-\x00-ristretto255-SHA512"
_HASH_TO_GROUP_DST = b"HashToGroup-" + CONTEXT
_HASH_TO_SCALAR_DST = b"HashToScalar-" + CONTEXT
_DERIVE_DST = b"DeriveKeyPair" + CONTEXT
#: Elements per thread task in the batch functions.
_TASK = 2048
#: Batches of fewer elements than this run in the calling process: below it, the round trips to the
#: workers (and, at a process's first big batch, the workers' start: a spawn and the import of
#: this module and libsodium, about 0.2 s each, in parallel) cost about what the work saves.
MIN_POOLED_ELEMENTS = 4096
#: Fewest elements per worker task: smaller tasks cost more in pickling and round trips than they balance.
_MIN_PROCESS_TASK = 512
#: Most workers the default pool starts (`default_workers`): an owner's batch or a key holder's page
#: (32,768 elements) gives each of 16 workers 2,048 or more elements.
MAX_DEFAULT_WORKERS = 16

#: Curve25519's field prime p and the order of its prime-order group (ristretto255's order).
FIELD_PRIME = 2 ** 255 - 19
GROUP_ORDER = 2 ** 252 + 27742317777372353535851937790883648493
_INV8 = pow(8, -1, GROUP_ORDER)
#: The canonical u-coordinates of the points of small order on Curve25519 and its twist (libsodium's list): 0 and
#: p - 1 (order 4 and 2), 1, and the two of order 8. A multiple of 8 times any of them is the identity.
LOW_ORDER_U = frozenset({0, 1, FIELD_PRIME - 1,
                         325606250916557431795983626356110631294008115727848805560023387167927233504,
                         39382357235489614581723060781553021112529911719440698176882885853963445705823})
#: The u-coordinate of Curve25519's base point (RFC 7748), a generator of the prime-order group.
BASE_U = (9).to_bytes(ELEMENT_BYTES, "little")

T = TypeVar("T")
R = TypeVar("R")


def _sodium() -> Any:
    """libsodium's ristretto255 functions (`rbcl`), loaded on first use: rbcl writes its bundled library to the
    temporary directory and loads it from there, which a hardened host mounts without exec (the compose
    deployments' read-only containers, which give it a small exec tmpfs as TMPDIR); a server that never evaluates
    a join pseudonym must still start there. The written file is removed once loaded (the mapping stays): each
    process that loads it would otherwise leave 2.7 MB behind in the temporary directory."""
    import rbcl

    global _SODIUM_FILE_REMOVED
    if not _SODIUM_FILE_REMOVED:
        _SODIUM_FILE_REMOVED = True
        path = getattr(sys.modules.get("rbcl._sodium"), "lib_path", None)
        if isinstance(path, str):
            try:
                os.unlink(path)
            except OSError:
                pass
    return rbcl


_SODIUM_FILE_REMOVED = False


def _x25519() -> Any:
    """libsodium's X25519 (PyNaCl's bindings: a compiled extension, nothing written to disk)."""
    import nacl.bindings

    return nacl.bindings


def line_scalar(scalar: bytes) -> bytes:
    """The X25519 scalar c = 2^254 + 8m with c = +-t mod the group order, for t the little-endian bytes `scalar`
    (32 of them, or 64 uniform ones) reduced mod the group order.

    X25519 clamps its scalar (clears the low three bits and bit 255, sets bit 254); c is clamped already, so X25519
    multiplies by c exactly, and on u-coordinates by +-t alike. Refuses zero and the fraction of about 2^-126 of
    scalars for which neither t nor -t has such a c (the multiples of 8 below about 2^127, and their negatives)."""
    t = int.from_bytes(scalar, "little") % GROUP_ORDER
    if t:
        for v in (t, GROUP_ORDER - t):
            m = (v - 2 ** 254) * _INV8 % GROUP_ORDER
            if m < 2 ** 251:
                return (2 ** 254 + 8 * m).to_bytes(SCALAR_BYTES, "little")
    raise InvalidInputError("this scalar has no X25519 form (zero, or one of a fraction of 2^-126): draw another")


def line_element(ristretto: bytes) -> bytes:
    """The ristretto255 element with encoding s as a Curve25519 u-coordinate, s^2 mod p (the module's docstring)."""
    s = int.from_bytes(ristretto, "little")
    return (s * s % FIELD_PRIME).to_bytes(ELEMENT_BYTES, "little")


def _canonical(u: bytes) -> bool:
    """A 32-byte u-coordinate below p (so bit 255 is clear): the one encoding each point has on the wire."""
    return len(u) == ELEMENT_BYTES and int.from_bytes(u, "little") < FIELD_PRIME


def _multiply(scalar: bytes, u: bytes, what: str) -> bytes:
    """X25519(scalar, u) for an X25519 scalar from `line_scalar`; a low-order `u` (the product is the identity) is
    refused, naming `what` it was."""
    try:
        return bytes(_x25519().crypto_scalarmult(scalar, bytes(u)))
    except RuntimeError as exc:  # libsodium refuses an all-zero product
        raise InvalidInputError(f"{what} is a low-order point (its product is the identity)") from exc


def random_element(uniform: bytes) -> bytes:
    """A uniformly random element of the group (as `blind`'s elements are) from 64 uniform bytes: t G for t the bytes
    reduced mod the group order (`line_scalar` reduces them)."""
    return _multiply(line_scalar(uniform), BASE_U, "the base point")


def _i2osp(value: int, length: int) -> bytes:
    return value.to_bytes(length, "big")


def expand_message_xmd(msg: bytes, dst: bytes, length: int) -> bytes:
    """RFC 9380, section 5.3.1, with SHA-512 (b = 64, s = 128 bytes)."""
    if len(dst) > 255 or length > 255 * 64:
        raise InvalidInputError("expand_message_xmd: DST or length too long")
    dst_prime = dst + _i2osp(len(dst), 1)
    ell = -(-length // 64)
    b0 = hashlib.sha512(bytes(128) + msg + _i2osp(length, 2) + b"\x00" + dst_prime).digest()
    out = [hashlib.sha512(b0 + b"\x01" + dst_prime).digest()]
    for i in range(2, ell + 1):
        out.append(hashlib.sha512(bytes(a ^ b for a, b in zip(b0, out[-1])) + _i2osp(i, 1) + dst_prime).digest())
    return b"".join(out)[:length]


def hash_to_group(msg: bytes) -> bytes:
    """HashToGroup of RFC 9497 (hash_to_ristretto255 of RFC 9380 with its DST): a 32-byte encoded element."""
    return bytes(_sodium().crypto_core_ristretto255_from_hash(expand_message_xmd(msg, _HASH_TO_GROUP_DST, 64)))


def hash_to_scalar(msg: bytes, dst: bytes = _HASH_TO_SCALAR_DST) -> bytes:
    """HashToScalar of RFC 9497: 64 bytes of expand_message_xmd, read little-endian, reduced mod the group order."""
    return bytes(_sodium().crypto_core_ristretto255_scalar_reduce(expand_message_xmd(msg, dst, 64)))


def _is_zero(scalar: bytes) -> bool:
    return not any(scalar)


def derive_key(seed: bytes, info: bytes) -> bytes:
    """DeriveKeyPair of RFC 9497 (section 3.2.1): the secret scalar skS for a 32-byte `seed` and public `info`."""
    if len(seed) != 32:
        raise InvalidInputError("an OPRF key seed is 32 bytes")
    derive_input = seed + _i2osp(len(info), 2) + info
    for counter in range(256):
        sk = hash_to_scalar(derive_input + _i2osp(counter, 1), _DERIVE_DST)
        if not _is_zero(sk):
            return sk
    raise InvalidInputError("DeriveKeyPair: no valid key for this seed")  # pragma: no cover (probability 2^-2000)


def study_key(master: bytes, study_id: str, contract_hash: str) -> bytes:
    """The key holder's OPRF key of one join study: DeriveKeyPair(master, "dpagg/join-oprf/v1|study|contract").

    One master secret (in the key holder's key store, never served) gives every study its own
    key, so pseudonyms of one study say nothing about those of another."""
    return derive_key(master, b"dpagg/join-oprf/v1|" + study_id.encode() + b"|" + contract_hash.encode())


def _batched(fn: Callable[[Sequence[T]], list[R]], items: Sequence[T], threads: int | None) -> list[R]:
    n = len(items)
    workers = min(threads or os.cpu_count() or 1, max(1, n // _TASK))
    if workers <= 1:
        return fn(items)
    parts = [items[i:i + _TASK] for i in range(0, n, _TASK)]
    with ThreadPoolExecutor(workers, thread_name_prefix="dpagg-oprf") as pool:
        return [x for part in pool.map(fn, parts) for x in part]


#: The environment variable that sets the default pool's worker count (0 or 1: in-process, on threads).
WORKERS_ENV = "DPAGG_OPRF_WORKERS"


def default_workers() -> int:
    """The default pool's worker count: $DPAGG_OPRF_WORKERS if set, else min(cores this process may use, 16); 0
    (in-process) on one core or in a daemonic process."""
    if multiprocessing.current_process().daemon:  # a daemonic process may not start processes
        return 0
    given = os.environ.get(WORKERS_ENV, "").strip()
    if given:
        if not given.isdigit():
            raise InvalidInputError(f"{WORKERS_ENV} must be a whole number of worker processes, got {given!r}")
        return int(given)
    cores = usable_cores()
    return min(cores, MAX_DEFAULT_WORKERS) if cores > 1 else 0



def _init_worker() -> None:
    """A worker's start: watch the parent, load libsodium once."""
    end_with_parent()
    _sodium()
    _x25519()


def _ready() -> None:
    """A no-op: submitting it spawns a worker of a new pool."""


class OprfPool:
    """`workers` local processes that run the big OPRF batches; spawned at `start` or at the first batch that uses
    them, kept until `close` (the default pool: until the process exits).

    `workers` <= 1: no processes; `uses_processes` is False and every batch runs in the calling process.
    `min_elements`: the smallest batch sent to the workers. `task`: elements per worker task (default: about four
    tasks per worker, at least 512 elements each). A worker that dies fails the batch it was in with
    WorkerLostError (nothing hangs); the next batch starts a new pool.
    """

    def __init__(self, workers: int | None = None, *, min_elements: int = MIN_POOLED_ELEMENTS,
                 task: int | None = None) -> None:
        self.workers = default_workers() if workers is None else workers
        if self.workers < 0:
            raise InvalidInputError(f"OPRF workers must be >= 0 (0 or 1: in-process), got {self.workers}")
        if min_elements < 1 or (task is not None and task < 1):
            raise InvalidInputError("an OPRF pool's min_elements and task are positive")
        self.min_elements = min_elements
        self.task = task
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def uses_processes(self, count: int) -> bool:
        """Whether a batch of `count` elements runs in the workers."""
        return self.workers > 1 and count >= self.min_elements

    def _pool(self) -> ProcessPoolExecutor:
        """The executor, created with all its workers spawned (caller holds `_lock`)."""
        if self._executor is None:
            executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                           initializer=_init_worker)
            with without_user_main():  # the workers start now: they must not run the caller's script
                for _ in range(self.workers):  # each submit finds no idle worker and spawns one
                    executor.submit(_ready)
            self._executor = executor
        return self._executor

    def start(self) -> None:
        """Spawn the workers now, without waiting for them (a caller about to send a big batch); no-op in-process."""
        if self.workers > 1:
            with self._lock:
                self._pool()

    def _discard(self, broken: ProcessPoolExecutor) -> None:
        """Drop a broken executor (if it is still ours) and end its surviving workers."""
        with self._lock:
            if self._executor is broken:
                self._executor = None
        for process in list((getattr(broken, "_processes", None) or {}).values()):
            if process.is_alive():
                process.kill()
        broken.shutdown(wait=False, cancel_futures=True)

    def map(self, fn: Callable[..., list[R]], items: Sequence[T], *args: Any) -> list[R]:
        """fn(part, *args) for consecutive parts of `items` in the workers, concatenated in order: fn's value on
        the whole of `items` for any fn that maps elements one by one. `fn` is a module-level function (workers
        import it by name); its errors are raised here as the worker raised them."""
        n = len(items)
        size = self.task or max(_MIN_PROCESS_TASK, -(-n // (4 * self.workers)))
        parts = [items[i:i + size] for i in range(0, n, size)]
        with self._lock:
            executor = self._pool()
        try:
            futures: list[Future[list[R]]] = [executor.submit(fn, part, *args) for part in parts]
            results = [f.result() for f in futures]
        except BrokenProcessPool as exc:
            log.error("an OPRF worker process ended abruptly: %s", exc)
            self._discard(executor)
            raise WorkerLostError("an OPRF worker process ended abruptly (see the log: killed, out of memory?); "
                                  "this batch gave no result and the next one starts new workers") from exc
        return [x for part in results for x in part]

    def close(self) -> None:
        """End the workers (waiting for the batches in work); a later batch spawns new ones."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


_DEFAULT: OprfPool | None = None
_DEFAULT_LOCK = threading.Lock()


def default_pool() -> OprfPool:
    """This process's pool (`default_workers` workers), created at first use (no process starts until a big batch
    or `start`), closed when the process exits."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = OprfPool()
            # Not atexit: a multiprocessing child (an owner's process in the benchmarks) runs no atexit handler,
            # and on its way out joins its children, these workers among them, before the executor's own exit
            # hook could stop them; finalizers of priority >= 0 run before that join (and at a main process's
            # exit). Above the queues' finalizers (priority 10), which stop the feeder that carries the workers'
            # stop signal.
            multiprocessing.util.Finalize(None, _DEFAULT.close, exitpriority=100)
        return _DEFAULT


def _run(fn: Callable[..., list[R]], items: Sequence[T], args: tuple[Any, ...], threads: int | None,
         pool: OprfPool | None) -> list[R]:
    """fn over a batch: in `pool`'s workers (None: the default pool) if it is big enough, else in threads here."""
    if pool is None and len(items) >= MIN_POOLED_ELEMENTS:
        pool = default_pool()
    if pool is not None and pool.uses_processes(len(items)):
        try:
            pool.start()
        except OSError as exc:  # no processes here (a sandbox without semaphores or fork/exec): stay in-process
            log.warning("OPRF worker processes cannot start (%s): batches run in this process", exc)
            pool.workers = 0
        else:
            return pool.map(fn, items, *args)
    return _batched(lambda part: fn(part, *args), items, threads)


def _scalars_part(indices: Sequence[int], seed: bytes, label: bytes) -> list[bytes]:
    out = []
    for i in indices:
        s = bytes(_sodium().crypto_core_ristretto255_scalar_reduce(hashlib.sha512(
            b"dpagg/oprf-" + label + b"|" + seed + b"|" + int(i).to_bytes(8, "big")).digest()))
        out.append(s if not _is_zero(s) else (1).to_bytes(32, "little"))
    return out


def blind_scalars(seed: bytes, count: int, *, label: bytes = b"blind", pool: OprfPool | None = None) -> list[bytes]:
    """`count` non-zero scalars derived from a 32-byte secret `seed` (uniform mod the order, as RFC 9497's random
    blinds): a re-run with the same seed sends the same blinded elements, so the key holder's once-per-study
    rule still answers it. A big batch is derived in `pool`'s workers (None: this process's default pool; the
    seed goes only to this process's own local workers), a small one here: the same scalars either way."""
    return _run(_scalars_part, list(range(count)), (bytes(seed), bytes(label)), 1, pool)


def _blind_part(pairs: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
    return [_multiply(line_scalar(r), line_element(hash_to_group(x)), "an input's hash") for x, r in pairs]


def blind(inputs: Sequence[bytes], blinds: Sequence[bytes], *, threads: int | None = None,
          pool: OprfPool | None = None) -> list[bytes]:
    """Blind of RFC 9497 for a batch: r_i H(x_i) for each input x_i and its (secret, non-zero) blind r_i, as
    u-coordinates.

    A big batch runs in `pool`'s workers (None: this process's default pool), a small one in `threads` threads."""
    if len(inputs) != len(blinds):
        raise InvalidInputError("one blind per input")
    return _run(_blind_part, list(zip(inputs, blinds)), (), threads, pool)


def check_elements(elements: Sequence[bytes]) -> None:
    """Refuse (InvalidInputError) anything that is not a canonical 32-byte u-coordinate, and the low-order points
    (whose product would be the identity), before any work is booked (under a microsecond each: no workers)."""
    if not all(_canonical(e) for e in elements):
        raise InvalidInputError("a blinded element is not a canonical Curve25519 u-coordinate (32 bytes, below "
                                "2^255 - 19)")
    if any(int.from_bytes(e, "little") in LOW_ORDER_U for e in elements):
        raise InvalidInputError("a blinded element is a low-order point (its product would be the identity)")


def _evaluate_part(elements: Sequence[bytes], key: bytes) -> list[bytes]:
    check_elements(elements)
    scalar = line_scalar(key)
    return [_multiply(scalar, e, "a blinded element") for e in elements]


def blind_evaluate(key: bytes, elements: Sequence[bytes], *, threads: int | None = None,
                   pool: OprfPool | None = None) -> list[bytes]:
    """BlindEvaluate of RFC 9497 for a batch: k B_i. Refuses anything that is not a canonical u-coordinate, and a
    low-order element (the module's docstring says why a twist point needs no test).

    A big batch runs in `pool`'s workers (None: this process's default pool), a small one in `threads` threads.
    The key goes to those workers only: local processes this process spawned, through their pipes."""
    return _run(_evaluate_part, list(elements), (bytes(key),), threads, pool)


def _output(x: bytes, n: bytes) -> bytes:
    """RFC 9497's Finalize hash of input x and its unblinded element N."""
    return hashlib.sha512(_i2osp(len(x), 2) + x + _i2osp(len(n), 2) + n + b"Finalize").digest()


def _finalize_part(triples: Sequence[tuple[bytes, bytes, bytes]]) -> list[bytes]:
    inverses = _inverses([r for _, r, _ in triples])
    out = []
    for (x, _, z), r_inv in zip(triples, inverses):
        if not _canonical(z):
            raise InvalidInputError("an evaluated element is not a canonical Curve25519 u-coordinate")
        out.append(_output(x, _multiply(line_scalar(r_inv), z, "an evaluated element")))
    return out


def finalize(inputs: Sequence[bytes], blinds: Sequence[bytes], evaluated: Sequence[bytes], *,
             threads: int | None = None, pool: OprfPool | None = None) -> list[bytes]:
    """Finalize of RFC 9497 for a batch: SHA-512(I2OSP(len(x), 2) || x || I2OSP(32, 2) || u(r^-1 Z) || "Finalize").

    A big batch runs in `pool`'s workers (None: this process's default pool), a small one in `threads` threads."""
    if not len(inputs) == len(blinds) == len(evaluated):
        raise InvalidInputError(f"{len(evaluated)} evaluated elements for {len(inputs)} inputs")
    return _run(_finalize_part, list(zip(inputs, blinds, evaluated)), (), threads, pool)


def _inverses(scalars: Sequence[bytes]) -> list[bytes]:
    """r^-1 mod the group order for each non-zero scalar r, with one inversion for the whole batch (Montgomery's
    trick: prefix products, one inversion, then two multiplications back per scalar; an inversion costs about 34
    us against 0.7 us for a multiplication). Exactly the values a per-scalar inversion gives."""
    sodium = _sodium()
    if any(_is_zero(r) for r in scalars):
        raise InvalidInputError("a blind is zero")
    prefix: list[bytes] = []
    acc = b""
    for r in scalars:
        acc = bytes(r) if not prefix else bytes(sodium.crypto_core_ristretto255_scalar_mul(acc, bytes(r)))
        prefix.append(acc)
    if not prefix:
        return []
    inv = bytes(sodium.crypto_core_ristretto255_scalar_invert(prefix[-1]))
    out: list[bytes] = [b""] * len(scalars)
    for i in range(len(scalars) - 1, 0, -1):
        out[i] = bytes(sodium.crypto_core_ristretto255_scalar_mul(inv, prefix[i - 1]))
        inv = bytes(sodium.crypto_core_ristretto255_scalar_mul(inv, bytes(scalars[i])))
    out[0] = inv
    return out


def evaluate(key: bytes, x: bytes) -> bytes:
    """The PRF directly (what blind, blind_evaluate and finalize compute together): only the key's holder can."""
    return _output(x, _multiply(line_scalar(key), line_element(hash_to_group(x)), "an input's hash"))
