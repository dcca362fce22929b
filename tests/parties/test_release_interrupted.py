"""A release that breaks on the computation server's side says what broke, not gRPC's "Exception iterating requests!"."""

from __future__ import annotations

from typing import Iterator

import pytest

from he_partition.core.measurements import PartitionSums

from .conftest import Cluster


def test_a_chunk_stream_that_breaks_here_raises_its_own_cause(cluster: Cluster) -> None:
    """The chunks come from this server's workers and files; when they fail mid-stream the caller sees that failure."""
    cluster.open_study(domain_size=64, owners=("a",))
    ds = cluster.decryption()
    contract_hash = ds.get_study("s1").contract_hash

    def chunks() -> Iterator[bytes]:
        raise OSError("the chunk file vanished")
        yield b""  # a generator

    with pytest.raises(OSError, match="the chunk file vanished"):
        ds.decrypt_measurement(study_id="s1", release_id="r1", release_epsilon=0.1,
                               measurement=PartitionSums(64, 0.1, 1, starts=(0,)), chunks=chunks(), chunk_count=1,
                               contract_hash=contract_hash)


def test_the_shutdown_marks_itself_before_it_closes_anything(cluster: Cluster) -> None:
    """Stopping sets `stopping` before the workers and the key holder's channel close, so a release failing as they
    close is recorded as the shutdown's doing (ABORTED, "interrupted by the computation server's shutdown")."""
    handle = cluster.cs
    assert not handle.handler.stopping.is_set()
    assert handle.closers[-1] == handle.handler.stopping.set  # closers run last to first
    handle.stop()
    assert handle.handler.stopping.is_set()
