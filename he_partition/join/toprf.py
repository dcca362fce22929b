"""The join's oblivious pseudonyms with the OPRF key shared among K key holders, any t of them answering (t = K, K - 1).

The pseudonym is the single key holder's (he_partition.join.oprf): F(k, x) = SHA-512(len(x) || x ||
len(N) || N || "Finalize"), N the u-coordinate of k H(x); only k is now a sum no party holds.

**The key: replicated additive shares, dealt by nobody.** k = sum of r_A over the sets A of
K - t + 1 holders (`key_sets`), and r_A is known to the holders in A only:
- t = K (K-of-K): the sets are the single holders, r_{i} = a scalar holder i derives from its own
  master secret (`factor_key`);
- t = K - 1 (2-of-3, 3-of-4, ...): the sets are the pairs, r_{i,j} = a scalar holders i and j
  both derive from their X25519 Diffie-Hellman secret (each holder's seal key with the other's,
  pinned in the study's contract): no message, no dealer.
Any t holders S cover every A (|A| + |S| = K + 1), so they apply all of k: each r_A once, by the
first holder of A in S (`route_scalar`). Any t - 1 holders miss the set of the K - t + 1 others,
so they know nothing of k. Larger sets (t < K - 1) would need a key known to three or more holders,
which pairwise secrets do not give: refused (`key_sets`).

**Why ristretto255 and not the x-line.** The holders of a route answer in parallel and the owner
adds their answers: sum_j s_j B = k B. Addition needs group elements (RFC 9496's ristretto255
through libsodium): u-coordinates have none. Multiplicative factors applied in turn would stay on
the x-line (44 against 93 us per multiplication) but serialize the holders, let each see the
previous one's output, and, with replicated factors and a quota at each holder, let a colluding
owner and computation server route pages through different t-sets: 3q/2 evaluations at 2-of-3
for per-holder quotas q (docs/join.md, "Oblivious pseudonyms with key holders").

**The quota holds at q whatever the routing** (t > K/2, true of every form built here). Each
holder's answer on page p of route S carries a zero-sum mask: holder j multiplies element i by
s_j(S) + z_j, with z_j = sum over the other holders l of S of +-PRF(m_{jl}; study, owner, p, S,
page digest, i) (`route_scalar`: + if j < l, - else, so the masks of S cancel in the sum; m_{jl}
from the pair's Diffie-Hellman secret). So answers combine only within one page index, one route
and one page; a holder answers each page index once per owner (the same elements again: the same
page, any route) and page p only for elements p x PAGE .. of the owner's quota (the holder's
book: parties.decryption.oprf). Two routes share a holder (t > K/2), so every page index yields
at most one evaluated set: at most q evaluations however the pages are routed. K-of-K has one
route: no masks needed (each holder answers at most q elements, and every evaluation needs all).

The owner blinds as RFC 9497 does with ristretto255 (B = r H(x), `blind`), adds the t answers
(`combine`) and unblinds on the x-line (`finalize`: X25519 of r^-1 with the sum's u-coordinate,
whose 8-multiple scalar also drops the torsion of s^2), so its output equals the single-key
`oprf.finalize` under k: the same pseudonyms the single key holder's path gives under that key.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Mapping, Sequence

from ..core.errors import InvalidInputError
from . import oprf

__all__ = ["key_sets", "factor_key", "HolderKey", "holder_key", "route_scalar", "check_route", "check_elements",
           "blind", "evaluate_share", "combine", "finalize", "combined_key", "IDENTITY"]

#: The ristretto255 encoding of the identity: refused as a blinded element (its product tells nothing).
IDENTITY = bytes(32)
_FACTOR = b"dpagg/join-toprf/v1/factor|"
_MASK = b"dpagg/join-toprf/v1/mask|"


def key_sets(holders: int, threshold: int) -> list[tuple[int, ...]]:
    """The sets A of K - t + 1 holders that each hold one additive part r_A of the study's key, in order.

    Refuses t outside [2, K] and any t below K - 1 (their sets have three or more holders: a part known to three
    needs a dealing the pairwise secrets do not give; not built)."""
    if holders < 2 or not 2 <= threshold <= holders:
        raise InvalidInputError(f"a shared OPRF key needs 2 <= t <= K holders, got t = {threshold}, K = {holders}")
    if holders - threshold + 1 > 2:
        raise InvalidInputError(f"a {threshold}-of-{holders} OPRF key would need parts known to "
                                f"{holders - threshold + 1} holders each; only K-of-K and (K-1)-of-K are built")
    return list(combinations(range(holders), holders - threshold + 1))


def factor_key(seed: bytes, study_id: str, contract_hash: str, part: Sequence[int]) -> int:
    """r_A of study `study_id` for set `part` from a secret `seed` its holders share (a holder's own master
    secret for a one-holder set, the pair's Diffie-Hellman secret for two): RFC 9497's DeriveKeyPair, never 0."""
    info = (_FACTOR + study_id.encode() + b"|" + contract_hash.encode() + b"|"
            + ",".join(str(i) for i in part).encode())
    return int.from_bytes(oprf.derive_key(hashlib.sha256(seed).digest(), info), "little")


@dataclass(frozen=True)
class HolderKey:
    """Holder `index`'s part of one study's shared OPRF key: its r_A (A containing it) and its mask keys m_{jl}."""

    index: int
    holders: int
    threshold: int
    study_id: str
    parts: Mapping[tuple[int, ...], int]
    masks: Mapping[int, bytes] = field(default_factory=dict)


def holder_key(index: int, holders: int, threshold: int, study_id: str, contract_hash: str, *,
               own_seed: bytes = b"", pair_seeds: Mapping[int, bytes] | None = None) -> HolderKey:
    """Holder `index`'s part of study `study_id`'s key: from `own_seed` (its master secret; K-of-K) or from
    `pair_seeds` (l -> the Diffie-Hellman secret of this holder and holder l, for every other holder; (K-1)-of-K)."""
    sets = [a for a in key_sets(holders, threshold) if index in a]
    if not 0 <= index < holders:
        raise InvalidInputError(f"holder index {index} is outside [0, {holders})")
    pairs = dict(pair_seeds or {})
    if threshold == holders:
        if len(own_seed) != 32:
            raise InvalidInputError("a K-of-K OPRF key part is derived from the holder's 32-byte master secret")
        return HolderKey(index, holders, threshold, study_id, {(index,): factor_key(own_seed, study_id,
                                                                                    contract_hash, (index,))})
    others = [h for h in range(holders) if h != index]
    if sorted(pairs) != others or any(len(pairs[h]) != 32 for h in others):
        raise InvalidInputError(f"a {threshold}-of-{holders} OPRF key part needs a 32-byte secret with each other "
                                f"holder ({others}), got {sorted(pairs)}")
    parts = {a: factor_key(pairs[a[0] if a[1] == index else a[1]], study_id, contract_hash, a) for a in sets}
    masks = {h: hmac.new(pairs[h], _MASK + study_id.encode() + b"|" + contract_hash.encode(),
                         hashlib.sha256).digest() for h in others}
    return HolderKey(index, holders, threshold, study_id, parts, masks)


def check_route(key: HolderKey, route: Sequence[int]) -> tuple[int, ...]:
    """The route as sorted holder indices: t distinct holders, this holder among them (else InvalidInputError)."""
    s = tuple(sorted(int(h) for h in route))
    if len(set(s)) != len(s) or len(s) != key.threshold or not all(0 <= h < key.holders for h in s):
        raise InvalidInputError(f"a route names {key.threshold} distinct holders of {key.holders}, got {list(route)}")
    if key.index not in s:
        raise InvalidInputError(f"the route {list(s)} does not include holder {key.index}, which was asked")
    return s


def route_scalar(key: HolderKey, route: Sequence[int], owner_id: str, page: int, digest: bytes,
                 count: int) -> list[int]:
    """Holder `key.index`'s scalar for each of `count` elements of an owner's page on `route` (the module's
    docstring): the parts r_A it applies on that route (A's first holder in the route) plus the element's mask."""
    s = check_route(key, route)
    base = sum(r for a, r in key.parts.items() if min(h for h in a if h in s) == key.index) % oprf.GROUP_ORDER
    if key.threshold == key.holders:
        return [base] * count
    out = [base] * count
    head = (b"|" + owner_id.encode() + b"|" + str(int(page)).encode() + b"|" + ",".join(map(str, s)).encode()
            + b"|" + digest)
    for other in s:
        if other == key.index:
            continue
        sign = 1 if key.index < other else -1
        m = key.masks[other]
        for i in range(count):
            z = int.from_bytes(hmac.new(m, head + i.to_bytes(4, "big"), hashlib.sha512).digest(), "little")
            out[i] = (out[i] + sign * z) % oprf.GROUP_ORDER
    return out


def _sodium() -> Any:
    """libsodium's ristretto255 functions (loaded on first use: `oprf._sodium`)."""
    return oprf._sodium()


def _mul(scalar: int, element: bytes, what: str) -> bytes:
    try:
        return bytes(_sodium().crypto_scalarmult_ristretto255(scalar.to_bytes(32, "little"), bytes(element)))
    except (RuntimeError, ValueError) as exc:  # libsodium refuses an identity product
        raise InvalidInputError(f"{what}: its product is the identity") from exc


def check_elements(elements: Sequence[bytes]) -> None:
    """Refuse (InvalidInputError) anything that is not a canonical ristretto255 encoding, and the identity, before
    any work is booked."""
    sodium = _sodium()
    for e in elements:
        if len(e) != 32 or e == IDENTITY or not sodium.crypto_core_ristretto255_is_valid_point(bytes(e)):
            raise InvalidInputError("a blinded element is not a canonical ristretto255 encoding of a non-identity "
                                    "element (32 bytes)")


def _blind_part(pairs: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
    return [_mul(int.from_bytes(r, "little"), oprf.hash_to_group(x), "an input's hash") for x, r in pairs]


def blind(inputs: Sequence[bytes], blinds: Sequence[bytes], *, pool: oprf.OprfPool | None = None) -> list[bytes]:
    """RFC 9497's Blind with ristretto255 elements for a batch: r_i H(x_i) for each input and its non-zero blind."""
    if len(inputs) != len(blinds):
        raise InvalidInputError("one blind per input")
    return oprf._run(_blind_part, list(zip(inputs, blinds)), (), 1, pool)


def _evaluate_part(pairs: Sequence[tuple[int, bytes]]) -> list[bytes]:
    return [_mul(s, e, "a blinded element") for s, e in pairs]


def evaluate_share(key: HolderKey, route: Sequence[int], owner_id: str, page: int, elements: Sequence[bytes], *,
                   pool: oprf.OprfPool | None = None) -> list[bytes]:
    """Holder `key.index`'s answer to one page of an owner's blinded elements on `route`: (s_j + z_ji) B_i each
    (`route_scalar`), ristretto255 encodings. Refuses invalid elements before any multiplication."""
    check_elements(elements)
    digest = hashlib.sha256(b"".join(elements)).digest()
    scalars = route_scalar(key, route, owner_id, page, digest, len(elements))
    return oprf._run(_evaluate_part, list(zip(scalars, elements)), (), 1, pool)


def combine(answers: Sequence[Sequence[bytes]]) -> list[bytes]:
    """The sum of the route's answers, element by element: k B_i when every holder answered the same page."""
    if not answers or len({len(a) for a in answers}) != 1:
        raise InvalidInputError("every holder of the route answers every element of the page")
    sodium = _sodium()
    out = []
    for column in zip(*answers):
        acc = bytes(column[0])
        for e in column[1:]:
            acc = bytes(sodium.crypto_core_ristretto255_add(acc, bytes(e)))
        out.append(acc)
    return out


def _finalize_part(triples: Sequence[tuple[bytes, bytes, bytes]]) -> list[bytes]:
    inverses = oprf._inverses([r for _, r, _ in triples])
    sodium = _sodium()
    out = []
    for (x, _, z), r_inv in zip(triples, inverses):
        if len(z) != 32 or not sodium.crypto_core_ristretto255_is_valid_point(bytes(z)):
            raise InvalidInputError("a combined element is not a ristretto255 encoding (a holder answered garbage)")
        out.append(oprf._output(x, oprf._multiply(oprf.line_scalar(r_inv), oprf.line_element(z),
                                                  "a combined element")))
    return out


def finalize(inputs: Sequence[bytes], blinds: Sequence[bytes], combined: Sequence[bytes], *,
             pool: oprf.OprfPool | None = None) -> list[bytes]:
    """The PRF outputs from the combined answers: Finalize on the x-line (u of r^-1 k B = u of k H(x)), so each
    equals `oprf.evaluate(k, x)` for the combined key k."""
    if not len(inputs) == len(blinds) == len(combined):
        raise InvalidInputError(f"{len(combined)} combined elements for {len(inputs)} inputs")
    return oprf._run(_finalize_part, list(zip(inputs, blinds, combined)), (), 1, pool)


def combined_key(keys: Sequence[HolderKey]) -> bytes:
    """k = sum of every r_A, from holders' parts that cover every set (a reference for tests and benchmarks: in a
    deployment no party holds these parts together)."""
    if not keys:
        raise InvalidInputError("no key parts")
    parts: dict[tuple[int, ...], int] = {}
    for key in keys:
        for a, r in key.parts.items():
            if parts.setdefault(a, r) != r:
                raise InvalidInputError(f"holders disagree on the part of set {a}")
    sets = key_sets(keys[0].holders, keys[0].threshold)
    if sorted(parts) != sets:
        raise InvalidInputError(f"the parts cover sets {sorted(parts)}, not all of {sets}")
    return (sum(parts.values()) % oprf.GROUP_ORDER).to_bytes(32, "little")
