"""Exact discrete Laplace noise from a secure (or, for tests, seeded) uniform source.

Sources: `CipherRandom` (production default: AES-256-CTR under a fresh OS key), `SecureRandom`
(`os.urandom` per draw), `KeyedRandom` (reproducible from a secret key), `SeededRandom` (tests).
"""

from __future__ import annotations

import decimal
import hashlib
import math
import os
import threading
from functools import lru_cache
from fractions import Fraction
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from .errors import InvalidInputError

__all__ = [
    "RandomSource",
    "SecureRandom",
    "SeededRandom",
    "KeyedRandom",
    "CipherRandom",
    "KEYED_STREAMS",
    "as_random_source",
    "laplace_scale",
    "discrete_laplace",
    "discrete_laplace_variance",
    "discrete_laplace_draw_count",
    "bernoulli_exp",
    "SCALE_GRID",
]

IntArray = npt.NDArray[np.int64]

#: Noise scales are rounded *up* to a multiple of 1/SCALE_GRID so that the sampler works on
#: exact integers; rounding up only adds noise, so the privacy promise holds exactly.
SCALE_GRID = 1 << 20

_U64_MAX = np.uint64(0xFFFFFFFFFFFFFFFF)


@runtime_checkable
class RandomSource(Protocol):
    """A source of exactly uniform integers; every noise draw in dpagg goes through one."""

    def integers(self, high: IntArray | int, size: int) -> IntArray:
        """Return `size` independent integers, each exactly uniform on [0, high)."""
        ...


class SecureRandom:
    """Exactly uniform integers straight from the OS CSPRNG: one `os.urandom` call per draw.

    Rejection sampling on 64-bit words removes modulo bias, so each value is exactly
    uniform; nobody, including the caller, can reproduce the draws. `CipherRandom` (AES-CTR
    under a fresh OS key, the default source) draws the same distribution about six times
    faster; this one remains for callers that want every word from the kernel.
    """

    def integers(self, high: IntArray | int, size: int) -> IntArray:
        return _uniform(high, size, lambda n: np.frombuffer(os.urandom(8 * n), dtype=np.uint64))


def _uniform(high: IntArray | int, size: int, words: Callable[[int], npt.NDArray[np.uint64]]) -> IntArray:
    """Exactly uniform integers on [0, high) by rejection on 64-bit words from `words(n)`.

    A word w is kept iff w < 2^64 - (2^64 mod h), the largest multiple of h words, and then
    w mod h is exactly uniform on [0, h); a rejected word is replaced by a fresh one. For a
    power-of-two h the top bits are used as they are. A scalar `high` takes the same words
    and gives the same values as the array form, only without per-element arithmetic.
    """
    # Only a Python int takes the scalar paths, each calling `words` exactly as before they existed
    # (a keyed source's draws depend on its call sequence): a numpy scalar goes the array way.
    if isinstance(high, int):
        if high >= 1 and high & (high - 1) == 0:
            # A power of two: the top bits of each word are exactly uniform, no rejection needed.
            if high == 1:
                return np.zeros(size, dtype=np.int64)
            shift = np.uint64(64 - (high.bit_length() - 1))
            w = words(size)
            top = np.right_shift(w, shift, out=w) if w.flags.writeable else np.right_shift(w, shift)
            # shift >= 1, so every value is below 2^63: the int64 view reads the same numbers.
            return top.view(np.int64)
        if 1 < high <= 1 << 63 and size > 0:
            return _uniform_scalar(high, size, words)
    highs = np.broadcast_to(np.asarray(high, dtype=np.uint64), (size,))
    if size and int(highs.min()) < 1:
        raise InvalidInputError(f"high must be >= 1, got {int(highs.min())}")
    out = np.empty(size, dtype=np.uint64)
    todo = np.arange(size)
    while todo.size:
        w = words(todo.size)
        h_todo = highs[todo]
        # (2**64) mod h, computed without overflowing uint64.
        rem = (_U64_MAX % h_todo + np.uint64(1)) % h_todo
        ok = w <= _U64_MAX - rem
        out[todo[ok]] = w[ok] % h_todo[ok]
        todo = todo[~ok]
    return out.astype(np.int64)


def _uniform_scalar(h: int, size: int, words: Callable[[int], npt.NDArray[np.uint64]]) -> IntArray:
    """`_uniform` for one bound 1 < h <= 2^63 (not a power of two) and size > 0: the same words, the same values."""
    limit = np.uint64((1 << 64) - 1 - (1 << 64) % h)  # accept w <= limit
    hh = np.uint64(h)
    w = words(size)
    ok = w <= limit
    if ok.all():
        return (w % hh).view(np.int64)
    out = np.empty(size, dtype=np.uint64)
    todo = np.arange(size)
    while todo.size:
        out[todo[ok]] = w[ok] % hh
        todo = todo[~ok]
        if not todo.size:
            break
        w = words(todo.size)
        ok = w <= limit
    return out.view(np.int64)


class SeededRandom:
    """Test source: exactly uniform integers from a seeded numpy PCG64 stream.

    Draws the same distribution as `CipherRandom` and `SecureRandom` (uniform on [0, high)); only the
    predictability differs. Never use it for a real release.
    """

    def __init__(self, seed: int) -> None:
        self._gen = np.random.Generator(np.random.PCG64(seed))

    def integers(self, high: IntArray | int, size: int) -> IntArray:
        return self._gen.integers(0, np.asarray(high, dtype=np.int64), size=size, dtype=np.int64)


#: KeyedRandom's streams: 1 = SHAKE-256 output per call; 2 = AES-256-CTR keystream per call, under
#: an AES key derived by SHAKE-256 from (key, label). Both are exactly reproducible from (key, label);
#: a party that switches stream keeps stream 1 for requests it answered under it (see its callers).
KEYED_STREAMS = (1, 2)
_AES_STREAM_LABEL = b"dpagg/keyed-random/aes-256-ctr/v2"


def _aes_ctr(aes_key: bytes, counter: int) -> Any:
    """An AES-256-CTR encryptor under `aes_key` whose first counter block is `counter` (128-bit big-endian)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    return Cipher(algorithms.AES(aes_key), modes.CTR(counter.to_bytes(16, "big"))).encryptor()


def _keystream_words(encryptor: Any, n: int) -> npt.NDArray[np.uint64]:
    """The next 8 n bytes of `encryptor`'s keystream as n native-order 64-bit words (a fresh, writable array)."""
    # update_into wants block_size - 1 spare bytes past the output; it writes straight into the array.
    out = np.empty(n + 2, dtype=np.uint64)
    encryptor.update_into(bytes(8 * n), out.data.cast("B"))
    return out[:n]


class KeyedRandom:
    """Deterministic CSPRNG: exactly uniform integers from (key, label, call number).

    The same (key, label, stream) gives the same draws in the same order, so a party can
    fix its noise for a request before it looks at anything data-dependent and give the
    same answer when the request is repeated. Without `key` nobody can predict or
    reproduce the draws. `key` must be a secret of at least 16 bytes.

    `stream` 1 (the default) takes SHAKE-256(key, label, call number) as each call's words;
    `stream` 2 takes the AES-256-CTR keystream of call number c (counter blocks c * 2^64,
    c * 2^64 + 1, ...) under the key SHAKE-256(stream label, key, label)[:32]: a keyed
    stream cipher, about twice as fast on this machine (the decryption server's draw of
    a 1M-value measurement takes 302 MB of words). The two streams give different draws.

    Threads may share one: each call takes its own call number under a lock, so no two
    calls ever read the same words (which call gets which number then depends on timing,
    so a reproducible sequence needs one thread).
    """

    def __init__(self, key: bytes, label: bytes, *, stream: int = 1) -> None:
        if len(key) < 16:
            raise InvalidInputError(f"the key of a KeyedRandom must have at least 16 bytes, got {len(key)}")
        if stream not in KEYED_STREAMS:
            raise InvalidInputError(f"unknown KeyedRandom stream {stream!r}; known: {KEYED_STREAMS}")
        self._prefix = len(key).to_bytes(4, "big") + key + len(label).to_bytes(8, "big") + label
        self._calls = 0
        self._lock = threading.Lock()
        self.stream = stream
        self._aes_key = hashlib.shake_256(_AES_STREAM_LABEL + self._prefix).digest(32) if stream == 2 else b""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _words(self, n: int) -> npt.NDArray[np.uint64]:
        with self._lock:
            self._calls += 1
            call = self._calls
        if self.stream == 2:
            return _keystream_words(_aes_ctr(self._aes_key, call << 64), n)
        data = hashlib.shake_256(self._prefix + call.to_bytes(8, "big")).digest(8 * n)
        return np.frombuffer(data, dtype=np.uint64)

    def integers(self, high: IntArray | int, size: int) -> IntArray:
        return _uniform(high, size, self._words)


#: CipherRandom serves requests of at most this many words from a keystream buffer of _CIPHER_BUFFER words.
_CIPHER_SMALL = 1 << 10
_CIPHER_BUFFER = 1 << 13


class CipherRandom:
    """Production source: exactly uniform integers from AES-256-CTR under a fresh OS key.

    What it is: one AES-256-CTR keystream (counter from 0) under a 32-byte key drawn from
    `os.urandom` when the instance is made; every call consumes the next unused 64-bit
    words of that keystream (small calls from a buffer of it, large ones directly), never
    the same word twice. The uniform integers are taken from those words by the same
    rejection sampling as `KeyedRandom` (`_uniform`), which reuses its AES-CTR keystream.

    Why it is a CSPRNG: AES-256 in counter mode under a secret uniformly random key is a
    pseudorandom generator (the construction of NIST SP 800-90A's CTR_DRBG, seeded from
    the OS); its output is computationally indistinguishable from uniform words to anyone
    without the key, for far more words than a process draws (2^128 blocks per key).

    Who knows its output: only this process. The key exists only in this object; it is
    never written, logged or derived from anything else, so nobody, including whoever
    made it, can reproduce the draws. A copy (pickle, copy.copy) is a new instance under
    its own fresh key, and a child made by fork() draws a fresh key at its first call, so
    no two processes ever share words.

    Exactness: each value is exactly uniform on [0, high) given uniform words (rejection
    sampling on 64-bit words, no modulo bias; powers of two take the top bits), so the
    discrete Laplace draws from it have exactly the distribution `discrete_laplace`
    promises, as with `SecureRandom`. It differs from `SecureRandom` (one `os.urandom`
    call per draw) only in speed: about 1.8 GB/s of words here against 0.3 GB/s.

    Threads may share one: a lock guards the keystream position.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rekey()

    def _rekey(self) -> None:
        self._pid = os.getpid()
        self._encryptor = _aes_ctr(os.urandom(32), 0)
        self._buffer: npt.NDArray[np.uint64] = np.empty(0, dtype=np.uint64)
        self._used = 0

    def __reduce__(self) -> tuple[type[CipherRandom], tuple[()]]:
        # A copy must never repeat this instance's words: it is a new instance under a fresh key.
        return (CipherRandom, ())

    def _words(self, n: int) -> npt.NDArray[np.uint64]:
        with self._lock:
            if os.getpid() != self._pid:
                self._rekey()  # a forked child: never replay the parent's keystream
            if n > _CIPHER_SMALL:
                return _keystream_words(self._encryptor, n)
            if self._used + n > self._buffer.size:
                self._buffer = _keystream_words(self._encryptor, _CIPHER_BUFFER)
                self._used = 0
            out = self._buffer[self._used:self._used + n].copy()
            self._used += n
            return out

    def integers(self, high: IntArray | int, size: int) -> IntArray:
        return _uniform(high, size, self._words)


def as_random_source(rng: RandomSource | int | None) -> RandomSource:
    """None -> CipherRandom (a fresh OS key), an int -> SeededRandom(int), a RandomSource -> itself."""
    if rng is None:
        return CipherRandom()
    if isinstance(rng, bool):
        raise InvalidInputError(f"rng must be a RandomSource, an int seed or None, got {rng!r}")
    if isinstance(rng, (int, np.integer)):
        return SeededRandom(int(rng))
    if isinstance(rng, np.random.Generator):
        # It has an `integers` method too, but with numpy's (low, high) meaning: draws would be wrong.
        raise InvalidInputError(
            "rng must be a RandomSource, an int seed or None, got a numpy Generator; pass an int seed "
            "(SeededRandom) for reproducible tests, or None for the secure source"
        )
    if isinstance(rng, RandomSource):
        return rng
    raise InvalidInputError(f"rng must be a RandomSource, an int seed or None, got {type(rng).__name__}")


def laplace_scale(sensitivity: float | Fraction, epsilon: float | Fraction) -> Fraction:
    """The smallest multiple of 1/SCALE_GRID that is >= sensitivity / epsilon (exact arithmetic).

    Noise of this scale gives epsilon' = sensitivity / scale <= epsilon.
    """
    sens = Fraction(sensitivity)
    eps = Fraction(epsilon)
    if not sens > 0:
        raise InvalidInputError(f"sensitivity must be > 0, got {sensitivity}")
    if not eps > 0:
        raise InvalidInputError(f"epsilon must be > 0, got {epsilon}")
    exact = sens / eps
    return Fraction(math.ceil(exact * SCALE_GRID), SCALE_GRID)


def discrete_laplace_variance(scale: Fraction | float) -> float:
    """Variance of the discrete Laplace distribution P[x] ~ exp(-|x| / scale) on the integers."""
    q = math.exp(-1.0 / float(scale))
    return 2.0 * q / (1.0 - q) ** 2


def _bernoulli_exp_fraction(num: IntArray, den: int, rng: RandomSource) -> npt.NDArray[np.bool_]:
    """Exact Bernoulli(exp(-num/den)) for 0 <= num <= den (Canonne-Kamath-Steinke Alg. 1)."""
    size = num.size
    k = np.ones(size, dtype=np.int64)
    active = np.arange(size)
    while active.size:
        # A ~ Bernoulli(num / (den * k)): continue while A is 1.
        a = rng.integers(den * k[active], active.size) < num[active]
        k[active[a]] += 1
        active = active[a]
    return np.asarray((k % 2) == 1, dtype=np.bool_)


def _bernoulli_exp_minus_one(size: int, rng: RandomSource) -> npt.NDArray[np.bool_]:
    return _bernoulli_exp_fraction(np.ones(size, dtype=np.int64), 1, rng)


#: Every geometric draw is truncated where P[G >= 2^J] <= 2^-_TAIL_BITS.
_TAIL_BITS = 110
#: Each Bernoulli bit compares two 62-bit uniform words with a 124-bit threshold.
_WORD_BITS = 62
_PRECISION_BITS = 2 * _WORD_BITS
#: Values drawn per `rng.integers` call (bounds the sampler's memory).
_BLOCK = 1 << 14


@lru_cache(maxsize=256)
def _geometric_bit_thresholds(t: int, s: int) -> tuple[IntArray, IntArray]:
    """Thresholds of the independent binary digits of a geometric draw with q = exp(-s/t).

    A geometric G with P[G = k] = (1 - q) q^k has independent binary digits: digit j is 1
    with probability p_j = r_j / (1 + r_j), r_j = q^(2^j) (since q^k factorises over the
    digits of k). Returns floor(p_j * 2^124) split into (high, low) 62-bit words for
    j < J, J the least with q^(2^J) <= 2^-110 (so P[G >= 2^J] <= 2^-110). Computed in
    60-digit decimal arithmetic (exp correctly rounded), well past the 124 bits kept.
    """
    ctx = decimal.Context(prec=60)
    # q^(2^J) <= 2^-110  <=>  2^J * s / t >= 110 ln 2.
    need = Fraction(_TAIL_BITS) * Fraction(ctx.ln(decimal.Decimal(2))) * t / s
    bits = max(1, math.ceil(math.log2(need)) if need > 1 else 1)
    while Fraction(1 << bits) < need:
        bits += 1
    if bits > 62:
        raise InvalidInputError(f"scale {Fraction(t, s)} is too large for int64 noise (at most about 6e16)")
    hi = np.empty(bits, dtype=np.int64)
    lo = np.empty(bits, dtype=np.int64)
    mask = (1 << _WORD_BITS) - 1
    for j in range(bits):
        r = ctx.exp(ctx.divide(decimal.Decimal(-(s << j)), decimal.Decimal(t)))
        p = ctx.divide(r, ctx.add(decimal.Decimal(1), r))
        threshold = int(ctx.multiply(p, decimal.Decimal(1 << _PRECISION_BITS)).to_integral_value(decimal.ROUND_FLOOR))
        hi[j], lo[j] = threshold >> _WORD_BITS, threshold & mask
    hi.setflags(write=False)
    lo.setflags(write=False)
    return hi, lo


def discrete_laplace_draw_count(scale: Fraction, size: int) -> int:
    """How many uniform integers `discrete_laplace(scale, size, ...)` takes: a function of (scale, size) only."""
    scale = Fraction(scale)
    return 4 * size * _geometric_bit_thresholds(scale.numerator, scale.denominator)[0].size


def discrete_laplace(scale: Fraction, size: int, rng: RandomSource) -> IntArray:
    """Draw `size` discrete Laplace samples, P[x] proportional to exp(-|x| / scale), in fixed work.

    X = G1 - G2 for two independent geometric draws with q = exp(-1/scale) (then
    P[X = x] = (1 - q)/(1 + q) q^|x| exactly), each geometric built from its independent
    binary digits (`_geometric_bit_thresholds`). The work does not depend on the values
    drawn: exactly `discrete_laplace_draw_count(scale, size)` 62-bit words from `rng.integers`
    (one call per block of 16,384 values), then fixed vector comparisons, so the time and the randomness consumed
    say nothing about the draw (the former Canonne-Kamath-Steinke sampler looped about
    |x| / scale times). The price: the distribution is within total variation 2^-100 per
    value of the exact one (digits above J dropped: 2^-110 each; 124-bit thresholds:
    2^-124 per digit), which adds at most that much to delta.
    Privacy: adding one draw to an integer query of L1 sensitivity `s` gives
    (s / scale)-DP (delta <= 2^-100 per value, as above; neighbouring relation that of
    the query); see `laplace_scale`. Whoever calls this knows the noise.
    """
    scale = Fraction(scale)
    if not scale > 0:
        raise InvalidInputError(f"scale must be > 0, got {scale}")
    if size < 0:
        raise InvalidInputError(f"size must be >= 0, got {size}")
    hi_t, lo_t = _geometric_bit_thresholds(scale.numerator, scale.denominator)
    bits = hi_t.size
    powers = np.left_shift(np.int64(1), np.arange(bits, dtype=np.int64))
    out: IntArray = np.empty(size, dtype=np.int64)
    # In blocks of a fixed size, so the working set stays small (64 words a value would be 512 MB
    # at a million values): the number of calls and words still depends on `size` only.
    for start in range(0, size, _BLOCK):
        n = min(_BLOCK, size - start)
        words = rng.integers(1 << _WORD_BITS, 4 * n * bits).reshape(2, n, bits, 2)
        hi, lo = words[..., 0], words[..., 1]
        # digit = (hi < hi_t) | ((hi == hi_t) & (lo < lo_t)), the same vector operations for every draw
        digit = hi < hi_t
        tie = hi == hi_t
        tie &= lo < lo_t
        digit |= tie
        geometric = digit.view(np.uint8) @ powers  # the sum of 2^j over the digits j that are 1
        out[start:start + n] = geometric[0] - geometric[1]
    return out


#: Largest denominator `bernoulli_exp` accepts: every uniform draw stays below 2**62.
_MAX_BERNOULLI_DENOMINATOR = 1 << 62


def bernoulli_exp(numerators: npt.ArrayLike, denominator: int, rng: RandomSource) -> npt.NDArray[np.bool_]:
    """Exact independent Bernoulli(exp(-n_i / denominator)) draws, one per numerator n_i >= 0.

    Canonne, Kamath, Steinke (2020), Algorithm 1 (both cases), vectorised: with
    gamma = w + f / d (w = n // d, f = n % d), the draw is 1 iff w Bernoulli(exp(-1)) draws
    and one Bernoulli(exp(-f / d)) draw are all 1. Inside the latter, Bernoulli(f / (d k))
    is drawn as Bernoulli(f / d) AND Bernoulli(1 / k), so no uniform draw exceeds
    max(d, k). Numerators may be Python ints of any size (w must fit in int64); all
    randomness comes from `rng.integers`. Adds no noise and spends no budget by itself.

    Raises:
        InvalidInputError: denominator outside [1, 2**62], a negative numerator, or
            n // denominator beyond int64.
    """
    den = int(denominator)
    if not 1 <= den <= _MAX_BERNOULLI_DENOMINATOR:
        raise InvalidInputError(f"denominator must be in [1, 2**62], got {denominator}")
    nums = [int(v) for v in np.asarray(numerators, dtype=object).reshape(-1)]
    if any(v < 0 for v in nums):
        raise InvalidInputError(f"numerators must be >= 0, got {min(nums)}")
    parts = [divmod(v, den) for v in nums]
    if any(w > np.iinfo(np.int64).max for w, _ in parts):
        raise InvalidInputError("numerator // denominator must fit in int64")
    size = len(nums)
    whole = np.array([w for w, _ in parts], dtype=np.int64).reshape(size)
    frac = np.array([f for _, f in parts], dtype=np.int64).reshape(size)
    out = np.ones(size, dtype=bool)
    # exp(-w): w Bernoulli(exp(-1)) draws in a row, stopping at the first 0.
    active = np.flatnonzero(whole > 0)
    while active.size:
        ok = _bernoulli_exp_minus_one(active.size, rng)
        out[active[~ok]] = False
        whole[active[ok]] -= 1
        active = active[ok & (whole[active] > 0)]
    # exp(-f/d) with f/d in [0, 1): k = 1, 2, ... while Bernoulli(f / (d k)) is 1; odd k -> 1.
    k = np.ones(size, dtype=np.int64)
    active = np.flatnonzero(out & (frac > 0))
    while active.size:
        a = (rng.integers(den, active.size) < frac[active]) & (rng.integers(k[active], active.size) == 0)
        k[active[a]] += 1
        active = active[a]
    return np.asarray(out & ((k % 2) == 1), dtype=np.bool_)
