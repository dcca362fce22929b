"""Exact discrete Laplace noise from a secure (or, for tests, seeded) uniform source."""

from __future__ import annotations

import math
import os
from fractions import Fraction
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from .errors import InvalidInputError

__all__ = [
    "RandomSource",
    "SecureRandom",
    "SeededRandom",
    "as_random_source",
    "laplace_scale",
    "discrete_laplace",
    "discrete_laplace_variance",
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
    """Production source: exactly uniform integers from the OS CSPRNG (`os.urandom`).

    Rejection sampling on 64-bit words removes modulo bias, so each value is exactly
    uniform; nobody, including the caller, can reproduce the draws.
    """

    def integers(self, high: IntArray | int, size: int) -> IntArray:
        highs = np.broadcast_to(np.asarray(high, dtype=np.uint64), (size,))
        if size and int(highs.min()) < 1:
            raise InvalidInputError(f"high must be >= 1, got {int(highs.min())}")
        out = np.empty(size, dtype=np.uint64)
        todo = np.arange(size)
        while todo.size:
            words = np.frombuffer(os.urandom(8 * todo.size), dtype=np.uint64)
            h = highs[todo]
            # (2**64) mod h, computed without overflowing uint64.
            rem = (_U64_MAX % h + np.uint64(1)) % h
            ok = words <= _U64_MAX - rem
            out[todo[ok]] = words[ok] % h[ok]
            todo = todo[~ok]
        return out.astype(np.int64)


class SeededRandom:
    """Test source: exactly uniform integers from a seeded numpy PCG64 stream.

    Draws the same distribution as `SecureRandom` (uniform on [0, high)); only the
    predictability differs. Never use it for a real release.
    """

    def __init__(self, seed: int) -> None:
        self._gen = np.random.Generator(np.random.PCG64(seed))

    def integers(self, high: IntArray | int, size: int) -> IntArray:
        return self._gen.integers(0, np.asarray(high, dtype=np.int64), size=size, dtype=np.int64)


def as_random_source(rng: RandomSource | int | None) -> RandomSource:
    """None -> SecureRandom, an int -> SeededRandom(int), a RandomSource -> itself."""
    if rng is None:
        return SecureRandom()
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
    return (k % 2) == 1


def _bernoulli_exp_minus_one(size: int, rng: RandomSource) -> npt.NDArray[np.bool_]:
    return _bernoulli_exp_fraction(np.ones(size, dtype=np.int64), 1, rng)


def discrete_laplace(scale: Fraction, size: int, rng: RandomSource) -> IntArray:
    """Draw `size` exact discrete Laplace samples, P[x] proportional to exp(-|x| / scale).

    Canonne, Kamath, Steinke (2020), Algorithm 2, vectorised; all randomness comes from
    `rng.integers`, so the seeded test path and production draw the same distribution.
    Privacy: adding one draw to an integer query of L1 sensitivity `s` gives
    (s / scale)-DP; see `laplace_scale`. Whoever calls this knows the noise.
    """
    scale = Fraction(scale)
    if not scale > 0:
        raise InvalidInputError(f"scale must be > 0, got {scale}")
    if size < 0:
        raise InvalidInputError(f"size must be >= 0, got {size}")
    t, s = scale.numerator, scale.denominator  # scale = t / s
    out = np.empty(size, dtype=np.int64)
    todo = np.arange(size)
    while todo.size:
        m = todo.size
        u = rng.integers(t, m)
        d = _bernoulli_exp_fraction(u, t, rng)
        u, idx = u[d], todo[d]
        v = np.zeros(idx.size, dtype=np.int64)
        going = np.arange(idx.size)
        while going.size:
            a = _bernoulli_exp_minus_one(going.size, rng)
            v[going[a]] += 1
            going = going[a]
        y = (u + t * v) // s
        b = rng.integers(2, idx.size)
        keep = ~((b == 1) & (y == 0))
        out[idx[keep]] = ((1 - 2 * b) * y)[keep]
        done = np.zeros(m, dtype=bool)
        done[np.flatnonzero(d)[keep]] = True
        todo = todo[~done]
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
    return out & ((k % 2) == 1)
