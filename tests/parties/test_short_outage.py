"""A short outage of the key holder: a measurement is retried, bounded and logged, with the
very same ciphertext bytes (no noise redrawn); the CLI keeps its request key while the release may still run."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from he_partition.core.measurements import PrefixDifferences, owner_encoding
from he_partition.he.bfv import BfvBackend, load_context
from parties.cli import main
from parties.common.errors import ServiceError
from parties.common.signing import stream_digest
from parties.decryption.server import create_decryption_server

from .conftest import Cluster


def test_a_measurement_rides_out_a_short_restart_of_the_key_holder_resending_the_same_bytes(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    contract = cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    ds = cluster.decryption("cs-1", "computation")
    ds.outage_seconds = 20.0  # as the computation server's client (parties.computation.server)
    be = BfvBackend(load_context(ds.public_context(study_id=contract.study_id)))
    chunks = [be.serialize_chunk(c) for c in be.encrypt(owner_encoding(np.arange(64))).chunks]
    pulled: list[int] = []

    def source():  # type: ignore[no-untyped-def]
        for i, c in enumerate(chunks):  # generated once: a retry must not ask for (or redraw) them again
            pulled.append(i)
            yield c

    port = cluster.ds.port
    cluster.ds.stop()  # the key holder is down when the measurement is sent, and back 1.5 s later

    def restart() -> None:
        cluster.ds = create_decryption_server(cluster._ds_config(cluster.root, cluster.pki, port, 41)).start()

    threading.Timer(1.5, restart).start()
    caplog.set_level(logging.WARNING, logger="dpagg.decryption.client")
    started = time.monotonic()
    res = ds.decrypt_measurement(study_id="s1", release_id="r1", release_epsilon=0.5,
                                 measurement=PrefixDifferences(64, 0.5, 2), chunks=source(), chunk_count=len(chunks),
                                 contract_hash=contract.contract_hash)
    assert time.monotonic() - started >= 1.0  # it waited for the restart
    assert res.values.shape == (64,) and pulled == list(range(len(chunks)))
    assert "retrying prefix_differences" in caplog.text  # logged
    charges = cluster.ds.handler.ledger.charges("s1")
    assert len(charges) == 1  # one decryption, one charge
    assert json.loads(charges[0].detail)["ciphertext_digest"] == stream_digest(chunks).hex()  # the same bytes


def test_an_outage_longer_than_the_bound_fails_the_call(cluster: Cluster) -> None:
    contract = cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    ds = cluster.decryption("cs-1", "computation")
    ds.outage_seconds = 1.0
    cluster.ds.stop()
    started = time.monotonic()
    with pytest.raises(ServiceError) as ei:
        ds.decrypt_measurement(study_id="s1", release_id="r1", release_epsilon=0.5,
                               measurement=PrefixDifferences(64, 0.5, 2), chunks=[b"x"], chunk_count=1,
                               contract_hash=contract.contract_hash)
    assert ei.value.code == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - started < 10  # bounded


def test_the_cli_keeps_its_request_key_while_the_release_may_still_run(cluster: Cluster, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0)
    cluster.owner("a").submit("s1", np.arange(64))
    from parties.computation import client as cs_client

    # The release runs on the real servers; only the CLI's polling sees the computation server unreachable
    # (a restart of the server while the CLI waits cannot be timed reliably against a 64-bin release).
    def unreachable(self, release_id, **kw):  # type: ignore[no-untyped-def]
        raise ServiceError(grpc.StatusCode.UNAVAILABLE, "computation server restarting")

    state = tmp_path / "state"
    args = ["release", "run", "s1", "--epsilon", "0.4", "--computation", cluster.cs.target, "--insecure",
            "--state-dir", str(state)]
    monkeypatch.setattr(cs_client.ComputationClient, "wait_release", unreachable)
    monkeypatch.setattr(cs_client.ComputationClient, "release_status", unreachable)
    assert main(args) != 0
    pending = list((state / "pending-releases").glob("*.json"))
    assert len(pending) == 1  # kept: a re-run attaches to the same release
    key = json.loads(pending[0].read_text())["request_key"]
    monkeypatch.undo()
    assert main(args) == 0  # the re-run attaches (same request key): one release, charged once
    releases = cluster.analyst().list_releases("s1")
    assert len(releases) == 1
    assert cluster.ds.handler.ledger.spent("s1") == pytest.approx(0.4)
    assert not list((state / "pending-releases").glob("*.json")) and key
