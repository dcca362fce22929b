"""Words and numbers agree: value and bin ranges labelled, one total, partition cuts flagged, 0 when nothing is left."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from parties.cli import main

from .conftest import Cluster


def _study(cluster: Cluster, *, strategy: str = "gap") -> str:
    cluster.open_study(domain_size=50, owners=("a",), epsilon=2.0, domain_spec="age:0:100:50", strategy=strategy)
    cluster.owner("a").submit("s1", np.full(50, 20))
    return cluster.computation().run_release("s1", epsilon=1.0).release_id


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([*args, "--insecure"])
    out, err = capsys.readouterr()
    return code, out, err


def test_value_ranges_beside_bin_ranges_both_labelled(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    rel = _study(cluster)
    code, out, _ = _run(capsys, "query", rel, "--range", "age=20:40", "--range", "10:20", "--analyst", cluster.cs.target)
    assert code == 0
    assert "bins [10, 20) = age in [20, 40):" in out.splitlines()[1]  # the value range, as bins and values
    assert "bins [10, 20) = age in [20, 40):" in out.splitlines()[2]  # the same bins given as bins
    code, out, _ = _run(capsys, "direct-query", "s1", "--range", "age=0:20", "--range", "30:50", "--epsilon", "0.1",
                        "--computation", cluster.cs.target)
    assert code == 0
    assert out.splitlines()[0].startswith("bins [0, 10) = age in [0, 20): ")
    assert out.splitlines()[1].startswith("bins [30, 50) = age in [60, 100): ")
    assert "2^-20 for the masked prefix" in out  # why the charge is a hair above 0.1


def test_a_value_range_off_the_bin_edges_is_refused_naming_the_nearest_edges(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    rel = _study(cluster)
    code, _, err = _run(capsys, "query", rel, "--range", "age=21:40", "--analyst", cluster.cs.target)
    assert code == 1 and "21 is not a bin edge" in err and "nearest edges are 20 or 22" in err
    code, _, err = _run(capsys, "query", rel, "--range", "income=0:10", "--analyst", cluster.cs.target)
    assert code == 1 and "bins the column 'age', not 'income'" in err
    with pytest.raises(SystemExit):
        main(["query", rel, "--range", "age=40:20", "--insecure"])


def test_release_run_prints_the_same_total_and_error_bar_as_a_whole_domain_query(
        cluster: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    cluster.open_study(domain_size=64, owners=("a",), epsilon=2.0, strategy="hier")
    cluster.owner("a").submit("s1", np.full(64, 50))
    code, out, _ = _run(capsys, "release", "run", "s1", "--epsilon", "1", "--computation", cluster.cs.target,
                        "--state-dir", str(tmp_path))
    assert code == 0
    rel = out.split()[1]
    total_line = next(line for line in out.splitlines() if "total" in line)
    code, q, _ = _run(capsys, "query", rel, "--json", "--analyst", cluster.cs.target)
    whole = json.loads(q)["range_counts"][0]
    assert f"total {whole['value']:,.1f} +- {whole['standard_error']:.1f}," in total_line


def test_ranges_that_cut_a_partition_are_flagged(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    rel = _study(cluster)
    summary = cluster.analyst().get_release(rel).summary
    starts = [int(s) for s in summary.starts]
    assert len(starts) > 1
    inside = starts[1] - 1 if starts[1] - starts[0] > 1 else None  # a bin strictly inside the first partition
    ranges = ["--range", f"{starts[0]}:{starts[1]}"]
    if inside is not None:
        ranges += ["--range", f"{starts[0]}:{inside}"]
    code, out, _ = _run(capsys, "query", rel, *ranges, "--analyst", cluster.cs.target)
    lines = out.splitlines()
    assert not lines[1].endswith(" *")  # exactly one partition: no bias beyond the noise
    if inside is not None:
        assert lines[2].endswith(" *") and "cuts a partition" in out
    code, out, _ = _run(capsys, "query", rel, *ranges, "--csv", "--analyst", cluster.cs.target)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows[0]["cuts_partition"] == "False" and rows[0]["label"].startswith(f"bins [{starts[0]}, {starts[1]})")
    assert float(rows[0]["value"]) == pytest.approx(float(summary.range_count(starts[0], starts[1]).value))


def test_a_budget_with_only_float_dust_left_prints_0(cluster: Cluster, capsys: pytest.CaptureFixture[str],
                                                      tmp_path: object) -> None:
    """The README's walkthrough: a direct query (0.1 + a 2^-20 prefix mask), then `--epsilon rest`."""
    cluster.open_study(domain_size=50, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(50))
    cluster.computation().direct_range_counts("s1", [(0, 10), (30, 50)], 0.1)
    cluster.computation().run_release("s1", epsilon="rest")
    b = cluster.decryption().budget("s1")
    assert 0 < b.available < 1e-12  # what the ledger's exact arithmetic leaves: dust, not a budget
    code, out, _ = _run(capsys, "budget", "s1", "--decryption", cluster.ds.target)
    first = out.splitlines()[0]
    assert code == 0 and "a new release may spend 0 (nothing usable is left" in first
    assert "spend 9e-17" not in first
