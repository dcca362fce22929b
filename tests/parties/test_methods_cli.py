"""The method subcommands (epsilon, audit, bayes-scale, charge, pview) give the seeds' worked numbers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from parties.cli.methods import add_parser as register


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers(dest="cmd", required=True))
    args = ap.parse_args(argv)
    code = args.func(args)
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("alpha,eps", [("0.1", 1.991), ("0.05", 2.297), ("0.01", 3.045)])
def test_alpha_to_epsilon(alpha: str, eps: float, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(["epsilon", "--alpha", alpha, "--json"], capsys)
    assert code == 0 and out["epsilon"] == eps


def test_epsilon_assessment_warns_outside_practical_range(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(["epsilon", "--eps", "8", "--json"], capsys)
    assert code == 0 and out["warnings"]
    code, out = _run(["epsilon", "--eps", "1", "--json"], capsys)
    assert out["variance_lower_bound"] == pytest.approx(1 / (np.e - 1) ** 2)
    assert out["guessing_bound_alpha"] == pytest.approx(4 / (np.e - 1) ** 2)


def test_epsilon_says_in_words_what_the_bounds_mean(capsys: pytest.CaptureFixture[str]) -> None:
    """On the former code `dpagg epsilon --eps 1` printed bare JSON."""
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers(dest="cmd", required=True))
    for argv, words in ((["epsilon", "--eps", "1"], "at least 1: no claim"),
                        (["epsilon", "--eps", "3"], "wrong with probability at most"),
                        (["epsilon", "--alpha", "0.1"], "epsilon 1.991")):
        args = ap.parse_args(argv)
        assert args.func(args) == 0
        out = capsys.readouterr().out
        assert words in out and "variance" in out or "Chebyshev" in out
        with pytest.raises(json.JSONDecodeError):
            json.loads(out)


def test_charge_seed_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Three intervals, two of which overlap: max clique 2 -> 2 eps instead of 3 eps.
    q = [{"lo": [0], "hi": [10], "epsilon": 0.5}, {"lo": [5], "hi": [15], "epsilon": 0.5},
         {"lo": [20], "hi": [30], "epsilon": 0.5}]
    f = tmp_path / "q.json"
    f.write_text(json.dumps(q))
    code, out = _run(["charge", "--queries", str(f)], capsys)
    assert out["charged_epsilon"] == 1.0 and out["sequential_epsilon"] == 1.5
    # Over the services, [5, 15) and [20, 30) also show the decryption server their prefixes [0, 5) and [0, 20)
    # at 2^-20 each; bins 5-9 are then covered by 0.5 + 0.5 + 2^-20 (the [0, 20) mask).
    assert out["prefix_mask_pieces"] == 2
    assert out["charged_epsilon_over_services_exact"] == "1048577/1048576"  # exactly 1 + 2^-20


def test_bayes_scale_two_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "a.json"
    f.write_text(json.dumps([[0, 1], [1, 0]]))
    code, out = _run(["bayes-scale", "--adjacency", str(f), "--eps", "1", "--tau", "1"], capsys)
    assert out["laplace_scale"] == pytest.approx(1 + out["max_leakage"])
    assert out["max_leakage"] > 0


@pytest.mark.statistical
def test_audit_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(["audit", "--eps", "1", "--trials", "20000", "--seed", "3"], capsys)
    assert code == 0 and out["epsilon_lower_bound"] <= 1.0
    code, out = _run(["audit", "--epsilon", "1", "--trials", "20000", "--seed", "3", "--broken"], capsys)
    assert out["epsilon_lower_bound"] > 1.0 and code == 1  # a reported violation is a failing exit


def test_pview_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    counts = np.zeros((8, 8), dtype=np.int64)
    counts[:4, :4] = 50
    np.save(tmp_path / "c.npy", counts)
    code, out = _run(["pview", "--counts", str(tmp_path / "c.npy"), "--eps", "1", "--seed", "1",
                      "--out", str(tmp_path / "v.npy")], capsys)
    assert code == 0 and out["blocks"] >= 1
    first = np.load(tmp_path / "v.npy")
    assert first.shape == (8, 8)
    # Same seed, same view; without --seed the noise comes from the OS CSPRNG.
    _run(["pview", "--counts", str(tmp_path / "c.npy"), "--eps", "1", "--seed", "1",
          "--out", str(tmp_path / "v2.npy")], capsys)
    np.testing.assert_array_equal(np.load(tmp_path / "v2.npy"), first)
    code, out = _run(["pview", "--counts", str(tmp_path / "c.npy"), "--eps", "1"], capsys)
    assert code == 0 and out["blocks"] >= 1 and out["estimate_written_to"] is None
