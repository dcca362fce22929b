"""`dpagg accuracy` (offline and for an open study) and open-study print the error a release will carry."""

from __future__ import annotations

import json

import pytest

from he_partition.methods.accuracy import accuracy_preview
from parties.cli import main

from .conftest import Cluster


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_accuracy_offline_prints_the_error_per_range_length(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "accuracy", "--domain", "age:0:100:50", "--epsilon", "0.9", "--width", "20",
                          "--length", "1")
    assert code == 0, err
    lines = out.splitlines()
    assert "no budget spent" in lines[0] and "design identity" in lines[0]
    expected = accuracy_preview(50, 0.9, [1, 10])
    assert "a range of 1 bin (age width 2)" in lines[1]
    assert f"a range of 10 bins (age width 20): expected error +-{expected.ranges[1].standard_error:.3g}" in lines[2]
    assert "95% interval +-13 (exact)" in lines[2]  # the walkthrough's bins [0, 10)
    code, out, err = _run(capsys, "accuracy", "--domain-size", "1000", "--epsilon", "0.5", "--json")
    got = json.loads(out)
    assert code == 0 and [r["length"] for r in got["ranges"]] == [1, 100, 500] and got["design"] == "tree"
    code, out, err = _run(capsys, "accuracy", "--domain-size", "100", "--epsilon", "1", "--strategy", "gap")
    assert code == 1 and "chooses its partition from the data" in err
    code, out, err = _run(capsys, "accuracy", "--domain", "age:0:100:50", "--epsilon", "1", "--width", "3")
    assert code == 1 and "not a whole number of bins" in err


def test_open_study_and_accuracy_study_show_the_preview(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "open-study", "--computation", cluster.cs.target, "--insecure", "--study-id", "ages",
                          "--domain", "age:0:100:50", "--epsilon", "1.0", "--owners", "a,b")
    assert code == 0, err
    assert "accuracy preview at epsilon 1 (no budget spent" in out
    assert "a range of 5 bins (age width 10): expected error +-" in out
    code, out, err = _run(capsys, "accuracy", "--study", "ages", "--epsilon", "0.5", "--length", "5", "--json",
                          "--computation", cluster.cs.target, "--insecure")
    assert code == 0, err
    got = json.loads(out)
    assert got["epsilon"] == 0.5 and got["ranges"][0]["standard_error"] == pytest.approx(
        accuracy_preview(50, 0.5, [5]).ranges[0].standard_error)
    assert cluster.decryption().budget("ages").spent == 0  # a preview spends nothing
    code, out, err = _run(capsys, "open-study", "--computation", cluster.cs.target, "--insecure", "--study-id", "g",
                          "--domain-size", "20", "--epsilon", "1.0", "--owners", "a", "--strategy", "gap", "--json")
    assert code == 0 and json.loads(out)["accuracy_preview"] is None
