"""Exact scales and the distribution of the discrete Laplace sampler."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable

import numpy as np
import pytest
from scipy import stats

from he_partition.core.errors import InvalidInputError
from he_partition.core.noise import (
    SCALE_GRID,
    CipherRandom,
    KeyedRandom,
    SecureRandom,
    SeededRandom,
    _uniform,
    as_random_source,
    discrete_laplace,
    discrete_laplace_variance,
    laplace_scale,
)


def test_scale_is_exact_and_rounded_up() -> None:
    assert laplace_scale(1, 0.1) == Fraction(10)
    assert laplace_scale(2, 0.5) == Fraction(4)
    assert laplace_scale(2, 0.2) == Fraction(10)
    s = laplace_scale(2, 0.3)
    assert s >= Fraction(2) / Fraction(0.3)
    assert s - Fraction(2) / Fraction(0.3) < Fraction(1, SCALE_GRID)
    assert s.denominator <= SCALE_GRID


@pytest.mark.parametrize("sens,eps", [(0, 1.0), (1, 0.0), (1, -1.0)])
def test_scale_rejects_bad_parameters(sens: float, eps: float) -> None:
    with pytest.raises(InvalidInputError):
        laplace_scale(sens, eps)


def test_variance_formula() -> None:
    q = math.exp(-1 / 3)
    assert discrete_laplace_variance(3) == pytest.approx(2 * q / (1 - q) ** 2, rel=1e-15)


def _pmf(k: np.ndarray, scale: float) -> np.ndarray:
    q = math.exp(-1 / scale)
    return (1 - q) / (1 + q) * q ** np.abs(k)


@pytest.mark.statistical
@pytest.mark.parametrize("source", ["seeded", "secure", "cipher", "keyed-1", "keyed-2"])
@pytest.mark.parametrize("scale", [Fraction(1), Fraction(7, 3), Fraction(20)])
def test_distribution_matches_pmf(source: str, scale: Fraction) -> None:
    from he_partition.core.noise import KeyedRandom

    rng = (SeededRandom(12345) if source == "seeded" else SecureRandom() if source == "secure"
           else CipherRandom() if source == "cipher"
           else KeyedRandom(b"pmf-test-key-0123456789", b"pmf", stream=int(source[-1])))
    # The seeded and keyed draws are fixed (chosen once), so their test is deterministic; the secure and cipher
    # sources cannot be seeded, so their thresholds give a false alarm below 1e-9 per assertion.
    alpha, sigmas, rel = (1e-9, 7, 0.08) if source in ("secure", "cipher") else (1e-3, 5, 0.05)
    n = 60_000
    x = discrete_laplace(scale, n, rng)
    assert x.dtype == np.int64
    # Chi-square goodness of fit on bins with expected count >= 20, tails pooled.
    lim = int(scale * 6)
    ks = np.arange(-lim, lim + 1)
    expected = _pmf(ks, float(scale)) * n
    keep = expected >= 20
    ks, expected = ks[keep], expected[keep]
    observed = np.array([np.count_nonzero(x == k) for k in ks], dtype=float)
    tail_obs = n - observed.sum()
    tail_exp = n - expected.sum()
    chi2, p = stats.chisquare(np.append(observed, tail_obs), np.append(expected, tail_exp))
    assert p > alpha, f"chi2={chi2:.1f} p={p:.2e}"
    # Symmetry and variance as further, independent checks.
    assert abs(x.mean()) < sigmas * math.sqrt(discrete_laplace_variance(scale) / n)
    assert x.var() == pytest.approx(discrete_laplace_variance(scale), rel=rel)


@pytest.mark.statistical
def test_seeded_and_secure_draw_the_same_distribution() -> None:
    a = discrete_laplace(Fraction(5, 2), 40_000, SeededRandom(1))
    b = discrete_laplace(Fraction(5, 2), 40_000, SecureRandom())
    # Two-sample KS on integers is conservative; a different distribution still fails it.
    assert stats.ks_2samp(a, b).pvalue > 1e-9  # b is unseeded: a false alarm below 1e-9
    c = discrete_laplace(Fraction(5, 1), 40_000, SeededRandom(2))
    assert stats.ks_2samp(a, c).pvalue < 1e-6


def test_seeded_is_reproducible() -> None:
    a = discrete_laplace(Fraction(3), 1000, SeededRandom(9))
    b = discrete_laplace(Fraction(3), 1000, SeededRandom(9))
    assert np.array_equal(a, b)


@pytest.mark.statistical
def test_secure_integers_are_uniform() -> None:
    r = SecureRandom()
    x = r.integers(7, 70_000)
    assert x.min() >= 0 and x.max() <= 6
    counts = np.bincount(x, minlength=7)
    assert stats.chisquare(counts).pvalue > 1e-9  # unseeded: a false alarm below 1e-9
    # Per-element bounds.
    y = r.integers(np.array([1, 2, 3] * 1000), 3000)
    assert np.all(y < np.array([1, 2, 3] * 1000)) and np.all(y[0::3] == 0)


def test_as_random_source() -> None:
    assert isinstance(as_random_source(None), CipherRandom)
    assert isinstance(as_random_source(3), SeededRandom)
    r = SeededRandom(1)
    assert as_random_source(r) is r
    with pytest.raises(InvalidInputError):
        as_random_source("seed")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        as_random_source(True)


def test_a_numpy_generator_is_refused_as_a_noise_source() -> None:
    """np.random.Generator has an `integers` method with another meaning; it must not pass as a RandomSource."""
    import numpy as np
    import pytest

    from he_partition.core.errors import InvalidInputError
    from he_partition.core.noise import as_random_source

    with pytest.raises(InvalidInputError, match="numpy Generator"):
        as_random_source(np.random.default_rng(0))


def test_keyed_streams_repeat_per_key_and_label_and_differ_between_streams() -> None:
    """Stream 2 (AES-256-CTR) is as reproducible as stream 1 (SHAKE-256), and a different stream."""
    from he_partition.core.noise import KeyedRandom

    def draw(key: bytes, label: bytes, stream: int) -> np.ndarray:
        rng = KeyedRandom(key, label, stream=stream)
        return np.concatenate([discrete_laplace(Fraction(5), 3000, rng), rng.integers(1 << 62, 100), rng.integers(7, 50)])

    k = b"k" * 32
    for stream in (1, 2):
        assert np.array_equal(draw(k, b"l", stream), draw(k, b"l", stream))
        assert not np.array_equal(draw(k, b"l", stream), draw(k, b"m", stream))
        assert not np.array_equal(draw(k, b"l", stream), draw(b"j" * 32, b"l", stream))
    assert not np.array_equal(draw(k, b"l", 1), draw(k, b"l", 2))
    # successive calls of one source never repeat a counter range
    rng = KeyedRandom(k, b"l", stream=2)
    a, b = rng.integers(1 << 62, 4096), rng.integers(1 << 62, 4096)
    assert len(np.intersect1d(a, b)) == 0
    with pytest.raises(InvalidInputError, match="stream"):
        KeyedRandom(k, b"l", stream=3)


@pytest.mark.statistical
def test_keyed_stream_2_words_are_uniform() -> None:
    from he_partition.core.noise import KeyedRandom

    x = KeyedRandom(b"uniform-key-0123456789", b"u", stream=2).integers(1000, 200_000)
    assert x.min() >= 0 and x.max() < 1000
    counts = np.bincount(x, minlength=1000)
    assert stats.chisquare(counts).pvalue > 1e-3
    assert stats.kstest((x + 0.5) / 1000, "uniform").pvalue > 1e-3


# --- CipherRandom: AES-256-CTR under a fresh OS key, and the rejection sampling every source shares ---


def _crafted(words: list[int]) -> Callable[[int], np.ndarray]:
    """A word source that hands out `words` in order (then fails): for exact rejection tests."""
    left = list(words)

    def take(n: int) -> np.ndarray:
        out, left[:n] = left[:n], []
        assert len(out) == n, "the sampler asked for more words than the test gave"
        return np.array(out, dtype=np.uint64)

    return take


@pytest.mark.parametrize("as_array", [False, True])
def test_uniform_rejects_exactly_the_biased_top_words(as_array: bool) -> None:
    """h = 3 * 2^61: 2^64 mod h = 2^62, so words above 2^64 - 2^62 - 1 are rejected and replaced, the rest kept mod h."""
    h = 3 << 61
    limit = (1 << 64) - 1 - (1 << 62)
    words = [limit, limit + 1, (1 << 64) - 1, 5, h, h + 1, limit + 2, 7]
    high = np.full(5, h, dtype=np.int64) if as_array else h
    got = _uniform(high, 5, _crafted(words))
    # limit, 5 and h kept; limit + 1 and 2^64 - 1 rejected and redrawn (h + 1 kept, limit + 2 rejected, then 7)
    assert got.tolist() == [limit % h, 1, 7, 5, 0]


def test_uniform_scalar_and_array_bounds_take_the_same_words() -> None:
    for h in (7, 1032193, 3 << 61, 5 << 60):
        a = KeyedRandom(b"same-words-key-012345", b"s", stream=2).integers(h, 20_000)
        b = KeyedRandom(b"same-words-key-012345", b"s", stream=2).integers(np.full(20_000, h, dtype=np.int64), 20_000)
        assert a.dtype == b.dtype == np.int64 and np.array_equal(a, b)


@pytest.mark.statistical
def test_no_modulo_bias_at_a_bound_that_is_not_a_power_of_two() -> None:
    """h = 3 * 2^61: plain w mod h would put 3/4 of the values below 2^62; exactly uniform puts 2/3 there."""
    h, n = 3 << 61, 60_000
    keyed = KeyedRandom(b"bias-test-key-0123456", b"b", stream=2).integers(h, n)  # fixed draws: deterministic
    fresh = CipherRandom().integers(h, n)
    for x in (keyed, fresh):
        assert x.min() >= 0 and x.max() < h
        below = np.count_nonzero(x < (1 << 62)) / n
        assert abs(below - 2 / 3) < 6 * math.sqrt(2 / 9 / n)  # 6 sigma; 3/4 is 43 sigma away
        # and uniform across thirds of [0, h)
        assert stats.chisquare(np.bincount(x // (1 << 61), minlength=3)).pvalue > 1e-9


@pytest.mark.statistical
def test_cipher_integers_are_uniform() -> None:
    r = CipherRandom()
    x = r.integers(1000, 200_000)
    assert x.dtype == np.int64 and x.min() >= 0 and x.max() < 1000
    assert stats.chisquare(np.bincount(x, minlength=1000)).pvalue > 1e-9  # unseeded: a false alarm below 1e-9
    assert stats.kstest((x + 0.5) / 1000, "uniform").pvalue > 1e-9
    # small calls (served from the keystream buffer) are uniform too
    y = np.concatenate([r.integers(7, 10) for _ in range(7_000)])
    assert stats.chisquare(np.bincount(y, minlength=7)).pvalue > 1e-9
    # per-element bounds and powers of two
    z = r.integers(np.array([1, 2, 3] * 1000), 3000)
    assert np.all(z < np.array([1, 2, 3] * 1000)) and np.all(z[0::3] == 0)
    top = r.integers(1 << 62, 100_000)
    assert top.min() >= 0 and top.max() < 1 << 62 and np.count_nonzero(top >= 1 << 61) == pytest.approx(50_000, abs=1_000)


def _words_of(r: CipherRandom | KeyedRandom, size: int = 1000) -> np.ndarray:
    return r.integers(1 << 62, size)


def test_cipher_instances_copies_and_calls_never_share_words() -> None:
    import copy
    import pickle

    a, b = CipherRandom(), CipherRandom()
    draws = [_words_of(a), _words_of(b), _words_of(copy.copy(a)), _words_of(pickle.loads(pickle.dumps(a))),
             _words_of(a), _words_of(a, 3), _words_of(a, 3), _words_of(a, 5000)]
    every = np.concatenate(draws)
    # 62-bit values: any repeat among 13k would be a reused keystream, not chance (about 2^-36)
    assert np.unique(every).size == every.size


def test_a_forked_child_draws_a_fresh_keystream() -> None:
    import os

    r = CipherRandom()
    _words_of(r, 3)  # fills the small-call buffer the child inherits
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first draws, then leave without running the parent's cleanup
        try:
            os.write(write, _words_of(r, 3).tobytes() + _words_of(r, 2000).tobytes())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        child = np.frombuffer(fh.read(), dtype=np.int64)
    os.waitpid(pid, 0)
    parent = np.concatenate([_words_of(r, 3), _words_of(r, 2000)])
    assert child.size == parent.size == 2003
    assert np.intersect1d(child, parent).size == 0


@pytest.mark.parametrize("make", [CipherRandom, lambda: KeyedRandom(b"thread-key-0123456789", b"t", stream=2),
                                  lambda: KeyedRandom(b"thread-key-0123456789", b"t", stream=1)])
def test_threads_sharing_one_source_never_get_the_same_words(make: Callable[[], CipherRandom | KeyedRandom]) -> None:
    import threading

    r = make()
    out: list[np.ndarray] = []
    lock = threading.Lock()

    def work(k: int) -> None:
        mine = [_words_of(r, 1 + (i * 37 + k) % 1500) for i in range(60)]
        with lock:
            out.extend(mine)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = np.concatenate(out)
    assert every.size > 100_000 and np.unique(every).size == every.size


def test_a_pickled_keyed_source_continues_its_stream() -> None:
    import pickle

    a = KeyedRandom(b"pickle-key-0123456789", b"p", stream=2)
    _words_of(a)
    b = pickle.loads(pickle.dumps(a))
    assert np.array_equal(_words_of(a), _words_of(b))


def _reference_uniform(high: object, size: int, words: Callable[[int], np.ndarray]) -> np.ndarray:
    """The rejection sampler as it was before its scalar fast paths, kept verbatim as the reference."""
    u64_max = np.uint64(0xFFFFFFFFFFFFFFFF)
    if isinstance(high, int) and high >= 1 and high & (high - 1) == 0:
        return (words(size) >> np.uint64(64 - (high.bit_length() - 1))).astype(np.int64) if high > 1 \
            else np.zeros(size, dtype=np.int64)
    highs = np.broadcast_to(np.asarray(high, dtype=np.uint64), (size,))
    out = np.empty(size, dtype=np.uint64)
    todo = np.arange(size)
    while todo.size:
        w = words(todo.size)
        h = highs[todo]
        rem = (u64_max % h + np.uint64(1)) % h
        ok = w <= u64_max - rem
        out[todo[ok]] = w[ok] % h[ok]
        todo = todo[~ok]
    return out.astype(np.int64)


def test_uniform_draws_the_same_values_from_the_same_calls_as_before_its_fast_paths() -> None:
    """A keyed source's draws depend on its call sequence, so the fast paths must ask for words exactly as before."""
    cases = [(7, 0), (8, 0), (1, 0), (1, 5), (True, 4), (np.int64(7), 0), (np.int64(1), 3), (np.int64(8), 5),
             (np.int64(1032193), 100), (2, 100), (1 << 62, 1000), (1 << 63, 50), (7, 10_000), (1032193, 30_000),
             (3 << 61, 1000), (5 << 60, 777), (3 * (1 << 40), 999), (np.arange(1, 501), 500),
             (np.array([3 << 61, 7, 5 << 60] * 50), 150)]
    for stream in (1, 2):
        new, old = (KeyedRandom(b"reference-key-0123456", b"r", stream=stream) for _ in range(2))
        asked: tuple[list[int], list[int]] = ([], [])

        def counted(src: KeyedRandom, log: list[int]) -> Callable[[int], np.ndarray]:
            return lambda n: (log.append(n), src._words(n))[1]

        for high, size in cases:
            a = _uniform(high, size, counted(new, asked[0]))  # type: ignore[arg-type]
            b = _reference_uniform(high, size, counted(old, asked[1]))
            assert a.dtype == b.dtype == np.int64 and np.array_equal(a, b), (stream, high, size)
        assert asked[0] == asked[1]
