"""TLS for the computation server's Ray cluster: node certificates from the deployment's CA, and Ray's TLS environment.

Ray (2.x) encrypts and authenticates its gRPC channels (GCS, raylets, workers, drivers) when
every process starts with ``RAY_USE_TLS=1``, ``RAY_TLS_SERVER_CERT``, ``RAY_TLS_SERVER_KEY``
and ``RAY_TLS_CA_CERT`` in its environment; each end presents its certificate and requires
the other's to chain to the CA. A Ray node is not a dpagg party: its certificate carries the
SAN URI ``dpagg://ray-node/<node_id>`` and no party role, so it cannot authenticate to the
parties' gRPC services (`peer_identity` finds no role in it) and no party certificate is
needed to join the cluster. Keys are ECDSA P-256, written 0600, never printed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from he_partition.core.errors import InvalidInputError

from .pki import _hostname_sans, _issue_leaf, _key_pem, _write_public_file
from .tls import CA_NAME, URI_SCHEME, CaFiles, _check_party_id, write_private_file

__all__ = ["RAY_NODE_KIND", "RayNodeFiles", "issue_ray_node_certificate", "ray_tls_env", "apply_ray_tls"]

#: The SAN URI's authority in a Ray node certificate (``dpagg://ray-node/<node_id>``); not a party role.
RAY_NODE_KIND = "ray-node"
_NODE_VALID_DAYS = 825


@dataclass(frozen=True)
class RayNodeFiles:
    """One Ray node's certificate and key (0600), and the CA certificate it trusts."""

    node_id: str
    cert_path: Path
    key_path: Path
    ca_cert_path: Path

    def __repr__(self) -> str:  # paths only, never key material
        return (f"RayNodeFiles(node_id={self.node_id!r}, cert_path={str(self.cert_path)!r}, "
                f"key_path={str(self.key_path)!r}, ca_cert_path={str(self.ca_cert_path)!r})")

    @classmethod
    def in_directory(cls, directory: Path | str, node_id: str, *, ca_name: str = CA_NAME) -> "RayNodeFiles":
        """The files `issue_ray_node_certificate` writes for `node_id` in `directory`."""
        d = Path(directory)
        return cls(_check_party_id(node_id), d / f"{node_id}.crt", d / f"{node_id}.key", d / f"{ca_name}.crt")


def issue_ray_node_certificate(ca: CaFiles, directory: Path | str, node_id: str,
                               hostnames: Sequence[str] = ("localhost", "127.0.0.1"), *,
                               valid_days: int = _NODE_VALID_DAYS) -> RayNodeFiles:
    """Issue a Ray node's certificate (`<node_id>.crt`), key (`<node_id>.key`, 0600) and a copy of the CA certificate.

    The certificate is valid for TLS server and client authentication (a Ray node is both),
    names `hostnames` as DNS/IP SANs (the addresses the node is reached at: Ray checks them)
    and carries no dpagg party role. Give the computation server (the Ray driver) its own
    node certificate too: a driver without one cannot connect to a TLS cluster.
    """
    _check_party_id(node_id)
    if isinstance(hostnames, str):
        hostnames = (hostnames,)
    d = Path(directory)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    sans = [x509.UniformResourceIdentifier(f"{URI_SCHEME}://{RAY_NODE_KIND}/{node_id}"), *_hostname_sans(hostnames)]
    key, cert = _issue_leaf(ca, RAY_NODE_KIND, node_id, sans,
                            [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], valid_days)
    files = RayNodeFiles.in_directory(d, node_id, ca_name=ca.cert_path.stem)
    write_private_file(files.key_path, _key_pem(key))
    _write_public_file(files.cert_path, cert.public_bytes(serialization.Encoding.PEM))
    if files.ca_cert_path.resolve() != ca.cert_path.resolve():
        _write_public_file(files.ca_cert_path, ca.cert_pem())
    return files


def ray_tls_env(files: RayNodeFiles) -> dict[str, str]:
    """The environment every Ray process of this node (and the driver) needs for TLS; set it before Ray starts."""
    return {"RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": str(files.cert_path),
            "RAY_TLS_SERVER_KEY": str(files.key_path), "RAY_TLS_CA_CERT": str(files.ca_cert_path)}


def apply_ray_tls(spec: str) -> dict[str, str]:
    """`DIR:NODE_ID` -> Ray's TLS environment for that node's files, set in this process (Ray reads it at start).

    Refuses (InvalidInputError naming the file) when the certificate, key or CA certificate is missing,
    so a typo never silently runs Ray in the clear.
    """
    directory, sep, node_id = spec.rpartition(":")
    if not sep or not directory or not node_id:
        raise InvalidInputError(f"--ray-tls is DIR:NODE_ID (the files of `dpagg certs --ray-node NODE_ID`), got {spec!r}")
    files = RayNodeFiles.in_directory(directory, node_id)
    for path in (files.cert_path, files.key_path, files.ca_cert_path):
        if not path.is_file():
            raise InvalidInputError(f"Ray TLS file {path} does not exist; issue it with `dpagg certs --ray-node {node_id}`")
    env = ray_tls_env(files)
    os.environ.update(env)
    return env
