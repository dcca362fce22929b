"""The deployment's private CA and the party certificates it issues (what `dpagg certs` writes).

Every party gets one ECDSA P-256 certificate naming it twice (CN = party id, SAN URI
``dpagg://<role>/<party_id>``); server roles also get the DNS name their clients check. Keys are
written with mode 0600 (`tls.write_private_file`), certificates 0644. The identity model these
certificates carry, and its checks in servicers, are in `tls.py`.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import secrets
from pathlib import Path
from typing import Iterable, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from he_partition.core.errors import InvalidInputError

from .tls import (CA_NAME, SERVER_ROLES, URI_SCHEME, CaFiles, PartyFiles, _check_party_id, _check_role,
                  server_role_name, write_private_file)

__all__ = ["create_ca", "issue_party_certificate"]

_CA_VALID_DAYS = 3650
_PARTY_VALID_DAYS = 825


def _write_public_file(path: Path, data: bytes) -> Path:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    # gRPC reads unencrypted PKCS#8; the file mode (0600) is the protection.
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def create_ca(directory: Path | str, name: str = CA_NAME, *, valid_days: int = _CA_VALID_DAYS) -> CaFiles:
    """Create a private CA (self-signed ECDSA P-256) in `directory`: `<name>.crt` and `<name>.key` (0600).

    Whoever holds the CA key can mint any party's identity: keep it offline, away from
    every server, once the party certificates are issued.
    """
    d = Path(directory)
    if not name or "/" in name or name.startswith("."):
        raise InvalidInputError(f"CA name must be a plain file stem, got {name!r}")
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dpagg"),
        x509.NameAttribute(NameOID.COMMON_NAME, name),
    ])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    files = CaFiles.in_directory(d, name)
    write_private_file(files.key_path, _key_pem(key))
    _write_public_file(files.cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return files


def _hostname_sans(hostnames: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for h in hostnames:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def _issue_leaf(ca: CaFiles, unit: str, common_name: str, sans: list[x509.GeneralName],
                usages: list[x509.ObjectIdentifier], valid_days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A fresh P-256 key and its end-entity certificate (O=dpagg, OU=`unit`, CN=`common_name`) signed by `ca`."""
    ca_cert = ca.certificate()
    ca_key = ca._private_key()
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dpagg"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(min(now + _dt.timedelta(days=valid_days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=True, key_cert_sign=False, crl_sign=False,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def issue_party_certificate(
    ca: CaFiles,
    directory: Path | str,
    party_id: str,
    role: str,
    hostnames: Sequence[str] = ("localhost", "127.0.0.1"),
    *,
    valid_days: int = _PARTY_VALID_DAYS,
) -> PartyFiles:
    """Issue `party_id`'s certificate (`<party_id>.crt`) and key (`<party_id>.key`, 0600) in `directory`.

    The certificate says CN=<party_id>, OU=<role>, SAN URI ``dpagg://<role>/<party_id>``.
    A server role (SERVER_ROLES) also gets the DNS SAN ``<role>.dpagg`` that clients check
    (`server_role_name`), DNS/IP SANs for `hostnames`, and is valid for TLS server and
    client authentication (the computation server is a server to the owners and a client
    of the decryption server). Every other role is a client only: clientAuth, no DNS or
    IP name, so its certificate cannot pose as a server.
    """
    _check_party_id(party_id)
    _check_role(role)
    if isinstance(hostnames, str):
        hostnames = (hostnames,)
    d = Path(directory)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(f"{URI_SCHEME}://{role}/{party_id}")]
    server = role in SERVER_ROLES
    if server:
        sans += [x509.DNSName(server_role_name(role)), *_hostname_sans(hostnames)]
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server \
        else [ExtendedKeyUsageOID.CLIENT_AUTH]
    key, cert = _issue_leaf(ca, role, party_id, sans, usages, valid_days)
    files = PartyFiles.in_directory(d, party_id, role)
    write_private_file(files.key_path, _key_pem(key))
    _write_public_file(files.cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return files
