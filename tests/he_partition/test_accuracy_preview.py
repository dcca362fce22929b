"""The accuracy preview agrees with simulated releases (seeded, through the library's own `release`)."""

from __future__ import annotations

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from he_partition.methods.accuracy import accuracy_preview
from he_partition.protocol import release


def _simulate(n: int, epsilon: float, length: int, releases: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Errors of a `length`-bin range at a random position in each of `releases` seeded releases of dense data,
    and whether each release's own 95% interval held the truth."""
    rng = np.random.default_rng(5)
    hs = [rng.integers(150, 250, n) for _ in range(2)]
    truth = np.concatenate([[0], np.cumsum(hs[0] + hs[1])])
    errors, inside = [], []
    design = ""
    for i in range(releases):
        s = release(hs, epsilon, rng=1000 + i)
        design = str(s.params.get("design"))
        a = int(rng.integers(0, n - length + 1))
        c = s.range_count(a, a + length, confidence=0.95)
        true = truth[a + length] - truth[a]
        errors.append(c.value - true)
        assert c.ci_lo is not None and c.ci_hi is not None
        inside.append(c.ci_lo <= true <= c.ci_hi)
    return np.asarray(errors, dtype=np.float64), np.asarray(inside), design


@pytest.mark.statistical
def test_preview_matches_simulated_releases_one_count_per_bin() -> None:
    preview = accuracy_preview(50, 0.9, [5])
    assert preview.design == "identity"
    r = preview.ranges[0]
    errors, inside, design = _simulate(50, 0.9, 5, 600)
    assert design == "identity"
    assert r.standard_error == pytest.approx(np.sqrt(np.mean(errors ** 2)), rel=0.10)
    assert r.interval_method == "exact"
    assert r.interval_halfwidth == pytest.approx(np.quantile(np.abs(errors), 0.95), rel=0.10)
    assert inside.mean() >= 0.93


@pytest.mark.statistical
def test_preview_matches_simulated_releases_tree() -> None:
    preview = accuracy_preview(128, 1.0, [12])
    assert preview.design == "tree"
    r = preview.ranges[0]
    errors, inside, design = _simulate(128, 1.0, 12, 800)
    assert design == "tree"
    assert r.standard_error == pytest.approx(np.sqrt(np.mean(errors ** 2)), rel=0.10)
    assert r.interval_method == "chernoff" and inside.mean() >= 0.95  # a tail bound: it covers more


def test_preview_spends_nothing_and_refuses_what_it_cannot_know() -> None:
    smaller = accuracy_preview(100, 2.0, [10]).ranges[0]
    larger = accuracy_preview(100, 0.5, [10]).ranges[0]
    assert larger.standard_error > smaller.standard_error  # less epsilon buys more error
    with pytest.raises(InvalidInputError, match="chooses its partition from the data"):
        accuracy_preview(100, 1.0, strategy="gap")
    with pytest.raises(InvalidInputError, match="range length"):
        accuracy_preview(100, 1.0, [101])
    with pytest.raises(InvalidInputError, match="epsilon"):
        accuracy_preview(100, 0.0)
    d = accuracy_preview(100, 1.0).as_dict()
    assert [r["length"] for r in d["ranges"]] == [1, 10, 50]
