"""Fixtures: real decryption and computation servers on loopback port 0, with SQLite state in a tmp dir.

`cluster` runs the servers explicitly insecure (plaintext, no role checks, unsigned
studies); `secure_cluster` runs them as deployed: mutual TLS with a private CA, one
certificate per party, and signed studies (every owner's Ed25519 key in the contract).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import grpc
import numpy as np
import pytest

from he_partition.he.bfv import load_context
from he_partition.he.threshold.c1 import c1_bytes, c1_of_vector
from parties.analyst.client import AnalystClient
from parties.common.pki import create_ca, issue_party_certificate
from parties.common.config import ComputationConfig, DecryptionConfig, RetryPolicy
from parties.common.contract import StudyContract
from parties.common.errors import ServiceError
from parties.common.server import ServerHandle
from parties.common.approval import StudyApproval, approve_study
from parties.common.signing import generate_signing_key
from parties.common.tls import TlsConfig
from parties.computation.client import ComputationClient
from parties.computation.server import create_computation_server
from parties.data_owner.client import DataOwnerClient
from parties.decryption.client import DecryptionClient
from parties.decryption.keyshare.uploads import sign_c1_parts
from parties.decryption.server import create_decryption_server

#: Fast retries so tests that hit UNAVAILABLE do not wait seconds.
FAST_RETRY = RetryPolicy(attempts=3, initial_delay=0.01, max_delay=0.05)


#: Party ids of the servers, the operator and the analyst in a secure cluster.
DS_ID, CS_ID, OPERATOR_ID, ANALYST_ID = "ds-1", "cs-1", "op", "analyst-1"
#: The operator's study approval key (private, public) of every test deployment: secure key holders pin its
#: public half, and the clients `Cluster.computation()` makes sign the studies they open with it.
OPERATOR_APPROVAL = generate_signing_key()


def approved(**terms: object) -> StudyApproval:
    """The test operator's approval of open-study `terms`, for a caller that talks to a key holder directly."""
    return approve_study(OPERATOR_APPROVAL[0], **terms)


class Pki:
    """A throwaway private CA and lazily issued party certificates (ECDSA P-256, keys 0600)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = create_ca(directory)
        self._issued: dict[str, str] = {}

    def tls(self, party_id: str, role: str) -> TlsConfig:
        if party_id not in self._issued:
            issue_party_certificate(self.ca, self.dir, party_id, role)
            self._issued[party_id] = role
        assert self._issued[party_id] == role, f"{party_id} was issued as {self._issued[party_id]}"
        return TlsConfig.in_directory(self.dir, party_id)


@dataclass
class Cluster:
    """A decryption server and a computation server (analyst service included) on loopback."""

    root: Path
    ds: ServerHandle
    cs: ServerHandle
    pki: Pki | None = None
    clients: list[object] = field(default_factory=list)
    signing_keys: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)
    #: The computation server's ingest processes (0: it serves its port alone).
    ingest: int = 0

    @property
    def secure(self) -> bool:
        return self.pki is not None

    @classmethod
    def start(cls, root: Path, *, ds_seed: int = 11, cs_seed: int = 12, secure: bool = False,
              ingest: int = 0) -> "Cluster":
        pki = Pki(root / "pki") if secure else None
        ds = create_decryption_server(cls._ds_config(root, pki, 0, ds_seed)).start()
        try:
            cs = create_computation_server(cls._cs_config(root, pki, ds.target, 0, cs_seed, ingest)).start()
        except BaseException:
            ds.stop()
            raise
        return cls(root, ds, cs, pki, ingest=ingest)

    @staticmethod
    def _ds_config(root: Path, pki: Pki | None, port: int, seed: int) -> DecryptionConfig:
        return DecryptionConfig(root / "ds", port=port, noise_seed=seed, insecure=pki is None,
                                tls=pki.tls(DS_ID, "decryption") if pki else None,
                                computation_ids=(CS_ID,) if pki else (),
                                operator_keys=(OPERATOR_APPROVAL[1],) if pki else ())

    @staticmethod
    def _cs_config(root: Path, pki: Pki | None, ds_target: str, port: int, seed: int,
                   ingest: int = 0) -> ComputationConfig:
        return ComputationConfig(root / "cs", ds_target, port=port, noise_seed=seed, insecure=pki is None,
                                 tls=pki.tls(CS_ID, "computation") if pki else None, ingest_processes=ingest)

    def restart_ds(self, seed: int = 21) -> None:
        port = self.ds.port
        self.ds.stop()
        self.ds = create_decryption_server(self._ds_config(self.root, self.pki, port, seed)).start()

    def restart_cs(self, seed: int = 22) -> None:
        port = self.cs.port
        self.cs.stop()
        self.cs = create_computation_server(self._cs_config(self.root, self.pki, self.ds.target, port, seed,
                                                            self.ingest)).start()

    def tls(self, party_id: str, role: str) -> TlsConfig | None:
        """The certificate of `party_id` as `role` (issued on first use); None in an insecure cluster."""
        return self.pki.tls(party_id, role) if self.pki is not None else None

    def signing_key(self, owner_id: str) -> tuple[bytes, bytes]:
        """(private, public) Ed25519 key of a data owner, generated on first use."""
        if owner_id not in self.signing_keys:
            self.signing_keys[owner_id] = generate_signing_key()
        return self.signing_keys[owner_id]

    def _keep(self, c: object) -> object:
        self.clients.append(c)
        return c

    def computation(self, party: str = OPERATOR_ID, role: str = "operator") -> ComputationClient:
        return self._keep(ComputationClient(self.cs.target, retry=FAST_RETRY,  # type: ignore[return-value]
                                            tls=self.tls(party, role), insecure=self.pki is None,
                                            approval_key=OPERATOR_APPROVAL[0]))

    def decryption(self, party: str = OPERATOR_ID, role: str = "operator") -> DecryptionClient:
        return self._keep(DecryptionClient(self.ds.target, retry=FAST_RETRY,  # type: ignore[return-value]
                                           tls=self.tls(party, role), insecure=self.pki is None))

    def analyst(self, party: str = ANALYST_ID, role: str = "analyst") -> AnalystClient:
        return self._keep(AnalystClient(self.cs.target, retry=FAST_RETRY,  # type: ignore[return-value]
                                        tls=self.tls(party, role), insecure=self.pki is None))

    def owner(self, owner_id: str) -> DataOwnerClient:
        return self._keep(DataOwnerClient(owner_id, computation=self.cs.target,  # type: ignore[return-value]
                                          decryption=self.ds.target, retry=FAST_RETRY, progress=False,
                                          tls=self.tls(owner_id, "data_owner"), insecure=self.pki is None,
                                          signing_key=self.signing_key(owner_id)[0]))

    def open_study(self, *, study_id: str = "s1", domain_size: int = 64, epsilon: float = 1.0,
                   owners: Sequence[str] = ("a", "b", "c"), signed: bool | None = None,
                   **kw: object) -> StudyContract:
        """Open a study as the operator; signed (every owner's key in the contract) by default when secure, and
        always by default for a join study (the key holder refuses unsigned ones).

        The strategy defaults to "gap" here (not the product default "auto"): many service tests check
        the gap strategy's exact charges (0.2 eps on gaps, 0.8 eps on sums).
        """
        kw.setdefault("strategy", "gap")
        if signed if signed is not None else (self.secure or kw["strategy"] == "join"):
            kw.setdefault("owner_keys", {o: self.signing_key(o)[1] for o in owners})
        contract, _ = self.computation().open_study(study_id=study_id, domain_size=domain_size, epsilon=epsilon,
                                                    expected_owners=list(owners), **kw)  # type: ignore[arg-type]
        return contract

    def forward_c1(self, contract: StudyContract, uploads: Mapping[str, Sequence[bytes]], *,
                   key: str = "k1") -> int:
        """Play the computation server of a signed study: each owner's upload chunks' c1 parts, signed with the
        owner's key (as its client does), forwarded to the decryption server; returns the chunks it keeps."""
        from .sealed_helpers import close_and_send

        ctx = load_context(self.ds.handler.public_key_for(contract.study_id)[0])
        parts = [sign_c1_parts(self.signing_key(o)[0], study_id=contract.study_id, owner_id=o, idempotency_key=key,
                               contract_hash=contract.contract_hash,
                               parts=[c1_bytes(c1_of_vector(ctx, c)) for c in chunks]) for o, chunks in uploads.items()]
        return close_and_send(self.decryption(CS_ID, "computation"), contract, parts,
                              {o: self.signing_key(o)[0] for o in uploads})

    def snapshot(self) -> tuple[object, ...]:
        """Everything a refused request must leave untouched: studies, ledger rows, uploads, submissions,
        releases, ciphertext files on disk and the oblivious evaluations answered."""
        ledger = self.ds.handler.ledger
        store = self.cs.handler.store
        studies = tuple(sorted(c.study_id for c in ledger.list_studies()))
        charges = tuple(c.charge_id for st in studies for c in ledger.charges(st))
        cs_studies = tuple(st for st in studies if store.get_study(st) is not None)
        owners = sorted({o for st in studies for o in ledger.get_study(st).expected_owners} | {"a", "b", "c"})
        subs = tuple((s.meta.study_id, s.owner_id) for st in studies for s in store.submissions(st))
        uploads = tuple(store.get_upload(st, o) for st in studies for o in owners)
        releases = tuple(r.release_id for r in store.list_releases())
        files = tuple(sorted(str(p) for p in (self.root / "cs").rglob("*.ct")))
        evaluations = tuple(self.ds.handler.evaluations.rows())
        return studies, charges, cs_studies, subs, uploads, releases, files, evaluations

    def stop(self, *, drop_pending_folds: bool = False) -> None:
        """Stop both servers. `drop_pending_folds` (a fixture's teardown): the commit-time folds still waiting out
        their quiet period are dropped, as a stop may leave them (the next start or release sums the owners
        missing), instead of waited for and run (1 s or more of a teardown after an upload)."""
        for c in self.clients:
            c.close()  # type: ignore[attr-defined]
        if drop_pending_folds:
            self.cs.handler.folds.close(5.0)
        self.cs.stop()
        self.ds.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster.start(tmp_path)
    try:
        yield c
    finally:
        c.stop(drop_pending_folds=True)


@pytest.fixture
def secure_cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster.start(tmp_path, secure=True)
    try:
        yield c
    finally:
        c.stop(drop_pending_folds=True)


def blocky_histograms(n: int, owners: int = 3, seed: int = 5) -> list[np.ndarray]:
    """Seeded owner histograms whose sum is piecewise constant-ish (what the gap strategy is built for)."""
    rng = np.random.default_rng(seed)
    levels = np.repeat(rng.integers(5, 60, size=4), -(-n // 4))[:n]
    return [rng.poisson(levels / owners * (1 + 0.5 * i)).astype(np.int64) for i in range(owners)]


@dataclass
class JoinCells:
    """A 2 x 2 join study opened on a cluster, and four released-cell ciphertexts of `values` as a computation server
    sends them (noised, padded, flooded): for tests that talk to the key holder's DecryptJoinCells directly."""

    contract: StudyContract
    decryption: DecryptionClient
    scheme: Any
    cells: list[bytes]
    measurement: Any


def join_cells(cluster: "Cluster", values: Sequence[int], study_id: str = "j1") -> JoinCells:
    import json

    from he_partition.core.measurements import PartitionSums
    from he_partition.he.join_scheme import JoinScheme

    terms = {"shape": [2, 2], "capacity": 8192, "padding_epsilon": 0.5, "padding_offset": 90, "release": "cells"}
    contract = cluster.open_study(study_id=study_id, domain_size=4, epsilon=3.0, owners=("a", "b"), strategy="join",
                                  strategy_params_json=json.dumps(terms))
    ds = cluster.decryption()
    scheme = JoinScheme.from_public(ds.public_context(study_id=study_id))
    pads = np.random.default_rng(1)
    cells = [scheme.serialize(scheme.noised(scheme.encrypt([v]), [0], 1,
                                            lambda k: pads.integers(0, scheme.plain_modulus, k))) for v in values]
    return JoinCells(contract, ds, scheme, cells, PartitionSums(4, 0.5, 1, starts=(0, 1, 2, 3)))


def status_of(excinfo: pytest.ExceptionInfo[ServiceError]) -> grpc.StatusCode:
    return excinfo.value.code
