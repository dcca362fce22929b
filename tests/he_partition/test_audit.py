"""Empirical DP audit: exact Clopper-Pearson bounds, the real mechanism passes, a broken one is caught."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from he_partition.methods import audit
from he_partition.core.errors import InvalidInputError
from he_partition.core.noise import as_random_source, discrete_laplace_variance, laplace_scale

# -- exact arithmetic ------------------------------------------------------------------

CP_CASES = [(0, 10), (1, 10), (3, 10), (9, 10), (10, 10), (0, 1), (1, 1), (17, 400), (500, 10_000),
            (4_999, 10_000), (9_990, 10_000), (1, 100_000), (37_000, 100_000)]


@pytest.mark.parametrize("k, n", CP_CASES)
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.999])
def test_clopper_pearson_interval_matches_scipy_beta_ppf(k: int, n: int, confidence: float) -> None:
    tail = (1 - confidence) / 2
    lo_ref = 0.0 if k == 0 else float(stats.beta.ppf(tail, k, n - k + 1))
    hi_ref = 1.0 if k == n else float(stats.beta.ppf(1 - tail, k + 1, n - k))
    lo, hi = audit.clopper_pearson_interval(k, n, confidence)
    assert lo == pytest.approx(lo_ref, rel=1e-8, abs=1e-15)
    assert hi == pytest.approx(hi_ref, rel=1e-8, abs=1e-15)
    up = audit.clopper_pearson_upper(k, n, confidence)
    up_ref = 1.0 if k == n else float(stats.beta.ppf(confidence, k + 1, n - k))
    assert up == pytest.approx(up_ref, rel=1e-8, abs=1e-15)


def test_clopper_pearson_closed_forms() -> None:
    # k = 0: the upper bound solves (1 - p)^n = 1 - c exactly; k = n: the lower bound solves p^n = (1 - c) / 2
    assert audit.clopper_pearson_upper(0, 50, 0.95) == pytest.approx(1 - 0.05 ** (1 / 50), rel=1e-12)
    assert audit.clopper_pearson_interval(50, 50, 0.95)[0] == pytest.approx(0.025 ** (1 / 50), rel=1e-12)


def test_epsilon_lower_bound_exact_value() -> None:
    # 1,000 runs per input; 120 false positives, 130 false negatives; confidence 0.95 -> each bound at 0.975
    eps, fpr_hi, fnr_hi = audit.epsilon_lower_bound(120, 1000, 130, 1000, confidence=0.95)
    fpr_ref = float(stats.beta.ppf(0.975, 121, 880))
    fnr_ref = float(stats.beta.ppf(0.975, 131, 870))
    assert fpr_hi == pytest.approx(fpr_ref, rel=1e-9)
    assert fnr_hi == pytest.approx(fnr_ref, rel=1e-9)
    ref = max(math.log((1 - fnr_ref) / fpr_ref), math.log((1 - fpr_ref) / fnr_ref))
    assert eps == pytest.approx(ref, rel=1e-9)
    with_delta, _, _ = audit.epsilon_lower_bound(120, 1000, 130, 1000, confidence=0.95, delta=0.1)
    assert with_delta == pytest.approx(max(math.log((0.9 - fnr_ref) / fpr_ref), math.log((0.9 - fpr_ref) / fnr_ref)))
    # a test no better than a coin gives no evidence at all
    assert audit.epsilon_lower_bound(500, 1000, 500, 1000)[0] == 0.0


@pytest.mark.parametrize("k, n", [(-1, 10), (11, 10), (0, 0), (1.5, 10)])
def test_bad_counts_are_refused(k: float, n: int) -> None:
    with pytest.raises(InvalidInputError):
        audit.clopper_pearson_upper(k, n)  # type: ignore[arg-type]


# -- the mechanism under audit is the real one -------------------------------------------


@pytest.mark.statistical
def test_partition_sum_mechanism_releases_true_sum_plus_one_discrete_laplace_draw() -> None:
    eps = 0.5
    x = np.asarray(audit.AUDIT_X0, dtype=np.int64)
    true_sum = int(x[2:5].sum())  # the changed bin's partition [2, 5)
    rng = as_random_source(11)
    out = np.concatenate([audit.partition_sum_mechanism(eps, batch=4096)(x, rng) for _ in range(5)])
    assert out.dtype == np.float64 and np.all(out == np.rint(out))
    noise = out - true_sum
    var = discrete_laplace_variance(laplace_scale(1, eps))  # 7.83 at scale 2
    assert abs(noise.mean()) < 4 * math.sqrt(var / noise.size)
    assert noise.var() == pytest.approx(var, rel=0.05)
    # P[noise = 0] = tanh(1 / (2 * scale)) exactly for discrete Laplace
    assert np.mean(noise == 0) == pytest.approx(math.tanh(eps / 2), abs=0.01)


@pytest.mark.statistical
def test_broken_mechanism_changes_only_the_noise_scale() -> None:
    # halving the scale at eps is the correct mechanism at 2 eps: same seed, same draws, same audit
    broken = audit.run_audit(0.5, trials=4000, broken=True, seed=3)
    correct = audit.run_audit(1.0, trials=4000, broken=False, seed=3)
    assert (broken.epsilon_lower_bound, broken.fpr, broken.fnr, broken.threshold) == (
        correct.epsilon_lower_bound, correct.fpr, correct.fnr, correct.threshold)


# -- the audit itself -------------------------------------------------------------------


@pytest.mark.statistical
def test_real_mechanism_stays_below_its_epsilon() -> None:
    result = audit.run_audit(1.0, trials=20_000, seed=2024)
    assert result.epsilon_lower_bound <= 1.0
    assert not result.violation
    # ...and the audit is strong enough to come close: a useless test would give ~0
    assert result.epsilon_lower_bound > 0.85
    assert result.trials == 20_000 and result.configured_epsilon == 1.0
    assert "PartitionSums" in result.description


@pytest.mark.statistical
def test_broken_mechanism_is_caught() -> None:
    result = audit.run_audit(1.0, trials=20_000, broken=True, seed=2024)
    assert result.epsilon_lower_bound > 1.0
    assert result.violation
    assert result.to_dict()["violation"] is True
    assert "broken" in result.description


@pytest.mark.statistical
@pytest.mark.parametrize("eps", [0.25, 4.0])
def test_audit_verdicts_hold_away_from_eps_1(eps: float) -> None:
    assert not audit.run_audit(eps, trials=40_000, seed=5).violation
    assert audit.run_audit(eps, trials=40_000, broken=True, seed=5).violation


@pytest.mark.statistical
def test_full_gap_release_end_to_end_stays_below_epsilon() -> None:
    # one big bin next to empty ones: the gap rule isolates it, so its range count is nearly
    # the noisy partition sum (eps_sum = 0.8 of eps = 1) and the audit has real power
    x0 = np.array([0, 0, 0, 50, 0, 0, 0, 0])
    x1 = x0.copy()
    x1[3] += 1
    mech = audit.gap_release_mechanism(1.0, 3, 4, noise_parties=1)
    result = audit.audit_epsilon(mech, x0, x1, trials=2000, rng=7, configured_epsilon=1.0)
    assert result.epsilon_lower_bound <= 1.0
    assert result.epsilon_lower_bound > 0.5


def test_audit_input_errors_name_the_problem() -> None:
    mech = audit.partition_sum_mechanism(1.0)
    x0 = np.asarray(audit.AUDIT_X0)
    with pytest.raises(InvalidInputError, match="identical"):
        audit.audit_epsilon(mech, x0, x0, trials=100, rng=1)
    with pytest.raises(InvalidInputError, match="trials"):
        audit.audit_epsilon(mech, x0, x0 + 1, trials=5, rng=1)
    with pytest.raises(InvalidInputError, match="same number of bins"):
        audit.audit_epsilon(mech, x0, x0[:-1], trials=100, rng=1)
    with pytest.raises(InvalidInputError, match="epsilon"):
        audit.run_audit(0.0, trials=100)
