"""Privelet: the Haar measurement's exact layout and sensitivity, privacy arithmetic, BFV equivalence, SEs."""

from __future__ import annotations

import numpy as np

from he_partition.core.backend import DEFAULT_PLAIN_MODULUS, centre
import pytest

from he_partition import release
from he_partition.core.errors import InvalidInputError
from he_partition.core.estimation import haar_depth, haar_forward
from he_partition.core.measurements import HaarCoefficients, measurement_from_dict, owner_encoding
from he_partition.strategies.privelet import PriveletParams, privelet_strategy

from .test_hier import check_privacy, drive


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 100, 4097])
def test_haar_measurement_layout(n):
    rng = np.random.default_rng(n)
    x = rng.integers(0, 50, n)
    m = HaarCoefficients(n, 1.0, 1 + haar_depth(n))
    eta = rng.integers(-1000, 1000, n)
    noise = m.noise_slots(eta)
    assert noise.dtype == np.int64 and np.all((0 <= noise) & (noise < DEFAULT_PLAIN_MODULUS))  # exact mod t
    assert m.measured_slots() is None  # every slot is measured: no pads, no plaintext multiply
    view = centre(owner_encoding(x) + noise, DEFAULT_PLAIN_MODULUS)
    assert np.array_equal(m.decode(view), haar_forward(x) + eta)


def test_haar_has_no_magnitude_limit_any_more():
    # The old CKKS layout multiplied by 2^L and failed above ~4e6 records per 4,096 bins.
    n = 4096
    x = np.full(n, 50_000, dtype=np.int64)  # 2e8 records
    m = HaarCoefficients(n, 1.0, 1 + haar_depth(n))
    eta = np.random.default_rng(0).integers(-1000, 1000, n)
    view = centre(owner_encoding(x) + m.noise_slots(eta), DEFAULT_PLAIN_MODULUS)
    assert np.array_equal(m.decode(view), haar_forward(x) + eta)


def test_haar_sensitivity_is_exact():
    assert HaarCoefficients(4096, 1.0, 13).sensitivity == 13
    assert HaarCoefficients(5000, 1.0, 2 * 14).scale == pytest.approx(28.0)
    with pytest.raises(InvalidInputError, match="multiple of 1 \\+ ceil"):
        HaarCoefficients(4096, 1.0, 12)
    m = HaarCoefficients(100, 0.5, 8)
    assert measurement_from_dict(m.to_dict()) == m


@pytest.mark.parametrize("c", [1, 3])
def test_privelet_privacy_accounting(c):
    x = np.random.default_rng(1).integers(0, 9, 300)
    summary, seen = drive(privelet_strategy(300, 0.8, noise_parties=2, contribution_bound=c), x, noise_seed=4)
    assert len(seen) == 1 and isinstance(seen[0], HaarCoefficients)
    check_privacy(summary, seen, 0.8, lambda m: c * (1 + haar_depth(300)))
    exact, _ = drive(privelet_strategy(300, 0.8, noise_parties=2), x)
    assert np.allclose(exact.estimate(), x)


def test_nonnegative_refinement_gives_non_negative_estimates():
    x = np.zeros(512, dtype=np.int64)
    x[100] = 40
    s = release([x], 0.5, strategy="privelet", params=PriveletParams(nonnegative=True), rng=3)
    assert s.estimator == "haar_nonnegative"
    assert np.all(s.estimate() >= -1e-9)
    plain = release([x], 0.5, strategy="privelet", rng=3)
    assert np.any(plain.estimate() < 0)


@pytest.mark.parametrize("n,owners", [(1, 1), (300, 3), (5000, 2)])
def test_bfv_equals_plain(n, owners):
    rng = np.random.default_rng(n)
    hs = [rng.integers(0, 5, n) for _ in range(owners)]
    assert release(hs, 0.6, strategy="privelet", backend="bfv", rng=9) == release(hs, 0.6, strategy="privelet", rng=9)


@pytest.mark.statistical
def test_standard_errors_match_empirical_spread():
    n = 200
    x = np.random.default_rng(2).integers(0, 20, n)
    ranges = np.array([[0, 200], [3, 4], [17, 90], [100, 199], [64, 128]])
    truth = np.array([x[a:b].sum() for a, b in ranges])
    errs = []
    for seed in range(300):
        s = release([x], 1.0, strategy="privelet", rng=seed)
        counts = s.range_counts(ranges)
        errs.append([c.value for c in counts] - truth)
    se = np.array([c.standard_error for c in counts])
    z2 = np.mean(np.array(errs) ** 2, axis=0) / se**2
    assert np.all((z2 > 0.75) & (z2 < 1.3)), z2
