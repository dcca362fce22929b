"""Careless input a new user types: each gets a clear refusal, and nothing half-done is left behind."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from parties.cli import main
from parties.common.contract import check_id
from parties.data_owner.dataset import write_sample_csv

from .conftest import Cluster


def test_an_empty_study_id_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["open-study", "--epsilon", "1", "--owners", "a", "--domain-size", "4"],
                    ["open-join", "--owners", "a,b", "--rows", "x:0:4:4", "--cols", "y:0:4:4", "--capacity", "8192",
                     "--epsilon", "1"]):
        with pytest.raises(SystemExit) as stop:
            main([*command, "--study-id", "", "--insecure"])
        assert stop.value.code == 2
        assert "--study-id: is empty (an unset shell variable?)" in capsys.readouterr().err


def test_a_unicode_id_is_refused_saying_ascii_letters() -> None:
    with pytest.raises(InvalidInputError, match="ASCII letters"):
        check_id("study_id", "café")


@pytest.mark.parametrize("flag", ["--computation", "--decryption"])
def test_a_url_for_a_server_is_an_immediate_usage_error(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    command = ["budget", "s1"] if flag == "--decryption" else ["status", "s1"]
    started = time.monotonic()
    with pytest.raises(SystemExit) as stop:
        main([*command, flag, "http://localhost:50052/", "--insecure"])
    assert stop.value.code == 2 and time.monotonic() - started < 5  # no retries, no DNS lookup
    assert "host:port, not a URL" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["query", "--list", "--analyst", "localhost", "--insecure"])  # no port


def test_submitting_other_data_after_a_successful_submit_is_an_error(
        cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.open_study(domain_size=20, owners=("a", "b"), epsilon=1.0, domain_spec="age:0:100:20")
    first, second = tmp_path / "first.csv", tmp_path / "second.csv"
    write_sample_csv(first, seed=1, n_records=200, owner_index=0)
    write_sample_csv(second, seed=2, n_records=200, owner_index=0)
    base = ["submit", "--study", "s1", "--owner", "a", "--computation", cluster.cs.target, "--insecure",
            "--state-dir", str(tmp_path / "state"), "--person-column", "person_id", "--no-progress"]
    refused = [a if a != "a" else "z" for a in base]  # an owner the study does not expect: refused, not resumable
    assert main([*refused, "--csv", str(first)]) == 1
    assert "kept in" not in capsys.readouterr().err  # no "re-running resumes" where a re-run cannot (former code)
    assert main([*base, "--csv", str(first)]) == 0
    assert main([*base, "--csv", str(first)]) == 0  # the same data again: a no-op
    assert "nothing sent" in capsys.readouterr().out
    assert main([*base, "--csv", str(second)]) == 1
    err = capsys.readouterr().err
    assert "differ and were NOT sent" in err and str(second) in err


def test_a_refused_release_leaves_no_pending_file(cluster: Cluster, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cluster.open_study(domain_size=16, owners=("a", "b"), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(16))  # b is missing: refused without --force
    state = tmp_path / "state"
    assert main(["release", "run", "s1", "--epsilon", "0.5", "--computation", cluster.cs.target, "--insecure",
                 "--state-dir", str(state)]) == 1
    assert "FAILED_PRECONDITION" in capsys.readouterr().err
    assert list(state.glob("pending-releases/*")) == []
