"""TLS mistakes name the certificate, CA or name that failed (not "is the server running?"), against real servers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from parties.common.pki import create_ca, issue_party_certificate
from parties.common.errors import ServiceError
from parties.common.tls import TlsConfig
from parties.computation.client import ComputationClient
from parties.decryption.client import DecryptionClient

from .conftest import FAST_RETRY, Cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _other_deployment(root: Path, party: str = "op", role: str = "operator") -> TlsConfig:
    """A consistent set of files (CA, certificate, key) from a different deployment's CA."""
    ca = create_ca(root)
    issue_party_certificate(ca, root, party, role)
    return TlsConfig.in_directory(root, party)


def _failure(client: DecryptionClient | ComputationClient) -> ServiceError:
    """The error of one call that must fail to connect."""
    with client, pytest.raises(ServiceError) as err:
        if isinstance(client, DecryptionClient):
            client.public_context()
        else:
            client.study_status("nope")
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    return err.value


def test_nothing_listening_says_so(secure_cluster: Cluster) -> None:
    port = _free_port()
    client = ComputationClient(f"127.0.0.1:{port}", retry=FAST_RETRY, tls=secure_cluster.tls("op", "operator"))
    err = _failure(client)
    assert f"nothing accepts connections at 127.0.0.1:{port}" in err.details


def test_server_from_another_ca_names_the_ca_file(secure_cluster: Cluster, tmp_path: Path) -> None:
    mine = _other_deployment(tmp_path / "other")
    err = _failure(ComputationClient(secure_cluster.cs.target, retry=FAST_RETRY, tls=mine))
    assert "was not issued by the CA in" in err.details and str(mine.ca_cert) in err.details


def test_own_certificate_from_another_ca_names_both_files(secure_cluster: Cluster, tmp_path: Path) -> None:
    mine = _other_deployment(tmp_path / "other")
    right_ca = secure_cluster.tls("op", "operator").ca_cert  # type: ignore[union-attr]
    mixed = TlsConfig(right_ca, mine.cert, mine.key)
    err = _failure(ComputationClient(secure_cluster.cs.target, retry=FAST_RETRY, tls=mixed))
    assert f"certificate {mine.cert} was not issued by the CA in {right_ca}" in err.details


def test_server_refusing_our_certificate_is_named(secure_cluster: Cluster, tmp_path: Path) -> None:
    """We trust the server (its CA is in our bundle) but the server does not trust our certificate."""
    mine = _other_deployment(tmp_path / "other")
    right_ca = secure_cluster.tls("op", "operator").ca_cert  # type: ignore[union-attr]
    bundle = tmp_path / "bundle.crt"
    bundle.write_bytes(mine.ca_cert.read_bytes() + right_ca.read_bytes())
    err = _failure(ComputationClient(secure_cluster.cs.target, retry=FAST_RETRY,
                                     tls=TlsConfig(bundle, mine.cert, mine.key)))
    assert f"refused this party's certificate {mine.cert}" in err.details


def test_wrong_server_role_names_the_expected_name(secure_cluster: Cluster) -> None:
    """A decryption client dialling the computation server: its certificate lacks decryption.dpagg."""
    err = _failure(DecryptionClient(secure_cluster.cs.target, retry=FAST_RETRY,
                                    tls=secure_cluster.tls("op", "operator")))
    assert "does not carry the name decryption.dpagg" in err.details
    assert "is not the decryption server" in err.details and "computation.dpagg" in err.details


def test_plaintext_client_to_tls_server_and_back(secure_cluster: Cluster, tmp_path: Path) -> None:
    err = _failure(ComputationClient(secure_cluster.cs.target, retry=FAST_RETRY, insecure=True))
    assert "requires mutual TLS" in err.details and "--ca-cert" in err.details
    plain = Cluster.start(tmp_path / "plain")
    try:
        err = _failure(ComputationClient(plain.cs.target, retry=FAST_RETRY, tls=secure_cluster.tls("op", "operator")))
    finally:
        plain.stop()
    assert "does not speak TLS" in err.details


def test_cli_prints_one_line_and_no_grpc_core_logs(secure_cluster: Cluster, tmp_path: Path) -> None:
    mine = _other_deployment(tmp_path / "other")
    proc = subprocess.run(
        [sys.executable, "-m", "parties.cli", "budget", "s1", "--decryption", secure_cluster.ds.target,
         "--ca-cert", str(mine.ca_cert), "--cert", str(mine.cert), "--key", str(mine.key)],
        capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"},
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dpagg: UNAVAILABLE: cannot reach") and str(mine.ca_cert) in lines[0]
