"""The computation server's chunk work on worker processes: same release as in-process, a killed worker retried."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from he_partition.execution import ProcessExecutor
from parties.common.server import ServerHandle
from parties.computation.server import create_computation_server
from parties.decryption.server import create_decryption_server

from .conftest import Cluster, blocky_histograms

N = 2 * 8192 + 10  # three chunks: chunk 1 is worker 1's


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


def _start(root: Path, executor: str) -> Cluster:
    ds = create_decryption_server(Cluster._ds_config(root, None, 0, 11)).start()
    config = dataclasses.replace(Cluster._cs_config(root, None, ds.target, 0, 12), executor=executor, chunk_workers=2)
    cs: ServerHandle = create_computation_server(config).start()
    return Cluster(root, ds, cs)


def _release(cluster: Cluster) -> tuple[object, list[float]]:
    cluster.open_study(domain_size=N, epsilon=1.0)
    for owner, h in zip(("a", "b", "c"), blocky_histograms(N)):
        assert cluster.owner(owner).submit("s1", h).committed
    rel = cluster.computation().run_release("s1")
    assert rel.state == "DONE"
    return rel.summary, [c.epsilon for c in cluster.ds.handler.ledger.charges("s1")]


def test_a_worker_killed_mid_release_gives_the_same_values_and_one_charge(tmp_path: Path) -> None:
    reference = _start(tmp_path / "inprocess", "inprocess")
    try:
        want, want_charges = _release(reference)
    finally:
        reference.stop()
    cluster = _start(tmp_path / "processes", "processes")
    killer = KillsAWorker()
    cluster.cs.handler.executor.close()
    cluster.cs.handler.executor = killer
    try:
        got, charges = _release(cluster)
        assert killer.killed, "no worker was killed: the test did not exercise the retry"
        assert killer.worker_pids()[1] not in (None, killer.killed[0])
    finally:
        killer.close()
        cluster.stop()
    assert got == want
    assert charges == want_charges and sum(charges) == 1.0  # each measurement charged once, none twice
