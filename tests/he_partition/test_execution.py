"""The chunk executors: in-process, local processes and Ray release the same values under a seed; dead workers are retried."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from he_partition.core.backend import ChunkedVector, n_chunks
from he_partition.core.errors import WorkerLostError
from he_partition.core.measurements import Measurement, PartitionSums, PrefixDifferences, owner_encoding
from he_partition.core.noise import SeededRandom
from he_partition.execution import ChunkBytes, ChunkFiles, InProcessExecutor, ProcessExecutor, make_executor
from he_partition.he.bfv import BfvBackend, generate_secret_context, load_context, public_context_bytes
from he_partition.protocol import ComputationSide

N = 3 * 8192 + 100  # four chunks, the last one partial
MEASUREMENTS: list[Measurement] = [PartitionSums(N, 0.5, 1, starts=(0, 5000, 9000, 20000, 24600)),
                                   PrefixDifferences(N, 0.3, 2)]


class Keys:
    def __init__(self, tmp: Path) -> None:
        secret = generate_secret_context()
        self.context = public_context_bytes(secret)
        self.secret = BfvBackend(secret)
        self.public = BfvBackend(load_context(self.context))
        rng = np.random.default_rng(3)
        owners = [self.public.encrypt(owner_encoding(rng.poisson(4, N))) for _ in range(3)]
        self.chunks = tuple(tuple(self.public.serialize_chunk(c) for c in o.chunks) for o in owners)
        templates = []
        for o, chunks in enumerate(self.chunks):
            d = tmp / f"owner{o}"
            d.mkdir()
            for i, data in enumerate(chunks):
                (d / f"{i:07d}.ct").write_bytes(data)
            templates.append(str(d / "{index:07d}.ct"))
        self.files = ChunkFiles(tuple(templates))
        self.n_chunks = n_chunks(N, self.public.slots)

    def decrypt(self, m: Measurement, chunks: dict[int, bytes]) -> np.ndarray:
        vec = ChunkedVector(N, tuple(None if i not in chunks else self.secret.deserialize_chunk(chunks[i])
                                     for i in range(self.n_chunks)))
        return m.decode(self.secret.decrypt(vec), self.secret.plain_modulus)

    def reference(self, seed: int) -> list[np.ndarray]:
        """Today's path: the aggregate in this process, `ComputationSide.measure_chunks`."""
        cs = ComputationSide(self.public, SeededRandom(seed))
        parts = [ChunkedVector(N, tuple(self.public.deserialize_chunk(c) for c in o)) for o in self.chunks]
        aggregate = cs.aggregate(parts)
        out = []
        for m in MEASUREMENTS:
            chunks = {i: self.public.serialize_chunk(c) for i, c in cs.measure_chunks(aggregate, m)}
            out.append(self.decrypt(m, chunks))
        return out


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(tmp_path_factory.mktemp("chunks"))


def _release(keys: Keys, executor: Any, seed: int, source: Any = None) -> list[np.ndarray]:
    cs = ComputationSide(keys.public, SeededRandom(seed))
    executor.load("rel", keys.context, source or keys.files, keys.n_chunks)
    out = []
    for m in MEASUREMENTS:
        got = list(cs.measure_on(executor, "rel", m))
        assert [i for i, _ in got] == sorted(m.measured_chunks(keys.public.slots))  # streamed in index order
        out.append(keys.decrypt(m, dict(got)))
    executor.drop("rel")
    return out


def _assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_in_process_executor_releases_todays_values(keys: Keys) -> None:
    reference = keys.reference(seed=17)
    _assert_same(_release(keys, InProcessExecutor(), 17), reference)
    _assert_same(_release(keys, InProcessExecutor(keys.public), 17, ChunkBytes(keys.chunks)), reference)
    # the noise is real: another seed releases other values
    assert not np.array_equal(_release(keys, InProcessExecutor(), 18)[0], reference[0])


def test_process_executor_releases_the_same_values(keys: Keys) -> None:
    executor = ProcessExecutor(2)
    try:
        _assert_same(_release(keys, executor, 17), keys.reference(seed=17))
        pids = executor.worker_pids()
        _assert_same(_release(keys, executor, 23, ChunkBytes(keys.chunks)), keys.reference(seed=23))
        assert executor.worker_pids() == pids  # workers are kept across releases
    finally:
        executor.close()
    assert executor.worker_pids() == [None, None]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_started_workers_serve_every_release_and_a_close_mid_start_leaves_no_process(keys: Keys) -> None:
    executor = ProcessExecutor(2)
    try:
        executor.start()  # as a server does when it starts: the imports are done before the first release
        pids = executor.worker_pids()
        assert None not in pids
        executor.start()  # idempotent: nothing new
        assert executor.worker_pids() == pids
        _assert_same(_release(keys, executor, 17), keys.reference(seed=17))
        assert executor.worker_pids() == pids  # the same processes did the release
    finally:
        executor.close()
    assert all(_gone(p) for p in pids if p is not None)
    starting = ProcessExecutor(2)
    t = threading.Thread(target=starting.start)
    t.start()
    while None in starting.worker_pids():
        time.sleep(0.01)
    half = starting.worker_pids()
    starting.close()  # does not wait for the imports
    t.join(10)
    assert not t.is_alive()
    assert all(_gone(p) for p in half if p is not None)


@dataclass(frozen=True)
class _KillsItsReader:
    """A chunk source whose every read ends the worker process reading it."""

    def read(self, index: int) -> list[bytes]:
        os._exit(3)


def test_folds_write_the_sums_on_the_workers_and_workers_that_keep_dying_are_lost(keys: Keys, tmp_path: Path) -> None:
    executor = ProcessExecutor(2)
    try:
        assert executor.write_sums(keys.context, keys.files, keys.n_chunks, str(tmp_path / "{index:07d}.ct"))
        want = [sum((keys.public.deserialize_chunk(o[i]) for o in keys.chunks[1:]), keys.public.deserialize_chunk(
            keys.chunks[0][i])) for i in range(keys.n_chunks)]
        got = [keys.public.deserialize_chunk((tmp_path / f"{i:07d}.ct").read_bytes()) for i in range(keys.n_chunks)]
        assert [keys.secret.decrypt(ChunkedVector(8192, (g,))).tolist() for g in got] == \
            [keys.secret.decrypt(ChunkedVector(8192, (w,))).tolist() for w in want]
        with pytest.raises(WorkerLostError):  # UNAVAILABLE at a server: its environment, not the request
            executor.write_sums(keys.context, _KillsItsReader(), keys.n_chunks, str(tmp_path / "x{index}"))
        _assert_same(_release(keys, executor, 17), keys.reference(seed=17))  # still usable afterwards
    finally:
        executor.close()


def test_a_worker_killed_mid_measurement_is_retried_with_the_same_values(keys: Keys) -> None:
    executor = ProcessExecutor(2)
    try:
        cs = ComputationSide(keys.public, SeededRandom(31))
        executor.load("rel", keys.context, keys.files, keys.n_chunks)
        first = dict(cs.measure_on(executor, "rel", MEASUREMENTS[0]))  # draws as a release does, in order
        m = MEASUREMENTS[1]  # every chunk measured: chunks 0, 2 on worker 0, chunks 1, 3 on worker 1
        stream = cs.measure_on(executor, "rel", m)
        got = [next(stream)]
        victim = executor.worker_pids()[1]
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        got += list(stream)
        assert [i for i, _ in got] == [0, 1, 2, 3]
        assert executor.worker_pids()[1] not in (None, victim)  # replaced
        _assert_same([keys.decrypt(MEASUREMENTS[0], first), keys.decrypt(m, dict(got))], keys.reference(seed=31))
    finally:
        executor.close()


def test_an_abandoned_stream_leaves_the_executor_usable(keys: Keys) -> None:
    executor = ProcessExecutor(2)
    try:
        cs = ComputationSide(keys.public, SeededRandom(5))
        executor.load("rel", keys.context, keys.files, keys.n_chunks)
        stream = cs.measure_on(executor, "rel", MEASUREMENTS[1])
        next(stream)
        stream.close()  # e.g. the decryption server refused the stream: replies may be in flight
        cs = ComputationSide(keys.public, SeededRandom(17))
        got = [keys.decrypt(m, dict(cs.measure_on(executor, "rel", m))) for m in MEASUREMENTS]
        _assert_same(got, keys.reference(seed=17))
    finally:
        executor.close()


def test_make_executor_names_the_choices() -> None:
    with pytest.raises(Exception, match="choose one of inprocess, processes, ray"):
        make_executor("dask")


def test_ray_executor_releases_the_same_values_and_retries_a_dead_actor(keys: Keys) -> None:
    ray = pytest.importorskip("ray")
    from he_partition.execution.ray_cluster import RayExecutor

    executor = RayExecutor(2)
    try:
        _assert_same(_release(keys, executor, 17), keys.reference(seed=17))
        cs = ComputationSide(keys.public, SeededRandom(31))
        executor.load("rel", keys.context, keys.files, keys.n_chunks)
        first = dict(cs.measure_on(executor, "rel", MEASUREMENTS[0]))
        # Killed before the measurement's tasks are submitted, so they all fail (an actor killed mid-stream may
        # already have finished its tasks, whose results Ray still serves: no retry would be exercised).
        victim = executor.actors()[1]
        ray.kill(victim, no_restart=True)
        m = MEASUREMENTS[1]
        got = list(cs.measure_on(executor, "rel", m))
        assert executor.actors()[1] is not victim
        _assert_same([keys.decrypt(MEASUREMENTS[0], first), keys.decrypt(m, dict(got))], keys.reference(seed=31))
    finally:
        executor.close()


def test_the_library_and_the_servers_import_without_ray() -> None:
    code = ("import sys; sys.modules['ray'] = None\n"  # `import ray` now fails as if Ray were not installed
            "import he_partition, he_partition.execution, parties.computation.server\n"
            "from he_partition.execution import make_executor\n"
            "make_executor('processes').close()\n"
            "try:\n    make_executor('ray')\nexcept Exception as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'dpagg[ray]'" in out.stdout
