"""A `dpagg submit` parses its study's domain once: a 4M-bin domain took seconds per parse, and it was parsed four
times (the CLI, and each contract the command received)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from parties.data_owner.domain import DomainSpec

from .conftest import Cluster
from .test_submit_resume import _submit_argv, _value_csv_study


def test_a_submit_parses_the_domain_once(cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from parties.cli import main

    argv = _submit_argv(cluster, tmp_path, _value_csv_study(cluster, tmp_path), "--value-column", "value")
    real = DomainSpec.parse.__func__  # type: ignore[attr-defined]
    here = threading.get_ident()  # the command's own parses, not the in-process servers'
    parses: list[str] = []

    def counted(cls: type[DomainSpec], text: str, **kw: Any) -> DomainSpec:
        if threading.get_ident() == here:
            parses.append(text)
        return real(cls, text, **kw)

    monkeypatch.setattr(DomainSpec, "parse", classmethod(counted))
    assert main(argv) == 0, capsys.readouterr().err
    assert "a submitted" in capsys.readouterr().out
    assert parses == ["v:0:20000:20000"]


@pytest.mark.parametrize("spec", ["age:0:100:50", "age:edges:0,18,65,120", "sector:categories:a,b,c", "a:b:0:1:4",
                                  "age:0:1:0", "age:1:0:3", "age:0:inf:3", ":0:1:2", "age:0:1:x", "age:edges:0,1,1",
                                  "age:0:100:20000000", "nonsense"])
def test_a_contract_counts_the_bins_of_every_spec_parse_accepts_and_refuses_the_rest(spec: str) -> None:
    try:
        parsed: int | str = DomainSpec.parse(spec, max_bins=1 << 24).n_bins
    except Exception as exc:  # noqa: BLE001 - compared below
        parsed = f"{type(exc).__name__}: {exc}"
    try:
        counted: int | str = DomainSpec.count_bins(spec, max_bins=1 << 24)
    except Exception as exc:  # noqa: BLE001
        counted = f"{type(exc).__name__}: {exc}"
    assert counted == parsed
