"""Lists that grow with the domain travel in pages: measurement starts, decrypted values, released summaries.

The page size and the inline limit are lowered here so a 64-bin study exercises every paged path
that a 2^23-bin release takes (`benchmarks/services.py --bins 8388608` runs that one); the slow
test at the end releases 2^21 bins with every gRPC message limited to 2 MiB.
"""
from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, Iterator

import grpc
import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from he_partition.core.measurements import PartitionSums
from he_partition.core.noise import KeyedRandom
from parties.common import convert, paging
from parties.common.contract import canonical_json
from parties.common.convert import summary_to_proto
from parties.decryption.handler import NOISE_STREAM, DecryptionHandler
from parties.common.errors import ServiceError
from parties.wire.v1 import analyst_pb2, analyst_pb2_grpc, computation_pb2, computation_pb2_grpc, decryption_pb2

from .conftest import Cluster


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paging, "PAGE_VALUES", 5)
    monkeypatch.setattr(paging, "PAGE_BYTES", 256)
    monkeypatch.setattr(paging, "INLINE_JSON_BYTES", 300)


def _spy_headers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """starts_count of every DecryptMeasurement header the decryption server reads."""
    import parties.decryption.servicer as servicer

    seen: list[int] = []
    real = servicer.read_measurement_header

    def spy(requests: Iterator[Any], method: str) -> Any:
        header, m = real(requests, method)
        seen.append(int(header.starts_count))
        return header, m

    monkeypatch.setattr(servicer, "read_measurement_header", spy)
    return seen


def test_a_release_of_many_partitions_travels_in_pages_and_reads_back_exactly(
        cluster: Cluster, small_pages: None, monkeypatch: pytest.MonkeyPatch) -> None:
    starts_counts = _spy_headers(monkeypatch)
    cluster.open_study(domain_size=64, owners=("a",), epsilon=4.0)
    cluster.owner("a").submit("s1", (np.arange(64) * 7919) % 23)
    rel = cluster.computation().run_release("s1", epsilon=2.0)
    assert rel.state == "DONE" and rel.summary is not None
    stored = cluster.cs.handler.store.get_release(rel.release_id)
    assert stored is not None and stored.summary is not None
    assert rel.summary == stored.summary  # read in pages, equal to what the server stored
    assert rel.summary.n_partitions > 5
    assert any(c > paging.PAGE_VALUES for c in starts_counts), starts_counts  # starts after the header, in pages

    # the reply itself carried no summary, only where to read it
    ch = cluster.computation().channel
    resp = computation_pb2_grpc.ComputationStub(ch).ReleaseStatus(
        computation_pb2.ReleaseStatusRequest(release_id=rel.release_id), timeout=30)
    assert not resp.HasField("summary") and resp.summary_paged
    # GetRelease (one message) names the paged method; the SDK reads the same summary in pages
    with pytest.raises(grpc.RpcError) as ei:
        analyst_pb2_grpc.AnalystStub(ch).GetRelease(analyst_pb2.GetReleaseRequest(release_id=rel.release_id),
                                                    timeout=30)
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "GetReleaseArrow" in ei.value.details()
    got = cluster.analyst().get_release(rel.release_id)
    assert got.summary == stored.summary and got.owners == ("a",)
    received = got.summary._arrow.partitions.column("sum").chunk(0).buffers()[1]  # type: ignore[attr-defined]
    assert np.shares_memory(got.summary.to_pandas()["sum"].to_numpy(), np.frombuffer(received, dtype=np.uint8))
    # the Arrow files' bytes travel in pages of PAGE_BYTES; older clients' numeric pages read the same summary
    stub = analyst_pb2_grpc.AnalystStub(ch)
    arrow = list(stub.GetReleaseArrow(analyst_pb2.GetReleaseRequest(release_id=rel.release_id), timeout=30))
    assert len(arrow) > 3 and all(len(p.data) <= paging.PAGE_BYTES for p in arrow[1:])
    assert [f.name for f in arrow[0].head.files] == ["partitions.arrow", "released.arrow"]
    assert sum(len(p.data) for p in arrow[1:]) == stored.summary_size == sum(f.size for f in arrow[0].head.files)
    old = paging.summary_from_pages(stub.GetReleasePages(analyst_pb2.GetReleaseRequest(release_id=rel.release_id),
                                                         timeout=30), "m")[1]
    assert old == stored.summary
    # range answers and intervals work on the paged summary as on any other
    counts = cluster.analyst().range_counts(rel.release_id, [(0, 64)], confidence=0.9)
    assert counts[0].ci_lo is not None and counts[0].ci_lo <= counts[0].value <= counts[0].ci_hi


def test_a_small_release_still_travels_whole(cluster: Cluster) -> None:
    cluster.open_study(domain_size=64, owners=("a",), epsilon=2.0)
    cluster.owner("a").submit("s1", np.arange(64) % 5)
    rel = cluster.computation().run_release("s1", epsilon=1.0)
    resp = computation_pb2_grpc.ComputationStub(cluster.computation().channel).ReleaseStatus(
        computation_pb2.ReleaseStatusRequest(release_id=rel.release_id), timeout=30)
    assert resp.HasField("summary") and not resp.summary_paged


# --- a cut or forged stream never reads as a smaller valid one -----------------------------------------

def _pages_of(summary: Any) -> list[analyst_pb2.ReleaseSummaryPage]:
    return list(paging.summary_pages(summary, release_id="r", study_id="s"))


def test_summary_pages_that_end_early_or_overflow_are_data_loss(small_pages: None) -> None:
    from he_partition.core.summary import Summary

    s = Summary(domain_size=20, epsilon=1.0, strategy="gap", noise_parties=2, contribution_bound=1,
                starts=tuple(range(0, 20, 2)), sums=tuple(range(10)), sum_variance=(2.0,) * 10,
                epsilon_spent=(("partition_sums", 1.0),), params={})
    pages = _pages_of(s)
    assert len(pages) == 1 + 2  # head + 10 partitions in pages of 5
    back = paging.summary_from_pages(pages, "m")[1]
    assert back == s and back.to_json() == s.to_json()  # a variance 2.0 stays a float beside a sum of 2
    assert all(type(v) is float for v in back.sum_variance) and all(type(v) is int for v in back.sums)
    for bad in (pages[:-1], pages[:1], pages + pages[1:2], [pages[1], pages[0], pages[2]]):
        with pytest.raises(ServiceError) as ei:
            paging.summary_from_pages(bad, "m")
        assert ei.value.code == grpc.StatusCode.DATA_LOSS
    head = summary_to_proto(s, release_id="r", study_id="s", lists=False)
    assert not head.starts and not head.sums and head.epsilon == 1.0


def test_arrow_pages_that_end_early_overflow_or_announce_too_much_are_refused(small_pages: None) -> None:
    from he_partition.core.summary import Summary
    from he_partition.core.summary_arrow import SUMMARY_FILES, summary_buffers
    from parties.wire.v1 import common_pb2

    s = Summary(domain_size=20, epsilon=1.0, strategy="gap", noise_parties=2, starts=tuple(range(0, 20, 2)),
                sums=tuple(range(10)), sum_variance=(2.0,) * 10, epsilon_spent=(("partition_sums", 1.0),))
    files = list(zip(SUMMARY_FILES, summary_buffers(s)))
    pages = list(paging.arrow_pages(common_pb2.ReleaseSummary(release_id="r", study_id="s"), files))
    assert all(len(p.data) == paging.PAGE_BYTES for p in pages[1:-1])  # a page may span both files
    release, back = paging.summary_from_arrow_pages(pages, "m")
    assert back == s and back.to_json() == s.to_json() and release.release_id == "r"
    for bad in (pages[:-1], pages[:1] + pages[2:], pages + pages[1:2], pages[1:], [pages[1], pages[0]]):
        with pytest.raises(ServiceError) as ei:
            paging.summary_from_arrow_pages(bad, "m")
        assert ei.value.code == grpc.StatusCode.DATA_LOSS
    cut = [(files[0][0], files[0][1][:-10] + b"x" * 10), files[1]]  # partitions.arrow without its footer's magic
    flipped = list(paging.arrow_pages(common_pb2.ReleaseSummary(release_id="r"), cut))
    with pytest.raises(ServiceError, match="valid summary") as ei:
        paging.summary_from_arrow_pages(flipped, "m")
    huge = analyst_pb2.ReleaseArrowPage()
    huge.CopyFrom(pages[0])
    huge.head.files[0].size = paging.MAX_ARROW_BYTES
    with pytest.raises(ServiceError) as ei:
        paging.summary_from_arrow_pages([huge, *pages[1:]], "m")
    assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED  # refused before a buffer of that size is made


def test_decrypted_values_cut_short_are_data_loss(small_pages: None) -> None:
    values = np.arange(12, dtype=np.int64) - 6
    replies = list(paging.values_replies(values, charge_id=3, epsilon_remaining=0.5))
    assert [len(r.values) for r in replies] == [5, 5, 2] and replies[0].charge_id == 3
    first, got = paging.read_values(replies, "m")
    assert got.tolist() == values.tolist() and first.value_count == 12
    for bad in (replies[:-1], [], replies + replies[-1:]):
        with pytest.raises(ServiceError) as ei:
            paging.read_values(bad, "m")
        assert ei.value.code == grpc.StatusCode.DATA_LOSS


def test_a_header_whose_starts_pages_do_not_add_up_is_invalid_argument(small_pages: None) -> None:
    m = PartitionSums(domain_size=40, epsilon=1.0, sensitivity=1, starts=tuple(range(0, 40, 3)))
    header = decryption_pb2.DecryptMeasurementHeader(study_id="s", release_id="r", chunk_count=1)
    msgs = list(paging.measurement_requests(header, m, [b"chunk"]))
    assert msgs[0].header.starts_count == 14 and not msgs[0].header.measurement.starts
    it = iter(msgs)
    h, back = paging.read_measurement_header(it, "DecryptMeasurement")
    assert back == m and next(it).chunk == b"chunk"
    without_a_page = msgs[:2] + msgs[3:]
    with pytest.raises(InvalidInputError, match="14 partition starts announced"):
        paging.read_measurement_header(iter(without_a_page), "DecryptMeasurement")
    extra = msgs[:1] + [decryption_pb2.DecryptMeasurementRequest(starts=decryption_pb2.Int64Page(values=[1] * 20))]
    with pytest.raises(InvalidInputError, match="more than the announced"):
        paging.read_measurement_header(iter(extra), "DecryptMeasurement")


def test_a_spec_written_a_block_of_starts_at_a_time_is_the_canonical_json_and_keys_the_same_draw(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(convert, "_JSON_BLOCK", 4)  # 11 starts: three blocks
    m = PartitionSums(domain_size=100, epsilon=0.3, sensitivity=2, starts=(0, 3, 7, 11, 19, 20, 31, 42, 57, 60, 99))
    text = convert.measurement_json(m)
    assert text == canonical_json(m.to_dict()) and json.loads(text)["starts"] == list(m.starts)
    # The key holder's draw is keyed by the same label as when the spec was spliced in as text.
    key, digest = b"k" * 32, "ab" * 32
    label = canonical_json({"study_id": "s", "release_id": "r", "release_epsilon": 1.0, "measurement": m.to_dict(),
                            "ciphertext_digest": digest}).encode("utf-8")
    want = KeyedRandom(key, label, stream=NOISE_STREAM).integers(1 << 40, 16)
    holder = SimpleNamespace(_noise_key=key)
    for spec in (text, None):
        got = DecryptionHandler._request_noise(holder, "s", "r", 1.0, m, digest,  # type: ignore[arg-type]
                                               stream=NOISE_STREAM, spec_json=spec).integers(1 << 40, 16)
        assert np.array_equal(got, want)


@pytest.mark.slow
def test_a_release_of_2_21_bins_with_every_message_under_2_mib(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every gRPC message of a 2^21-bin release fits 2 MiB: before paging, its adjacent differences (2M
    decrypted values, ~5 MB) and its summary (~250k partitions, ~4 MB) each needed one message."""
    import parties.common.client as client_mod
    import parties.common.config as config

    two = 2 * 2**20
    options = (("grpc.max_send_message_length", two), ("grpc.max_receive_message_length", two))
    monkeypatch.setattr(config, "GRPC_OPTIONS", options)  # every server's limits (each at most its own)
    monkeypatch.setattr(client_mod, "GRPC_OPTIONS", options)  # every client's
    n = 1 << 21
    c = Cluster.start(tmp_path)
    try:
        c.open_study(domain_size=n, owners=("a",), epsilon=2.0)
        hist = np.random.default_rng(3).poisson(40.0, n).astype(np.int64)
        c.owner("a").submit("s1", hist)
        rel = c.computation().run_release("s1", epsilon=1.0)
        assert rel.state == "DONE" and rel.summary is not None
        assert rel.summary.n_partitions > 200_000 and not paging.summary_is_inline(rel.summary.to_json())
        assert abs(sum(rel.summary.sums) - int(hist.sum())) < 0.01 * int(hist.sum())
        got = c.analyst().get_release(rel.release_id)
        assert got.summary == rel.summary
    finally:
        c.stop(drop_pending_folds=True)


def test_parsed_summaries_kept_for_queries_are_bounded_by_their_size(cluster: Cluster) -> None:
    from parties.analyst.handler import AnalystHandler

    cluster.open_study(domain_size=64, owners=("a",), epsilon=2.0)
    cluster.owner("a").submit("s1", (np.arange(64) * 31) % 11)
    rels = [cluster.computation().run_release("s1", epsilon=0.5).release_id for _ in range(3)]
    store = cluster.cs.handler.store
    sizes = [paging.summary_numbers(AnalystHandler(store).release(r)[1]) for r in rels]
    # Room for the two newest, not for all three (each release partitions anew, so their sizes differ: the
    # bound is set from them, not from one of them).
    bound = sizes[1] + sizes[2]
    handler = AnalystHandler(store, cache_numbers=bound)
    for r in rels:
        handler.release(r)
    kept = list(handler._cache)  # noqa: SLF001 (what the handler keeps in memory)
    assert kept == rels[1:]
    assert sum(paging.summary_numbers(e[1]) for e in handler._cache.values()) <= bound  # noqa: SLF001
