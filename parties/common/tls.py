"""Mutual TLS between parties: a private CA, one certificate per party, and identity checks in servicers.

Issuing the CA and the party certificates (`dpagg certs`) is in `pki.py`; here are the files a
party loads, the gRPC credentials, and the identity model with its checks in servicers.

Identity model. Every party holds one certificate issued by the deployment's private CA. The
certificate names the party twice: subject CN = party id, and a SAN URI
``dpagg://<role>/<party_id>`` that also carries its role. gRPC (BoringSSL) verifies the
chain against the CA on both ends (``require_client_auth=True``), so inside a servicer
``context.auth_context()`` holds a certificate that the CA vouched for; `peer_identity`
reads it and `require_role` turns a missing or wrong identity into UNAUTHENTICATED or
PERMISSION_DENIED before the method does anything.

Keys are ECDSA P-256. Ed25519 certificates are not usable: with grpcio 1.85 the handshake
fails with NO_COMMON_SIGNATURE_ALGORITHMS (checked on this project's machines). Private
keys are written with mode 0600 through ``os.open`` and are never printed or logged.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, NoReturn

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from he_partition.core.errors import DPAggError, InvalidInputError

__all__ = [
    "ROLES",
    "SERVER_ROLES",
    "server_role_name",
    "ROLE_CAPABILITIES",
    "URI_SCHEME",
    "CaFiles",
    "PartyFiles",
    "PeerIdentity",
    "TlsConfig",
    "AccessDeniedError",
    "server_credentials",
    "channel_credentials",
    "identity_from_certificate",
    "peer_identity",
    "authorize",
    "require_role",
    "require_role_async",
    "write_private_file",
    "CA_NAME",
]

#: File stem of the CA that `dpagg certs` creates (``dpagg-ca.crt`` / ``dpagg-ca.key``).
CA_NAME = "dpagg-ca"

#: The roles a certificate can carry: one per party package, plus "operator" for the
#: person who opens studies and starts releases (a CLI user, not a server).
ROLES: tuple[str, ...] = ("data_owner", "computation", "decryption", "analyst", "operator")
#: Roles that run servers: only their certificates may authenticate a TLS server (serverAuth) and carry
#: the DNS name `server_role_name(role)` that clients of that role's server check.
SERVER_ROLES: tuple[str, ...] = ("computation", "decryption")


def server_role_name(role: str) -> str:
    """The DNS name a client checks in a server's certificate to know it talks to that role's server."""
    return f"{role}.dpagg"

#: What each role may do; quoted in every PERMISSION_DENIED message.
ROLE_CAPABILITIES: dict[str, str] = {
    "data_owner": "submit its own encrypted histogram to studies that list it as an owner",
    "computation": "open studies, aggregate submissions and ask the decryption server to decrypt measurements",
    "decryption": "publish the public context and decrypt measurements requested by the computation server",
    "analyst": "read released summaries and ask range counts against them",
    "operator": "open studies, start releases and read their status",
}

URI_SCHEME = "dpagg"

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
def _check_party_id(party_id: str) -> str:
    if not isinstance(party_id, str) or not _ID_RE.match(party_id):
        raise InvalidInputError(
            f"party id must be 1-64 characters of ASCII letters, digits, '.', '_' or '-' starting with a letter or "
            f"digit, got {party_id!r}"
        )
    return party_id


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise InvalidInputError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def write_private_file(path: Path | str, data: bytes) -> Path:
    """Write secret bytes atomically to `path` with mode 0600 (never world- or group-readable).

    The file is created with ``os.open(..., 0o600)`` under a temporary name with O_EXCL and
    renamed over `path`, so no reader ever sees a partial key or a wider mode, even when
    replacing an existing file.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # umask can only narrow the mode; make it exact anyway
        with os.fdopen(fd, "wb") as fh:
            fd = -1
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return path


@dataclass(frozen=True)
class CaFiles:
    """Where a private CA's certificate and key are stored (the key file is 0600)."""

    cert_path: Path
    key_path: Path

    def cert_pem(self) -> bytes:
        return self.cert_path.read_bytes()

    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem())

    def _private_key(self) -> ec.EllipticCurvePrivateKey:
        key = serialization.load_pem_private_key(self.key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise InvalidInputError(f"{self.key_path} does not hold an ECDSA key made by create_ca")
        return key

    @classmethod
    def in_directory(cls, directory: Path | str, name: str = CA_NAME) -> "CaFiles":
        d = Path(directory)
        return cls(d / f"{name}.crt", d / f"{name}.key")


@dataclass(frozen=True)
class PartyFiles:
    """One party's certificate and key files (the key file is 0600), and the identity they carry."""

    party_id: str
    role: str
    cert_path: Path
    key_path: Path

    def cert_pem(self) -> bytes:
        return self.cert_path.read_bytes()

    def key_pem(self) -> bytes:
        return self.key_path.read_bytes()

    def __repr__(self) -> str:  # never show key material, only where it lives
        return (f"PartyFiles(party_id={self.party_id!r}, role={self.role!r}, cert_path={str(self.cert_path)!r}, "
                f"key_path={str(self.key_path)!r})")

    @classmethod
    def in_directory(cls, directory: Path | str, party_id: str, role: str) -> "PartyFiles":
        """The files `issue_party_certificate` writes for this party in `directory`."""
        d = Path(directory)
        return cls(_check_party_id(party_id), _check_role(role), d / f"{party_id}.crt", d / f"{party_id}.key")


@dataclass(frozen=True)
class PeerIdentity:
    """A peer's identity as its CA-verified certificate states it."""

    party_id: str
    role: str


def _check_key_matches(key_path: Path, cert_path: Path, cert: x509.Certificate) -> None:
    """Raise InvalidInputError unless `key_path` holds the private key of `cert` (read from `cert_path`)."""
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError):
        raise InvalidInputError(f"TLS key {key_path} is not an unencrypted PEM private key; use the .key file "
                                "`dpagg certs` wrote") from None
    raw = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*raw) != cert.public_key().public_bytes(*raw):
        raise InvalidInputError(f"TLS key {key_path} does not belong to the certificate {cert_path}: pass the key "
                                "file issued with that certificate (`dpagg certs` writes ID.crt and ID.key side by "
                                "side)")


@dataclass(frozen=True)
class TlsConfig:
    """One party's mutual-TLS material: the deployment CA's certificate, its own certificate and key.

    Validated at construction: the three files must exist, the key file must not be
    readable by group or others, and the certificate must carry a dpagg identity (SAN URI
    ``dpagg://<role>/<party_id>``); `identity` is that identity. Servers present the
    certificate and require a client certificate from the CA; clients present it and trust
    only the CA. `server_name`, if set, is the name clients check in the server's
    certificate instead of the host they dial (gRPC's ``ssl_target_name_override``).
    The key is read at construction only to check that it is the certificate's key (a
    mismatch is one clear error here, not a failed handshake later), and never printed
    (see `__repr__`).
    """

    ca_cert: Path
    cert: Path
    key: Path
    server_name: str = ""

    def __post_init__(self) -> None:
        for name in ("ca_cert", "cert", "key"):
            object.__setattr__(self, name, Path(getattr(self, name)))
            p: Path = getattr(self, name)
            if not p.is_file():
                raise InvalidInputError(
                    f"TLS {name.replace('_', ' ')} file {p} does not exist; create the CA and party certificates "
                    "with `dpagg certs --out DIR --party ID:ROLE ...`"
                )
        mode = os.stat(self.key).st_mode & 0o777
        if mode & 0o077:
            raise InvalidInputError(
                f"TLS key {self.key} has mode {mode:04o}: other users could read it. Run: chmod 600 {self.key}"
            )
        try:
            cert = x509.load_pem_x509_certificate(self.cert.read_bytes())
            x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        except ValueError as exc:
            raise InvalidInputError(f"{self.cert} or {self.ca_cert} is not a PEM certificate: {exc}") from exc
        _check_key_matches(self.key, self.cert, cert)
        ident = identity_from_certificate(cert)
        if ident is None:
            raise InvalidInputError(
                f"{self.cert} carries no dpagg party identity (SAN URI dpagg://<role>/<id>); issue it with "
                "`dpagg certs`"
            )
        object.__setattr__(self, "_identity", ident)

    def __repr__(self) -> str:  # paths only, never key material
        return (f"TlsConfig(ca_cert={str(self.ca_cert)!r}, cert={str(self.cert)!r}, key={str(self.key)!r}, "
                f"identity={self.identity.role}/{self.identity.party_id})")

    @property
    def identity(self) -> PeerIdentity:
        """The party id and role the certificate states."""
        ident: PeerIdentity = self.__dict__["_identity"]  # set once in __post_init__ (frozen dataclass)
        return ident

    @classmethod
    def in_directory(cls, directory: Path | str, party_id: str, *, ca_name: str = CA_NAME,
                     server_name: str = "") -> "TlsConfig":
        """The files `dpagg certs --out DIR` wrote for `party_id`: DIR/<ca_name>.crt, DIR/<id>.crt, DIR/<id>.key."""
        d = Path(directory)
        _check_party_id(party_id)
        return cls(d / f"{ca_name}.crt", d / f"{party_id}.crt", d / f"{party_id}.key", server_name=server_name)

    def require_role(self, *roles: str) -> "TlsConfig":
        """Return self if the certificate's role is one of `roles`, else raise InvalidInputError."""
        if self.identity.role not in roles:
            raise InvalidInputError(
                f"{self.cert} is {_article(self.identity.role)} {self.identity.role} certificate (party "
                f"{self.identity.party_id!r}); this needs {' or '.join(roles)}"
            )
        return self

    def server_credentials(self) -> grpc.ServerCredentials:
        """Server side: present this certificate, require a client certificate issued by the CA."""
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=self.ca_cert.read_bytes(),
            require_client_auth=True,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client side: trust only the CA, present this certificate."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_cert.read_bytes(),
            private_key=self.key.read_bytes(),
            certificate_chain=self.cert.read_bytes(),
        )

    def channel_options(self) -> list[tuple[str, str]]:
        """Extra channel options (the server-name override, if any)."""
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


class AccessDeniedError(DPAggError):
    """A caller has no verified identity (UNAUTHENTICATED) or may not do this (PERMISSION_DENIED).

    `code` is the gRPC status the services answer with.
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def server_credentials(party: PartyFiles, ca: CaFiles) -> grpc.ServerCredentials:
    """Server side of mutual TLS: present `party`'s certificate, require a client certificate from `ca`.

    A client without a certificate, or with one from another CA, fails the handshake, so
    no RPC of this server ever runs for it.
    """
    return grpc.ssl_server_credentials(
        [(party.key_pem(), party.cert_pem())],
        root_certificates=ca.cert_pem(),
        require_client_auth=True,
    )


def channel_credentials(party: PartyFiles, ca: CaFiles) -> grpc.ChannelCredentials:
    """Client side of mutual TLS: trust only `ca` and present `party`'s certificate.

    Dial the server by a name in its certificate's SANs (default "localhost" or
    "127.0.0.1"), or pass ``("grpc.ssl_target_name_override", name)`` as a channel option.
    """
    return grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem(),
        private_key=party.key_pem(),
        certificate_chain=party.cert_pem(),
    )


def identity_from_certificate(cert: x509.Certificate) -> PeerIdentity | None:
    """The identity a (CA-verified) certificate carries, or None if it is not a dpagg party certificate.

    The SAN URI ``dpagg://<role>/<party_id>`` is authoritative; its party id must equal
    the subject CN, or the certificate is not accepted.
    """
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(f"{URI_SCHEME}://")]
    if len(uris) != 1:
        return None
    rest = uris[0][len(URI_SCHEME) + 3:]
    role, sep, party_id = rest.partition("/")
    if not sep or role not in ROLES or not _ID_RE.match(party_id):
        return None
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(cns) != 1 or cns[0].value != party_id:
        return None
    return PeerIdentity(party_id=party_id, role=role)


def peer_identity(context: Any) -> PeerIdentity | None:
    """The calling party's identity from its TLS client certificate, or None.

    Reads ``context.auth_context()``: gRPC puts the peer certificate there only after
    verifying it against the server's root CA, so this is the verified identity. Returns
    None on an insecure channel or when the certificate carries no dpagg identity.
    Works with both ``grpc.ServicerContext`` and ``grpc.aio.ServicerContext``.
    """
    try:
        auth = context.auth_context() or {}
    except Exception:  # a context without auth data (insecure port) has no identity
        return None
    pems = auth.get("x509_pem_cert") or []
    if len(pems) != 1:
        return None
    try:
        cert = x509.load_pem_x509_certificate(pems[0])
    except ValueError:
        return None
    return identity_from_certificate(cert)


def _article(role: str) -> str:
    return "an" if role[:1] in "aeiou" else "a"


def authorize(
    identity: PeerIdentity | None,
    allowed_roles: Iterable[str],
    allowed_ids: Iterable[str] | None = None,
    *,
    action: str = "call this method",
) -> PeerIdentity:
    """Return `identity` if it may do `action`, else raise AccessDeniedError (UNAUTHENTICATED/PERMISSION_DENIED).

    `allowed_ids` (if given) further restricts to those party ids, e.g. the data owners a
    study lists. Transport-neutral, so non-gRPC code and tests can use it directly.
    """
    roles = tuple(allowed_roles)
    for r in roles:
        _check_role(r)
    if identity is None:
        raise AccessDeniedError(
            grpc.StatusCode.UNAUTHENTICATED,
            f"no verified party identity: to {action} connect with mutual TLS and a party certificate issued by "
            "this deployment's CA (see `issue_party_certificate`)",
        )
    can = ROLE_CAPABILITIES.get(identity.role, "nothing")
    who = f"party {identity.party_id!r} ({_article(identity.role)} {identity.role})"
    if identity.role not in roles:
        raise AccessDeniedError(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{who} may not {action}: only {' or '.join(roles) or 'no role'} may. "
            f"{_article(identity.role).capitalize()} {identity.role} may {can}.",
        )
    if allowed_ids is not None:
        ids = sorted(set(allowed_ids))
        if identity.party_id not in ids:
            raise AccessDeniedError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{who} may not {action}: only {', '.join(repr(i) for i in ids) or 'no party'} may. "
                f"{_article(identity.role).capitalize()} {identity.role} may {can}.",
            )
    return identity


def require_role(
    context: grpc.ServicerContext,
    allowed_roles: Iterable[str],
    allowed_ids: Iterable[str] | None = None,
    *,
    action: str = "call this method",
) -> PeerIdentity:
    """In a sync servicer: the caller's verified identity, or abort the RPC (nothing else runs).

    Aborts with UNAUTHENTICATED when the caller has no verified identity and with
    PERMISSION_DENIED when its role (or id) is not allowed; the message names the party
    and what its role may do. Call it first thing in the method.
    """
    try:
        return authorize(peer_identity(context), allowed_roles, allowed_ids, action=action)
    except AccessDeniedError as exc:
        _abort(context, exc)


def _abort(context: grpc.ServicerContext, exc: AccessDeniedError) -> NoReturn:
    context.abort(exc.code, exc.message)
    raise exc  # abort always raises; this keeps type checkers and odd contexts honest


async def require_role_async(
    context: Any,
    allowed_roles: Iterable[str],
    allowed_ids: Iterable[str] | None = None,
    *,
    action: str = "call this method",
) -> PeerIdentity:
    """`require_role` for ``grpc.aio`` servicers (whose ``context.abort`` is a coroutine)."""
    try:
        return authorize(peer_identity(context), allowed_roles, allowed_ids, action=action)
    except AccessDeniedError as exc:
        await context.abort(exc.code, exc.message)
        raise exc
