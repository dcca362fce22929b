"""The running aggregate: each commit is folded in once, releases and direct counts start from it, crashes lose nothing.

The decryption server's own draw differs between runs by design (keyed by fresh encryption
randomness), so, as in test_scale_out, each test decrypts the exact bytes the CS sent with the
DS's secret key and compares them with the numpy oracle replaying the CS's seed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from he_partition.core.measurements import Measurement
from he_partition.execution import InProcessExecutor, ProcessExecutor
from he_partition.execution.base import ChunkSource
from parties.computation.running import MANIFEST, RunningAggregates
from parties.computation.store import Submission, UploadMeta

from .conftest import Cluster, blocky_histograms
from .test_scale_out import N  # three chunks
from .test_scale_out import assert_cs_view_is_the_oracle as assert_sent_is_the_oracle


class Sent:
    """Keeps what the CS hands the real decryption client (measurement, chunks) and what its executor loads."""

    def __init__(self, cluster: Cluster) -> None:
        self.measurements: list[tuple[Measurement, list[bytes]]] = []
        self.sources: list[ChunkSource] = []
        handler = cluster.cs.handler
        real, load = handler.decryption.decrypt_measurement, handler.executor.load

        def recording(**kw: Any) -> Any:
            chunks: list[bytes] = []
            self.measurements.append((kw["measurement"], chunks))

            def keep() -> Iterator[bytes]:
                for c in kw["chunks"]:
                    chunks.append(c)
                    yield c

            return real(**{**kw, "chunks": keep()})

        def loading(key: str, context: bytes, source: ChunkSource, count: int) -> None:
            self.sources.append(source)
            load(key, context, source, count)

        handler.decryption.decrypt_measurement = recording
        handler.executor.load = loading


def assert_cs_view_is_the_oracle(cluster: Cluster, sent: Sent, hs: list[np.ndarray], seed: int) -> None:
    """Every measurement the CS sent decrypts to the oracle's aggregate + the seeded draws, in the same order."""
    assert_sent_is_the_oracle(cluster.ds.handler.backend_for(cluster.ds.handler.get_study("s1")), sent.measurements,
                              hs, seed)


def _manifest(cluster: Cluster) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((cluster.root / "cs" / "aggregates" / "s1" / MANIFEST).read_text())
    return manifest


def _submit(cluster: Cluster, owners: tuple[str, ...], hs: list[np.ndarray]) -> None:
    for owner, h in zip(owners, hs):
        assert cluster.owner(owner).submit("s1", h).committed


def test_each_commit_is_folded_once_and_a_release_reads_only_the_running_sum(tmp_path: Path) -> None:
    cluster = Cluster.start(tmp_path)
    hs = blocky_histograms(N)
    try:
        cluster.open_study(domain_size=N, epsilon=2.0)  # budget left after the release: the study's key stays
        for i, owner in enumerate("abc"):
            _submit(cluster, (owner,), [hs[i]])
            assert cluster.cs.handler.folds.wait_idle(60)  # the commit's fold runs in the background
            manifest = _manifest(cluster)
            assert [o for o, _ in manifest["uploads"]] == list("abc"[:i + 1])
            gens = [p.name for p in (tmp_path / "cs" / "aggregates" / "s1").iterdir() if p.is_dir()]
            assert gens == [manifest["generation"]]  # the previous generation is gone
        sent = Sent(cluster)
        assert cluster.computation().run_release("s1", epsilon=1.0).state == "DONE"
        (source,) = sent.sources
        assert source.templates == (str(tmp_path / "cs" / "aggregates" / "s1" / manifest["generation"] /  # type: ignore[attr-defined]
                                        "{index:07d}.ct"),)
        assert_cs_view_is_the_oracle(cluster, sent, hs, seed=12)
    finally:
        cluster.stop()


def test_a_crash_mid_fold_neither_double_counts_nor_loses_the_owner(tmp_path: Path) -> None:
    cluster = Cluster.start(tmp_path)
    hs = blocky_histograms(N)
    study_dir = tmp_path / "cs" / "aggregates" / "s1"
    try:
        cluster.open_study(domain_size=N, epsilon=1.0)
        _submit(cluster, ("a", "b"), hs[:2])
        assert cluster.cs.handler.folds.wait_idle(60)
        before = tmp_path / "before"
        shutil.copytree(study_dir, before)
        _submit(cluster, ("c",), hs[2:])
        assert cluster.cs.handler.folds.wait_idle(60)
        cluster.cs.stop()
        # The disk as a crash during c's fold leaves it: c committed, the old manifest and generation, and a
        # half-written new generation that no manifest names.
        orphan = tmp_path / "orphan"
        shutil.copytree(study_dir / _manifest(cluster)["generation"], orphan)
        shutil.rmtree(study_dir)
        shutil.copytree(before, study_dir)
        shutil.copytree(orphan, study_dir / "gen-half")
        (study_dir / "gen-half" / "0000000.ct").write_bytes(b"half a chunk")
        cluster.restart_cs(seed=22)
        assert [o for o, _ in _manifest(cluster)["uploads"]] == ["a", "b"]
        sent = Sent(cluster)
        assert cluster.computation().run_release("s1", epsilon=0.5).state == "DONE"
        # The release first folds c, the owner the aggregate lacks, and reads that one sum; the orphan is removed.
        (source,) = sent.sources
        assert len(source.templates) == 1  # type: ignore[attr-defined]
        assert [o for o, _ in _manifest(cluster)["uploads"]] == ["a", "b", "c"]
        assert [p.name for p in study_dir.iterdir() if p.is_dir()] == [_manifest(cluster)["generation"]]
        assert_cs_view_is_the_oracle(cluster, sent, hs, seed=22)
        # A further fold (the background pass after the release) finds nothing left: c is counted once.
        generation = _manifest(cluster)["generation"]
        cluster.cs.handler.fold_committed("s1", cluster.cs.handler.backend_for(cluster.cs.handler.study("s1")))
        assert _manifest(cluster)["generation"] == generation
    finally:
        cluster.stop()


@pytest.mark.parametrize("executor", ["inprocess", "processes"])
def test_direct_counts_run_on_the_executor_and_release_the_seeded_values(tmp_path: Path, executor: str) -> None:
    cluster = Cluster.start(tmp_path)
    handler = cluster.cs.handler
    handler.executor.close()
    handler.executor = ProcessExecutor(2) if executor == "processes" else InProcessExecutor()
    hs = blocky_histograms(N)
    try:
        cluster.open_study(domain_size=N, epsilon=1.0)
        _submit(cluster, ("a", "b", "c"), hs)
        sent = Sent(cluster)
        r = cluster.computation().direct_range_counts("s1", [(0, 10), (8180, 8200), (100, 16380)], 0.1)
        assert len(r.counts) == 3
        assert len(sent.sources) == 1  # one load on the executor for the whole batch
        assert_cs_view_is_the_oracle(cluster, sent, hs, seed=12)
    finally:
        handler.executor.close()
        cluster.stop()


def _sub(owner: str) -> Submission:
    return Submission(UploadMeta("s1", owner, "k1", 2, 2, "fp"), 2, "now")


def test_a_generation_being_read_survives_a_fold_until_its_reader_ends(tmp_path: Path) -> None:
    """Plain integers stand in for ciphertexts: the bookkeeping is what is tested (the sum is exact either way)."""
    chunks = {o: tmp_path / "up" / o for o in "abc"}
    for n, d in enumerate(chunks.values()):
        d.mkdir(parents=True)
        for i in range(2):
            (d / f"{i:07d}.ct").write_text(str(10 ** n * (i + 1)))
    running = RunningAggregates(tmp_path / "agg", durable=False)

    def fold(owners: str) -> None:
        def write_sums(templates: tuple[str, ...], count: int, out: str) -> None:
            for i in range(count):
                Path(out.format(index=i)).write_text(str(sum(int(Path(t.format(index=i)).read_text())
                                                             for t in templates)))

        running.fold([_sub(o) for o in owners], write_sums, lambda s: str(chunks[s.owner_id] / "{index:07d}.ct"))

    def total(templates: tuple[str, ...]) -> list[int]:
        return [sum(int(Path(t.format(index=i)).read_text()) for t in templates) for i in range(2)]

    fold("ab")
    with running.reading([_sub(o) for o in "abc"], lambda s: str(chunks[s.owner_id] / "{index:07d}.ct")) as ts:
        assert len(ts) == 2 and total(ts) == [111, 222]
        fold("abc")
        assert total(ts) == [111, 222]  # still readable: a replaced worker may read it again
    assert len(list((tmp_path / "agg" / "s1").glob("gen-*"))) == 1
    with running.reading([_sub(o) for o in "abc"], lambda s: str(chunks[s.owner_id] / "{index:07d}.ct")) as ts:
        assert len(ts) == 1 and total(ts) == [111, 222]
    # A manifest naming an upload that is no longer a submission is not used: every owner is summed.
    with running.reading([_sub(o) for o in "ab"], lambda s: str(chunks[s.owner_id] / "{index:07d}.ct")) as ts:
        assert len(ts) == 2 and total(ts) == [11, 22]
