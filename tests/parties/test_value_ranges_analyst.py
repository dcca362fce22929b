"""Value ranges (age=20:40) through `dpagg serve-analyst` and the SDK; releases record their domain; labelled frames."""

from __future__ import annotations

import json
from typing import Iterator

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from parties.analyst.client import AnalystClient
from parties.cli import main
from parties.common.config import AnalystConfig
from parties.computation.server import create_analyst_server

from .conftest import Cluster


@pytest.fixture
def released(cluster: Cluster) -> Iterator[tuple[Cluster, str, str]]:
    """A release of a study over age:0:100:50, and a stand-alone analyst server over the computation store."""
    cluster.open_study(domain_size=50, owners=("a",), epsilon=2.0, strategy="auto", domain_spec="age:0:100:50")
    cluster.owner("a").submit("s1", np.arange(50) % 7)
    rel = cluster.computation().run_release("s1", epsilon=1.0).release_id
    handle = create_analyst_server(AnalystConfig(cluster.root / "cs", insecure=True)).start()
    try:
        yield cluster, rel, handle.target
    finally:
        handle.stop()


def test_value_ranges_through_serve_analyst(released: tuple[Cluster, str, str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    cluster, rel, target = released
    code = main(["query", rel, "--range", "age=20:40", "--range", "0:5", "--json", "--analyst", target, "--insecure"])
    out, err = capsys.readouterr()
    assert code == 0, err
    answers = json.loads(out)["range_counts"]
    assert [(a["lo"], a["hi"]) for a in answers] == [(10, 20), (0, 5)]
    assert answers[0]["label"] == "bins [10, 20) = age in [20, 40)"
    code = main(["query", rel, "--range", "age=21:40", "--analyst", target, "--insecure"])
    assert code == 1 and "21 is not a bin edge" in capsys.readouterr().err


def test_sdk_range_counts_take_value_ranges_and_label_their_frame(released: tuple[Cluster, str, str]) -> None:
    pytest.importorskip("pandas")
    cluster, rel, target = released
    with AnalystClient(target, insecure=True) as an:
        release = an.get_release(rel)
        assert release.domain is not None and release.domain.column == "age"
        answers = an.range_counts(rel, ["age=20:40", (0, 5), "5:10"], confidence=0.95)
        assert [(c.lo, c.hi) for c in answers] == [(10, 20), (0, 5), (5, 10)]
        direct = an.range_counts(rel, [(10, 20)])
        assert answers[0].value == direct[0].value
        frame = answers.to_pandas()
        assert list(frame["label"]) == ["age in [20, 40)", "age in [0, 10)", "age in [10, 20)"]
        assert list(frame["value_lo"]) == [20.0, 0.0, 10.0] and set(frame["interval_method"]) == {"exact"}
        with pytest.raises(InvalidInputError, match="not a bin edge"):
            an.range_counts(rel, ["age=21:40"])
        with pytest.raises(InvalidInputError, match="bins the column 'age', not 'income'"):
            an.range_counts(rel, ["income=0:10"])
        with pytest.raises(InvalidInputError, match="a range is LO:HI"):
            an.range_counts(rel, ["twenty to forty"])
        parts = release.to_pandas(confidence=0.95)
        assert list(parts.columns[:5]) == ["start", "stop", "value_lo", "value_hi", "label"]
        assert len(parts) == release.summary.n_partitions and parts["label"][0] == "age in [0, 2)"


def test_a_release_without_a_domain_names_the_problem_and_the_fix(cluster: Cluster) -> None:
    cluster.open_study(domain_size=50, owners=("a",), epsilon=2.0, strategy="auto")
    cluster.owner("a").submit("s1", np.arange(50) % 7)
    rel = cluster.computation().run_release("s1", epsilon=1.0).release_id
    with pytest.raises(InvalidInputError, match="records no domain spec.*give bin ranges LO:HI"):
        cluster.analyst().range_counts(rel, ["age=20:40"])
