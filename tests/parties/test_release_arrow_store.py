"""The computation server stores a release's summary as Arrow files, not JSON in SQLite; older JSON rows still read."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from he_partition import release
from he_partition.core.summary_arrow import PARTITIONS_FILE, RELEASED_FILE, read_summary
from parties.analyst.handler import AnalystHandler
from parties.computation.store import ReleaseRecord
from parties.computation.store_sqlite import RELEASES_DIR, SqliteComputationStore


def _summary(strategy: str = "hier"):
    return release([np.random.default_rng(7).integers(0, 9, 200)], 0.9, strategy=strategy, rng=2)


def test_a_release_is_stored_as_arrow_files_and_read_back_after_a_restart(tmp_path: Path) -> None:
    s = _summary()
    store = SqliteComputationStore(tmp_path / "cs", durable=False)
    fields = store.summary_fields("rel-1", s)
    rec = ReleaseRecord("rel-1", "s1", "DONE", 0.9, ("a",), "h", "t0", finished_at="t1", **fields)
    store.save_release(rec)
    assert store.get_release("rel-1").summary is s  # the newest release is answered from the object it came from
    store.close()
    with sqlite3.connect(tmp_path / "cs" / SqliteComputationStore.DB_FILE) as db:
        row = db.execute("SELECT summary_json, summary_file, summary_size FROM releases").fetchone()
    assert row[0] == "" and row[1] == f"{RELEASES_DIR}/rel-1"  # no JSON in SQLite; the path is the data dir's
    files = tmp_path / "cs" / RELEASES_DIR / "rel-1"
    assert row[2] == sum((files / f).stat().st_size for f in (PARTITIONS_FILE, RELEASED_FILE))
    for opened in (SqliteComputationStore(tmp_path / "cs"), SqliteComputationStore(tmp_path / "cs", read_only=True)):
        got = opened.get_release("rel-1")
        assert got is not None and got.summary == s and got.summary.to_json() == s.to_json()
        assert [(i.domain_size, i.partitions) for i in opened.release_listing()] == [(200, s.n_partitions)]
        handler_rec, handler_files = AnalystHandler(opened).arrow_files("rel-1")
        assert [p for _, p in handler_files] == [files / PARTITIONS_FILE, files / RELEASED_FILE]
        opened.close()


def test_a_release_stored_as_json_before_the_arrow_files_still_reads_and_serves(tmp_path: Path) -> None:
    s = _summary("auto")
    store = SqliteComputationStore(tmp_path / "cs", durable=False)
    old = ReleaseRecord("rel-old", "s1", "DONE", 0.9, ("a",), "h", "t0", finished_at="t1", summary_json=s.to_json())
    store.save_release(old)
    store.close()
    reopened = SqliteComputationStore(tmp_path / "cs")
    got = reopened.get_release("rel-old")
    assert got is not None and got.summary_file == "" and got.summary == s
    assert got.stored_summary_bytes == len(s.to_json())
    _, files = AnalystHandler(reopened).arrow_files("rel-old")  # made from the parsed summary, in memory
    assert read_summary(*(data for _, data in files)) == s
    reopened.close()
