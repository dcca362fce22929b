"""`release(..., executor=...)`: the library's BFV release with the owners' encryption and the chunk work on an executor.

Every executor must release exactly the summary of the plain in-process path under the same seed
(the benchmark `python -m benchmarks.perf` checks the same at 1M bins).
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from he_partition.core.backend import ChunkedVector, n_chunks
from he_partition.core.errors import InvalidInputError
from he_partition.core.measurements import owner_encoding
from he_partition.execution import InProcessExecutor, ProcessExecutor, SimulatedOwners
from he_partition.execution.base import share_of
from he_partition.he.keyholder import generate_backends
from he_partition.he.bfv import public_context_bytes
from he_partition.protocol import release

N = 3 * 8192 + 100  # four chunks, the last one partial


@pytest.fixture(scope="module")
def hists() -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    return [rng.poisson(np.where((np.arange(N) // 700) % 3 == 0, 9.0, 0.5)) for _ in range(3)]


def test_every_executor_releases_the_serial_summary_under_a_seed(hists: list[np.ndarray]) -> None:
    reference = release(hists, 1.0, backend="bfv", rng=41)
    assert release(hists, 1.0, backend="bfv", rng=41, executor=InProcessExecutor()) == reference
    executor = ProcessExecutor(2)
    try:
        assert release(hists, 1.0, backend="bfv", rng=41, executor=executor) == reference
        pids = executor.worker_pids()
        other = release(hists, 1.0, backend="bfv", rng=42, executor=executor)
        assert executor.worker_pids() == pids  # the workers serve every release
    finally:
        executor.close()
    assert other == release(hists, 1.0, backend="bfv", rng=42)
    assert other.sums != reference.sums  # the noise is real: another seed releases other values
    assert len(reference.epsilon_spent) >= 2


def test_a_worker_killed_between_releases_is_replaced_and_releases_the_same_summary(hists: list[np.ndarray]) -> None:
    executor = ProcessExecutor(2)
    try:
        executor.start()
        victim = executor.worker_pids()[0]
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        got = release(hists, 0.5, backend="bfv", rng=7, executor=executor)
        assert executor.worker_pids()[0] not in (None, victim)
    finally:
        executor.close()
    assert got == release(hists, 0.5, backend="bfv", rng=7)


def test_simulated_owners_encrypt_each_owners_encoded_chunk_and_ship_only_a_workers_rows(
        hists: list[np.ndarray]) -> None:
    secret, public = generate_backends()
    encoded = [owner_encoding(h) for h in hists]
    owners = SimulatedOwners.of(public_context_bytes(secret.context), encoded, public.slots)
    k = n_chunks(N, public.slots)
    assert owners.indices == tuple(range(k))
    mine = share_of(owners, [1, 3])
    assert isinstance(mine, SimulatedOwners) and mine.indices == (1, 3)
    assert all(e.shape == (2, public.slots) for e in mine.encoded)  # the other rows never cross the pipe
    for o, data in enumerate(mine.read(3)):  # the last chunk: zero-padded like the owner's upload
        got = secret.decrypt(ChunkedVector(public.slots, (secret.deserialize_chunk(data),)))
        want = np.zeros(public.slots, dtype=np.int64)
        want[: N - 3 * public.slots] = encoded[o][3 * public.slots:]
        np.testing.assert_array_equal(got, want)
    with pytest.raises(KeyError):
        mine.ciphertexts(0, public)


def test_an_executor_needs_the_bfv_backend(hists: list[np.ndarray]) -> None:
    with pytest.raises(InvalidInputError, match="backend 'plain'"):
        release(hists, 1.0, backend="plain", rng=1, executor=InProcessExecutor())


def test_a_ray_cluster_releases_the_serial_summary_under_a_seed(hists: list[np.ndarray]) -> None:
    pytest.importorskip("ray")
    from he_partition.execution.ray_cluster import RayExecutor

    executor = RayExecutor(2)
    try:
        got = release(hists, 1.0, backend="bfv", rng=41, executor=executor)  # each actor gets only its own rows
    finally:
        executor.close()
    assert got == release(hists, 1.0, backend="bfv", rng=41)
