"""Textbook Shamir sharing of a 32-byte key over the prime field GF(P), P = 2^256 + 297: any t of N shares give it.

An owner of a study whose key holders hold a t-of-N key (`StudyContract.seal_threshold` t)
splits its upload key k (`parties.common.sealing`) so that any t holders' shares open it: read as
a big-endian integer, k < 2^256 < P is the constant term of f(x) = k + a_1 x + ... + a_{t-1} x^{t-1}
mod P, and holder j's share is f(x_j) with x_j = j + 1 (x = 0 is where the key sits; the same
points as the study key's shares, `he_partition.he.threshold.shamir.evaluation_point`), written
as SHARE_BYTES big-endian bytes. Any t shares give k back by Lagrange interpolation at 0
(`combine_key`); fewer than t are consistent with every key (for every candidate key there is
exactly one polynomial of degree t - 1 through it and the given shares), so they say nothing of
it as long as a_1 .. a_{t-1} are uniform mod P.

The coefficients come from the caller (`split_key`'s `coefficient(m)`: 64 bytes, reduced mod P,
so off uniform by at most 2^-255): the sealing derives them from the key itself with HKDF, as it
derives today's XOR shares, so that a retried upload seals to the same bytes. Nothing here is
noise or budget; nothing is stored.
"""
from __future__ import annotations

from typing import Callable, Mapping

from he_partition.core.errors import InvalidInputError

__all__ = ["KEY_BYTES", "PRIME", "SHARE_BYTES", "check_split_threshold", "combine_key", "split_key"]

#: The field's prime: the least prime above 2^256 (so every 32-byte key is a field element).
PRIME = (1 << 256) + 297
#: Bytes of one share (a field element below P < 2^257).
SHARE_BYTES = 33
KEY_BYTES = 32


def _point(holder: int) -> int:
    return int(holder) + 1


def check_split_threshold(threshold: int, holders: int) -> None:
    """Refuse (InvalidInputError) a t that is not a strict majority of the N holders below N: N/2 < t < N.

    t = N keeps the XOR split; a majority makes every two sets of t holders share one (the close's argument,
    docs/threshold.md section 10)."""
    if isinstance(threshold, bool) or not isinstance(threshold, int) or not holders // 2 < threshold < holders:
        raise InvalidInputError(f"an upload key split t-of-N needs N/2 < t < N = {holders} (a strict majority of "
                                f"the key holders; t = N keeps the XOR split), got t = {threshold!r}")


def split_key(key: bytes, threshold: int, holders: int, coefficient: Callable[[int], bytes]) -> list[bytes]:
    """The N = `holders` shares of `key` (any `threshold` of them give it), share j for holder j, in holder order.

    `coefficient(m)` gives at least 64 bytes for a_m, m = 1 .. t - 1 (reduced mod P)."""
    check_split_threshold(threshold, holders)
    if len(key) != KEY_BYTES:
        raise InvalidInputError(f"an upload key has {KEY_BYTES} bytes, got {len(key)}")
    raw = [coefficient(m) for m in range(1, threshold)]
    if any(len(r) < 64 for r in raw):
        raise InvalidInputError("each Shamir coefficient needs at least 64 bytes of randomness")
    coefficients = [int.from_bytes(key, "big")] + [int.from_bytes(r, "big") % PRIME for r in raw]
    out = []
    for j in range(holders):
        x, acc = _point(j), 0
        for c in reversed(coefficients):  # Horner
            acc = (acc * x + c) % PRIME
        out.append(acc.to_bytes(SHARE_BYTES, "big"))
    return out


def _value(holder: int, share: bytes) -> int:
    if len(share) != SHARE_BYTES:
        raise InvalidInputError(f"holder {holder}'s share of an upload key has {len(share)} bytes, expected "
                                f"{SHARE_BYTES} (a t-of-N share)")
    y = int.from_bytes(share, "big")
    if y >= PRIME:
        raise InvalidInputError(f"holder {holder}'s share of an upload key is not below the field's prime")
    return y


def _at(points: Mapping[int, int], x: int) -> int:
    """The polynomial of degree len(points) - 1 through `points` (x -> y), evaluated at `x` (Lagrange)."""
    total = 0
    for xj, yj in points.items():
        num = den = 1
        for xm in points:
            if xm != xj:
                num = num * (x - xm) % PRIME
                den = den * (xj - xm) % PRIME
        total = (total + yj * num * pow(den, -1, PRIME)) % PRIME
    return total


def combine_key(shares: Mapping[int, bytes], threshold: int) -> bytes:
    """The key from holder index -> share, at least `threshold` of them (InvalidInputError otherwise).

    The first t shares in holder order give the key; every further share must lie on the same polynomial,
    and the key must be below 2^256 (InvalidInputError: the shares disagree, so one of them is not the
    holder's share of this key)."""
    if len(shares) < threshold:
        raise InvalidInputError(f"{len(shares)} share(s) of an upload key split {threshold}-of-N: at least "
                                f"{threshold} are needed, fewer say nothing of the key")
    holders = sorted(shares)
    if len(set(holders)) != len(holders) or any(h < 0 for h in holders):
        raise InvalidInputError(f"shares named by holders {holders}: each holder once")
    points = {_point(h): _value(h, shares[h]) for h in holders}
    first = dict(list(points.items())[:threshold])
    if any(_at(first, x) != y for x, y in list(points.items())[threshold:]):
        raise InvalidInputError(f"the holders' shares of an upload key disagree ({len(points)} shares, threshold "
                                f"{threshold}): one of them is not its holder's share of this key")
    key = _at(first, 0)
    if key >> 256:
        raise InvalidInputError("the shares of an upload key interpolate to no 32-byte key: one of them is not "
                                "its holder's share of this key")
    return key.to_bytes(KEY_BYTES, "big")
