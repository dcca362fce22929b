"""Fixtures: real decryption and computation servers on loopback port 0, with SQLite state in a tmp dir."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import grpc
import numpy as np
import pytest

from parties.analyst.client import AnalystClient
from parties.common.config import ComputationConfig, DecryptionConfig, RetryPolicy
from parties.common.contract import StudyContract
from parties.common.errors import ServiceError
from parties.common.server import ServerHandle
from parties.computation.client import ComputationClient
from parties.computation.server import create_computation_server
from parties.data_owner.client import DataOwnerClient
from parties.decryption.client import DecryptionClient
from parties.decryption.server import create_decryption_server

#: Fast retries so tests that hit UNAVAILABLE do not wait seconds.
FAST_RETRY = RetryPolicy(attempts=3, initial_delay=0.01, max_delay=0.05)


@dataclass
class Cluster:
    """A decryption server and a computation server (analyst service included) on loopback."""

    root: Path
    ds: ServerHandle
    cs: ServerHandle
    clients: list[object] = field(default_factory=list)

    @classmethod
    def start(cls, root: Path, *, ds_seed: int = 11, cs_seed: int = 12) -> "Cluster":
        ds = create_decryption_server(DecryptionConfig(root / "ds", noise_seed=ds_seed)).start()
        cs = create_computation_server(ComputationConfig(root / "cs", ds.target, noise_seed=cs_seed)).start()
        return cls(root, ds, cs)

    def restart_ds(self, seed: int = 21) -> None:
        port = self.ds.port
        self.ds.stop()
        self.ds = create_decryption_server(DecryptionConfig(self.root / "ds", port=port, noise_seed=seed)).start()

    def restart_cs(self, seed: int = 22) -> None:
        port = self.cs.port
        self.cs.stop()
        self.cs = create_computation_server(
            ComputationConfig(self.root / "cs", self.ds.target, port=port, noise_seed=seed)).start()

    def _keep(self, c: object) -> object:
        self.clients.append(c)
        return c

    def computation(self) -> ComputationClient:
        return self._keep(ComputationClient(self.cs.target, retry=FAST_RETRY))  # type: ignore[return-value]

    def decryption(self) -> DecryptionClient:
        return self._keep(DecryptionClient(self.ds.target, retry=FAST_RETRY))  # type: ignore[return-value]

    def analyst(self) -> AnalystClient:
        return self._keep(AnalystClient(self.cs.target, retry=FAST_RETRY))  # type: ignore[return-value]

    def owner(self, owner_id: str) -> DataOwnerClient:
        return self._keep(DataOwnerClient(owner_id, computation=self.cs.target, decryption=self.ds.target,
                                          retry=FAST_RETRY, progress=False))  # type: ignore[return-value]

    def open_study(self, *, study_id: str = "s1", domain_size: int = 64, epsilon: float = 1.0,
                   owners: Sequence[str] = ("a", "b", "c"), **kw: object) -> StudyContract:
        contract, _ = self.computation().open_study(study_id=study_id, domain_size=domain_size, epsilon=epsilon,
                                                    expected_owners=list(owners), **kw)  # type: ignore[arg-type]
        return contract

    def stop(self) -> None:
        for c in self.clients:
            c.close()  # type: ignore[attr-defined]
        self.cs.stop()
        self.ds.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster.start(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def blocky_histograms(n: int, owners: int = 3, seed: int = 5) -> list[np.ndarray]:
    """Seeded owner histograms whose sum is piecewise constant-ish (what the gap strategy is built for)."""
    rng = np.random.default_rng(seed)
    levels = np.repeat(rng.integers(5, 60, size=4), -(-n // 4))[:n]
    return [rng.poisson(levels / owners * (1 + 0.5 * i)).astype(np.int64) for i in range(owners)]


def status_of(excinfo: pytest.ExceptionInfo[ServiceError]) -> grpc.StatusCode:
    return excinfo.value.code
