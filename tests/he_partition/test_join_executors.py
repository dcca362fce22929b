"""The join's cell totals on the chunk executors: in-process, local processes and Ray release the same table under
a seed, and a worker that dies mid-release is rebuilt and re-sent the same draws and pads."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from he_partition.core.measurements import Measurement
from he_partition.core.noise import SeededRandom
from he_partition.core.summary import Summary
from he_partition.execution import ChunkExecutor, InProcessExecutor, ProcessExecutor
from he_partition.he.join_scheme import JoinScheme
from he_partition.join.parallel import JoinEvaluator, UploadFiles
from he_partition.join.protocol import JoinTerms
from he_partition.join.release import bin_cells, release_table

from .test_join import SLOTS, _data, _uploads

SHAPE = (4, 4)
#: Hilbert-ordered hier over 16 cells: partitions and Haar-like nodes span the two workers' blocks.
TERMS = JoinTerms(4, 4, SLOTS, 1.0, 0, release="hier", order="hilbert")


@pytest.fixture(scope="module")
def setup() -> tuple[JoinScheme, JoinScheme, Any]:
    ds = JoinScheme.generate()
    pub = JoinScheme.from_public(ds.public_bytes())
    a, b = _data(500, 400, 250, SHAPE, seed=11)
    return ds, pub, _uploads(pub, a, b, SHAPE, SLOTS, seed=4)


def _release(setup: tuple[JoinScheme, JoinScheme, Any], executor: ChunkExecutor | None, seed: int,
             before: Callable[[int], None] = lambda n: None, uploads: Any = None, **kw: Any) -> Summary:
    """A release at epsilon 1 (the noise is not zero): the computation server's draws from `seed`.

    `before(n)` runs before the n-th measurement reaches the evaluator (tests kill a worker there).
    """
    ds, pub, up = setup
    up = uploads or up
    calls = [0]
    with JoinEvaluator(pub.public_bytes(), up[0], up[1], bin_cells(TERMS), SeededRandom(seed),
                       executor=executor, **kw) as ev:

        def measure(m: Measurement) -> list[bytes]:
            before(calls[0])
            calls[0] += 1
            return ev.measure(m)

        return release_table(measure, ds, TERMS, 1.0, SeededRandom(seed + 100))[0]


def _assert_same(got: Summary, want: Summary) -> None:
    assert list(got.starts) == list(want.starts)
    np.testing.assert_array_equal(np.asarray(got.sums), np.asarray(want.sums))


def test_in_process_and_worker_processes_release_the_same_table(setup: Any) -> None:
    reference = _release(setup, InProcessExecutor(), 5)
    other = _release(setup, None, 6)
    assert (list(other.starts), list(other.sums)) != (list(reference.starts), list(reference.sums))  # seed matters
    executor = ProcessExecutor(2)
    try:
        _assert_same(_release(setup, executor, 5), reference)
        assert all(pid is not None for pid in executor.worker_pids())  # the blocks ran in the two workers
    finally:
        executor.close()


def test_a_worker_killed_mid_release_is_rebuilt_and_sent_the_same_values(setup: Any) -> None:
    reference = _release(setup, None, 8)
    executor = ProcessExecutor(2)
    killed: list[int] = []

    def kill(n: int) -> None:
        if n == 0:
            pid = executor.worker_pids()[1]
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    try:
        _assert_same(_release(setup, executor, 8, kill), reference)
        assert killed, "no worker was killed: the test did not exercise the retry"
        assert executor.worker_pids()[1] not in (None, killed[0])  # replaced
    finally:
        executor.close()


def _in_files(up: Any, root: Path) -> tuple[UploadFiles, UploadFiles]:
    """Both uploads written as a store's chunk files (value v of group g: chunk g * values + v)."""
    out = []
    for side, groups in enumerate(up):
        (root / str(side)).mkdir()
        template = str(root / str(side) / "chunk-{index}.bin")
        for g, group in enumerate(groups):
            for v, data in enumerate(group):
                Path(template.format(index=g * len(group) + v)).write_bytes(data)
        out.append(UploadFiles(template, len(groups), len(groups[0])))
    return out[0], out[1]


def test_workers_reading_the_chunk_files_in_passes_release_the_same_table(setup: Any, tmp_path: Path) -> None:
    """The services' path: each worker reads its rows and columns from the files, a group at a time, in passes
    of 3 cells (several per block); a worker killed mid-release is rebuilt from the files. Same values."""
    reference = _release(setup, None, 9)
    files = _in_files(setup[2], tmp_path)
    _assert_same(_release(setup, None, 9, uploads=files, cells_per_pass=3), reference)
    executor = ProcessExecutor(2)
    killed: list[int] = []

    def kill(n: int) -> None:
        if n == 0:
            pid = executor.worker_pids()[0]
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    try:
        _assert_same(_release(setup, executor, 9, kill, uploads=files, cells_per_pass=3), reference)
        assert killed, "no worker was killed: the test did not exercise the rebuild"
    finally:
        executor.close()


def test_ray_releases_the_same_table_and_retries_a_dead_actor(setup: Any) -> None:
    ray = pytest.importorskip("ray")
    from he_partition.execution.ray_cluster import RayExecutor

    reference = _release(setup, None, 9)
    executor = RayExecutor(2)
    killed: list[Any] = []

    def kill(n: int) -> None:
        if n == 0:
            killed.append(executor.actors()[1])
            ray.kill(killed[0], no_restart=True)

    try:
        _assert_same(_release(setup, executor, 9), reference)
        _assert_same(_release(setup, executor, 9, kill), reference)
        assert killed and executor.actors()[1] is not killed[0]
    finally:
        executor.close()


def test_a_refused_call_leaves_the_workers_in_step() -> None:
    """Worker 0 refuses (unknown key) while worker 1's answer is still due: the next call gets fresh answers from
    both, not worker 1's stale one."""
    executor = ProcessExecutor(2)
    try:
        executor.hold("k", lambda w: (dict, ({"x": 10 + w, "y": 20 + w},)))
        with pytest.raises(Exception, match="worker 0 refused __getitem__: KeyError"):
            executor.call("k", "__getitem__", [("missing",), ("x",)])
        assert executor.call("k", "__getitem__", [("y",), ("y",)]) == [20, 21]
    finally:
        executor.close()
