"""The services' release answer and the running aggregate's generation sync (services, 1M bins).

The release is answered from the Summary the server computed (its stored JSON is not parsed
again), the stored JSON is exactly what `json.dumps` writes, the proto conversion keeps every
value, and a fold's generation is synced before the manifest names it, by syncfs or by one
fsync per file where syncfs is missing.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from he_partition.core.summary import Summary
from parties.common import util
from parties.common.convert import summary_from_proto, summary_to_proto
from parties.computation.store import ReleaseRecord

from .conftest import Cluster


def _summary(variances: list[float], *, params: dict[str, object] | None = None) -> Summary:
    k = len(variances)
    rng = np.random.default_rng(k)
    return Summary(domain_size=4 * k, epsilon=0.5, strategy="gap", noise_parties=2,
                   starts=tuple(range(0, 4 * k, 4)), sums=tuple(int(v) for v in rng.integers(-90, 90, k)),
                   sum_variance=tuple(variances), contribution_bound=2, epsilon_spent=(("prefix_differences", 0.1),),
                   params=params or {"nested": [1, 2.5, "sum_variance"]})


@pytest.mark.parametrize("variances", [
    [2.0 / 3.0, 1e-05, 3.25e20, 7.0] * 600,  # few distinct values, long and short reprs: the formatted-once path
    [float(v) for v in np.random.default_rng(3).random(3000)],  # all distinct: the plain encoder
    [1.5, math.inf, 0.1] * 700,  # a non-finite value is written as json.dumps writes it
    [math.nan] * 1500,
    [0.25, 4.0],  # short lists
])
def test_summary_json_is_exactly_what_json_dumps_writes(variances: list[float]) -> None:
    s = _summary(variances)
    text = s.to_json()
    assert text == json.dumps(s.to_dict(), separators=(",", ":"))
    back = Summary.from_json(text)
    assert back.sums == s.sums and back.starts == s.starts
    assert [repr(v) for v in back.sum_variance] == [repr(v) for v in s.sum_variance]


def test_a_param_naming_sum_variance_is_not_replaced() -> None:
    s = _summary([1.0, 2.0] * 700, params={"note": "sum_variance", "sum_variance": "kept"})
    assert json.loads(s.to_json())["params"] == {"note": "sum_variance", "sum_variance": "kept"}


def test_a_record_answers_with_its_own_summary_and_parses_any_other_text() -> None:
    s = _summary([1.0, 2.0, 3.0])
    text = s.to_json()
    rec = ReleaseRecord("rel-1", "s1", "DONE", 0.5, ("a",), "h", "now", summary_json=text, summary_cache=(text, s))
    assert rec.summary is s
    other = _summary([4.0, 5.0, 6.0])
    changed = replace(rec, summary_json=other.to_json())  # the cache belongs to the old text: never served for this
    assert changed.summary == other
    # the cache is not part of the record's identity (the stored record reads back equal)
    assert rec == replace(rec, summary_cache=None)
    assert replace(rec, summary_cache=None).summary == s


def test_summary_proto_round_trip_keeps_every_value() -> None:
    s = _summary([2.0 / 3.0, 1e-05, 3.25e20] * 400)
    back = summary_from_proto(summary_to_proto(s, release_id="rel-1", study_id="s1"))
    assert back == s
    assert all(type(v) is int for v in back.sums) and all(type(v) is float for v in back.sum_variance)


@pytest.mark.parametrize("syncfs", ["os", "missing", "failing"])
def test_sync_written_files_takes_every_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncfs: str) -> None:
    paths = []
    for i in range(3):
        p = tmp_path / f"{i}.ct"
        p.write_bytes(bytes([i]) * 100)
        paths.append(p)
    synced: list[int] = []
    real_fsync = util.os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(util.os, "fsync", fsync)
    if syncfs == "missing":
        monkeypatch.setattr(util, "_syncfs", None)
    elif syncfs == "failing":
        monkeypatch.setattr(util, "_syncfs", lambda fd: -1)
    elif util._syncfs is None:
        pytest.skip("no syncfs(2) on this platform")
    util.sync_written_files(paths, tmp_path)
    assert len(synced) == (0 if syncfs == "os" else len(paths) + 1)  # every file and the directory


def test_the_key_holder_draws_new_requests_from_stream_2_and_replays_old_ones_on_stream_1(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request answered by an older server (stream 1, its ledger row names no stream) gets the same draw when
    replayed after the upgrade; a new request is drawn from stream 2, recorded in its row, and repeats too."""
    from he_partition.core.measurements import PrefixDifferences, owner_encoding
    from he_partition.he.bfv import BfvBackend, load_context
    from parties.decryption import handler as ds_handler

    contract = cluster.open_study(domain_size=64, owners=("a",), epsilon=3.0)
    ds = cluster.decryption("cs-1", "computation")
    be = BfvBackend(load_context(ds.public_context(study_id=contract.study_id)))
    chunks = [be.serialize_chunk(c) for c in be.encrypt(owner_encoding(np.arange(64) % 5)).chunks]
    m = PrefixDifferences(64, 0.1, 2)

    def ask(release_id: str) -> np.ndarray:
        return ds.decrypt_measurement(study_id="s1", release_id=release_id, release_epsilon=0.5, measurement=m,
                                      chunks=chunks, chunk_count=len(chunks),
                                      contract_hash=contract.contract_hash).values

    def streams() -> list[int]:
        return [json.loads(c.detail).get("noise_stream", 1) for c in cluster.ds.handler.ledger.charges("s1")]

    monkeypatch.setattr(ds_handler, "NOISE_STREAM", 1)  # the server before the upgrade
    old = ask("r1")
    monkeypatch.setattr(ds_handler, "NOISE_STREAM", 2)
    assert np.array_equal(ask("r1"), old)  # the replay keeps stream 1's draw
    new = ask("r2")
    assert np.array_equal(ask("r2"), new)
    assert streams() == [1, 2]  # each replay is answered from its first row, not charged again
    truth = np.diff(np.arange(64) % 5, prepend=0)
    assert not np.array_equal(new, truth) and not np.array_equal(old, truth)  # both carry the key holder's draw


def test_a_precomputed_measurement_spec_gives_the_same_label_and_detail(cluster: Cluster) -> None:
    from he_partition.core.measurements import PartitionSums
    from parties.common.contract import canonical_json
    from parties.decryption.handler import decryption_detail

    contract = cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    h = cluster.ds.handler
    m = PartitionSums(64, 0.25, 1, starts=(0, 3, 40))
    spec = canonical_json(m.to_dict())
    for stream in (1, 2):
        plain = h._request_noise("s1", "r1", 0.5, m, "ab" * 32, stream=stream).integers(1 << 62, 64)
        given = h._request_noise("s1", "r1", 0.5, m, "ab" * 32, stream=stream, spec_json=spec).integers(1 << 62, 64)
        assert np.array_equal(plain, given)
    assert decryption_detail(contract, m, "cd" * 32, spec_json=spec) == decryption_detail(contract, m, "cd" * 32)
