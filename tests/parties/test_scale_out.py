"""The computation server's chunk work on worker processes: a worker killed mid-release is retried with the same values.

The decryption server's own draw is keyed by each request's ciphertext digest (fresh encryption
randomness), so two runs never release the same final values by design. What the CS controls
is its view of every measurement (the aggregate plus its seeded draws): the test decrypts the
exact bytes the CS sent, with the DS's secret key, and compares them with the numpy oracle
replaying the same seed.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from he_partition.core.backend import ChunkedVector, PlainBackend, n_chunks, sum_vectors
from he_partition.core.measurements import Measurement, owner_encoding
from he_partition.core.noise import SeededRandom
from he_partition.execution import ProcessExecutor
from he_partition.protocol import ComputationSide
from parties.common.config import ComputationConfig
from parties.computation.server import create_computation_server
from parties.decryption.server import create_decryption_server

from .conftest import Cluster, blocky_histograms

N = 2 * 8192 + 10  # three chunks: chunk 1 is worker 1's
CS_SEED = 12


class KillsAWorker(ProcessExecutor):
    """The real process executor; after the first chunk of the first measurement it SIGKILLs worker 1."""

    def __init__(self) -> None:
        super().__init__(2)
        self.killed: list[int] = []

    def noised(self, key: str, noise: Mapping[int, np.ndarray]) -> Iterator[tuple[int, bytes]]:
        for n, item in enumerate(super().noised(key, noise)):
            yield item
            if n == 0 and not self.killed:
                pid = self.worker_pids()[1]
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                self.killed.append(pid)


def assert_cs_view_is_the_oracle(secret: Any, sent: list[tuple[Measurement, list[bytes]]], hs: list[np.ndarray],
                                 seed: int) -> None:
    """Every measurement the CS sent decrypts (DS secret key) to the numpy oracle's aggregate + the seeded draws."""
    assert sent, "nothing was sent: the comparison would be empty"
    n = int(hs[0].size)
    plain = PlainBackend()
    oracle = ComputationSide(plain, SeededRandom(seed))
    aggregate = sum_vectors(plain, (plain.encrypt(owner_encoding(h)) for h in hs))
    k = n_chunks(n, secret.slots)
    for m, chunks in sent:
        want = m.decode(plain.decrypt(oracle.measure(aggregate, m)), plain.plain_modulus)
        measured = sorted(m.measured_chunks(secret.slots))
        assert len(chunks) == len(measured)
        by_index = dict(zip(measured, (secret.deserialize_chunk(c) for c in chunks)))
        got = m.decode(secret.decrypt(ChunkedVector(n, tuple(by_index.get(i) for i in range(k)))),
                       secret.plain_modulus)
        np.testing.assert_array_equal(got, want)


def test_a_worker_killed_mid_release_sends_the_same_values_and_is_charged_once(tmp_path: Path) -> None:
    ds = create_decryption_server(Cluster._ds_config(tmp_path, None, 0, 11)).start()
    config = dataclasses.replace(Cluster._cs_config(tmp_path, None, ds.target, 0, CS_SEED), executor="processes",
                                 chunk_workers=2)
    cluster = Cluster(tmp_path, ds, create_computation_server(config).start())
    handler = cluster.cs.handler
    handler.executor.close()
    handler.executor = killer = KillsAWorker()
    sent: list[tuple[Measurement, list[bytes]]] = []
    real = handler.decryption.decrypt_measurement

    def recording(**kw: Any) -> Any:  # the real client call, on the same chunks, which it also keeps
        chunks: list[bytes] = []
        sent.append((kw["measurement"], chunks))

        def keep() -> Iterator[bytes]:
            for c in kw["chunks"]:
                chunks.append(c)
                yield c

        return real(**{**kw, "chunks": keep()})

    handler.decryption.decrypt_measurement = recording
    hs = blocky_histograms(N)
    try:
        cluster.open_study(domain_size=N, epsilon=1.0)
        # the study's key, kept before the release spends the whole budget (then the key holder erases it)
        secret = cluster.ds.handler.backend_for(cluster.ds.handler.get_study("s1"))
        for owner, h in zip(("a", "b", "c"), hs):
            assert cluster.owner(owner).submit("s1", h).committed
        rel = cluster.computation().run_release("s1")
        assert rel.state == "DONE"
        assert killer.killed, "no worker was killed: the test did not exercise the retry"
        assert killer.worker_pids()[1] not in (None, killer.killed[0])  # replaced
        charges = [c.epsilon for c in cluster.ds.handler.ledger.charges("s1")]
    finally:
        killer.close()
        cluster.stop()
    assert [m.kind for m, _ in sent] == ["prefix_differences", "partition_sums"]
    assert charges == [m.epsilon for m, _ in sent] and sum(charges) == 1.0  # each measurement charged once
    # The CS's view of every measurement equals the numpy oracle's under the same seed: the retried chunks
    # carried the very draws the first attempt had.
    assert_cs_view_is_the_oracle(secret, sent, hs, CS_SEED)

def test_the_executor_settings_are_checked_when_the_config_is_built(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="executor must be one of processes, inprocess, ray, got 'dask'"):
        ComputationConfig(tmp_path, "127.0.0.1:1", insecure=True, executor="dask")
    with pytest.raises(InvalidInputError, match="chunk_workers must be >= 0"):
        ComputationConfig(tmp_path, "127.0.0.1:1", insecure=True, chunk_workers=-1)
    with pytest.raises(InvalidInputError, match="cluster '10.0.0.1:6379' is a Ray address; it needs executor 'ray'"):
        ComputationConfig(tmp_path, "127.0.0.1:1", insecure=True, cluster="10.0.0.1:6379")
    assert ComputationConfig(tmp_path, "127.0.0.1:1", insecure=True, executor="ray", cluster="10.0.0.1:6379")


def test_the_workers_start_with_the_server_serve_its_releases_and_stop_with_it(tmp_path: Path) -> None:
    ds = create_decryption_server(Cluster._ds_config(tmp_path, None, 0, 11)).start()
    config = dataclasses.replace(Cluster._cs_config(tmp_path, None, ds.target, 0, CS_SEED), executor="processes",
                                 chunk_workers=2)
    cluster = Cluster(tmp_path, ds, create_computation_server(config).start())
    executor = cluster.cs.handler.executor
    try:
        end = time.monotonic() + 60
        while None in executor.worker_pids() and time.monotonic() < end:  # started before anything is asked
            time.sleep(0.05)
        pids = executor.worker_pids()
        assert None not in pids
        executor.start()  # returns once the server's own start has the workers' imports done
        assert executor.worker_pids() == pids
        folds: list[bool] = []
        real = executor.write_sums

        def recording(*args: Any, **kw: Any) -> bool:
            folds.append(real(*args, **kw))
            return folds[-1]

        executor.write_sums = recording  # type: ignore[method-assign]
        cluster.open_study(domain_size=N, epsilon=1.0)
        for owner, h in zip(("a", "b", "c"), blocky_histograms(N)):
            assert cluster.owner(owner).submit("s1", h).committed
            assert cluster.cs.handler.folds.wait_idle(60)
        assert folds == [True, True, True]  # each commit folded on the workers
        assert cluster.computation().run_release("s1", epsilon=0.5).state == "DONE"
        assert cluster.computation().run_release("s1", epsilon=0.5).state == "DONE"
        assert executor.worker_pids() == pids  # the same processes served the folds and both releases
    finally:
        cluster.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):  # no orphan: stopping the server ended its workers
            os.kill(pid, 0)
