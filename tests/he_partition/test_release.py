"""The public entry point: BFV equals the numpy oracle, inputs are validated, summaries behave."""

from __future__ import annotations

import numpy as np
import pytest

from he_partition import InvalidInputError, Summary, release
from he_partition.core.backend import PlainBackend
from he_partition.he.bfv import BfvBackend, generate_secret_context, load_context, public_context_bytes
from he_partition.core.errors import PrecisionError
from he_partition.core.measurements import PartitionSums, PrefixDifferences
from he_partition.core.noise import SeededRandom
from he_partition.protocol import Budget, ComputationSide, DecryptionSide, encrypt_histogram


def _owners(n: int, k: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    base = np.where((np.arange(n) // 97) % 3 == 0, 40, 2)
    return [rng.poisson(base) for _ in range(k)]


@pytest.mark.parametrize("n", [1, 37, 4096, 5000, 8193])
def test_bfv_equals_plain(n: int) -> None:
    hs = _owners(n, 3, n)
    a = release(hs, 0.8, backend="plain", rng=11)
    b = release(hs, 0.8, backend="bfv", rng=11)
    assert a == b
    assert a.domain_size == n


def test_bfv_equals_plain_single_noise() -> None:
    hs = _owners(300, 2, 1)
    assert release(hs, 1.0, backend="bfv", noise_parties=1, rng=5) == release(
        hs, 1.0, backend="plain", noise_parties=1, rng=5
    )


@pytest.mark.parametrize(
    "hs,eps,match",
    [
        ([[1, 2, -1]], 1.0, "negative"),
        ([[1, 2, 3], [1, 2]], 1.0, "lengths differ"),
        ([[1.0, float("nan"), 3.0]], 1.0, "NaN"),
        ([[1.5, 2.0]], 1.0, "non-integer"),
        ([[]], 1.0, "empty"),
        ([], 1.0, "at least one"),
        ([[[1, 2]]], 1.0, "1-D"),
        ([[1, 2]], 0.0, "epsilon"),
        ([[1, 2]], -1.0, "epsilon"),
        ([[1, 2]], float("nan"), "epsilon"),
        ([[1, 2]], float("inf"), "epsilon"),
    ],
)
def test_invalid_inputs_name_the_problem(hs: list, eps: float, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        release(hs, eps)


def test_invalid_options() -> None:
    with pytest.raises(InvalidInputError, match="noise_parties"):
        release([[1, 2]], 1.0, noise_parties=3)
    with pytest.raises(InvalidInputError, match="strategy"):
        release([[1, 2]], 1.0, strategy="magic")
    with pytest.raises(InvalidInputError, match="backend"):
        release([[1, 2]], 1.0, backend="gpu")
    with pytest.raises(InvalidInputError, match="contribution_bound"):
        release([[1, 2]], 1.0, contribution_bound=0)
    with pytest.raises(InvalidInputError, match="single 1-D"):
        release(np.array([1, 2]), 1.0)  # type: ignore[arg-type]


def test_release_is_integer_and_json_round_trips() -> None:
    s = release(_owners(500, 2, 3), 1.0, rng=4)
    assert all(isinstance(v, int) for v in s.sums)
    t = Summary.from_json(s.to_json())
    assert t == s
    assert np.array_equal(t.estimate(), s.estimate())
    with pytest.raises(InvalidInputError, match="format"):
        Summary.from_json('{"format": "other"}')
    with pytest.raises(InvalidInputError, match="JSON"):
        Summary.from_json("{nope")


def test_range_count_and_standard_error() -> None:
    s = Summary(domain_size=10, epsilon=1.0, strategy="gap", noise_parties=2, starts=(0, 4, 6),
                sums=(40, 10, 8), sum_variance=(4.0, 4.0, 9.0))
    assert s.estimate().tolist() == [10] * 4 + [5] * 2 + [2] * 4
    r = s.range_count(2, 8)  # half of p0, all of p1, half of p2
    assert r.value == pytest.approx(20 + 10 + 4)
    assert r.standard_error == pytest.approx(np.sqrt(0.25 * 4 + 4 + 0.25 * 9))
    assert s.range_count(0, 10).value == 58
    with pytest.raises(InvalidInputError, match="range"):
        s.range_count(3, 3)
    with pytest.raises(InvalidInputError, match="range"):
        s.range_count(0, 11)


@pytest.mark.statistical
def test_range_errors_match_reported_standard_error() -> None:
    # Ranges aligned with partitions have no spreading error: z-scores must look standard.
    x = np.repeat([30, 0, 100, 5], 50)
    z = []
    for seed in range(200):
        s = release([x], 0.5, rng=seed)
        bounds = list(s.starts) + [s.domain_size]
        lo, hi = bounds[0], bounds[len(bounds) // 2]
        r = s.range_count(lo, hi)
        z.append((r.value - x[lo:hi].sum()) / r.standard_error)
    assert abs(np.mean(z)) < 0.25
    assert 0.8 < np.std(z) < 1.2


def test_decryption_side_refuses_bad_ciphertexts() -> None:
    secret = generate_secret_context()
    ds_be = BfvBackend(secret)
    pub_be = BfvBackend(load_context(public_context_bytes(secret)))
    assert not pub_be.can_decrypt
    rng = SeededRandom(0)
    budget = Budget(10.0)
    ds = DecryptionSide(ds_be, rng, budget, 2)
    x = np.arange(20)
    agg = encrypt_histogram(pub_be, x)
    # A measurement that does not fit the ciphertext's length: refused, nothing charged.
    with pytest.raises(InvalidInputError, match="slots in use"):
        ds.decrypt_measurement(PartitionSums(21, 1.0, 1, starts=(0, 10)), agg)
    assert budget.charges == []
    # A ciphertext under another key decrypts to garbage: refused by the noise-budget check.
    other = BfvBackend(generate_secret_context())
    foreign = ComputationSide(other, rng).measure(encrypt_histogram(other, x), PrefixDifferences(20, 1.0, 2))
    foreign_here = type(foreign)(20, tuple(ds_be.deserialize_chunk(other.serialize_chunk(c)) for c in foreign.chunks))
    with pytest.raises(PrecisionError, match="another key"):
        ds.decrypt_measurement(PrefixDifferences(20, 1.0, 2), foreign_here)
    with pytest.raises(InvalidInputError, match="secret key"):
        DecryptionSide(pub_be, rng, budget, 2)
    with pytest.raises(InvalidInputError, match="not a BFV ciphertext"):
        pub_be.deserialize_chunk(b"\x00" * 100)


def test_public_context_has_no_secret_key() -> None:
    secret = generate_secret_context()
    pub = load_context(public_context_bytes(secret))
    assert secret.is_private() and not pub.is_private()
    assert not pub.has_galois_keys()


def test_plain_backend_chunking() -> None:
    be = PlainBackend(4, plain_modulus=17)
    v = be.encrypt(np.arange(10))
    assert len(v.chunks) == 3
    assert be.decrypt(be.add(v, v)).tolist() == [0, 2, 4, 6, 8, -7, -5, -3, -1, 1]  # exact modulo 17, centred
    with pytest.raises(InvalidInputError, match="fractional"):
        be.encrypt(np.array([0.5]))
