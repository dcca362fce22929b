"""Listing releases reads metadata only: no stored summary is read or parsed, whatever its size."""
from __future__ import annotations

import numpy as np
import pytest

from he_partition.core.summary import Summary

from .conftest import Cluster


def test_list_releases_parses_no_summary_and_backfills_older_rows(cluster: Cluster,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """On the former code every ListReleases call decoded every stored summary in full (4-16 s and ~1.5 GB per
    call once large releases existed), locking other callers out."""
    cluster.open_study(domain_size=64, owners=("a",), epsilon=2.0)
    cluster.owner("a").submit("s1", np.arange(64) % 5)
    first = cluster.computation().run_release("s1", epsilon=0.5)
    second = cluster.computation().run_release("s1", epsilon=0.5)
    expected = {r.release_id: cluster.analyst().get_release(r.release_id).summary.n_partitions for r in (first, second)}

    def no_parsing(*_: object, **__: object) -> Summary:
        raise AssertionError("a listing parsed a stored summary")

    monkeypatch.setattr(Summary, "from_json", staticmethod(no_parsing))
    cluster.restart_cs()  # no summary cached in memory
    listed = cluster.analyst().list_releases("s1")
    assert [i.release_id for i in listed] == [second.release_id, first.release_id]  # newest first
    assert {i.release_id: i.partitions for i in listed} == expected
    assert all(i.domain_size == 64 for i in listed)
    monkeypatch.undo()

    # a store written before the metadata columns: read once, kept
    store = cluster.cs.handler.store
    with store._lock, store._tx():  # type: ignore[attr-defined]
        store._db.execute("UPDATE releases SET domain_size = -1, partitions = -1")  # type: ignore[attr-defined]
    assert {i.release_id: i.partitions for i in store.release_listing("s1")} == expected
    rows = store._db.execute("SELECT partitions FROM releases").fetchall()  # type: ignore[attr-defined]
    assert all(int(r[0]) >= 1 for r in rows)


def test_a_cached_release_is_answered_without_reading_its_stored_record_again(cluster: Cluster,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """On the former code every RangeCounts read the whole stored record (a 2^20-bin summary is ~38 MB of text, read
    under the store's lock) before looking in the cache, so heavy range queries held up every other store call."""
    cluster.open_study(domain_size=64, owners=("a",), epsilon=2.0)
    cluster.owner("a").submit("s1", np.arange(64) % 5)
    rid = cluster.computation().run_release("s1", epsilon=0.5).release_id
    analyst = cluster.analyst()
    first = analyst.range_counts(rid, [(0, 10), (5, 64)])
    store = cluster.cs.handler.store
    reads: list[str] = []
    real = type(store).get_release
    monkeypatch.setattr(type(store), "get_release", lambda self, r: reads.append(r) or real(self, r))
    assert analyst.range_counts(rid, [(0, 10), (5, 64)]) == first
    release = analyst.get_release(rid)
    assert release.release_id == rid and release.owners == ("a",) and release.created_at
    assert reads == []  # answered from the analyst's cache
