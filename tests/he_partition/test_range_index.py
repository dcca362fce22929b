"""A partition summary answers a range in O(log partitions), with the same value as summing every partition."""
from __future__ import annotations

import numpy as np

from he_partition.core.summary import Summary


def _direct(summary: Summary, lo: int, hi: int) -> tuple[float, float]:
    s = np.asarray(summary.starts, dtype=np.int64)
    e = np.append(s[1:], summary.domain_size)
    frac = np.clip(np.minimum(e, hi) - np.maximum(s, lo), 0, None) / (e - s)
    return float(np.sum(frac * np.asarray(summary.sums))), float(np.sqrt(np.sum(frac**2 * np.asarray(
        summary.sum_variance))))


def test_range_counts_equal_the_sum_over_every_partition() -> None:
    rng = np.random.default_rng(3)
    n = 5000
    starts = np.sort(rng.choice(np.arange(1, n), size=700, replace=False))
    starts = np.concatenate([[0], starts])
    summary = Summary(domain_size=n, epsilon=1.0, strategy="gap", noise_parties=2, starts=tuple(int(x) for x in starts),
                      sums=tuple(float(x) for x in rng.normal(50, 20, starts.size)),
                      sum_variance=tuple(float(x) for x in rng.uniform(1, 9, starts.size)))
    for _ in range(2000):
        lo = int(rng.integers(0, n))
        hi = int(rng.integers(lo + 1, n + 1))
        got = summary.range_count(lo, hi)
        value, se = _direct(summary, lo, hi)
        assert abs(got.value - value) <= 1e-9 * max(1.0, abs(value)), (lo, hi)
        assert abs(got.standard_error - se) <= 1e-9 * max(1.0, se), (lo, hi)
    # a range inside one partition, one exactly on partition edges, the whole domain
    for lo, hi in ((int(starts[3]) + 0, int(starts[3]) + 1), (int(starts[5]), int(starts[9])), (0, n)):
        assert abs(summary.range_count(lo, hi).value - _direct(summary, lo, hi)[0]) < 1e-6
