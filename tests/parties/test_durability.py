"""Durability of the privacy ledger: SIGKILL the real decryption server process in the middle of a release,
restart it on the same data directory, and check that the ledger is consistent and that no value left the
server without a committed charge."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np

from he_partition.he.bfv import BfvBackend, load_context
from he_partition.he.threshold.c1 import c1_bytes, c1_of_vector
from he_partition.core.measurements import PrefixDifferences, owner_encoding
from parties.common.pki import create_ca, issue_party_certificate
from parties.common.errors import ServiceError
from parties.common.signing import generate_signing_key
from parties.common.tls import TlsConfig
from parties.decryption.client import DecryptionClient
from parties.decryption.keyshare.uploads import sign_c1_parts
from parties.decryption.ledger import SqliteLedgerStore, exact_sum
from parties.decryption.server import LEDGER_FILE

from .sealed_helpers import close_and_send
from .conftest import FAST_RETRY, OPERATOR_APPROVAL, approved

ROOT = Path(__file__).resolve().parents[2]
EPS = 0.02  # per measurement; the release declares 1.0 = 50 measurements


def _start(tmp: Path, pki: Path, port_file: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with (tmp / "ds.log").open("ab") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "parties.cli", "serve-decryption", "--data-dir", str(tmp / "ds"), "--port", "0",
             "--port-file", str(port_file), "--computation-id", "cs-1", "--ca-cert", str(pki / "dpagg-ca.crt"),
             "--cert", str(pki / "ds-1.crt"), "--key", str(pki / "ds-1.key"),
             "--operator-key", OPERATOR_APPROVAL[1].hex()],
            cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=log)
    end = time.monotonic() + 60
    while not port_file.exists():
        assert proc.poll() is None, (tmp / "ds.log").read_text()
        assert time.monotonic() < end, "decryption server did not start"
        time.sleep(0.05)
    return proc, f"127.0.0.1:{int(port_file.read_text())}"


def test_sigkill_mid_release_leaves_a_consistent_ledger_and_no_uncharged_value(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    ca = create_ca(pki)
    for party, role in (("ds-1", "decryption"), ("cs-1", "computation")):
        issue_party_certificate(ca, pki, party, role)
    cs_tls = TlsConfig.in_directory(pki, "cs-1")
    proc, target = _start(tmp_path, pki, tmp_path / "ds.port")
    received: list[tuple[int, float]] = []  # (charge id, epsilon) of every value the client got back
    lock = threading.Lock()
    try:
        with DecryptionClient(target, tls=cs_tls, retry=FAST_RETRY) as ds:
            ds.wait_ready()
            owner_key, owner_public = generate_signing_key()
            terms = dict(study_id="s1", domain_size=64, epsilon=1.0, expected_owners=["a"], strategy="gap",
                         owner_keys={"a": owner_public})
            contract, _ = ds.open_study(**terms, approval=approved(**terms))  # type: ignore[arg-type]
            be = BfvBackend(load_context(ds.public_context(study_id="s1")))
            chunk = be.serialize_chunk(be.encrypt(owner_encoding(np.arange(64))).chunks[0])
            # a signed study: the owner's signed c1 first, as the computation server forwards it
            close_and_send(ds, contract, [sign_c1_parts(
                owner_key, study_id="s1", owner_id="a", idempotency_key="k1", contract_hash=contract.contract_hash,
                parts=[c1_bytes(c1_of_vector(be.context, chunk))])], {"a": owner_key})
            stop = threading.Event()
            # Every request a different measurement (its sensitivity), so each is charged: a key holder answers
            # the very same request again from its first charge.
            sensitivities = itertools.count(2)

            def worker() -> None:
                while not stop.is_set():
                    with lock:
                        sens = next(sensitivities)
                    try:
                        res = ds.decrypt_measurement(study_id="s1", release_id="r1", release_epsilon=1.0,
                                                     measurement=PrefixDifferences(64, EPS, sens), chunks=[chunk],
                                                     chunk_count=1, contract_hash=contract.contract_hash, timeout=10)
                    except ServiceError:
                        return  # the server died under us (or the budget ran out)
                    with lock:
                        received.append((res.charge_id, EPS))

            threads = [threading.Thread(target=worker) for _ in range(3)]
            for t in threads:
                t.start()
            end = time.monotonic() + 30
            while len(received) < 8 and time.monotonic() < end:
                time.sleep(0.001)
            os.kill(proc.pid, signal.SIGKILL)  # mid-release: calls are in flight on three threads
            proc.wait(10)
            stop.set()
            for t in threads:
                t.join(15)
        assert proc.returncode == -signal.SIGKILL
        got = len(received)
        assert 8 <= got < 50, got  # killed in the middle of the release

        # Offline, before restarting: the SQLite file is intact and replays under the budget rules.
        store = SqliteLedgerStore(tmp_path / "ds" / LEDGER_FILE)
        try:
            assert store.check_consistency() == []
            rows = store.charges("s1")
        finally:
            store.close()
        ids = {c.charge_id for c in rows}
        # Every value that left the server was paid for by a committed charge (charges precede results) ...
        assert {cid for cid, _ in received} <= ids
        # ... and at most the calls in flight at the kill (3 threads) were charged without their reply arriving.
        assert len(rows) - got <= 3, (len(rows), got)
        assert all(c.epsilon == EPS and c.release_id == "r1" for c in rows)

        # Restart on the same data directory: same key, same study, same charges, budget still enforced.
        proc, target = _start(tmp_path, pki, tmp_path / "ds.port")
        with DecryptionClient(target, tls=cs_tls, retry=FAST_RETRY) as ds:
            ds.wait_ready()
            assert ds.get_study("s1") == contract
            budget = ds.budget("s1")
            assert {c.charge_id for c in budget.charges} == ids
            assert budget.spent == float(exact_sum(c.epsilon for c in rows))  # nothing beyond the recorded charges (exact decimal sum, as the ledger adds)
            assert budget.reserved == 1.0
            more = 0
            while True:  # the release goes on after the restart, never past its declared 1.0
                try:
                    ds.decrypt_measurement(study_id="s1", release_id="r1", release_epsilon=1.0,
                                           measurement=PrefixDifferences(64, EPS, next(sensitivities)),
                                           chunks=[chunk], chunk_count=1, contract_hash=contract.contract_hash)
                    more += 1
                except ServiceError as err:
                    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
                    break
            assert len(rows) + more == 50  # 50 x 0.02 = 1.0 in total, before and after the crash
            final = ds.budget("s1")
            assert abs(final.spent - 1.0) < 1e-9 and final.remaining < 1e-9
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    store = SqliteLedgerStore(tmp_path / "ds" / LEDGER_FILE)
    try:
        assert store.check_consistency() == []
    finally:
        store.close()
