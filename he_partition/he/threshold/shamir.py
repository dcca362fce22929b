"""t-of-N key shares: each holder's n-of-n secret Shamir-shared to every holder, per RNS prime, in NTT form.

After the n-of-n setup (`threshold.setup`) holder i holds s_i and the collective key decrypts with
s = s_1 + ... + s_N. To let any t of the N holders decrypt, each holder i deals its s_i:

- it draws a polynomial f_i(x) = s_i + a_1 x + ... + a_{t-1} x^{t-1} for every coefficient of s_i
  and every prime q of the key level, with a_m exactly uniform mod q (rejection sampling from the OS
  CSPRNG), and sends holder j the sub-share f_i(x_j) (x_j = j + 1), `SubShare`. The arithmetic is on
  the NTT-form residues the holder already keeps (`HolderSecret.s_ntt`): the NTT is linear mod each
  prime, so sharing the NTT form shares s_i itself;
- holder j adds what every dealer sent it: S_j = sum_i f_i(x_j) (`receive`), its t-of-N share. It
  keeps S_j in place of s_j; the n-of-n secret is no longer needed.

For a set P of t holders, the Lagrange coefficients at 0, lambda_j = prod_{m in P, m != j} x_m / (x_m - x_j)
mod q (`lagrange`), give sum_{j in P} lambda_j S_j = sum_i f_i(0) = s, so holder j's decryption
share for P is the n-of-n share computed with lambda_j S_j in place of s_i (`participant_secret`):
`decrypt.decryption_share`, `decrypt.chunk_share` and `decrypt.combine` work unchanged on the t
shares of P. A share is made for one participant set only; the set is fixed before anyone draws.

Secrecy: fewer than t sub-shares of s_i are uniformly distributed whatever s_i is (Shamir: each
missing coefficient is a one-time pad mod q), so a coalition of fewer than t holders learns nothing
about an honest holder's s_i, hence nothing about s; their shares combined with any Lagrange
weights decrypt to noise (tests/he_partition/test_threshold_shamir.py). A dealer that sends shares
off one polynomial breaks decryption, not secrecy: the setup's closing test decryption, run for
every t-subset (`subsets`), catches it before the key is used.

Smudging with t shares: each participant adds its own uniform smudge on [-2^B, 2^B) (B = 70), so
one honest participant hides the combined phase's data-dependent noise as in the n-of-n case, and
decryption stays exact while t 2^B + 2^61 + |v| < Q / 2t_plain (t <= N <= 8 at B = 70).

May import `he_partition.core` and its siblings; no party, network or storage. Holds secrets only in
memory; the caller stores them in the holder's key store.
"""
from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt
import tenseal as ts

from he_partition.core.errors import InvalidInputError
from he_partition.he.rns import mulmod
from he_partition.he.threshold.keys import HolderSecret, key_moduli, pack_residues, unpack_residues

__all__ = ["SubShare", "check_threshold", "deal", "evaluation_point", "lagrange", "participant_secret", "receive",
           "subsets", "uniform_residues"]

_SUBSHARE_MAGIC = b"DPTS1"
U64 = npt.NDArray[np.uint64]


def evaluation_point(holder: int) -> int:
    """x_j = j + 1: holder ids start at 0 and x = 0 is where the secret sits."""
    return int(holder) + 1


def check_threshold(threshold: int, holders: Sequence[int]) -> None:
    """Refuse a threshold that is not a strict majority of the holders (t > N/2) or more than N.

    A majority is what makes every two participant sets share a holder, on which the budget's
    no-double-spend argument rests (`parties.decryption.keyshare.charges`)."""
    n = len(holders)
    if len(set(holders)) != n or n < 2:
        raise InvalidInputError(f"a t-of-N key needs >= 2 distinct holders, got {list(holders)}")
    if isinstance(threshold, bool) or not isinstance(threshold, int) or not n // 2 < threshold <= n:
        raise InvalidInputError(f"threshold must be an integer with N/2 < t <= N = {n} (a strict majority of the "
                                f"holders), got {threshold!r}")


def subsets(holders: Sequence[int], threshold: int) -> list[tuple[int, ...]]:
    """Every participant set of `threshold` holders, in order (what the setup's closing test decrypts with)."""
    return list(itertools.combinations(sorted(holders), threshold))


def uniform_residues(q: int, shape: tuple[int, ...]) -> U64:
    """Values exactly uniform on [0, q) from the OS CSPRNG: masked 64-bit words, those >= q drawn again."""
    size = int(np.prod(shape))
    mask = np.uint64((1 << int(q).bit_length()) - 1)
    out = np.empty(size, dtype=np.uint64)
    filled = 0
    while filled < size:
        need = size - filled
        words = np.frombuffer(os.urandom(8 * (need + need // 4 + 8)), dtype="<u8").astype(np.uint64) & mask
        good = words[words < np.uint64(q)][:need]
        out[filled:filled + len(good)] = good
        filled += len(good)
    return out.reshape(shape)


@dataclass(frozen=True)
class SubShare:
    """f_i(x_j): what dealer i sends holder j (NTT-form residues at the key level, shape (k, N)). Secret."""

    dealer: int
    recipient: int
    threshold: int
    values: U64

    def to_bytes(self) -> bytes:
        return _SUBSHARE_MAGIC + bytes([self.recipient, self.threshold]) + pack_residues(b"", self.dealer, self.values)

    @classmethod
    def from_bytes(cls, ctx: ts.Context, data: bytes) -> "SubShare":
        head = len(_SUBSHARE_MAGIC) + 2
        if not isinstance(data, (bytes, bytearray)) or len(data) < head or not bytes(data).startswith(_SUBSHARE_MAGIC):
            raise InvalidInputError("not a key sub-share (wrong magic bytes or too short)")
        recipient, threshold = bytes(data[len(_SUBSHARE_MAGIC):head])
        degree = int(ctx.seal_context().data.key_context_data().parms().poly_modulus_degree())
        dealer, arr = unpack_residues(b"", bytes(data[head:]), "key sub-share", key_moduli(ctx), degree)
        return cls(dealer, recipient, threshold, arr)

    def digest(self) -> bytes:
        """SHA-256 of the sub-share's bytes (what a dealer signs, with the setup session, before sealing it)."""
        return hashlib.sha256(b"dpagg/tofn-subshare/v1" + self.to_bytes()).digest()


def _horner(coefficients: Sequence[U64], x: int, q: int) -> U64:
    acc = np.asarray(coefficients[-1], dtype=np.uint64)
    for c in reversed(coefficients[:-1]):
        acc = (mulmod(acc, x % q, q) + np.asarray(c, dtype=np.uint64)) % np.uint64(q)  # both < q < 2^61
    return acc


def deal(ctx: ts.Context, secret: HolderSecret, holders: Sequence[int], threshold: int) -> dict[int, SubShare]:
    """Holder `secret.holder`'s sub-shares of its s_i for every holder (itself included), threshold `threshold`.

    One fresh polynomial per coefficient and prime, f(0) = s_i, the other t - 1 coefficients exactly
    uniform mod q (`uniform_residues`); the polynomial is dropped when this returns. Each sub-share
    goes to its recipient only, sealed and signed by the caller. Adds no noise."""
    check_threshold(threshold, holders)
    if secret.holder not in holders:
        raise InvalidInputError(f"dealer {secret.holder} is not one of the holders {list(holders)}")
    moduli = key_moduli(ctx)
    s = np.asarray(secret.s_ntt, dtype=np.uint64)
    if s.shape[0] != len(moduli):
        raise InvalidInputError(f"holder secret has {s.shape[0]} primes, the key level {len(moduli)}")
    out: dict[int, U64] = {j: np.empty_like(s) for j in holders}
    for r, q in enumerate(moduli):
        coefficients = [s[r]] + [uniform_residues(q, s[r].shape) for _ in range(threshold - 1)]
        for j in holders:
            out[j][r] = _horner(coefficients, evaluation_point(j), q)
    return {j: SubShare(secret.holder, j, threshold, v) for j, v in out.items()}


def receive(ctx: ts.Context, recipient: int, holders: Sequence[int], threshold: int,
            subshares: Mapping[int, SubShare]) -> HolderSecret:
    """Holder `recipient`'s t-of-N share S_j = sum_i f_i(x_j) from every dealer's sub-share (one per holder).

    Refuses (InvalidInputError naming the dealer) a missing or foreign dealer, a sub-share for
    another recipient or another threshold."""
    check_threshold(threshold, holders)
    missing = [h for h in holders if h not in subshares]
    if missing:
        raise InvalidInputError(f"holder {missing[0]} has not dealt its key sub-share: setup stopped")
    foreign = sorted(set(subshares) - set(holders))
    if foreign:
        raise InvalidInputError(f"key sub-share from holder {foreign[0]}, which is not in this setup: setup stopped")
    moduli = key_moduli(ctx)
    qs = np.array(moduli, dtype=np.uint64)[:, None]
    total: U64 | None = None
    for dealer in sorted(subshares):
        sub = subshares[dealer]
        if sub.dealer != dealer or sub.recipient != recipient or sub.threshold != threshold:
            raise InvalidInputError(f"the key sub-share sent as holder {dealer}'s names dealer {sub.dealer}, recipient "
                                    f"{sub.recipient}, threshold {sub.threshold}; expected dealer {dealer}, recipient "
                                    f"{recipient}, threshold {threshold}: setup stopped")
        v = np.asarray(sub.values, dtype=np.uint64)
        total = v.copy() if total is None else (total + v) % qs
    assert total is not None
    return HolderSecret(recipient, total)


def lagrange(participants: Iterable[int], moduli: Sequence[int]) -> dict[int, list[int]]:
    """lambda_j mod each prime for the participant set (Lagrange coefficients at x = 0 over x_j = j + 1)."""
    p = sorted(set(int(j) for j in participants))
    out: dict[int, list[int]] = {}
    for j in p:
        xj = evaluation_point(j)
        coeffs = []
        for q in moduli:
            num, den = 1, 1
            for m in p:
                if m != j:
                    xm = evaluation_point(m)
                    num = num * xm % q
                    den = den * (xm - xj) % q
            coeffs.append(num * pow(den, -1, q) % q)
        out[j] = coeffs
    return out


def participant_secret(ctx: ts.Context, share: HolderSecret, participants: Sequence[int]) -> HolderSecret:
    """lambda_j S_j: what holder j multiplies c1 by in its decryption share for the participant set.

    The shares of exactly the holders in `participants` (each computed with its own lambda for
    that set) add up to c1 s: pass the result to `decrypt.decryption_share` / `decrypt.chunk_share`
    as the holder's secret. Secret, like S_j; adds no noise."""
    if share.holder not in participants:
        raise InvalidInputError(f"holder {share.holder} is not in the participant set {sorted(participants)}")
    moduli = key_moduli(ctx)
    lam = lagrange(participants, moduli)[share.holder]
    s = np.asarray(share.s_ntt, dtype=np.uint64)
    out = np.stack([mulmod(s[r], lam[r], q) for r, q in enumerate(moduli)])
    return HolderSecret(share.holder, out)
