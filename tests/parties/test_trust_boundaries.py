"""Trust boundaries, second pass: no single-noise studies, one server per port and per data directory."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from he_partition.he.bfv import BfvParams, generate_secret_context, public_context_bytes
from he_partition.core.errors import InvalidInputError
from parties.common.config import DecryptionConfig, ComputationConfig
from parties.common.contract import StudyContract
from parties.common.errors import DPAggError, ServiceError
from parties.computation.handler import ComputationHandler
from parties.computation.server import create_computation_server
from parties.data_owner.client import DataOwnerClient
from parties.decryption.server import create_decryption_server

from .conftest import FAST_RETRY, Cluster


def test_a_study_refuses_a_single_noise_party(cluster: Cluster) -> None:
    with pytest.raises(InvalidInputError, match="knows its own draw"):
        StudyContract.create(study_id="s1", domain_size=8, epsilon=1.0, expected_owners=("a",), noise_parties=1,
                             context_fingerprint="0" * 64)
    with pytest.raises(ServiceError) as ei:
        cluster.computation().open_study(study_id="s1", domain_size=8, epsilon=1.0, expected_owners=["a"],
                                         noise_parties=1)
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT and "noise_parties" in ei.value.details


def test_a_second_server_on_a_port_in_use_refuses_to_start(tmp_path: Path) -> None:
    first = create_decryption_server(DecryptionConfig(tmp_path / "ds1", insecure=True)).start()
    try:
        with pytest.raises(InvalidInputError, match="port in use"):
            create_decryption_server(DecryptionConfig(tmp_path / "ds2", port=first.port, insecure=True))
        with pytest.raises(InvalidInputError, match="port in use"):
            create_computation_server(ComputationConfig(tmp_path / "cs", first.target, port=first.port,
                                                        insecure=True))
    finally:
        first.stop()
    # The refused servers released their data directories.
    again = create_decryption_server(DecryptionConfig(tmp_path / "ds2", insecure=True))
    again.stop()


def test_two_servers_on_one_data_directory_refuse(tmp_path: Path) -> None:
    first = create_decryption_server(DecryptionConfig(tmp_path / "ds", insecure=True)).start()
    try:
        with pytest.raises(DPAggError, match="in use by another decryption server"):
            create_decryption_server(DecryptionConfig(tmp_path / "ds", insecure=True))
        cs = create_computation_server(ComputationConfig(tmp_path / "cs", first.target, insecure=True))
        try:
            with pytest.raises(DPAggError, match="in use by another computation server"):
                create_computation_server(ComputationConfig(tmp_path / "cs", first.target, insecure=True))
        finally:
            cs.stop()
    finally:
        first.stop()
    create_decryption_server(DecryptionConfig(tmp_path / "ds", insecure=True)).stop()  # free again after stop


class _Recorder(grpc.ServerInterceptor):
    """Counts every RPC that reaches a server."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def intercept_service(self, continuation, details):  # type: ignore[no-untyped-def]
        self.calls.append(details.method)
        return continuation(details)


def _rogue(tls_config) -> tuple[grpc.Server, str, _Recorder]:  # type: ignore[no-untyped-def]
    from concurrent import futures

    recorder = _Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=(recorder,))
    port = server.add_secure_port("127.0.0.1:0", tls_config.server_credentials())
    server.start()
    return server, f"127.0.0.1:{port}", recorder


def test_a_rogue_server_with_another_roles_certificate_gets_nothing(secure_cluster: Cluster) -> None:
    """Any certificate holder of the same CA posing as a server: the client refuses before sending anything."""
    from parties.data_owner.client import DataOwnerClient
    from parties.decryption.client import DecryptionClient

    from .conftest import FAST_RETRY

    c = secure_cluster
    c.open_study(domain_size=64, owners=("a",))
    server, target, seen = _rogue(c.tls("mallory", "analyst"))  # an analyst poses as the computation server
    try:
        owner = DataOwnerClient("a", computation=target, decryption=c.ds.target, tls=c.tls("a", "data_owner"),
                                signing_key=c.signing_key("a")[0], progress=False, retry=FAST_RETRY)
        with owner, pytest.raises(ServiceError) as ei:
            owner.submit("s1", np.arange(64))
        assert ei.value.code == grpc.StatusCode.UNAVAILABLE and "not the computation server" in ei.value.details
        assert seen.calls == []  # no RPC reached the impostor: nothing was uploaded
    finally:
        server.stop(None)
    # A computation server's certificate cannot pose as the key holder either (owners fetch the key from it).
    server, target, seen = _rogue(c.tls("cs-2", "computation"))
    try:
        with DecryptionClient(target, tls=c.tls("a", "data_owner"), retry=FAST_RETRY) as ds, \
                pytest.raises(ServiceError) as ei:
            ds.public_context()
        assert "not the decryption server" in ei.value.details and seen.calls == []
    finally:
        server.stop(None)
    # The real servers pass the same check.
    assert c.owner("a").submit("s1", np.arange(64)).committed


def test_the_sdk_refuses_plaintext_unless_insecure_is_explicit() -> None:
    from parties.computation.client import ComputationClient
    from parties.data_owner.client import DataOwnerClient

    with pytest.raises(DPAggError, match="insecure=True"):
        ComputationClient("127.0.0.1:1")
    with pytest.raises(DPAggError, match="insecure=True"):
        DataOwnerClient("a", computation="127.0.0.1:1", decryption="127.0.0.1:2")
    ComputationClient("127.0.0.1:1", insecure=True).close()


def test_only_server_roles_get_server_certificates(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    from parties.common.pki import create_ca, issue_party_certificate

    ca = create_ca(tmp_path)
    for party, role in (("ds", "decryption"), ("cs", "computation"), ("an", "analyst"), ("op", "operator"),
                        ("h1", "data_owner")):
        files = issue_party_certificate(ca, tmp_path, party, role)
        cert = x509.load_pem_x509_certificate(files.cert_pem())
        eku = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
        dns = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
        if role in ("decryption", "computation"):
            assert ExtendedKeyUsageOID.SERVER_AUTH in eku and f"{role}.dpagg" in dns
        else:
            assert eku == [ExtendedKeyUsageOID.CLIENT_AUTH] and dns == []


def test_a_person_in_several_organizations_multiplies_every_sensitivity(cluster: Cluster) -> None:
    """max_organizations k: a person at k owners adds k x c records, so every noise scale is k times larger."""
    from he_partition.core.measurements import PartitionSums

    plain = StudyContract.create(study_id="s1", domain_size=8, epsilon=1.0, expected_owners=("a",),
                                 context_fingerprint="0" * 64)
    assert "max_organizations" not in plain.to_dict()  # default 1: existing contract hashes are unchanged
    three = cluster.open_study(domain_size=64, owners=("a", "b"), epsilon=1.0, strategy="hier", max_organizations=3,
                               contribution_bound=2)
    assert three.max_organizations == 3 and three.person_bound == 6 and three.to_dict()["max_organizations"] == 3
    assert three.contract_hash != cluster.open_study(study_id="s2", domain_size=64, owners=("a", "b"), epsilon=1.0,
                                                     strategy="hier", contribution_bound=2).contract_hash
    for o in ("a", "b"):
        cluster.owner(o).submit("s1", np.arange(64) % 2)
    rel = cluster.computation().run_release("s1", epsilon=1.0)
    s = rel.summary
    assert s.params["max_organizations"] == 3 and s.contribution_bound == 6
    # The decryption server refuses a measurement noised for one organization per person.
    from parties.common.errors import ServiceError as SE
    ds = cluster.decryption()
    with pytest.raises(SE) as ei:
        ds.decrypt_measurement(study_id="s1", release_id="r-x", release_epsilon=0.5,
                               measurement=PartitionSums(64, 0.5, 2, (0, 32)), chunks=[], chunk_count=1,
                               contract_hash=three.contract_hash)
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT and "3 organization(s)" in ei.value.details



def test_an_owner_that_reaches_only_the_computation_server_gets_the_key_through_it(
        secure_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compose keeps owners off the decryption server's network: the key comes through the computation server's
    relay, still checked against the contract's fingerprint (a swapped key is refused before anything is sent)."""
    c = secure_cluster
    c.open_study(owners=("a",))
    owner = DataOwnerClient("a", computation=c.cs.target, decryption=None, retry=FAST_RETRY, progress=False,
                            tls=c.tls("a", "data_owner"), signing_key=c.signing_key("a")[0])
    with owner:
        assert owner.submit("s1", np.arange(64)).committed
    other = public_context_bytes(generate_secret_context(BfvParams()))  # a key the relay could substitute
    monkeypatch.setattr(ComputationHandler, "public_context", lambda self, study_id="": other)
    c.open_study(study_id="s2", owners=("a",))
    with DataOwnerClient("a", computation=c.cs.target, retry=FAST_RETRY, progress=False,
                         tls=c.tls("a", "data_owner"), signing_key=c.signing_key("a")[0]) as owner:
        with pytest.raises(InvalidInputError, match="is not the key of study s2"):
            owner.submit("s2", np.arange(64))
    assert c.computation().study_status("s2").submitted_owners == ()
