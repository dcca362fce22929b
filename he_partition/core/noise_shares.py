"""Shares of one discrete Laplace draw for K key-share holders (threshold decryption).

A geometric variable is infinitely divisible: G ~ Geometric(q) (P[G = k] = (1 - q) q^k) is
the sum of K independent negative-binomial NB(r = 1/K, q) variables, with
P[N = k] = C(k + r - 1, k) (1 - q)^r q^k. So if each of K holders draws
D_i = N_i - N'_i (two independent NB(1/K, q) draws), the sum D_1 + ... + D_K is
G - G' for two independent geometrics, which is exactly one discrete Laplace draw with
q = exp(-1/scale), the draw the single key holder adds today (`noise.discrete_laplace`).

Sampling. An NB(1/K, q) pmf is irrational ((1 - q)^(1/K) with q = exp(-1/scale)), so the
draw cannot be exact with rational arithmetic. Each NB draw is an inverse-CDF lookup of one
124-bit uniform integer (two 62-bit words from the `RandomSource`) in a table of
floor(CDF_k * 2^124), the CDF computed in 256-bit fixed-point integers from a 90-digit
decimal (1 - q)^(1/K) and q, and the table cut where the tail is <= 2^-110. No floating
point touches a value (the attack of Mironov 2012 needs float arithmetic on the draw).
Error bound (total variation, per NB draw): at most n * 2^-123 from the 124-bit
thresholds (n <= 2^22 table entries, so <= 2^-101) plus the cut tail 2^-110 plus the
fixed-point error (<= n * 2^-250): below 2^-100. A share is within 2^-99 of its exact
distribution and the sum of K shares within K * 2^-99 of the exact discrete Laplace; like
`discrete_laplace` (2^-100 per value) this only adds to delta.

Fixed work: every share consumes exactly 4 words (two NB draws of 2 words), drawn in one
`rng.integers` call per block of 16,384 shares, so the randomness consumed and the number
of calls depend on (size) only, never on the values. The lookup is a binary search over
the table (log2 n steps whatever the value); only when a uniform's top 62 bits equal a
threshold's (probability <= n * 2^-62 per draw) is a second comparison made. The one
value-dependent effect left is which table cache lines the search touches, the same kind of
effect as today's sampler's shifts (documented in docs/threshold.md).
"""

from __future__ import annotations

import decimal
import math
from fractions import Fraction
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from .errors import InvalidInputError
from .noise import KeyedRandom, RandomSource

__all__ = [
    "MAX_HOLDERS",
    "MAX_TABLE_ENTRIES",
    "discrete_laplace_share",
    "discrete_laplace_share_draw_count",
    "negative_binomial_coefficients",
    "holder_noise_source",
    "share_variance",
    "tolerant_share",
    "tolerant_sum_variance_factor",
]

IntArray = npt.NDArray[np.int64]

#: Most key-share holders a share can be drawn for.
MAX_HOLDERS = 64
#: Largest inverse-CDF table (entries): scale up to about 54,000 (the tail needs ~76 * scale entries).
MAX_TABLE_ENTRIES = 1 << 22
_TAIL_BITS = 110
_WORD_BITS = 62
_PRECISION_BITS = 2 * _WORD_BITS
_FIXED_BITS = 256
_BLOCK = 1 << 14


def negative_binomial_coefficients(holders: int, count: int) -> list[Fraction]:
    """C(k + r - 1, k) for r = 1/holders and k < count, exactly: the rational part of the NB pmf.

    P[N = k] = C(k + r - 1, k) (1 - q)^r q^k; the coefficients of K such pmfs convolve to all
    ones (the geometric's), which is why K shares sum to one discrete Laplace draw. Adds no
    noise and spends no budget.
    """
    _check_holders(holders)
    r = Fraction(1, holders)
    out, c = [], Fraction(1)
    for k in range(count):
        out.append(c)
        c = c * (k + r) / (k + 1)
    return out


def _check_holders(holders: int) -> None:
    if isinstance(holders, bool) or not isinstance(holders, (int, np.integer)) or not 1 <= holders <= MAX_HOLDERS:
        raise InvalidInputError(f"holders must be an integer in [1, {MAX_HOLDERS}], got {holders!r}")


@lru_cache(maxsize=64)
def _nb_cdf_table(t: int, s: int, holders: int) -> tuple[IntArray, IntArray]:
    """floor(CDF_k * 2^124) of NB(1/holders, q = exp(-s/t)) as (high, low) 62-bit words, k < n.

    n is the least count with P[N >= n] <= 2^-110. Computed in 256-bit fixed point: the pmf
    by the exact recurrence p_{k+1} = p_k q (K k + 1) / (K (k + 1)) from p_0 = (1 - q)^(1/K).
    """
    if Fraction(t, s) * 77 > MAX_TABLE_ENTRIES:
        raise InvalidInputError(f"scale {Fraction(t, s)} is too large for a noise share (at most about "
                                f"{MAX_TABLE_ENTRIES // 77}): the inverse-CDF table would exceed "
                                f"{MAX_TABLE_ENTRIES} entries")
    ctx = decimal.Context(prec=90)
    q = ctx.exp(ctx.divide(decimal.Decimal(-s), decimal.Decimal(t)))
    p0 = ctx.exp(ctx.divide(ctx.ln(ctx.subtract(decimal.Decimal(1), q)), decimal.Decimal(holders)))
    one = 1 << _FIXED_BITS
    q_fix = int(ctx.multiply(q, decimal.Decimal(one)).to_integral_value(decimal.ROUND_FLOOR))
    p = int(ctx.multiply(p0, decimal.Decimal(one)).to_integral_value(decimal.ROUND_FLOOR))
    tail_limit = one >> _TAIL_BITS
    shift = _FIXED_BITS - _PRECISION_BITS
    cdf, k, thresholds = 0, 0, []
    while True:
        cdf += p
        thresholds.append(cdf >> shift)
        if one - cdf <= tail_limit or len(thresholds) > MAX_TABLE_ENTRIES:
            break
        p = (p * q_fix * (holders * k + 1)) // (holders * (k + 1)) >> _FIXED_BITS
        k += 1
    if len(thresholds) > MAX_TABLE_ENTRIES:
        raise InvalidInputError(f"scale {Fraction(t, s)} is too large for a noise share: the table exceeds "
                                f"{MAX_TABLE_ENTRIES} entries")
    mask = (1 << _WORD_BITS) - 1
    hi = np.array([v >> _WORD_BITS for v in thresholds], dtype=np.int64)
    lo = np.array([v & mask for v in thresholds], dtype=np.int64)
    hi.setflags(write=False)
    lo.setflags(write=False)
    return hi, lo


def _inverse_cdf(hi_t: IntArray, lo_t: IntArray, u_hi: IntArray, u_lo: IntArray) -> IntArray:
    """#{k : T_k <= u} for 124-bit uniforms u = (u_hi, u_lo): an NB draw per uniform."""
    below = np.searchsorted(hi_t, u_hi, side="left")
    upto = np.searchsorted(hi_t, u_hi, side="right")
    out = below.astype(np.int64)
    # Top words equal to a threshold's (probability <= n * 2^-62 per draw): compare the low words.
    for i in np.flatnonzero(upto > below):
        out[i] += int(np.count_nonzero(lo_t[below[i]:upto[i]] <= u_lo[i]))
    return out


def discrete_laplace_share_draw_count(size: int) -> int:
    """How many uniform integers `discrete_laplace_share(scale, holders, size, ...)` takes: 4 per share."""
    return 4 * size


def discrete_laplace_share(scale: Fraction, holders: int, size: int, rng: RandomSource) -> IntArray:
    """One holder's share of `size` discrete Laplace draws: N - N', N and N' ~ NB(1/holders, q).

    With q = exp(-1/scale), the shares of `holders` independent holders sum to one discrete
    Laplace draw, P[x] proportional to exp(-|x| / scale), exactly as one key holder draws it
    today (within total variation holders * 2^-99 per value, see the module docstring);
    the variance of the sum is 2q / (1 - q)^2, each share's 1/holders of it.
    Privacy: adding the K shares to an integer query of L1 sensitivity `s` (neighbouring
    relation that of the query, add/remove of one person with at most c records in
    dpagg) gives (s / scale)-DP, i.e. epsilon = s / scale, with delta <= holders * 2^-99
    per value, against anyone who does not know all K shares: each holder knows only its
    own share; a coalition of holders that knows some shares still faces the others' sum
    (for K - 1 colluding holders a single share, whose protection is weaker than a full
    draw; `tolerant_share` draws for K - T holders so that any T colluders still leave a
    full draw, see docs/threshold.md).
    Fixed work: exactly `discrete_laplace_share_draw_count(size)` words in one
    `rng.integers` call per block of 16,384 shares.
    """
    scale = Fraction(scale)
    if not scale > 0:
        raise InvalidInputError(f"scale must be > 0, got {scale}")
    _check_holders(holders)
    if isinstance(size, bool) or size < 0:
        raise InvalidInputError(f"size must be >= 0, got {size}")
    hi_t, lo_t = _nb_cdf_table(scale.numerator, scale.denominator, int(holders))
    out: IntArray = np.empty(size, dtype=np.int64)
    for start in range(0, size, _BLOCK):
        n = min(_BLOCK, size - start)
        words = rng.integers(1 << _WORD_BITS, 4 * n).reshape(2, n, 2)
        draws = _inverse_cdf(hi_t, lo_t, words[..., 0].reshape(-1), words[..., 1].reshape(-1)).reshape(2, n)
        out[start:start + n] = draws[0] - draws[1]
    return out


def _check_tolerates(holders: int, tolerates: int) -> None:
    _check_holders(holders)
    if isinstance(tolerates, bool) or not isinstance(tolerates, (int, np.integer)) or not 0 <= tolerates < holders:
        raise InvalidInputError(f"noise_tolerates must be an integer in [0, K - 1] = [0, {holders - 1}] with K = "
                                f"{holders} holders, got {tolerates!r}")


def tolerant_share(scale: Fraction, holders: int, tolerates: int, size: int, rng: RandomSource) -> IntArray:
    """One of K = `holders` holders' shares when T = `tolerates` of them may collude with the combiner.

    The share is `discrete_laplace_share(scale, K - T, ...)`: N - N', N and N' ~ NB(1/(K - T), q),
    q = exp(-1/scale). Any K - T holders' shares sum to NB(1) - NB(1) = one full discrete Laplace
    draw (more holders: more), so the combiner that knows its own draw and the shares of T
    holders still faces at least one full draw of P[x] proportional to exp(-|x| / scale) on
    every value. All K shares sum to NB(K/(K - T)) - NB(K/(K - T)): K/(K - T) times one
    draw's variance (`tolerant_sum_variance_factor`), the price of the tolerance. T = 0 is
    today's split (the K shares sum to exactly one draw, a coalition of K - 1 holders leaves
    one share of 1/K of the variance).
    Privacy: added to an integer query of L1 sensitivity `s` (neighbouring relation that of
    the query: add/remove of one person with at most c records in dpagg) the K shares give
    epsilon = s / scale (delta <= K * 2^-99 per value) against the combiner together with
    any T holders; each holder knows only its own share (its own keyed source), the combiner
    only the sum. Fixed work as `discrete_laplace_share`.
    """
    _check_tolerates(holders, tolerates)
    return discrete_laplace_share(scale, int(holders) - int(tolerates), size, rng)


def tolerant_sum_variance_factor(holders: int, tolerates: int) -> Fraction:
    """K/(K - T): the variance of the sum of all K `tolerant_share`s in units of one discrete Laplace draw's
    (exact: NB variances add, r = K x 1/(K - T)). Adds no noise."""
    _check_tolerates(holders, tolerates)
    return Fraction(int(holders), int(holders) - int(tolerates))


def holder_noise_source(noise_key: bytes, holder: int, holders: int, request_label: bytes, *,
                        stream: int = 2) -> KeyedRandom:
    """The keyed source of holder `holder`'s share for one request (each holder's own noise key).

    Like the single key holder's `_request_noise`: the label fixes the request (study,
    release, release epsilon, measurement, ciphertext digest, as canonical bytes), so a
    repeated request gets the same share and any other request an independent one; the
    holder index and K are bound into the label, so one key reused across holder slots or
    K values never repeats a share. Only the holder knows `noise_key`, so only it can
    reproduce its share. `stream`: the `KeyedRandom` stream (2, AES-256-CTR, the default since
    the share path was sped up; 1 the SHAKE-256 stream). Draws no noise itself.
    """
    _check_holders(holders)
    if not 0 <= holder < holders:
        raise InvalidInputError(f"holder must be in [0, {holders}), got {holder}")
    label = b"dpagg/dl-share/v1" + holder.to_bytes(2, "big") + holders.to_bytes(2, "big") + request_label
    return KeyedRandom(noise_key, label, stream=stream)


def share_variance(scale: Fraction | float, holders: int) -> float:
    """Variance of one share, 2 r q / (1 - q)^2 with r = 1/holders: 1/holders of the discrete Laplace's."""
    _check_holders(holders)
    q = math.exp(-1.0 / float(scale))
    return 2.0 * q / (holders * (1.0 - q) ** 2)
