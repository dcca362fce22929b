"""Durability: a computation-server restart loses nothing and double-counts nothing; uploads resume."""

from __future__ import annotations

import numpy as np

from he_partition.he.bfv import BfvBackend, load_context
from he_partition.protocol import encrypt_histogram

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
    be = BfvBackend(load_context(cluster.decryption().public_context()))
    vec = encrypt_histogram(be, np.ones(64, dtype=int))
    assert len(vec.chunks) == 1 and contract.context_fingerprint == cluster.ds.handler.fingerprint
