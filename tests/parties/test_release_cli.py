"""`release run` as an operator meets it: explicit epsilon, idempotent re-runs, Ctrl-C, test-only switches."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import numpy as np
import pytest

from parties.cli import build_parser, main
from parties.common.errors import ServiceError

from .conftest import Cluster


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "0.0"])
def test_release_epsilon_zero_negative_or_non_finite_is_a_usage_error(value: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["release", "run", "s1", "--epsilon", value])
    with pytest.raises(SystemExit):  # the rest of the budget needs the explicit word
        build_parser().parse_args(["release", "run", "s1"])
    assert build_parser().parse_args(["release", "run", "s1", "--epsilon", "rest"]).epsilon == "rest"


def test_epsilon_zero_is_refused_by_the_server_and_rest_spends_exactly_what_is_left(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    cs = cluster.computation()
    for eps in (0.0, -0.5, float("nan")):
        with pytest.raises(ServiceError) as ei:
            cs.run_release("s1", epsilon=eps)
        assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT and "rest" in ei.value.details
    assert cluster.decryption().budget("s1").charges == ()  # nothing was spent by the refusals
    assert cs.run_release("s1", epsilon=0.25).state == "DONE"
    rest = cs.run_release("s1", epsilon="rest")
    assert rest.state == "DONE" and rest.epsilon == pytest.approx(0.75)
    with pytest.raises(ServiceError) as ei:
        cs.run_release("s1", epsilon="rest")
    assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_rerun_attaches_to_the_same_release_and_ctrl_c_says_it_continues(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    base = ["release", "run", "s1", "--epsilon", "0.5", "--computation", cluster.cs.target, "--insecure",
            "--state-dir", str(tmp_path / "state")]

    from parties.computation.client import ComputationClient

    def interrupted(self: ComputationClient, release_id: str, **_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ComputationClient, "wait_release", interrupted)
    assert main(base) == 130
    captured = capsys.readouterr()
    first_id = captured.out.split()[1]  # "release REL of study ... started" is printed before waiting
    assert first_id.startswith("rel-") and "continues on the server" in captured.err
    monkeypatch.undo()
    # Re-running the same command attaches to the same release: nothing is spent twice.
    assert main([*base, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["release_id"] == first_id and again["state"] == "DONE"
    assert [c.epsilon for c in cluster.decryption().budget("s1").charges] != []
    assert sum(c.epsilon for c in cluster.decryption().budget("s1").charges) == pytest.approx(0.5)
    # Finished, the pending key is dropped: the next run is a new release.
    assert main([*base, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["release_id"] != first_id


def test_a_seeded_noise_server_needs_insecure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    for command in ("serve-decryption", "serve-computation"):
        assert main([command, "--data-dir", "d", "--port", "0", "--insecure-noise-seed", "3",
                     "--ca-cert", "ca.crt", "--cert", "x.crt", "--key", "x.key"]) == 1
        assert "only accepted together with --insecure" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_a_run_whose_request_key_already_finished_says_so_not_started(
        cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    base = ["release", "run", "s1", "--epsilon", "0.5", "--computation", cluster.cs.target, "--insecure",
            "--state-dir", str(tmp_path / "state"), "--request-key", "same-key"]
    assert main(base) == 0
    first = capsys.readouterr().out
    assert "started" in first
    assert main(base) == 0  # the same request key: the finished release, nothing spent again
    again = capsys.readouterr().out
    assert "already done" in again and "started" not in again
    assert sum(c.epsilon for c in cluster.decryption().budget("s1").charges) == pytest.approx(0.5)
