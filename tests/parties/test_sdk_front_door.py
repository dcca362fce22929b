"""`import dpagg`: the clients, typed context managers, one exception family, documented methods, DataFrames."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest

import dpagg
from he_partition.core.errors import DPAggError
from he_partition.core.summary import RangeCounts, Summary
from parties.analyst.client import AnalystClient
from parties.common.client import BaseClient
from parties.demo import partition_boundaries, plot_bands

from .conftest import Cluster

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ("ComputationClient", "DataOwnerClient", "AnalystClient", "DecryptionClient")


def test_import_dpagg_gives_the_four_clients_and_one_exception_family() -> None:
    assert sorted(dpagg.__all__) == sorted(dpagg._EXPORTS)
    for name in dpagg.__all__:
        assert getattr(dpagg, name) is not None
    for name in CLIENTS:
        assert inspect.isclass(getattr(dpagg, name)) and getattr(dpagg, name).__module__.startswith("parties.")
    errors = [getattr(dpagg, n) for n in dpagg.__all__ if n.endswith("Error")]
    assert len(errors) >= 7 and all(issubclass(e, dpagg.DPAggError) for e in errors)
    assert dpagg.DPAggError is DPAggError and "v1" not in dpagg.__all__
    with pytest.raises(AttributeError):
        dpagg.NoSuchThing  # noqa: B018


def test_importing_the_generated_code_loads_no_client() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = ("import sys; import parties.wire.v1.analyst_pb2; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('parties', 'dpagg')"
            " and m not in ('parties', 'parties.wire') and not m.startswith('parties.wire.v1')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize("name", CLIENTS)
def test_with_gives_back_the_client_typed(name: str) -> None:
    cls = getattr(dpagg, name)
    assert typing.get_type_hints(cls.__enter__)["return"] is typing.Self


@pytest.mark.parametrize("name", CLIENTS)
def test_every_public_method_is_documented(name: str) -> None:
    cls = getattr(dpagg, name)
    missing = [n for n, member in inspect.getmembers(cls)
               if not n.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
               and not inspect.getdoc(member)]
    assert missing == [], f"{name}: undocumented {missing}"


def _example(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    block = doc.split("::", 1)[1]
    return "\n".join(line[4:] if line.startswith("    ") else line for line in block.strip("\n").splitlines())


def test_the_analyst_client_docstring_example_runs_as_written(secure_cluster: Cluster, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the address is substituted (as in the README walkthrough); the files are where `dpagg certs` puts them."""
    secure_cluster.open_study(study_id="ages", domain_size=50, owners=("a",), epsilon=1.0)
    secure_cluster.owner("a").submit("ages", np.arange(50))
    secure_cluster.computation().run_release("ages", epsilon=1.0)
    alice = secure_cluster.tls("alice", "analyst")
    assert alice is not None
    assert alice.cert.parent == tmp_path / "pki"  # the `dpagg certs --out pki` layout
    monkeypatch.chdir(tmp_path)
    code = _example(AnalystClient)
    assert '"localhost:50052"' in code
    exec(compile(code.replace('"localhost:50052"', repr(secure_cluster.cs.target)), "example", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["0", "10"], ["10", "50"]]


def test_list_releases_of_an_unknown_study_is_empty_as_documented(cluster: Cluster) -> None:
    assert cluster.analyst().list_releases("no-such-study") == []
    assert "unknown study" in (inspect.getdoc(AnalystClient.list_releases) or "")


def test_summaries_and_range_answers_become_dataframes(cluster: Cluster) -> None:
    pd = pytest.importorskip("pandas")
    cluster.open_study(domain_size=16, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(16))
    rel = cluster.computation().run_release("s1", epsilon=1.0)
    summary = cluster.analyst().get_release(rel.release_id).summary
    frame = summary.to_pandas()
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == ["start", "stop", "sum", "standard_error"]
    assert frame["start"].tolist() == list(summary.starts) and frame["sum"].tolist() == list(summary.sums)
    answers = cluster.analyst().range_counts(rel.release_id, [(0, 8), (8, 16)])
    assert isinstance(answers, RangeCounts)
    table = answers.to_pandas()
    assert table[["lo", "hi"]].values.tolist() == [[0, 8], [8, 16]]
    assert table["value"].tolist() == [a.value for a in answers]


def test_a_join_table_becomes_a_dataframe() -> None:
    pytest.importorskip("pandas")
    summary = Summary(domain_size=4, epsilon=1.0, strategy="join", noise_parties=2, starts=(0, 1, 2, 3),
                      sums=(5, 6, 7, 8), sum_variance=(2.0, 2.0, 2.0, 2.0),
                      params={"join": {"shape": [2, 2], "order": "row", "release": "cells"}})
    frame = dpagg.join_table_frame(summary)
    assert frame.shape == (2, 2) and frame.values.sum() == pytest.approx(26.0)
    assert dpagg.join_table_frame(summary, standard_errors=True).values.tolist() == [[2**0.5] * 2] * 2


def test_to_pandas_without_pandas_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=re.escape("pip install 'dpagg[pandas]'")):
        RangeCounts().to_pandas()


def test_the_demo_plot_draws_an_error_band_and_nothing_below_zero() -> None:
    result = {"released_estimates": [-3.0, -3.0, 10.0, 10.0, 10.0, 10.0],
              "partitions": {"starts": [0, 2], "sum_variance": [16.0, 64.0]}}
    shown, low, high = plot_bands(result)
    assert shown.tolist() == [0.0, 0.0, 10.0, 10.0, 10.0, 10.0]
    assert low.tolist() == [0.0, 0.0, 8.0, 8.0, 8.0, 8.0]  # sqrt(64) / 4 bins = 2 per bin
    assert high.tolist() == [0.0, 0.0, 12.0, 12.0, 12.0, 12.0]  # -3 + 2 is still below zero


def test_the_demo_plot_marks_where_each_partition_starts() -> None:
    result = {"domain": {"edges": [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]}, "partitions": {"starts": [0, 2, 3]}}
    assert partition_boundaries(result).tolist() == [4.0, 6.0]  # the first partition's left edge is no boundary
    assert partition_boundaries({**result, "partitions": {"starts": [0]}}).size == 0


def test_the_demo_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from parties.demo import plot_demo

    result = {"released_estimates": [-3.0, 5.0], "true_histogram": [0, 4], "epsilon_spent": 1.0,
              "release_id": "rel-x", "domain": {"edges": [0.0, 1.0, 2.0], "column": "age"},
              "partitions": {"starts": [0, 1], "sum_variance": [4.0, 4.0]}}
    path = plot_demo(result, tmp_path / "demo.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    many = {**result, "released_estimates": [1.0] * 200, "true_histogram": [1] * 200,
            "domain": {"edges": list(range(201)), "column": "age"},
            "partitions": {"starts": list(range(0, 200, 2)), "sum_variance": [4.0] * 100}}
    assert plot_demo(many, tmp_path / "many.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # ticks, not lines


def test_base_client_enter_is_typed_self() -> None:
    assert typing.get_type_hints(BaseClient.__enter__)["return"] is typing.Self
