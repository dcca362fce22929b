"""Mutual TLS: CA and party certificates, real gRPC servers on port 0, identities and role checks."""

from __future__ import annotations

import stat
from concurrent import futures
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from he_partition.core.errors import DPAggError
from parties.common import tls
from parties.common.pki import create_ca, issue_party_certificate
from parties.common.tls import AccessDeniedError, PeerIdentity

SERVICE = "dpagg.test.Probe"
TIMEOUT = 10


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    d = tmp_path_factory.mktemp("pki")
    ca = create_ca(d)
    other_ca = create_ca(d / "other", name="rogue-ca")
    return {
        "dir": d,
        "ca": ca,
        "ds": issue_party_certificate(ca, d, "ds-1", "decryption"),
        "cs": issue_party_certificate(ca, d, "cs-1", "computation"),
        "alice": issue_party_certificate(ca, d, "alice", "data_owner"),
        "eve": issue_party_certificate(ca, d, "eve", "analyst"),
        "rogue_cs": issue_party_certificate(other_ca, d / "other", "cs-1", "computation"),
    }


class _Probe:
    """A tiny servicer: Whoami echoes the verified identity; Decrypt is only for the computation server."""

    def __init__(self) -> None:
        self.decrypt_calls = 0
        self.submit_calls = 0

    def whoami(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        ident = tls.peer_identity(context)
        return b"none" if ident is None else f"{ident.role}/{ident.party_id}".encode()

    def decrypt(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        tls.require_role(context, ["computation"], action="ask for a decryption")
        self.decrypt_calls += 1
        return b"decrypted"

    def submit(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        ident = tls.require_role(context, ["data_owner"], allowed_ids=["alice", "bob"],
                                 action="submit data to study s1")
        self.submit_calls += 1
        return ident.party_id.encode()


def _start(probe: _Probe, creds: grpc.ServerCredentials | None) -> tuple[grpc.Server, int]:
    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Whoami": grpc.unary_unary_rpc_method_handler(probe.whoami),
        "Decrypt": grpc.unary_unary_rpc_method_handler(probe.decrypt),
        "Submit": grpc.unary_unary_rpc_method_handler(probe.submit),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
    port = (server.add_secure_port("127.0.0.1:0", creds) if creds is not None
            else server.add_insecure_port("127.0.0.1:0"))
    assert port > 0
    server.start()
    return server, port


@pytest.fixture()
def secure_server(pki: dict[str, object]) -> Iterator[tuple[_Probe, int]]:
    probe = _Probe()
    server, port = _start(probe, tls.server_credentials(pki["ds"], pki["ca"]))  # type: ignore[arg-type]
    yield probe, port
    server.stop(None)


def _call(port: int, creds: grpc.ChannelCredentials | None, method: str, host: str = "localhost") -> bytes:
    target = f"{host}:{port}"
    channel = grpc.secure_channel(target, creds) if creds is not None else grpc.insecure_channel(target)
    with channel:
        result: bytes = channel.unary_unary(f"/{SERVICE}/{method}")(b"x", timeout=TIMEOUT)
        return result


# -- files ------------------------------------------------------------------------------


def test_key_files_are_0600_and_certificates_carry_the_identity(pki: dict[str, object]) -> None:
    ca: tls.CaFiles = pki["ca"]  # type: ignore[assignment]
    cs: tls.PartyFiles = pki["cs"]  # type: ignore[assignment]
    assert _mode(ca.key_path) == 0o600
    assert _mode(cs.key_path) == 0o600
    assert _mode(cs.cert_path) == 0o644
    assert b"PRIVATE KEY" in cs.key_path.read_bytes()
    assert b"PRIVATE KEY" not in cs.cert_path.read_bytes()
    assert "PRIVATE" not in repr(cs) and cs.key_pem().decode() not in repr(cs)

    cert = x509.load_pem_x509_certificate(cs.cert_pem())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "cs-1"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["dpagg://computation/cs-1"]
    assert san.get_values_for_type(x509.DNSName) == ["computation.dpagg", "localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.issuer == ca.certificate().subject
    assert tls.identity_from_certificate(cert) == PeerIdentity("cs-1", "computation")
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.certificate().extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_reissuing_replaces_a_too_open_key_file_with_a_0600_one(tmp_path: Path) -> None:
    ca = create_ca(tmp_path)
    key = tmp_path / "alice.key"
    key.write_bytes(b"old")
    key.chmod(0o644)
    files = issue_party_certificate(ca, tmp_path, "alice", "data_owner")
    assert files.key_path == key
    assert _mode(key) == 0o600 and key.read_bytes() != b"old"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("party_id, role", [("", "analyst"), ("a/b", "analyst"), ("../x", "analyst"),
                                            ("ok", "admin"), ("x" * 65, "analyst")])
def test_bad_party_id_or_role_is_refused(pki: dict[str, object], tmp_path: Path, party_id: str, role: str) -> None:
    with pytest.raises(DPAggError, match="party id|role"):
        issue_party_certificate(pki["ca"], tmp_path, party_id, role)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_identity_requires_cn_to_match_the_san_uri(pki: dict[str, object]) -> None:
    import datetime as dt

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)

    def cert(cn: str, uris: list[str]) -> x509.Certificate:
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
             .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
             .public_key(key.public_key()).serial_number(1)
             .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1)))
        if uris:
            b = b.add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]),
                                critical=False)
        return b.sign(key, hashes.SHA256())

    assert tls.identity_from_certificate(cert("alice", ["dpagg://data_owner/alice"])) == PeerIdentity(
        "alice", "data_owner")
    assert tls.identity_from_certificate(cert("mallory", ["dpagg://computation/cs-1"])) is None
    assert tls.identity_from_certificate(cert("cs-1", ["dpagg://root/cs-1"])) is None
    assert tls.identity_from_certificate(cert("cs-1", [])) is None
    assert tls.identity_from_certificate(
        cert("cs-1", ["dpagg://computation/cs-1", "dpagg://decryption/cs-1"])) is None


# -- real servers -----------------------------------------------------------------------


def test_server_sees_the_verified_client_identity(pki: dict[str, object], secure_server: tuple[_Probe, int]) -> None:
    _, port = secure_server
    for name, expected in [("cs", b"computation/cs-1"), ("alice", b"data_owner/alice"), ("eve", b"analyst/eve")]:
        creds = tls.channel_credentials(pki[name], pki["ca"])  # type: ignore[arg-type]
        assert _call(port, creds, "Whoami") == expected
    # the certificate also names 127.0.0.1, so dialling the IP verifies too
    creds = tls.channel_credentials(pki["cs"], pki["ca"])  # type: ignore[arg-type]
    assert _call(port, creds, "Whoami", host="127.0.0.1") == b"computation/cs-1"


def test_client_without_certificate_fails_the_handshake(pki: dict[str, object],
                                                         secure_server: tuple[_Probe, int]) -> None:
    probe, port = secure_server
    ca: tls.CaFiles = pki["ca"]  # type: ignore[assignment]
    with pytest.raises(grpc.RpcError) as info:
        _call(port, grpc.ssl_channel_credentials(root_certificates=ca.cert_pem()), "Decrypt")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError) as info:
        _call(port, None, "Decrypt")  # plaintext to a TLS port
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert probe.decrypt_calls == 0


def test_client_certificate_from_another_ca_fails(pki: dict[str, object], secure_server: tuple[_Probe, int]) -> None:
    probe, port = secure_server
    rogue: tls.PartyFiles = pki["rogue_cs"]  # type: ignore[assignment]
    ca: tls.CaFiles = pki["ca"]  # type: ignore[assignment]
    # same party id and role, but minted by another CA; the client trusts the real CA
    creds = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem(), private_key=rogue.key_pem(),
                                         certificate_chain=rogue.cert_pem())
    with pytest.raises(grpc.RpcError) as info:
        _call(port, creds, "Decrypt")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert probe.decrypt_calls == 0


def test_client_refuses_a_server_from_another_ca(pki: dict[str, object]) -> None:
    probe = _Probe()
    server, port = _start(probe, tls.server_credentials(pki["rogue_cs"], pki["ca"]))  # type: ignore[arg-type]
    try:
        with pytest.raises(grpc.RpcError) as info:
            _call(port, tls.channel_credentials(pki["cs"], pki["ca"]), "Whoami")  # type: ignore[arg-type]
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(None)


def test_require_role_allows_the_right_role(pki: dict[str, object], secure_server: tuple[_Probe, int]) -> None:
    probe, port = secure_server
    assert _call(port, tls.channel_credentials(pki["cs"], pki["ca"]), "Decrypt") == b"decrypted"  # type: ignore[arg-type]
    assert _call(port, tls.channel_credentials(pki["alice"], pki["ca"]), "Submit") == b"alice"  # type: ignore[arg-type]
    assert probe.decrypt_calls == 1 and probe.submit_calls == 1


@pytest.mark.parametrize("who, method, needle", [
    ("eve", "Decrypt", "party 'eve' (an analyst) may not ask for a decryption: only computation may. "
                       "An analyst may read released summaries"),
    ("alice", "Decrypt", "party 'alice' (a data_owner) may not ask for a decryption"),
    ("cs", "Submit", "party 'cs-1' (a computation) may not submit data to study s1: only data_owner may"),
])
def test_require_role_denies_the_wrong_role(pki: dict[str, object], secure_server: tuple[_Probe, int],
                                            who: str, method: str, needle: str) -> None:
    probe, port = secure_server
    with pytest.raises(grpc.RpcError) as info:
        _call(port, tls.channel_credentials(pki[who], pki["ca"]), method)  # type: ignore[arg-type]
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert needle in (info.value.details() or "")
    assert probe.decrypt_calls == 0 and probe.submit_calls == 0


def test_require_role_denies_an_owner_not_listed(tmp_path: Path, pki: dict[str, object],
                                                 secure_server: tuple[_Probe, int]) -> None:
    probe, port = secure_server
    carol = issue_party_certificate(pki["ca"], tmp_path, "carol", "data_owner")  # type: ignore[arg-type]
    with pytest.raises(grpc.RpcError) as info:
        _call(port, tls.channel_credentials(carol, pki["ca"]), "Submit")  # type: ignore[arg-type]
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "party 'carol' (a data_owner) may not submit data to study s1: only 'alice', 'bob' may" in (
        info.value.details() or "")
    assert probe.submit_calls == 0


def test_require_role_without_identity_is_unauthenticated() -> None:
    probe = _Probe()
    server, port = _start(probe, None)  # an insecure port: no peer certificate at all
    try:
        assert _call(port, None, "Whoami") == b"none"
        with pytest.raises(grpc.RpcError) as info:
            _call(port, None, "Decrypt")
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "mutual TLS" in (info.value.details() or "")
        assert probe.decrypt_calls == 0
    finally:
        server.stop(None)


def test_authorize_is_transport_neutral() -> None:
    ident = PeerIdentity("cs-1", "computation")
    assert tls.authorize(ident, ["computation"]) is ident
    with pytest.raises(AccessDeniedError) as info:
        tls.authorize(None, ["computation"])
    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(AccessDeniedError) as info:
        tls.authorize(ident, ["decryption"], action="decrypt")
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert isinstance(info.value, DPAggError)
    with pytest.raises(DPAggError, match="role must be one of"):
        tls.authorize(ident, ["root"])
