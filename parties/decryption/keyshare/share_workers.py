"""A key-share holder's shares of a large measurement, computed on its local worker pool.

The pool is the decryption server's (`parties.decryption.workers.DecryptPool`), started keyless:
local processes only (spawn start method), no Ray, no socket. Each task names the holder's key
share for the study (`KeyRef`): its file in the holder's key store on this host (mode 0600),
which the worker reads itself, or, for a holder without a key store (the library form, tests),
its bytes through the worker's pipe. The secret never crosses a network. A worker keeps a few
loaded key shares (with a t-of-N key, the participant set's Lagrange-weighted share). A chunk's
c1 s_i (`secret_product`) is computed by the worker that gets the chunk first and returned with
its share; the holder keeps it in its server process (`ThresholdHolder.product`'s cache, as the
in-process path does) and sends it with the chunk's later tasks, so a later measurement of the
chunk, on any worker, only adds its noise.

One chunk's share (`noised_chunk_share`) is the same function in the server process and in a
worker: the chunk's c1 s_i plus the holder's keyed smudging, its keyed uniform pads on the
unmeasured slots and its slice of the DP share, so pooled shares are byte-identical to
in-process ones for the same request (`tests/parties/test_keyshare_workers.py`).

Privacy: what runs where and when. The coordinator (the holder's request thread) keeps every
decision and its order (docs/threshold.md, sections 3 and 3a): the contract and measurement
checks, the c1 digests of the owners' signed aggregate (public), the DP share drawn from its
noise key keyed by the request, then `pooled_shares` computes every chunk's share on the
workers and holds them in the server process, then the charge (or the signed charge log's
check) and only then are shares returned. A refused charge drops them unread; nothing that
leaves the holder depends on the workers before the charge. A worker that dies is replaced and
the chunks not yet computed are computed again: the same bytes (every noise is keyed by the
request and the chunk), charged once.
"""
from __future__ import annotations

import hashlib
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import numpy.typing as npt

from he_partition.core.noise import KeyedRandom
from he_partition.he.bfv import generate_secret_context
from he_partition.he.threshold.decrypt import chunk_share, padded_noise, secret_product
from he_partition.he.threshold.keys import HolderSecret
from he_partition.he.threshold.shamir import participant_secret

from ..workers import DecryptPool, KeyRef, maybe_die

__all__ = ["ShareTask", "holder_pool", "noised_chunk_share", "pooled_shares", "prepare"]

U64 = npt.NDArray[np.uint64]

#: Most key shares (per key and participant set) one worker keeps loaded.
MAX_WORKER_SECRETS = 8

_TEMPLATE: Any = None
_SECRETS: dict[tuple[str, bytes, tuple[int, ...]], HolderSecret] = {}


def noised_chunk_share(ctx: Any, holder: int, key_fp: bytes, product: U64, moduli: Sequence[int], bound: bytes,
                       noise_key: bytes, request: bytes, index: int, chunk_noise: npt.NDArray[np.int64],
                       chunk_mask: npt.NDArray[np.bool_], stream: int) -> bytes:
    """Holder `holder`'s share of upload chunk `index` of one measurement: `product` (c1 s_i) + its noises.

    Privacy: adds this holder's slice `chunk_noise` of its DP share on the `chunk_mask` slots
    (drawn by the caller, `KeyShareService.issue_shares`: epsilon of the measurement, L1
    sensitivity its sensitivity, neighbouring relation add/remove of one person with at most c
    records; charged by the caller before the share leaves), its uniform pad mod t on every
    other slot (`padded_noise`) and its smudging (`chunk_share`), both from `noise_key` keyed by
    the request digest `request` and the chunk, so a repeat gives the same bytes. Who knows the
    noise: only this holder; the combiner sees the sum over the holders.
    """
    at = int(index).to_bytes(4, "big")
    smudge = KeyedRandom(noise_key, b"dpagg/threshold/smudge/v2" + request + at, stream=stream)
    pads = KeyedRandom(noise_key, b"dpagg/threshold/pads/v2" + request + at, stream=stream)
    plain_modulus = int(ctx.seal_context().data.first_context_data().parms().plain_modulus().value())
    dp = padded_noise(chunk_noise, chunk_mask, pads, plain_modulus)
    return chunk_share(ctx, holder, key_fp, product, moduli, bound, dp_noise=dp, rng=smudge)


#: One chunk's task: (key ref, key fingerprint, participants, holder index, the signed c1 (None when its c1 s_i
#: is sent), its c1 s_i (None: not computed yet), c1 digest, noise key, request digest, chunk index, DP slice,
#: measured mask, noise stream).
ShareTask = tuple[KeyRef, bytes, tuple[int, ...], int, "U64 | None", "U64 | None", bytes, bytes, bytes, int,
                  npt.NDArray[np.int64], npt.NDArray[np.bool_], int]
#: A task's answer: (the share, the c1 s_i the worker computed for it, or None when it was sent).
Answer = tuple[bytes, "U64 | None"]


def holder_pool(workers: int, **kw: Any) -> DecryptPool:
    """A key-share holder's pool: `workers` local processes (0 or 1: none), no server key, this module loaded as
    each starts (`kw`: `DecryptPool`'s test options)."""
    return DecryptPool(workers, keyless=True, preload=__name__, **kw)


def prepare() -> None:
    """In a worker as it starts: the BFV parameters made, so the first chunk waits for no set-up."""
    _template()


def _template() -> Any:
    """This worker's BFV parameters (a context whose own keys are never used)."""
    global _TEMPLATE
    if _TEMPLATE is None:
        _TEMPLATE = generate_secret_context()
    return _TEMPLATE


def _keep(cache: dict[Any, Any], key: Any, value: Any, most: int) -> None:
    cache[key] = value  # the newest last
    while len(cache) > most:
        cache.pop(next(iter(cache)))


def _secret(key: KeyRef, fingerprint: bytes, participants: tuple[int, ...]) -> HolderSecret:
    """The holder's share (s_i, or lambda_j S_j for a t-of-N participant set), loaded once per worker."""
    assert key is not None, "a key-share holder's task names its key share"
    name = key if isinstance(key, str) else hashlib.sha256(key).hexdigest()
    got = _SECRETS.pop((name, fingerprint, participants), None)
    if got is None:
        ctx = _template()
        got = HolderSecret.from_bytes(ctx, Path(key).read_bytes() if isinstance(key, str) else key)
        if participants:
            got = participant_secret(ctx, got, participants)
    _keep(_SECRETS, (name, fingerprint, participants), got, MAX_WORKER_SECRETS)
    return got


def _share_task(key: KeyRef, fingerprint: bytes, participants: tuple[int, ...], holder: int, c1: U64 | None,
                product: U64 | None, bound: bytes, noise_key: bytes, request: bytes, index: int,
                chunk_noise: npt.NDArray[np.int64], chunk_mask: npt.NDArray[np.bool_], stream: int) -> Answer:
    """In a worker: one chunk's share (`noised_chunk_share`) and, when it was not sent, the c1 s_i computed for it."""
    maybe_die()
    ctx = _template()
    made = None
    if product is None:
        assert c1 is not None
        made = product = secret_product(ctx, _secret(key, fingerprint, participants),
                                        [int(x) for x in ctx.seal_context().data.first_parms_id()], c1)
    moduli = [int(m.value()) for m in ctx.seal_context().data.first_context_data().parms().coeff_modulus()]
    return noised_chunk_share(ctx, holder, fingerprint, product, moduli, bound, noise_key, request, index,
                              chunk_noise, chunk_mask, stream), made


def pooled_shares(pool: DecryptPool, tasks: Sequence[ShareTask]) -> list[Answer]:
    """Every task's answer, in order, computed on `pool`'s workers; held here until the caller returns the shares.

    A worker that died: the tasks not yet answered run again on a fresh pool (the same bytes), up
    to the pool's retries, then WorkerLostError. Any other failure cancels the rest and is raised.
    """
    futures: list[tuple[ProcessPoolExecutor, Future[Any]]] = [pool.submit_task(_share_task, *t) for t in tasks]
    out: list[Answer] = []
    try:
        for executor, future in futures:
            try:
                out.append(future.result())
            except BrokenProcessPool:
                for _, f in futures:
                    f.cancel()
                return out + pool.run_again(_share_task, tasks[len(out):], executor)
    except BaseException:
        for _, f in futures:
            f.cancel()
        raise
    return out
