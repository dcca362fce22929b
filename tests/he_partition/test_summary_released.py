"""Summary extension: backward compatibility of partition summaries, JSON of tree/wavelet summaries, SE API."""

from __future__ import annotations

import json

import numpy as np
import pytest

from he_partition import release
from he_partition.core.errors import InvalidInputError
from he_partition.core.summary import ReleasedValues, Summary


def _gap_summary() -> Summary:
    return Summary(domain_size=10, epsilon=1.0, strategy="gap", noise_parties=2, starts=(0, 4), sums=(7, 3),
                   sum_variance=(2.0, 2.0), epsilon_spent=(("prefix_differences", 0.2), ("partition_sums", 0.8)))


def test_partition_summaries_are_unchanged():
    s = _gap_summary()
    d = s.to_dict()
    assert "estimator" not in d and "released" not in d  # the v1 document is byte-for-byte the old one
    assert d["format"] == "dpagg.summary.v1"
    assert Summary.from_json(s.to_json()) == s
    assert np.allclose(s.estimate(), [1.75] * 4 + [0.5] * 6)
    rc = s.range_count(2, 6)
    assert rc.value == pytest.approx(1.75 * 2 + 0.5 * 2)
    assert rc.standard_error == pytest.approx(np.sqrt(0.5**2 * 2 + (2 / 6) ** 2 * 2))
    value, se = s.weighted_count(np.r_[np.zeros(2), np.ones(4), np.zeros(4)])
    assert (value, se) == pytest.approx((rc.value, rc.standard_error))


@pytest.mark.parametrize("strategy", ["hier", "dawa", "privelet", "auto"])
def test_json_round_trip_keeps_estimates(strategy):
    x = np.random.default_rng(1).integers(0, 9, 300)
    s = release([x], 0.7, strategy=strategy, rng=3)
    back = Summary.from_json(s.to_json())
    assert back == s
    assert np.array_equal(back.estimate(), s.estimate())
    assert back.range_count(10, 200) == s.range_count(10, 200)
    d = json.loads(s.to_json())
    assert d["estimator"] in ("tree", "haar") and d["released"]


@pytest.mark.parametrize("strategy", ["hier", "dawa", "privelet", "auto"])
def test_range_count_agrees_with_weighted_count_and_estimate(strategy):
    x = np.random.default_rng(2).integers(0, 9, 257)
    s = release([x], 0.7, strategy=strategy, rng=8)
    rc = s.range_count(13, 201)
    assert rc.value == pytest.approx(s.estimate()[13:201].sum())
    w = np.zeros(257)
    w[13:201] = 1
    assert s.weighted_count(w) == pytest.approx((rc.value, rc.standard_error))
    # A union of two ranges: its SE accounts for their correlation (not the sum of variances).
    w2 = np.zeros(257)
    w2[0:50] = 1
    w2[100:150] = 1
    v, se = s.weighted_count(w2)
    assert v == pytest.approx(s.estimate()[w2 > 0].sum())
    assert se > 0
    with pytest.raises(InvalidInputError, match="range must satisfy"):
        s.range_counts([(5, 5)])
    with pytest.raises(InvalidInputError, match="weights must be"):
        s.weighted_count(np.ones(3))


def test_inconsistent_documents_are_refused():
    base = _gap_summary().to_dict()
    with pytest.raises(InvalidInputError, match="estimator"):
        Summary.from_dict({**base, "estimator": "magic"})
    with pytest.raises(InvalidInputError, match="tree summary"):
        Summary.from_dict({**base, "estimator": "tree"})
    bad = {**base, "estimator": "tree", "released": [
        {"kind": "partition_sums", "values": [1, 2], "variance": 1.0, "epsilon": 0.5, "starts": [0, 5]},
        {"kind": "partition_sums", "values": [1, 2], "variance": 1.0, "epsilon": 0.5, "starts": [0, 3]}]}
    with pytest.raises(InvalidInputError, match="nest|measured"):
        Summary.from_dict(bad)
    with pytest.raises(InvalidInputError, match="released kind"):
        ReleasedValues(kind="nope", values=(1,), variance=1.0, epsilon=1.0)
    with pytest.raises(InvalidInputError, match="variance"):
        ReleasedValues(kind="partition_sums", values=(1,), variance=-1.0, epsilon=1.0, starts=(0,))
