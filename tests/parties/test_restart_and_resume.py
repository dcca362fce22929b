"""Durability: a computation-server restart loses nothing and double-counts nothing; uploads resume."""

from __future__ import annotations

import time
from typing import Any, Iterator

import numpy as np
import pytest

from he_partition.he.bfv import BfvBackend, context_fingerprint, load_context
from he_partition.protocol import encrypt_histogram
from parties.common.errors import ServiceError
from parties.computation import uploads
from parties.computation.client import ComputationClient

from .conftest import Cluster


def test_computation_server_restart_between_uploads_and_release_loses_nothing(cluster: Cluster) -> None:
    n = 64
    cluster.open_study(domain_size=n, owners=("a", "b", "c"))
    hs = [np.full(n, 10 * (i + 1)) for i in range(3)]
    cluster.owner("a").submit("s1", hs[0], idempotency_key="ka")
    cluster.owner("b").submit("s1", hs[1], idempotency_key="kb")
    cluster.restart_cs()
    cs = cluster.computation()
    assert cs.study_status("s1").submitted_owners == ("a", "b")
    # A retried upload after the restart is recognised (not counted twice).
    again = cluster.owner("a").submit("s1", hs[0], idempotency_key="ka")
    assert again.duplicate and again.bytes_sent == 0
    cluster.owner("c").submit("s1", hs[2], idempotency_key="kc")
    cluster.restart_cs()
    cs = cluster.computation()
    rel = cs.run_release("s1")
    assert rel.owners == ("a", "b", "c") and rel.summary is not None
    total = int(np.sum(hs))  # 3,840
    se = cluster.analyst().range_counts(rel.release_id, [(0, n)])[0]
    assert abs(se.value - total) <= 4 * se.standard_error  # counted exactly once

    cluster.restart_cs()
    analyst = cluster.analyst()  # released summaries persist
    assert [r.release_id for r in analyst.list_releases("s1")] == [rel.release_id]
    assert analyst.get_release(rel.release_id).summary == rel.summary


def test_interrupted_upload_resumes_with_only_the_missing_chunks_even_across_a_restart(cluster: Cluster) -> None:
    n = 3 * 8192 - 100  # three ciphertext chunks
    cluster.open_study(domain_size=n, owners=("a",))
    owner = cluster.owner("a")
    enc = owner.encrypt("s1", np.ones(n, dtype=int))
    part = owner.upload(enc, idempotency_key="resume-me", only=[0, 2])  # the "interrupted" first attempt
    assert not part.committed and part.chunks_sent == 2
    cs = cluster.computation()
    st = cs.upload_status("s1", "a", "resume-me")
    assert st.state == "PARTIAL" and st.received == (0, 2) and st.chunk_count == 3
    assert cs.study_status("s1").submitted_owners == ()

    cluster.restart_cs()
    owner = cluster.owner("a")
    done = owner.upload(enc, idempotency_key="resume-me")
    assert done.committed and done.chunks_sent == 1 and done.bytes_sent == len(enc.chunks[1])
    assert cluster.computation().study_status("s1").submitted_owners == ("a",)


def test_resume_may_mix_chunks_of_two_encryptions_of_the_same_histogram(cluster: Cluster) -> None:
    """A crashed owner re-encrypts (fresh randomness) and resumes with the same key: chunks still add up."""
    n = 2 * 8192
    cluster.open_study(domain_size=n, owners=("a",), epsilon=1.0)
    owner = cluster.owner("a")
    h = np.arange(n) % 3
    first = owner.encrypt("s1", h)
    owner.upload(first, idempotency_key="k", only=[0])
    second = owner.encrypt("s1", h)
    assert second.chunks[0] != first.chunks[0]
    assert owner.upload(second, idempotency_key="k").chunks_sent == 1
    rel = cluster.computation().run_release("s1")
    rc = cluster.analyst().range_counts(rel.release_id, [(0, n)])[0]
    assert abs(rc.value - h.sum()) <= 4 * rc.standard_error


def test_partial_upload_under_a_new_key_replaces_the_old_partial(cluster: Cluster) -> None:
    n = 2 * 8192
    cluster.open_study(domain_size=n, owners=("a",))
    owner = cluster.owner("a")
    enc = owner.encrypt("s1", np.ones(n, dtype=int))
    owner.upload(enc, idempotency_key="old", only=[0])
    res = owner.upload(enc, idempotency_key="new")
    assert res.committed and res.chunks_sent == 2
    cs = cluster.computation()
    assert cs.upload_status("s1", "a", "old").state == "CONFLICT"
    assert not (cluster.root / "cs" / "uploads" / "s1" / "a" / "old").exists()


def test_encrypting_locally_matches_what_the_server_expects(cluster: Cluster) -> None:
    contract = cluster.open_study(domain_size=64)
    data = cluster.decryption().public_context(study_id=contract.study_id)  # the study's own key
    be = BfvBackend(load_context(data))
    vec = encrypt_histogram(be, np.ones(64, dtype=int))
    assert len(vec.chunks) == 1 and contract.context_fingerprint == context_fingerprint(data)


def test_an_upload_syncs_its_chunks_in_batches_and_a_broken_stream_keeps_what_arrived(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uploads, "SYNC_EVERY_CHUNKS", 2)
    store = cluster.cs.handler.store
    batches: list[int] = []
    real = store.sync_chunks

    def counting(meta: Any, staged: list[object]) -> None:
        batches.append(len(staged))
        real(meta, staged)

    monkeypatch.setattr(store, "sync_chunks", counting)
    n = 5 * 8192 - 100  # five ciphertext chunks
    cluster.open_study(domain_size=n, owners=("a", "b"))
    assert cluster.owner("a").submit("s1", np.ones(n, dtype=int), idempotency_key="ka").committed
    assert batches == [2, 2, 1]  # one flush per two chunks; the last one before the reply lists them

    owner = cluster.owner("b")
    enc = owner.encrypt("s1", np.ones(n, dtype=int))
    real_submit = ComputationClient.submit_chunks

    def breaks_off(self: ComputationClient, *, chunks: Iterator[tuple[int, bytes]], **kw: Any) -> Any:
        def three() -> Iterator[tuple[int, bytes]]:
            for k, item in enumerate(chunks):
                if k == 3:
                    time.sleep(0.5)  # the three chunks reach the server, then the stream breaks
                    raise ConnectionError("the owner's machine went away")
                yield item
        return real_submit(self, chunks=three(), **kw)

    with monkeypatch.context() as m:
        m.setattr(uploads, "SYNC_EVERY_CHUNKS", 100)  # nothing synced while the stream runs
        m.setattr(ComputationClient, "submit_chunks", breaks_off)
        with pytest.raises(ServiceError):  # the call was cancelled
            owner.upload(enc, idempotency_key="kb")
    cs = cluster.computation()
    end = time.monotonic() + 10
    while cs.upload_status("s1", "b", "kb").received != (0, 1, 2) and time.monotonic() < end:
        time.sleep(0.05)  # the server notices the broken stream on its own thread
    assert cs.upload_status("s1", "b", "kb").received == (0, 1, 2)  # staged, then synced as the stream broke
    done = cluster.owner("b").upload(enc, idempotency_key="kb")
    assert done.committed and done.chunks_sent == 2


def test_one_owner_sends_its_chunks_over_several_streams_at_once_and_commits_once(cluster: Cluster) -> None:
    n = 2 * 8192 + 10  # three chunks
    cluster.open_study(domain_size=n, owners=("a",))
    headers: list[str] = []
    real_open = cluster.cs.handler.open_upload
    cluster.cs.handler.open_upload = lambda **kw: headers.append(kw["owner_id"]) or real_open(**kw)
    h = np.arange(n) % 5
    res = cluster.owner("a").submit("s1", h, streams=3)
    assert res.committed and res.chunks_sent == 3  # each chunk sent once, whichever stream took it
    assert headers == ["a", "a", "a"]  # three streams of the one upload, at once
    (sub,) = cluster.cs.handler.store.submissions("s1")
    assert sorted(cluster.cs.handler.store.received_chunks(sub.meta)) == [0, 1, 2]
    rec = cluster.computation().run_release("s1", epsilon=1.0)
    assert rec.state == "DONE" and abs(sum(rec.summary.sums) - int(h.sum())) < 200  # type: ignore[union-attr]
