"""`dpagg query --confidence` and `dpagg direct-query --confidence` print an interval (text and JSON); the SDK's
range answers carry it, and so do their DataFrames."""

from __future__ import annotations

import json

import numpy as np
import pytest

from parties.cli import main

from .conftest import Cluster


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main([*args, "--insecure"])
    return code, capsys.readouterr().out


def test_query_and_direct_query_print_a_confidence_interval(cluster: Cluster,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    cluster.open_study(domain_size=50, owners=("a",), epsilon=2.0, strategy="gap")
    cluster.owner("a").submit("s1", np.full(50, 20))
    rel = cluster.computation().run_release("s1", epsilon=1.0).release_id
    code, out = _run(capsys, "query", rel, "--range", "0:50", "--confidence", "0.95", "--analyst", cluster.cs.target)
    assert code == 0
    line = out.splitlines()[1]
    assert "+-" in line and line.count("[") == 2  # the bins, then the interval
    assert "95% confidence interval: in at least 95% of releases the interval contains the true count" in out
    code, out = _run(capsys, "query", rel, "--range", "0:50", "--range", "3:7", "--confidence", "0.9", "--json",
                     "--analyst", cluster.cs.target)
    answers = json.loads(out)["range_counts"]
    for a in answers:
        assert a["confidence"] == 0.9 and a["ci_lo"] < a["value"] < a["ci_hi"]
    assert [a["interval_method"] for a in answers] == ["exact", "exact"]  # whole partitions; one cut
    code, out = _run(capsys, "query", rel, "--range", "0:50", "--json", "--analyst", cluster.cs.target)
    assert "ci_lo" not in json.loads(out)["range_counts"][0]  # only when asked for

    code, out = _run(capsys, "direct-query", "s1", "--range", "0:20", "--epsilon", "0.5", "--confidence", "0.99",
                     "--json", "--computation", cluster.cs.target)
    a = json.loads(out)["range_counts"][0]
    assert code == 0 and a["confidence"] == 0.99 and a["ci_lo"] < a["value"] < a["ci_hi"]
    assert a["interval_method"] == "exact"
    code, out = _run(capsys, "direct-query", "s1", "--range", "20:30", "--epsilon", "0.5", "--confidence", "0.95",
                     "--computation", cluster.cs.target)
    assert code == 0 and "95% confidence interval" in out and out.splitlines()[0].count("[") == 2


def test_confidence_must_be_a_level(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["query", "r1", "--confidence", "95", "--insecure"])
    assert "strictly between 0 and 1" in capsys.readouterr().err


def test_sdk_range_counts_carry_the_interval_and_the_frame_shows_it(cluster: Cluster) -> None:
    pytest.importorskip("pandas")
    cluster.open_study(domain_size=40, owners=("a",), epsilon=2.0, strategy="gap")
    cluster.owner("a").submit("s1", np.full(40, 5))
    rel = cluster.computation().run_release("s1", epsilon=1.0).release_id
    an = cluster.analyst()
    plain = an.range_counts(rel, [(0, 40), (0, 7)])
    assert all(c.interval() is None for c in plain)
    assert list(plain.to_pandas().columns) == ["lo", "hi", "value", "standard_error"]
    answers = an.range_counts(rel, [(0, 40), (0, 7)], confidence=0.95)
    summary = an.get_release(rel).summary
    for c, p in zip(answers, plain):
        assert (c.value, c.standard_error) == (p.value, p.standard_error)
        ci = summary.interval(c.lo, c.hi, 0.95)
        assert c.interval() == (ci.lo, ci.hi) and c.confidence == 0.95
    frame = answers.to_pandas()
    assert list(frame.columns) == ["lo", "hi", "value", "standard_error", "ci_lo", "ci_hi", "confidence",
                                   "interval_method"]
    assert (frame["ci_lo"] < frame["value"]).all() and (frame["value"] < frame["ci_hi"]).all()
