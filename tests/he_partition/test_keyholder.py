"""The key holder's view: a curious decryption server tries to tell datasets apart from what its key reveals.

The decryption server (DS) holds the secret key, so for every ciphertext it receives it
sees the exact slot values and the noise polynomial (`keyholder.residual_view`). The slot
values are the DP-noised measurement (and uniform pads); these tests attack the rest. The
attack is the residue-prediction attack that broke the old CKKS layout: for each
hypothesis (dataset A or B) the DS predicts the data-dependent part of the noise (the
rounding of round(q m / t) in each encryption that was summed, which it can compute for
a candidate owner plaintext m) and picks the hypothesis whose prediction fits the observed
residual best. With the computation server's flooding it must be at chance; with flooding
switched off, the view carries an exact function of how the data splits between owners
(`test_without_flooding_the_view_carries_an_exact_function_of_the_owners_plaintexts`) and
is not uniform (`test_the_flooded_residual_is_uniform_whatever_the_data` fails). Measured:
with BFV at these parameters the residue attack is weak even unflooded (the carry term is
{-1, 0, 1} against fresh noise of standard deviation ~30 per coefficient, and the two
hypotheses' scores differed by ~1e-5 relative), so flooding is what makes the bound
provable rather than what makes this particular attack fail.

Trials use real BFV ciphertexts, whose encryption randomness and flooding come from SEAL
and the OS (they cannot be seeded), so the thresholds give a false alarm below 3e-8 per
assertion (about 1e-7 per run of this file).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
import tenseal.sealapi as sealapi

from he_partition.he.bfv import BfvBackend
from he_partition.he.keyholder import generate_backends, residual_view
from he_partition.core.measurements import (HaarCoefficients, Measurement, PartitionSums, PrefixDifferences, RangeCount,
                                       owner_encoding)
from he_partition.core.noise import SeededRandom
from he_partition.protocol import ComputationSide, encrypt_histogram
from he_partition.core.estimation import haar_depth

N = 8192
TRIALS = 40
#: P(Binomial(40, 1/2) >= 38) = 7.5e-10: a flooded view reaching this is not at chance.
CHANCE_LIMIT = 37


@pytest.fixture(scope="module")
def keys() -> tuple[BfvBackend, BfvBackend]:
    return generate_backends()


class ResiduePredictor:
    """What a DS can compute for a candidate plaintext: SEAL's rounding residue of round(Q m / t)."""

    def __init__(self, ds: BfvBackend) -> None:
        seal = ds.context.seal_context().data
        self.encoder = sealapi.BatchEncoder(seal)
        self.t = ds.plain_modulus
        self.q = 1
        for m in seal.first_context_data().parms().coeff_modulus():
            self.q *= int(m.value())

    def plaintext(self, slots: np.ndarray) -> list[int]:
        plain = sealapi.Plaintext()
        self.encoder.encode([int(v) % self.t for v in slots], plain)
        return [int(plain[i]) for i in range(plain.coeff_count())] + [0] * (N - plain.coeff_count())

    def residue(self, coeffs: list[int]) -> np.ndarray:
        """round(Q m / t) - Q m / t per coefficient, times t (exact integers in [-t/2, t/2])."""
        q, t = self.q, self.t
        return np.array([((q * m + t // 2) // t) * t - q * m for m in coeffs], dtype=np.float64)


def attack(ds: BfvBackend, public: BfvBackend, a: np.ndarray, b: np.ndarray,
           measurement: Callable[[], Measurement], *, flooding: bool, trials: int = TRIALS) -> int:
    """How many of `trials` the residue-prediction attack gets right (the truth alternates A, B)."""
    pred = ResiduePredictor(ds)
    enc_a, enc_b = pred.plaintext(owner_encoding(a)), pred.plaintext(owner_encoding(b))
    res_a, res_b = pred.residue(enc_a), pred.residue(enc_b)
    public.flooding = flooding
    try:
        correct = 0
        for trial in range(trials):
            truth = a if trial % 2 == 0 else b
            m = measurement()
            aggregate = encrypt_histogram(public, truth)
            chunk = ComputationSide(public, SeededRandom(1000 + trial)).measure(aggregate, m).chunks[0]
            observed = residual_view(ds, chunk).astype(np.float64) * ds.plain_modulus
            total = pred.plaintext(ds.decrypt(type(aggregate)(aggregate.length, (chunk,))))
            res_total = pred.residue(total)
            scores = []
            for enc, res in ((enc_a, res_a), (enc_b, res_b)):
                # The CS's noise plaintext is total - owner under this hypothesis; its residue is predictable too.
                noise_plain = [(x - y) % ds.plain_modulus for x, y in zip(total, enc)]
                predicted = res + pred.residue(noise_plain) - res_total
                scores.append(float(np.sum((observed - predicted) ** 2)))
            guess_a = scores[0] < scores[1]
            correct += int(guess_a == (trial % 2 == 0))
        return correct
    finally:
        public.flooding = True


def _same_partition_sums() -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """All mass at each partition's first bin (A) vs its last (B): equal partition sums."""
    starts = tuple(range(0, N, 64))
    a = np.zeros(N, dtype=np.int64)
    b = np.zeros(N, dtype=np.int64)
    for s in starts:
        a[s] = 50
        b[s + 63] = 50
    return a, b, starts


def _one_record_added() -> tuple[np.ndarray, np.ndarray]:
    a = np.random.default_rng(7).poisson(20, N).astype(np.int64)
    b = a.copy()
    b[N // 3] += 1
    return a, b


def test_equal_partition_sums_are_indistinguishable_from_the_residual_view(keys) -> None:
    ds, public = keys
    a, b, starts = _same_partition_sums()
    correct = attack(ds, public, a, b, lambda: PartitionSums(N, 0.5, 1, starts), flooding=True)
    assert correct <= CHANCE_LIMIT, f"the key holder told the datasets apart in {correct} of {TRIALS} trials"


def test_without_flooding_the_view_carries_an_exact_function_of_the_owners_plaintexts(keys) -> None:
    """What flooding hides, shown exactly: the noise of a sum is the summands' noises plus carries of their data.

    residual(ct1 + ct2) - residual(ct1) - residual(ct2) equals round(Q m1/t) + round(Q m2/t) - round(Q (m1+m2)/t),
    a {-1, 0, 1} pattern that depends on how the total splits between owners, which the DS must not learn.
    With flooding on, the measurement's residual is uniform on [-2^61, 2^61) instead.
    """
    ds, public = keys
    pred = ResiduePredictor(ds)
    x1 = np.random.default_rng(1).integers(0, 10**9, N)
    x2 = np.random.default_rng(2).integers(0, 10**9, N)
    c1, c2 = public.encrypt(x1), public.encrypt(x2)
    carries = residual_view(ds, public.add(c1, c2).chunks[0]) - residual_view(ds, c1.chunks[0]) \
        - residual_view(ds, c2.chunks[0])
    t = ds.plain_modulus
    predicted = (pred.residue(pred.plaintext(x1)) + pred.residue(pred.plaintext(x2))
                 - pred.residue(pred.plaintext(x1 + x2))) / t
    assert np.array_equal(carries, predicted.astype(np.int64)) and np.count_nonzero(carries) > 1000
    flooded = public.add_noise(public.add(c1, c2), np.zeros(N, dtype=np.int64))
    assert np.max(np.abs(residual_view(ds, flooded.chunks[0]))) > 2**60


def test_the_flooded_residual_is_uniform_whatever_the_data(keys) -> None:
    """The view's distribution: uniform on [-2^61, 2^61) for both datasets (fails with flooding off)."""
    from scipy import stats

    ds, public = keys
    a, b, starts = _same_partition_sums()
    m = PartitionSums(N, 0.5, 1, starts)
    views = []
    for x in (a, b):
        chunk = ComputationSide(public, SeededRandom(9)).measure(encrypt_histogram(public, x), m).chunks[0]
        views.append(residual_view(ds, chunk).astype(np.float64) / 2.0**61)
    for v in views:  # 8,192 coefficients each; a false alarm below 1e-9 per assertion
        assert stats.kstest(v, stats.uniform(loc=-1, scale=2).cdf).pvalue > 1e-9
    assert stats.ks_2samp(views[0], views[1]).pvalue > 1e-9
    public.flooding = False
    try:
        chunk = ComputationSide(public, SeededRandom(9)).measure(encrypt_histogram(public, a), m).chunks[0]
        raw = residual_view(ds, chunk).astype(np.float64) / 2.0**61
    finally:
        public.flooding = True
    assert stats.kstest(raw, stats.uniform(loc=-1, scale=2).cdf).pvalue < 1e-100  # tiny, data-bearing noise


def test_one_record_added_is_at_chance_from_the_residual_view(keys) -> None:
    ds, public = keys
    a, b = _one_record_added()
    correct = attack(ds, public, a, b, lambda: PartitionSums(N, 0.1, 1, tuple(range(0, N, 128))), flooding=True)
    assert correct <= CHANCE_LIMIT


@pytest.mark.parametrize("kind", ["prefix_differences", "haar", "range_count", "range_count_from_zero"])
def test_every_measurement_kind_is_at_chance_from_the_residual_view(keys, kind: str) -> None:
    ds, public = keys
    a, b = _one_record_added()
    make: dict[str, Callable[[], Measurement]] = {
        "prefix_differences": lambda: PrefixDifferences(N, 0.1, 2),
        "haar": lambda: HaarCoefficients(N, 0.5, 1 + haar_depth(N)),
        "range_count": lambda: RangeCount(N, 0.1, 1, lo=100, hi=5000),
        "range_count_from_zero": lambda: RangeCount(N, 0.1, 1, lo=0, hi=5000),
    }
    correct = attack(ds, public, a, b, make[kind], flooding=True, trials=30)
    # P(Binomial(30, 1/2) >= 29) = 2.9e-8.
    assert correct <= 28, f"{kind}: the key holder was right in {correct} of 30 trials"


def test_slots_outside_the_measurement_are_uniform_pads(keys) -> None:
    """The key holder's slot values: the noised measurement, and pads that are fresh each time."""
    ds, public = keys
    a, _, starts = _same_partition_sums()
    m = PartitionSums(N, 0.5, 1, starts)
    agg = encrypt_histogram(public, a)
    views = [ds.decrypt(ComputationSide(public, SeededRandom(s)).measure(agg, m)) for s in (1, 2)]
    free = ~m.measured_slots()
    assert not np.any(views[0][free] == views[1][free])  # 8,064 pads, each uniform on 2^49 values
    t = ds.plain_modulus
    # Uniform mod t: the centred pads fill (-t/2, t/2]; their mean is near 0 on the scale of t.
    assert abs(float(np.mean(views[0][free]))) < t / 20
    assert np.max(np.abs(views[0][free])) > t / 2 * 0.99


def test_flooded_residual_is_large_and_budget_still_decrypts(keys) -> None:
    ds, public = keys
    x = np.arange(100)
    chunk = ComputationSide(public, SeededRandom(3)).measure(encrypt_histogram(public, x),
                                                             PartitionSums(100, 1.0, 1, (0, 50))).chunks[0]
    res = residual_view(ds, chunk)
    assert res.shape == (N,) and np.max(np.abs(res)) > 2**60  # flooding: uniform on [-2^61, 2^61)
    assert ds.noise_budget(chunk) >= 40
    fresh = residual_view(ds, encrypt_histogram(public, x).chunks[0])
    assert np.max(np.abs(fresh)) < 2**10  # a fresh encryption's noise, before flooding


def test_the_key_holders_own_flood_keeps_honest_decodes_exact_and_is_fixed_by_the_ciphertext() -> None:
    """The decryption server's flood (`BfvBackend.holder_flooded`, 2^108 at these parameters, Delta / 2 = 2^110):
    an honest flooded chunk decodes to the same slots and keeps 2 bits of budget (>= FLOODED_MIN_BUDGET_BITS);
    the same ciphertext gets the same flood (a re-sent request cannot average it), another key's chunk has 0."""
    from he_partition.he.bfv import FLOODED_MIN_BUDGET_BITS

    ds, owner = generate_backends()
    assert ds.holder_flood_bits == 108
    values = np.arange(-4096, 4096, dtype=np.int64) * 1000
    data = owner.serialize_chunk(owner.encrypt(values).chunks[0] + owner._flood())
    key = bytes(range(32))
    once, twice = ds.holder_flooded(data, key), ds.holder_flooded(data, key)
    assert once == twice and once != ds.holder_flooded(data, bytes(32))
    decoded, passed = ds.decrypt_flooded(ds.deserialize_chunk(once))
    assert passed and np.array_equal(decoded, values)
    assert ds.noise_budget(ds.deserialize_chunk(once)) == 2 >= FLOODED_MIN_BUDGET_BITS
    other, _ = generate_backends()
    foreign = ds.holder_flooded(other.serialize_chunk(other.encrypt(values).chunks[0]), key)
    assert not ds.decrypt_flooded(ds.deserialize_chunk(foreign))[1]
