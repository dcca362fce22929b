"""A join owner's oblivious pseudonyms from K key-share holders: each page to a route of t holders, their answers added.

The form comes from the signed contract only: its key holders are the seal keys it pins (K, in
holder order) and t is its upload keys' split (`seal_threshold`, 0 meaning K-of-K); nothing the
computation server says picks them. Each page goes to the first t holders that are up, in
parallel; a holder that is unavailable is dropped and the page is sent again on the next
route (the holders that answered it already answer the same elements again, and book nothing
new). The answers are added (he_partition.join.toprf.combine) and unblinded as one key's.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, Sequence

import grpc

from he_partition.core.errors import InvalidInputError
from he_partition.join import oprf, toprf

from ..common.contract import StudyContract
from ..common.errors import FailedPreconditionError, ServiceError

__all__ = ["SharedEvaluator", "holders_form", "shared_evaluations", "shared_batch", "shared_outputs"]

log = logging.getLogger("dpagg.join")


class SharedEvaluator(Protocol):
    """One key-share holder as an owner reaches it: its answer to one page on a route."""

    def evaluate_shared(self, *, study_id: str, owner_id: str, contract_hash: str, page: int,
                        route: Sequence[int], elements: Sequence[bytes]) -> list[bytes]: ...


def holders_form(contract: StudyContract) -> tuple[int, int]:
    """(K, t) of the study's shared OPRF key, from its contract: K pinned seal keys, t its split (0: K)."""
    holders = len(contract.holder_seal_keys)
    if holders < 2:
        raise InvalidInputError(f"join study {contract.study_id} pins no key-share holders: its pseudonyms come "
                                "from the single key holder")
    t = contract.seal_threshold or holders
    toprf.key_sets(holders, t)
    return holders, t


def _down(exc: BaseException) -> bool:
    return isinstance(exc, ServiceError) and exc.code in (grpc.StatusCode.UNAVAILABLE,
                                                          grpc.StatusCode.DEADLINE_EXCEEDED)


def shared_evaluations(holders: Sequence[SharedEvaluator | None], contract: StudyContract, owner_id: str,
                       elements: Sequence[bytes], *, page_elements: int) -> list[bytes]:
    """k B for each blinded element (ristretto255), in pages of `page_elements` numbered from 0, each from t of the
    contract's K holders (`holders[i]`: holder i, None when this owner has no address for it).

    Raises FailedPreconditionError when fewer than t holders are up; any other refusal of a holder as it came."""
    k, t = holders_form(contract)
    if len(holders) != k:
        raise InvalidInputError(f"join study {contract.study_id} pins {k} key holders; {len(holders)} given")
    up = [i for i, h in enumerate(holders) if h is not None]
    out: list[bytes] = []
    with ThreadPoolExecutor(max(1, t), thread_name_prefix="dpagg-join-holders") as pool:
        for page, start in enumerate(range(0, len(elements), page_elements)):
            chunk = list(elements[start:start + page_elements])
            while True:
                if len(up) < t:
                    raise FailedPreconditionError(
                        f"join study {contract.study_id}: {len(up)} of its {k} key holders are up, its pseudonyms "
                        f"need {t}; nothing more was sent (run again when they are)")
                route = up[:t]
                futures = {i: pool.submit(holders[i].evaluate_shared,  # type: ignore[union-attr]
                                          study_id=contract.study_id, owner_id=owner_id,
                                          contract_hash=contract.contract_hash, page=page, route=route,
                                          elements=chunk) for i in route}
                answers, failed = [], []
                for i, f in futures.items():
                    try:
                        answers.append(f.result())
                    except Exception as exc:
                        if not _down(exc):
                            raise
                        log.warning("key holder %d is unavailable (%s): page %d goes to another route", i, exc, page)
                        failed.append(i)
                if not failed:
                    break
                up = [i for i in up if i not in failed]
            if any(len(a) != len(chunk) for a in answers):
                raise InvalidInputError(f"a key holder answered page {page} with another number of elements")
            out.extend(toprf.combine(answers))
    return out


def shared_batch(secret: bytes, inputs: list[bytes], pads: int) -> tuple[list[bytes], list[bytes], list[int]]:
    """`join.evaluation_batch` for key-share holders: (the blinded ristretto255 elements to send, sorted; the blinds
    of `inputs`; where each input's element is in the batch). Blinds and padding come from `secret`, so a re-run
    sends the same pages; the padding elements are t G for uniform t, as uniform as the blinded elements."""
    seed = hmac.new(secret, b"oprf-blinds", hashlib.sha256).digest()
    order = sorted(range(len(inputs)), key=lambda i: inputs[i])
    scalars = oprf.blind_scalars(seed, len(inputs))
    blinds: list[bytes] = [b""] * len(inputs)
    for k, i in enumerate(order):
        blinds[i] = scalars[k]
    elements = toprf.blind(inputs, blinds)
    sodium = oprf._sodium()
    padding = [bytes(sodium.crypto_scalarmult_ristretto255_base(bytes(sodium.crypto_core_ristretto255_scalar_reduce(
        hashlib.sha512(b"dpagg/oprf-pad|" + seed + j.to_bytes(8, "big")).digest())))) for j in range(pads)]
    batch = sorted(elements + padding)
    where = {e: k for k, e in enumerate(batch)}
    return batch, blinds, [where[e] for e in elements]


def shared_outputs(holders: Sequence[SharedEvaluator | None], contract: StudyContract, owner_id: str, secret: bytes,
                   inputs: list[bytes], pads: int, *, page_elements: int) -> list[bytes]:
    """The oblivious PRF value of each input under the study's shared key: blinded, evaluated by t of the contract's
    holders page by page (`shared_evaluations`), added and unblinded (equal to the single key's output under k)."""
    batch, blinds, where = shared_batch(secret, inputs, pads)
    combined = shared_evaluations(holders, contract, owner_id, batch, page_elements=page_elements)
    return toprf.finalize(inputs, blinds, [combined[k] for k in where])
