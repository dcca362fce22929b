"""Say which certificate, CA or name failed when a connection does not come up.

gRPC reports every connection failure as UNAVAILABLE ("failed to connect to all
addresses"), whether nothing listens, the server's certificate is from another CA, it is
issued for another role, the server refused this party's certificate, or one side
speaks plaintext. `diagnose` probes the target once with Python's own TLS stack, using
the same files the client uses, and returns one sentence naming the file or name at
fault (or None when the probe finds nothing wrong, so the original message stands).

The probe sends no RPC and no application data: a TCP connect and a TLS handshake
(ALPN "h2", as gRPC) with this party's certificate, then waits briefly for the server's
verdict on that certificate (TLS 1.3 servers send it after the handshake).
"""

from __future__ import annotations

import datetime as _dt
import socket
import ssl

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from .tls import TlsConfig

__all__ = ["diagnose", "PROBE_TIMEOUT"]

#: Seconds the probe waits for a connect, a handshake, or the server's verdict on our certificate.
PROBE_TIMEOUT = 3.0


def _split(target: str) -> tuple[str, int] | None:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def _connect(addr: tuple[str, int]) -> socket.socket | str:
    try:
        return socket.create_connection(addr, timeout=PROBE_TIMEOUT)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return (f"nothing accepts connections at {addr[0]}:{addr[1]} ({reason}): is the server running, and is "
                "the address (host and port) right?")


def _names(der: bytes | None) -> list[str]:
    if not der:
        return []
    try:
        cert = x509.load_der_x509_certificate(der)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return []
    return [*san.get_values_for_type(x509.DNSName), *san.get_values_for_type(x509.UniformResourceIdentifier)]


def _own_certificate_problem(tls: TlsConfig) -> str | None:
    """Problems visible without the server: our certificate not from our CA, or outside its validity."""
    cert = x509.load_pem_x509_certificate(tls.cert.read_bytes())
    ca = x509.load_pem_x509_certificate(tls.ca_cert.read_bytes())
    now = _dt.datetime.now(_dt.timezone.utc)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        return (f"this party's certificate {tls.cert} is valid only from {cert.not_valid_before_utc:%Y-%m-%d} to "
                f"{cert.not_valid_after_utc:%Y-%m-%d}; issue a new one with `dpagg certs`")
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return (f"this party's certificate {tls.cert} was not issued by the CA in {tls.ca_cert}: use the "
                "certificate and CA file of the same deployment (`dpagg certs --out DIR` writes both)")
    return None


def _tls_probe(addr: tuple[str, int], tls: TlsConfig, name: str, role: str) -> str | None:
    own = _own_certificate_problem(tls)
    if own:
        return own
    try:
        ctx = ssl.create_default_context(cafile=str(tls.ca_cert))
        ctx.load_cert_chain(str(tls.cert), str(tls.key))
    except (ssl.SSLError, OSError) as exc:  # files changed since TlsConfig checked them
        return (f"this party's TLS files cannot be used together ({getattr(exc, 'reason', None) or exc}): check "
                f"that {tls.key} is the key of {tls.cert} and {tls.ca_cert} is the deployment's CA certificate")
    ctx.set_alpn_protocols(["h2"])
    sock = _connect(addr)
    if isinstance(sock, str):
        return sock
    where = f"{addr[0]}:{addr[1]}"
    try:
        with ctx.wrap_socket(sock, server_hostname=name) as s:
            s.settimeout(PROBE_TIMEOUT)
            try:
                # A TLS 1.3 server judges our certificate after the handshake: an alert, or a bare close
                # (a gRPC server never closes a fresh connection before the client speaks otherwise).
                refused = s.recv(1) == b""
                reason = "it closed the connection after the handshake"
            except ssl.SSLError as exc:
                refused, reason = True, str(exc.reason)
            except (TimeoutError, OSError):
                refused = False
            if refused and "EXPIRED" in reason.upper():
                return (f"the server at {where} refused this party's certificate {tls.cert} as expired ({reason}): "
                        "one of the two clocks is wrong, or the certificate ran out; check both machines' time, or "
                        "issue a new certificate with `dpagg certs`")
            if refused:
                return (f"the server at {where} refused this party's certificate {tls.cert} ({reason}): the "
                        f"server trusts another CA than the one that issued it; use the deployment's "
                        "certificates")
    except ssl.SSLCertVerificationError as exc:
        message = str(exc.verify_message).lower()
        if exc.verify_code in (9, 10):  # X509_V_ERR_CERT_NOT_YET_VALID, X509_V_ERR_CERT_HAS_EXPIRED
            now = _dt.datetime.now(_dt.timezone.utc)
            return (f"the server's certificate at {where} {exc.verify_message} (this machine's clock says "
                    f"{now:%Y-%m-%d %H:%M} UTC): one of the two clocks is wrong, or the server needs a new "
                    "certificate (`dpagg certs`)")
        if exc.verify_code in (26, 62) or "hostname" in message or "purpose" in message:
            names = ", ".join(_names(_peer_certificate(addr))) or "nothing"
            what = f"{where} is not the {role} server" if role else f"{where} is not the server you meant"
            if "purpose" in message:
                return (f"the server at {where} presented a certificate not issued for a server (it names {names}): "
                        f"{what}; check the address")
            return (f"the server's certificate does not carry the name {name}: {what} (its certificate names "
                    f"{names}); check the address, or --tls-server-name")
        return (f"the server's certificate at {where} was not issued by the CA in {tls.ca_cert} "
                f"({exc.verify_message}): is --ca-cert (DPAGG_CA_CERT) this deployment's CA?")
    except ssl.SSLError as exc:
        if "WRONG_VERSION_NUMBER" in str(exc).upper() or "RECORD_LAYER" in str(exc).upper():
            return (f"the server at {where} does not speak TLS (it was started with --insecure); connect with "
                    "--insecure, or restart it with its certificate")
        return (f"the TLS handshake with {where} failed ({exc.reason}); the server refused this party's "
                f"certificate {tls.cert}, or trusts another CA than {tls.ca_cert}")
    except (TimeoutError, OSError) as exc:
        return f"the TLS handshake with {where} did not complete ({exc}); is it a dpagg server?"
    return None


def _peer_certificate(addr: tuple[str, int]) -> bytes | None:
    """The server's certificate, unverified (only to name what it is issued for)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    sock = _connect(addr)
    if isinstance(sock, str):
        return None
    try:
        with ctx.wrap_socket(sock) as s:
            return s.getpeercert(binary_form=True)
    except (ssl.SSLError, OSError):
        return None


def _plaintext_probe(addr: tuple[str, int]) -> str | None:
    """An --insecure client: does the server speak TLS?"""
    sock = _connect(addr)
    if isinstance(sock, str):
        return sock
    sock.close()
    if _peer_certificate(addr) is not None:
        return (f"the server at {addr[0]}:{addr[1]} requires mutual TLS and this client connected without it "
                "(--insecure); pass this party's --ca-cert, --cert and --key (or DPAGG_CA_CERT, DPAGG_CERT, "
                "DPAGG_KEY)")
    return None


def diagnose(target: str, tls: TlsConfig | None, *, server_name: str = "", role: str = "") -> str | None:
    """One sentence on why a connection to `target` fails, naming the file or name at fault; None if the probe
    finds no fault (the server may be overloaded, or the failure intermittent).

    `tls`: the client's files (None for an --insecure client); `server_name`: the name the
    client checks in the server's certificate; `role`: the server role it expects.
    """
    addr = _split(target)
    if addr is None:
        return f"{target!r} is not host:port"
    if tls is None:
        return _plaintext_probe(addr)
    return _tls_probe(addr, tls, server_name or tls.server_name or addr[0], role)

