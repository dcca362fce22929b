"""K = 3 key-share holders through real services (issue 29): mutual TLS, real gRPC servers on port 0, real
TenSEAL ciphertexts under the collective key, real SQLite ledgers (one per holder)."""
from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from he_partition.core.measurements import Measurement
from he_partition.core.noise import KeyedRandom, discrete_laplace
from he_partition.core.noise_shares import discrete_laplace_share, holder_noise_source
from parties.common.config import ComputationConfig, DecryptionConfig
from parties.common.errors import ServiceError
from parties.common.server import ServerHandle
from parties.common.signing import stream_digest
from parties.computation.server import create_computation_server
from parties.decryption.keyshare import measurement_label
from parties.decryption.keyshare_servicer import create_keyshare_server
from parties.decryption.ledger import backup_ledger
from tests.parties.conftest import CS_ID, FAST_RETRY, Cluster, Pki

from parties.computation.client import ComputationClient
from parties.data_owner.client import DataOwnerClient

HOLDERS = ("h1", "h2", "h3")
DOMAIN = 64
OWNERS = ("a", "b", "c")


def _histograms() -> list[np.ndarray]:
    rng = np.random.default_rng(29)
    return [rng.integers(0, 40, size=DOMAIN).astype(np.int64) for _ in OWNERS]


@dataclass
class Threshold:
    """Three key-share holders and a computation server in threshold mode, mutual TLS."""

    root: Path
    pki: Pki
    holders: list[ServerHandle]
    cs: ServerHandle
    cs_seed: int
    clients: list[Any] = field(default_factory=list)
    signing: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)

    @classmethod
    def start(cls, root: Path, cs_seed: int = 12) -> "Threshold":
        pki = Pki(root / "pki")
        holders = [create_keyshare_server(cls._holder_config(root, pki, name, 0), name, HOLDERS).start()
                   for name in HOLDERS]
        specs = tuple(f"{n}={h.target}" for n, h in zip(HOLDERS, holders))
        cs = create_computation_server(ComputationConfig(root / "cs", "", holders=specs, port=0, noise_seed=cs_seed,
                                                         tls=pki.tls(CS_ID, "computation"), executor="inprocess"))
        return cls(root, pki, holders, cs.start(), cs_seed)

    @staticmethod
    def _holder_config(root: Path, pki: Pki, name: str, port: int) -> DecryptionConfig:
        seed = 100 + HOLDERS.index(name)
        return DecryptionConfig(root / name, port=port, noise_seed=seed, tls=pki.tls(name, "decryption"),
                                computation_ids=(CS_ID,))

    def stop_holder(self, i: int) -> None:
        self.holders[i].stop()

    def start_holder(self, i: int) -> None:
        port = self.holders[i].port
        self.holders[i] = create_keyshare_server(self._holder_config(self.root, self.pki, HOLDERS[i], port),
                                                 HOLDERS[i], HOLDERS).start()

    @property
    def combiner(self) -> Any:
        return self.cs.handler.decryption

    def computation(self) -> ComputationClient:
        c = ComputationClient(self.cs.target, retry=FAST_RETRY, tls=self.pki.tls("op", "operator"))
        self.clients.append(c)
        return c

    def owner(self, owner_id: str) -> DataOwnerClient:
        from parties.common.signing import generate_signing_key
        if owner_id not in self.signing:
            self.signing[owner_id] = generate_signing_key()
        c = DataOwnerClient(owner_id, computation=self.cs.target, retry=FAST_RETRY, progress=False,
                            tls=self.pki.tls(owner_id, "data_owner"), signing_key=self.signing[owner_id][0])
        self.clients.append(c)
        return c

    def open_and_submit(self, study_id: str, epsilon: float = 1.0, strategy: str = "hier") -> Any:
        from parties.common.signing import generate_signing_key
        for o in OWNERS:
            self.signing.setdefault(o, generate_signing_key())
        contract, _ = self.computation().open_study(
            study_id=study_id, domain_size=DOMAIN, epsilon=epsilon, expected_owners=list(OWNERS), strategy=strategy,
            owner_keys={o: self.signing[o][1] for o in OWNERS})
        for o, h in zip(OWNERS, _histograms()):
            self.owner(o).submit(study_id, h)
        return contract

    def ledger(self, i: int) -> Any:
        return self.holders[i].handler.require_active().ledger

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        self.cs.stop()
        for h in self.holders:
            h.stop()


@pytest.fixture
def threshold(tmp_path: Path) -> Iterator[Threshold]:
    t = Threshold.start(tmp_path)
    try:
        t.computation().setup_key()
        yield t
    finally:
        t.stop()


def test_setup_gives_one_fingerprint_every_holder_agrees_on_and_a_restart_keeps_it(threshold: Threshold) -> None:
    fp, names, already = threshold.computation().setup_key()
    assert already and names == HOLDERS
    assert [h.handler.active.fingerprint for h in threshold.holders] == [fp] * 3
    threshold.stop_holder(1)
    threshold.start_holder(1)
    assert threshold.holders[1].handler.active.fingerprint == fp
    contract = threshold.open_and_submit("s-fp")
    assert contract.context_fingerprint == fp


def test_a_release_through_three_holders_is_done(threshold: Threshold) -> None:
    threshold.open_and_submit("s1")
    rel = threshold.computation().run_release("s1", epsilon=1.0)
    assert rel.state == "DONE", rel.error_message
    for i in range(3):
        assert sum(c.epsilon for c in threshold.ledger(i).charges("s1")) == pytest.approx(1.0)
