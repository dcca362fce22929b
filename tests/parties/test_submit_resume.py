"""An interrupted submit resumes from the chunks the server holds: no re-encryption, no resending (real servers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from parties.computation.client import ComputationClient
from parties.data_owner.client import SubmitInterrupted

from .conftest import Cluster

#: 20,000 bins fill three 8,192-slot ciphertext chunks.
BINS = 20_000


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """The next upload stream delivers `n` chunks to the real server, then the user presses Ctrl-C."""
    real = ComputationClient.submit_chunks

    def partial(self: ComputationClient, *, chunks: Iterator[tuple[int, bytes]], **kw: Any) -> Any:
        first = [next(chunks) for _ in range(n)]
        real(self, chunks=iter(first), **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(ComputationClient, "submit_chunks", partial)


def test_signed_upload_resumes_with_the_same_ciphertexts(secure_cluster: Cluster, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    secure_cluster.open_study(domain_size=BINS, owners=("a",))
    counts = np.random.default_rng(3).integers(0, 5, size=BINS)
    with monkeypatch.context() as m:
        _interrupt_after(m, 1)
        with pytest.raises(SubmitInterrupted) as stop:
            secure_cluster.owner("a").submit("s1", counts, idempotency_key="k1", resume_dir=tmp_path)
    assert (stop.value.sent, stop.value.held_before, stop.value.chunk_count) == (1, 0, 3)
    assert "not committed" in str(stop.value)
    assert secure_cluster.computation().upload_status("s1", "a", "k1").received == (0,)
    saved = sorted(p.name for p in (tmp_path / "s1.a.k1.chunks").iterdir())
    assert saved == ["chunk-000000.ct", "chunk-000001.ct", "chunk-000002.ct", "upload.json"]

    changed = counts.copy()
    changed[0] += 1
    with pytest.raises(InvalidInputError, match="the data differs from what the interrupted upload k1"):
        secure_cluster.owner("a").submit("s1", changed, idempotency_key="k1", resume_dir=tmp_path)

    res = secure_cluster.owner("a").submit("s1", counts, idempotency_key="k1", resume_dir=tmp_path)
    assert res.committed and not res.duplicate
    assert (res.chunk_count, res.chunks_sent) == (3, 2)  # the held chunk was not sent again
    assert not (tmp_path / "s1.a.k1.chunks").exists()  # forgotten once committed
    assert secure_cluster.computation().study_status("s1").submitted_owners == ("a",)


def _value_csv_study(cluster: Cluster, tmp_path: Path) -> Path:
    """Study s1 of owner a over BINS value bins, and a.csv: one record every 7th value."""
    cluster.open_study(domain_size=BINS, owners=("a",), domain_spec=f"v:0:{BINS}:{BINS}")
    csv = tmp_path / "a.csv"
    csv.write_text("value\n" + "\n".join(str(v) for v in range(0, BINS, 7)) + "\n")
    return csv


def _submit_argv(cluster: Cluster, tmp_path: Path, csv: Path, *columns: str) -> list[str]:
    """`dpagg submit` of owner a's `csv` to study s1 on the cluster (insecure, no progress bar)."""
    return ["submit", "--study", "s1", "--owner", "a", "--csv", str(csv), *columns, "--computation",
            cluster.cs.target, "--decryption", cluster.ds.target, "--insecure", "--no-progress",
            "--state-dir", str(tmp_path / "state")]


def test_cli_says_how_to_resume_and_the_rerun_sends_only_the_rest(cluster: Cluster, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from parties.cli import main

    argv = _submit_argv(cluster, tmp_path, _value_csv_study(cluster, tmp_path), "--value-column", "value")
    with monkeypatch.context() as m:
        _interrupt_after(m, 2)
        assert main(argv) == 130
    err = capsys.readouterr().err
    assert f"{-(-BINS // 7)} records read" in err  # counts reported before anything is sent
    assert "held 0 of 3 chunk(s) and this run sent 2 more" in err
    assert "Run the same command again to resume" in err
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["committed"] and (out["chunks"], out["chunks_sent"]) == (3, 1)


def test_an_interrupted_submit_of_the_sample_data_resumes(cluster: Cluster, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The sample data has people with more records than the contribution bound keeps: the records kept are chosen
    at random, and a re-run once chose another subset ("the data differs from what the interrupted upload began
    with"). The choice is now keyed by a secret made with the upload, so the re-run keeps the same records."""
    from parties.cli import main
    from parties.data_owner.dataset import write_sample_csv

    cluster.open_study(domain_size=BINS, owners=("a",), domain_spec=f"age:0:100:{BINS}")
    csv = tmp_path / "owner-1.csv"
    write_sample_csv(csv, seed=7, n_records=3000, owner_index=0)
    argv = _submit_argv(cluster, tmp_path, csv, "--person-column", "person_id")
    with monkeypatch.context() as m:
        _interrupt_after(m, 1)
        assert main(argv) == 130
    first = capsys.readouterr().err
    dropped = int(first.split(" dropped by the contribution bound")[0].rsplit(", ", 1)[1])
    assert dropped > 0  # the bound did choose among a person's records
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["committed"] and (out["chunks"], out["chunks_sent"]) == (3, 2) and out["records_dropped"] == dropped


def test_a_submit_whose_output_pipe_is_closed_still_uploads(cluster: Cluster, tmp_path: Path) -> None:
    """`dpagg submit ... 2>&1 | head -2`: both streams go to a pipe whose reader leaves. The first write to the
    gone stderr raised and the upload stopped before its first chunk (exit 1, nothing said)."""
    import os
    import subprocess
    import sys

    from .test_cli import _env

    argv = _submit_argv(cluster, tmp_path, _value_csv_study(cluster, tmp_path), "--value-column", "value")
    argv.remove("--no-progress")  # progress on stderr is what met the closed pipe
    read, write = os.pipe()
    os.close(read)  # the reader (`head -2`) is gone
    try:
        proc = subprocess.run([sys.executable, "-m", "parties.cli", *argv],
                              stdout=write, stderr=write, env=_env(tmp_path), timeout=300)
    finally:
        os.close(write)
    assert proc.returncode == 0
    assert cluster.computation().study_status("s1").submitted_owners == ("a",)
