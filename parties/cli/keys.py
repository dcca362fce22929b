"""Key and certificate commands: the deployment's CA and party certificates (certs), an owner's signing key (keygen)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from he_partition.core.errors import DPAggError

from .options import Subparsers, command_adder, print_json


def _party(text: str) -> tuple[str, str, tuple[str, ...]]:
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise argparse.ArgumentTypeError(f"a party is ID:ROLE or ID:ROLE:HOST,HOST..., got {text!r}")
    hosts = tuple(h for h in parts[2].split(",") if h) if len(parts) == 3 else ()
    return parts[0], parts[1], hosts


def cmd_certs(args: argparse.Namespace) -> int:
    """Create (or reuse) a private CA and issue one certificate per party; print where the files are."""
    from ..common import tls
    from ..common.pki import create_ca, issue_party_certificate
    from ..common.signing import generate_signing_key, save_private_key

    if not args.party and not args.ray_node:
        raise DPAggError("nothing to issue: pass --party ID:ROLE (and/or --ray-node ID) at least once")
    out = Path(args.out)
    ca_dir = Path(args.ca) if args.ca else out
    ca = tls.CaFiles.in_directory(ca_dir)
    created_ca = False
    if ca.cert_path.exists() and ca.key_path.exists():
        pass  # reuse: new parties join the same deployment
    elif ca.cert_path.exists() or ca.key_path.exists():
        raise DPAggError(f"{ca_dir} holds only half of a CA ({ca.cert_path.name} / {ca.key_path.name}); "
                         "restore the other file or choose an empty --ca directory")
    else:
        ca = create_ca(ca_dir)
        created_ca = True
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    if ca_dir.resolve() != out.resolve() and not args.per_party_dirs:
        (out / ca.cert_path.name).write_bytes(ca.cert_pem())  # parties need the CA certificate, not its key
    written: list[dict[str, Any]] = []
    kept: list[str] = []
    for party_id, role, hosts in args.party:
        where = out / party_id if args.per_party_dirs else out
        files = tls.PartyFiles.in_directory(where, party_id, role)
        if files.key_path.exists() and files.cert_path.exists() and args.keep_existing and not args.force:
            _check_kept(files, ca, role)
            kept.append(party_id)
            continue
        if files.key_path.exists() and not args.force:
            raise DPAggError(f"{files.key_path} exists; pass --force to issue a new key and certificate for "
                             f"{party_id!r}, or --keep-existing to keep it")
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        if args.per_party_dirs:
            (where / ca.cert_path.name).write_bytes(ca.cert_pem())  # each party trusts the CA, nothing else
        names = hosts or (party_id, "localhost", "127.0.0.1")
        files = issue_party_certificate(ca, where, party_id, role, hostnames=names)
        entry: dict[str, Any] = {"party_id": party_id, "role": role, "cert": str(files.cert_path),
                                 "key": str(files.key_path), "hostnames": list(names)}
        # an owner's submission-signing key; an operator's key that signs study terms (parties.common.approval)
        kind = {"data_owner": "signing", "operator": "approval"}.get(role)
        if kind is not None and args.signing_keys:
            private, public = generate_signing_key()
            key_path = save_private_key(where / f"{party_id}.{kind}.key", private)
            (where / f"{party_id}.{kind}.pub").write_text(public.hex() + "\n")
            entry.update({f"{kind}_key": str(key_path), f"{kind}_public_key": public.hex()})
        written.append(entry)
    for node_id, hosts in args.ray_node or ():
        written += _issue_ray_node(ca, out / node_id if args.per_party_dirs else out, node_id, hosts, args, kept)
    if args.json:
        print_json({"ca_cert": str(out / ca.cert_path.name), "ca_key": str(ca.key_path), "created_ca": created_ca,
                     "parties": written, "kept": kept})
    else:
        print(f"CA {'created' if created_ca else 'reused'}: {ca.cert_path} (its key {ca.key_path} can mint any "
              "identity: keep it offline)")
        if kept:
            print(f"  kept the existing certificates of {', '.join(kept)}")
        for e in written:
            extra = f", signing key {e['signing_key']} (public {e['signing_public_key']})" if "signing_key" in e else ""
            if "approval_key" in e:
                extra = (f", study approval key {e['approval_key']} (public {e['approval_public_key']}: every key "
                         "holder pins it with --operator-key)")
            print(f"  {e['role']:<11} {e['party_id']}: {e['cert']}, key {e['key']}{extra}")
    return 0


def _ray_node(text: str) -> tuple[str, tuple[str, ...]]:
    node_id, _, hosts = text.partition(":")
    if not node_id:
        raise argparse.ArgumentTypeError(f"a Ray node is ID or ID:HOST,HOST..., got {text!r}")
    return node_id, tuple(h for h in hosts.split(",") if h)


def _issue_ray_node(ca: Any, where: Path, node_id: str, hosts: tuple[str, ...], args: argparse.Namespace,
                    kept: list[str]) -> list[dict[str, Any]]:
    """A Ray node's TLS certificate from the deployment's CA (parties/common/ray_tls.py); kept like a party's."""
    from ..common.ray_tls import RayNodeFiles, issue_ray_node_certificate

    files = RayNodeFiles.in_directory(where, node_id)
    if files.key_path.exists() and files.cert_path.exists() and args.keep_existing and not args.force:
        kept.append(node_id)
        return []
    if files.key_path.exists() and not args.force:
        raise DPAggError(f"{files.key_path} exists; pass --force to issue a new key and certificate for Ray node "
                         f"{node_id!r}, or --keep-existing to keep it")
    names = hosts or (node_id, "localhost", "127.0.0.1")
    files = issue_ray_node_certificate(ca, where, node_id, names)
    return [{"party_id": node_id, "role": "ray-node", "cert": str(files.cert_path), "key": str(files.key_path),
             "hostnames": list(names)}]


def _check_kept(files: Any, ca: Any, role: str) -> None:
    """An existing certificate kept by --keep-existing must be this CA's, for this role: else say how to fix it."""
    from cryptography import x509

    from ..common.tls import identity_from_certificate

    cert = x509.load_pem_x509_certificate(files.cert_path.read_bytes())
    ident = identity_from_certificate(cert)
    try:
        cert.verify_directly_issued_by(ca.certificate())
        same_ca = True
    except Exception:  # noqa: BLE001 - InvalidSignature, ValueError, TypeError: all mean "not this CA"
        same_ca = False
    if not same_ca or ident is None or ident.role != role:
        raise DPAggError(f"{files.cert_path} exists but is not a certificate of this CA for role {role}; pass "
                         "--force to reissue it")


def cmd_keygen(args: argparse.Namespace) -> int:
    """Create a data owner's Ed25519 signing key (0600) and print its public half for the operator."""
    from ..common.signing import (
        generate_signing_key,
        key_fingerprint,
        load_private_key,
        public_key_of,
        save_private_key,
    )

    out = Path(args.out)
    if out.exists() and args.keep_existing and not args.force:
        private = load_private_key(out)
        public = public_key_of(private)
    elif out.exists() and not args.force:
        raise DPAggError(f"{out} exists; pass --force to replace it (uploads already signed with it stay valid), or "
                         "--keep-existing to keep it")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        private, public = generate_signing_key()
        save_private_key(out, private)
    pub_path = out.with_suffix(".pub")
    pub_path.write_text(public.hex() + "\n")
    if args.public_dir:
        Path(args.public_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.public_dir) / pub_path.name).write_text(public.hex() + "\n")
    if args.json:
        print_json({"private_key": str(out), "public_key_file": str(pub_path), "public_key": public.hex(),
                     "fingerprint": key_fingerprint(public)})
    else:
        print(f"signing key written to {out} (mode 0600; keep it secret)")
        print(f"public key {public.hex()} (also in {pub_path}): give it to the operator, who opens the study with "
              "--owner-key YOUR_ID=<public key>")
    return 0


def add_parser(sub: Subparsers) -> None:
    """Add this group's commands to the `dpagg` parser."""
    add = command_adder(sub)
    p = add("certs", cmd_certs, "create a private CA and one mutual-TLS certificate per party (keys 0600, never "
                                "printed)")
    p.add_argument("--out", required=True, help="directory for the party certificates and keys")
    p.add_argument("--ca", help="directory of the CA (dpagg-ca.crt/.key): reused if present, else created "
                                "(default: --out)")
    p.add_argument("--party", type=_party, action="append", default=[], metavar="ID:ROLE[:HOSTS]",
                   help="a party and its role (data_owner, computation, decryption, analyst, operator), optionally "
                        "the comma-separated host names it serves under (default: ID, localhost, 127.0.0.1); "
                        "repeatable")
    p.add_argument("--ray-node", type=_ray_node, action="append", metavar="ID[:HOSTS]",
                   help="also issue a TLS certificate for a Ray node (or the computation server as a Ray driver) "
                        "with the host names / IPs it is reached at; set RAY_USE_TLS and RAY_TLS_* from it "
                        "(docs/scaling.md); repeatable")
    p.add_argument("--signing-keys", action="store_true",
                   help="also create an Ed25519 submission-signing key for every data_owner (ID.signing.key, 0600, "
                        "and ID.signing.pub) and a study approval key for every operator (ID.approval.key and "
                        "ID.approval.pub, which key holders pin with --operator-key); in a real deployment each "
                        "owner and the operator run `dpagg keygen` themselves")
    p.add_argument("--force", action="store_true", help="replace existing party keys and certificates")
    p.add_argument("--keep-existing", action="store_true",
                   help="skip parties whose key and certificate exist (checked: this CA, this role), so the "
                        "command can run on every start")
    p.add_argument("--per-party-dirs", action="store_true",
                   help="write each party's files, with a copy of the CA certificate, into OUT/ID/ (one directory "
                        "to hand to each party; the CA key stays in --ca)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = add("keygen", cmd_keygen, "data owner: create an Ed25519 signing key for your uploads; prints the public key")
    p.add_argument("--out", required=True, help="private key file to write (mode 0600); the public key goes to "
                                                "the same name with suffix .pub")
    p.add_argument("--force", action="store_true", help="replace an existing key file")
    p.add_argument("--keep-existing", action="store_true",
                   help="if the key file exists, keep it and print its public key (exit 0)")
    p.add_argument("--public-dir", metavar="DIR",
                   help="also write the public key to DIR/<name>.pub (a place the operator reads)")
    p.add_argument("--json", action="store_true", help="print JSON")
