"""A one-level tree (auto's one count per bin) gets the exact interval of a sum of whole partitions, not the bound."""

from __future__ import annotations

import numpy as np

from he_partition.core.intervals import exact_sum_halfwidth
from he_partition.protocol import release


def _identity_release(seed: int = 3):
    rng = np.random.default_rng(1)
    hs = [rng.integers(0, 40, 50) for _ in range(2)]
    summary = release(hs, 0.9, rng=seed)  # the README's walkthrough: 50 bins, 0.9 left for the release
    assert summary.params["design"] == "identity" and summary.estimator == "tree" and len(summary.released) == 1
    return summary, hs[0] + hs[1]


def test_auto_identity_interval_for_whole_bins_is_the_exact_one() -> None:
    summary, _ = _identity_release()
    variance = summary.released[0].variance
    ci = summary.interval(0, 10, 0.95)
    exact = exact_sum_halfwidth([variance], [10], 0.95, 2)
    assert exact is not None and ci.method == "exact"
    assert (ci.hi - ci.lo) / 2 == exact  # about 13, where the bound said 24.7
    rc = summary.range_counts([(0, 10)], confidence=0.95)[0]
    assert (rc.ci_lo, rc.ci_hi, rc.interval_method) == (ci.lo, ci.hi, "exact")
    assert rc.as_dict()["interval_method"] == "exact"
    assert list(summary.range_counts([(0, 10)], confidence=0.95).to_pandas()["interval_method"]) == ["exact"]


def test_the_exact_interval_covers_at_its_level_and_is_much_narrower_than_the_bound() -> None:
    """Seeded: over 400 releases the 95% interval of bins [0, 10) contains the truth at least ~95% of the time."""
    summary, truth = _identity_release()
    ci = summary.interval(0, 10, 0.95)
    sd = summary.range_count(0, 10).standard_error
    assert (ci.hi - ci.lo) / 2 < 2.2 * sd  # the bound was about 3.6 standard errors
    rng = np.random.default_rng(1)
    hs = [rng.integers(0, 40, 50) for _ in range(2)]
    inside = 0
    for seed in range(400):
        s = release(hs, 0.9, rng=10_000 + seed)
        c = s.interval(0, 10, 0.95)
        inside += c.lo <= truth[:10].sum() <= c.hi
    assert inside / 400 >= 0.93


def test_a_multi_level_tree_gets_the_chernoff_bound_on_its_exact_weights() -> None:
    """Least-squares answers: the Chernoff bound on the estimator's own weights (narrower than the bound from the
    standard error alone, about 3.6 standard errors at 95%), and it still covers (seeded, 300 releases)."""
    from he_partition.core.intervals import bound_halfwidth

    rng = np.random.default_rng(2)
    hs = [rng.integers(100, 200, 256) for _ in range(2)]
    truth = (hs[0] + hs[1])[5:90].sum()
    inside = 0
    for seed in range(300):
        s = release(hs, 1.0, rng=seed)
        assert s.estimator == "tree" and len(s.released) > 1
        ci = s.interval(5, 90, 0.95)
        inside += ci.lo <= truth <= ci.hi
    se = s.range_count(5, 90).standard_error
    bound = bound_halfwidth(se, min(r.variance for r in s.released), 0.95, s.draws_per_value)
    assert ci.method == "chernoff" and (ci.hi - ci.lo) / 2 < 0.85 * bound
    assert inside / 300 >= 0.95


def test_grouping_terms_only_widens_the_chernoff_bound_and_barely() -> None:
    from he_partition.core.intervals import chernoff_halfwidth, grouped_terms

    rng = np.random.default_rng(7)
    w = np.concatenate([np.full(300, 0.25), np.full(200, 0.25 * (1 + 1e-9)), rng.uniform(0.01, 1.0, 50), [0.0]])
    v = np.concatenate([np.full(500, 4.0), np.full(50, 9.0), [1.0]])
    gw, gv, gn = grouped_terms(-w, v)
    assert gn.sum() == 550 and gw.size < 60  # the 500 near-equal weights are one term; the zero weight is dropped
    plain = chernoff_halfwidth(w, v, 0.95)
    grouped = chernoff_halfwidth(gw, gv, 0.95, counts=gn)
    assert plain <= grouped <= plain * (1 + 1e-6)
