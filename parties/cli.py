"""The `dpagg` command line: run each server, act as operator, data owner or analyst, or run the demo."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
import os
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

# gRPC's C core logs every failed TLS handshake on stderr; the CLI reports failures itself (naming the file
# or name at fault), so it keeps the core to errors unless the user set GRPC_VERBOSITY. Set before grpc loads.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc  # noqa: E402

import numpy as np  # noqa: E402

from he_partition.core.errors import DPAggError
from he_partition.join.protocol import DEFAULT_JOIN_RELEASE, JOIN_ORDERS, JOIN_RELEASES

from .common.config import (
    ENV_ANALYST,
    ENV_COMPUTATION,
    ENV_DECRYPTION,
    AnalystConfig,
    ComputationConfig,
    DecryptionConfig,
    default_target,
)
from .common.errors import ServiceError

if TYPE_CHECKING:
    from .common.contract import StudyContract
    from .common.tls import TlsConfig

__all__ = ["main", "build_parser"]

ENV_STATE_DIR = "DPAGG_STATE_DIR"
ENV_CA_CERT = "DPAGG_CA_CERT"
ENV_CERT = "DPAGG_CERT"
ENV_KEY = "DPAGG_KEY"


# ---------------------------------------------------------------------------------------- helpers
def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=None, separators=(",", ":")))


def _owners(text: str) -> list[str]:
    owners = [o.strip() for o in text.split(",") if o.strip()]
    if not owners:
        raise argparse.ArgumentTypeError("give at least one owner id, comma-separated")
    return owners


def _range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a range is LO:HI (bin indices, HI exclusive), got {text!r}") from None
    return lo, hi


def _state_dir(args: argparse.Namespace) -> Path:
    base = args.state_dir or os.environ.get(ENV_STATE_DIR) or str(Path.home() / ".dpagg")
    return Path(base) / "uploads"


def _upload_key(args: argparse.Namespace) -> str:
    """The idempotency key of this owner's upload to this study, kept on disk so a re-run resumes."""
    if args.idempotency_key:
        return str(args.idempotency_key)
    ident = hashlib.sha256(f"{args.computation}|{args.study}|{args.owner}".encode()).hexdigest()[:16]
    path = _state_dir(args) / f"{args.study}.{args.owner}.{ident}.key"
    if path.exists():
        return path.read_text().strip()
    key = f"up-{uuid.uuid4().hex[:20]}"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(key + "\n")
    return key


def _tls(args: argparse.Namespace) -> "TlsConfig | None":
    """This party's mutual-TLS files from --ca-cert/--cert/--key (or DPAGG_CA_CERT/DPAGG_CERT/DPAGG_KEY).

    Without them the command refuses to run unless --insecure was given explicitly.
    """
    from .common.tls import TlsConfig

    given = [args.ca_cert, args.cert, args.key]
    if args.insecure:
        return None
    if not all(given):
        missing = [flag for flag, v in zip(("--ca-cert", "--cert", "--key"), given) if not v]
        raise DPAggError(
            f"`dpagg {args.command}` uses mutual TLS and needs this party's certificate: {', '.join(missing)} "
            f"missing (or set {ENV_CA_CERT}, {ENV_CERT}, {ENV_KEY}). Create them with `dpagg certs --out DIR "
            "--party ID:ROLE ...`, or pass --insecure for a local test setup without TLS"
        )
    return TlsConfig(Path(args.ca_cert), Path(args.cert), Path(args.key), server_name=args.tls_server_name or "")


def _conn(args: argparse.Namespace) -> dict[str, Any]:
    """Client connection arguments: this party's TLS, or an explicit plaintext test setup."""
    return {"tls": _tls(args), "insecure": bool(args.insecure)}


# --------------------------------------------------------------------------------------- commands
def _refuse_seed_without_insecure(args: argparse.Namespace) -> None:
    if getattr(args, "insecure_noise_seed", None) is not None and not args.insecure:
        raise DPAggError("--insecure-noise-seed makes this server's DP noise predictable (no privacy); it is only "
                         "accepted together with --insecure, on a test setup")


def cmd_serve_decryption(args: argparse.Namespace) -> int:
    from .decryption.server import serve_decryption

    _refuse_seed_without_insecure(args)
    tls = _tls(args)
    serve_decryption(DecryptionConfig(Path(args.data_dir), host=args.host, port=args.port,
                                      noise_seed=args.insecure_noise_seed, tls=tls, insecure=tls is None,
                                      computation_ids=tuple(args.computation_id or ())), port_file=args.port_file)
    return 0


def cmd_serve_computation(args: argparse.Namespace) -> int:
    from .computation.server import serve_computation

    _refuse_seed_without_insecure(args)
    tls = _tls(args)
    serve_computation(ComputationConfig(Path(args.data_dir), args.decryption, host=args.host, port=args.port,
                                        noise_seed=args.insecure_noise_seed, serve_analyst=not args.no_analyst,
                                        tls=tls, insecure=tls is None),
                      port_file=args.port_file)
    return 0


def cmd_serve_analyst(args: argparse.Namespace) -> int:
    from .computation.server import serve_analyst

    tls = _tls(args)
    serve_analyst(AnalystConfig(Path(args.data_dir), host=args.host, port=args.port, tls=tls, insecure=tls is None),
                  port_file=args.port_file)
    return 0


def _party(text: str) -> tuple[str, str, tuple[str, ...]]:
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise argparse.ArgumentTypeError(f"a party is ID:ROLE or ID:ROLE:HOST,HOST..., got {text!r}")
    hosts = tuple(h for h in parts[2].split(",") if h) if len(parts) == 3 else ()
    return parts[0], parts[1], hosts


def cmd_certs(args: argparse.Namespace) -> int:
    """Create (or reuse) a private CA and issue one certificate per party; print where the files are."""
    from .common import tls
    from .common.signing import generate_signing_key, save_private_key

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
        ca = tls.create_ca(ca_dir)
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
        files = tls.issue_party_certificate(ca, where, party_id, role, hostnames=names)
        entry: dict[str, Any] = {"party_id": party_id, "role": role, "cert": str(files.cert_path),
                                 "key": str(files.key_path), "hostnames": list(names)}
        if role == "data_owner" and args.signing_keys:
            private, public = generate_signing_key()
            key_path = save_private_key(where / f"{party_id}.signing.key", private)
            pub_path = where / f"{party_id}.signing.pub"
            pub_path.write_text(public.hex() + "\n")
            entry.update(signing_key=str(key_path), signing_public_key=public.hex())
        written.append(entry)
    if args.json:
        _print_json({"ca_cert": str(out / ca.cert_path.name), "ca_key": str(ca.key_path), "created_ca": created_ca,
                     "parties": written, "kept": kept})
    else:
        print(f"CA {'created' if created_ca else 'reused'}: {ca.cert_path} (its key {ca.key_path} can mint any "
              "identity: keep it offline)")
        if kept:
            print(f"  kept the existing certificates of {', '.join(kept)}")
        for e in written:
            extra = f", signing key {e['signing_key']} (public {e['signing_public_key']})" if "signing_key" in e else ""
            print(f"  {e['role']:<11} {e['party_id']}: {e['cert']}, key {e['key']}{extra}")
    return 0


def _check_kept(files: Any, ca: Any, role: str) -> None:
    """An existing certificate kept by --keep-existing must be this CA's, for this role: else say how to fix it."""
    from cryptography import x509

    from .common.tls import identity_from_certificate

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


def cmd_open_study(args: argparse.Namespace) -> int:
    from .computation.client import ComputationClient

    domain_size = args.domain_size
    if args.domain:
        from .data_owner.dataset import DomainSpec

        n = DomainSpec.parse(args.domain).n_bins
        if domain_size and domain_size != n:
            raise DPAggError(f"--domain {args.domain} has {n} bins but --domain-size says {domain_size}")
        domain_size = n
    if not domain_size:
        raise DPAggError("give the domain: --domain COLUMN:LO:HI:BINS (or --domain-size N)")
    owner_keys = _owner_keys(args)
    correlation = _correlation_terms(args)
    with ComputationClient(args.computation, **_conn(args)) as cs:
        contract, existed = cs.open_study(
            study_id=args.study_id or "", domain_size=domain_size, epsilon=args.epsilon, expected_owners=args.owners,
            strategy=args.strategy, contribution_bound=args.contribution_bound, noise_parties=args.noise_parties,
            strategy_params_json=args.strategy_params or "", domain_spec=args.domain or "", owner_keys=owner_keys,
            max_organizations=args.max_organizations, **correlation)
    from he_partition.methods.guidance import assess_epsilon

    guide = assess_epsilon(contract.epsilon)
    for w in guide.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.json:
        _print_json({**contract.to_dict(), "contract_hash": contract.contract_hash, "already_existed": existed,
                     "noise_multiplier": contract.noise_multiplier,
                     "epsilon_guidance": {"variance_lower_bound": guide.variance_lower_bound,
                                          "guessing_bound_alpha": guide.guessing_bound,
                                          "warnings": list(guide.warnings)}})
    else:
        print(f"study {contract.study_id} {'already open' if existed else 'opened'}: {contract.domain_size} bins, "
              f"epsilon {contract.epsilon:g}, owners {', '.join(contract.expected_owners)}, "
              f"contribution bound {contract.contribution_bound} per owner, a person in at most "
              f"{contract.max_organizations} organization(s), noise parties {contract.noise_parties}")
        if contract.correlated or contract.correlation_source:
            print(_correlation_line(contract))
        print(f"epsilon {contract.epsilon:g}: any unbiased estimate of one count has variance >= "
              f"{guide.variance_lower_bound:.4g} (1/(e^eps-1)^2), adversary's guessing bound alpha = "
              f"{guide.guessing_bound:.4g} (4/(e^eps-1)^2{', vacuous' if guide.guessing_bound_is_vacuous else ''}; "
              "seed 002, see `dpagg epsilon`)")
        print(f"contract hash {contract.contract_hash}")
        print(f"key fingerprint {contract.context_fingerprint}")
    return 0


def cmd_open_join(args: argparse.Namespace) -> int:
    """Open a join study: two owners, a rows x cols table of their attributes over the customers both hold."""
    from .computation.client import ComputationClient
    from .data_owner.dataset import DomainSpec

    if len(args.owners) != 2:
        raise DPAggError(f"a join study has exactly two owners (rows, then columns), got {len(args.owners)}")
    rows, cols = DomainSpec.parse(args.rows).n_bins, DomainSpec.parse(args.cols).n_bins
    order = args.order
    if order == "auto":
        order = "hilbert" if rows == cols and not rows & (rows - 1) else "row"
    terms = {"shape": [rows, cols], "capacity": args.capacity, "padding_epsilon": args.padding_epsilon,
             "padding_offset": args.padding_offset, "row_spec": args.rows, "col_spec": args.cols,
             "identifier": args.id_column, "release": args.release, "order": order}
    with ComputationClient(args.computation, **_conn(args)) as cs:
        contract, existed = cs.open_study(
            study_id=args.study_id or "", domain_size=rows * cols, epsilon=args.epsilon, expected_owners=args.owners,
            strategy="join", contribution_bound=1, strategy_params_json=json.dumps(terms),
            owner_keys=_owner_keys(args))
    if args.json:
        _print_json({**contract.to_dict(), "contract_hash": contract.contract_hash, "already_existed": existed})
        return 0
    print(f"join study {contract.study_id} {'already open' if existed else 'opened'}: {rows} x {cols} table of "
          f"{args.owners[0]}'s {args.rows} by {args.owners[1]}'s {args.cols} over the {args.id_column} values both "
          f"hold; epsilon {contract.epsilon:g} ({args.padding_epsilon:g} booked now for the padding that hides the "
          f"intersection size), capacity {args.capacity} records; released with {args.release} ({order} order)")
    print(f"contract hash {contract.contract_hash}")
    print(f"key fingerprint {contract.context_fingerprint}")
    return 0


def cmd_join_submit(args: argparse.Namespace) -> int:
    """A join owner's whole side: key agreement, pseudonyms, placement, encrypted signed upload (waits for the peer)."""
    from .computation.client import ComputationClient
    from .data_owner.client import DataOwnerClient
    from .data_owner.dataset import DomainSpec
    from .data_owner.join import read_join_csv, submit_join

    tls = _tls(args)
    with ComputationClient(args.computation, **_conn(args)) as cs:
        contract = cs.study_status(args.study).contract
        terms = contract.join_terms()
        if args.owner not in contract.expected_owners:
            raise DPAggError(f"{args.owner} is not an owner of join study {args.study} "
                             f"({', '.join(contract.expected_owners)})")
        side = contract.expected_owners.index(args.owner)
        spec_text = args.domain or terms.spec_of(side)
        if not spec_text:
            raise DPAggError(f"join study {args.study} records no binning for {args.owner}; pass --domain")
        spec = DomainSpec.parse(spec_text)
        if args.value_column:
            spec = dataclasses.replace(spec, column=args.value_column)
        if spec.n_bins != terms.values_of(side):
            raise DPAggError(f"--domain has {spec.n_bins} bins; {args.owner}'s side of the table has "
                             f"{terms.values_of(side)}")
        recs = read_join_csv(args.csv, spec, args.id_column or terms.identifier, drop_bad=args.drop_bad_values)
        if not recs.values:
            raise DPAggError(f"{args.csv}: no record inside the domain; refusing an empty submission")
        if not args.json:
            print(f"{args.csv}: {recs.records_read} records read, {recs.out_of_domain} outside the domain or "
                  f"unreadable; joining {len(recs.values)} (waiting for the other owner if needed)", file=sys.stderr,
                  flush=True)
        signing_key = None
        if args.signing_key:
            from .common.signing import load_private_key

            signing_key = load_private_key(args.signing_key)
        with DataOwnerClient(args.owner, computation=cs, decryption=args.decryption, tls=tls, insecure=args.insecure,
                             signing_key=signing_key, progress=False) as owner:
            res = submit_join(owner, args.study, recs.values, idempotency_key=_upload_key(args),
                              state_dir=_state_dir(args), wait_timeout=args.wait)
    if args.json:
        _print_json({"study_id": res.study_id, "owner_id": res.owner_id, "committed": res.committed,
                     "duplicate": res.duplicate, "chunks": res.chunk_count, "bytes_sent": res.bytes_sent,
                     "records": len(recs.values)})
    elif res.duplicate:
        print(f"{args.owner} had already submitted to join study {args.study}; nothing sent")
    else:
        print(f"{args.owner} submitted {len(recs.values)} records to join study {args.study}: {res.chunk_count} "
              f"ciphertexts, {res.bytes_sent / 1e6:.1f} MB")
    return 0


def _correlation_line(contract: "StudyContract") -> str:
    return (f"correlated records: max leakage L = {contract.correlation_leakage:g}, noise multiplier "
            f"{contract.noise_multiplier:g} (epsilon {contract.epsilon:g} is Bayesian DP under the Gaussian "
            f"correlation model; each release's noise is {contract.noise_multiplier:g}x that of plain DP)"
            + (f"; model {contract.correlation_source}" if contract.correlation_source else ""))


def _load_adjacency(path: str) -> Any:
    """A weighted adjacency matrix, read as `dpagg bayes-scale` reads it (.csv, .npy or JSON)."""
    from .methods_cli import load_matrix

    if not Path(path).is_file():
        raise DPAggError(f"--correlation-graph {path}: no such file")
    try:
        return load_matrix(path)
    except (OSError, ValueError) as exc:
        raise DPAggError(f"--correlation-graph {path}: cannot read a numeric n x n matrix (.csv, .npy or JSON list "
                         f"of lists): {exc}") from exc


def _correlation_terms(args: argparse.Namespace) -> dict[str, Any]:
    """correlation_leakage / _source from --correlation-graph (and --correlation-tau) or --correlation-leakage."""
    if args.correlation_graph is None:
        if args.correlation_tau is not None:
            raise DPAggError("--correlation-tau needs --correlation-graph")
        if args.correlation_leakage is None:
            if args.correlation_source:
                raise DPAggError("--correlation-source needs --correlation-leakage")
            return {}
        return {"correlation_leakage": args.correlation_leakage, "correlation_source": args.correlation_source or ""}
    if args.correlation_source:
        raise DPAggError("--correlation-source is recorded for you with --correlation-graph; give it only with "
                         "--correlation-leakage")
    from he_partition.methods.bayesian import correlation_terms

    adjacency = _load_adjacency(args.correlation_graph)
    name = Path(args.correlation_graph).name
    label = f"file={name}" if name.isprintable() and len(name) <= 128 else ""
    try:
        return correlation_terms(adjacency, args.correlation_tau or 0.0, source_label=label)
    except (TypeError, ValueError) as exc:
        raise DPAggError(f"--correlation-graph {args.correlation_graph}: {exc}") from exc


def _owner_keys(args: argparse.Namespace) -> dict[str, str]:
    """Owner id -> Ed25519 public key hex, from --owner-key ID=HEX|ID=@FILE and --owner-keys-dir DIR."""
    keys: dict[str, str] = {}
    for item in args.owner_key or ():
        owner, sep, value = item.partition("=")
        if not sep or not owner or not value:
            raise DPAggError(f"--owner-key takes ID=HEX or ID=@FILE, got {item!r}")
        keys[owner] = Path(value[1:]).read_text().strip() if value.startswith("@") else value.strip()
    if args.owner_keys_dir:
        for owner in args.owners:
            if owner in keys:
                continue
            path = Path(args.owner_keys_dir) / f"{owner}.signing.pub"
            if not path.exists():
                raise DPAggError(f"no public key for owner {owner}: {path} is missing (the owner creates it with "
                                 f"`dpagg keygen --out {owner}.signing.key`)")
            keys[owner] = path.read_text().strip()
    return keys


def cmd_keygen(args: argparse.Namespace) -> int:
    """Create a data owner's Ed25519 signing key (0600) and print its public half for the operator."""
    from .common.signing import (generate_signing_key, key_fingerprint, load_private_key, public_key_of,
                                 save_private_key)

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
        _print_json({"private_key": str(out), "public_key_file": str(pub_path), "public_key": public.hex(),
                     "fingerprint": key_fingerprint(public)})
    else:
        print(f"signing key written to {out} (mode 0600; keep it secret)")
        print(f"public key {public.hex()} (also in {pub_path}): give it to the operator, who opens the study with "
              "--owner-key YOUR_ID=<public key>")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from .computation.client import ComputationClient

    with ComputationClient(args.computation, **_conn(args)) as cs:
        st = cs.study_status(args.study)
    if args.json:
        _print_json({"contract": st.contract.to_dict(), "contract_hash": st.contract.contract_hash,
                     "submitted_owners": list(st.submitted_owners), "missing_owners": list(st.missing_owners),
                     "release_ids": list(st.release_ids)})
    else:
        c = st.contract
        print(f"study {c.study_id}: {c.domain_size} bins{f' ({c.domain_spec})' if c.domain_spec else ''}, "
              f"epsilon {c.epsilon:g}, contract {c.contract_hash[:16]}")
        if c.correlated or c.correlation_source:
            print(f"  {_correlation_line(c)}")
        print(f"  contract hash   {c.contract_hash}")
        print(f"  key fingerprint {c.context_fingerprint}")
        print(f"  submitted: {', '.join(st.submitted_owners) or '-'}")
        print(f"  missing:   {', '.join(st.missing_owners) or '-'}")
        print(f"  releases:  {', '.join(st.release_ids) or '-'}")
    return 0


#: Above this share of records outside the domain, `submit` asks for --accept-out-of-domain: a wrong column
#: or unit usually looks like this, and a submission cannot be taken back.
MAX_OUT_OF_DOMAIN_SHARE = 0.2


def _check_careless_csv(args: argparse.Namespace, hist: Any) -> None:
    """Refuse what is almost surely a mistake before anything is encrypted or sent (a submission is final)."""
    if hist.records_read == 0 or hist.total == 0:
        raise DPAggError(
            f"{args.csv}: {hist.records_read} record(s) read, none inside the domain: refusing an empty submission "
            "(it would commit irreversibly). Check the file and --domain"
        )
    share = hist.out_of_domain / hist.records_read
    if share > MAX_OUT_OF_DOMAIN_SHARE and not args.accept_out_of_domain:
        raise DPAggError(
            f"{args.csv}: {hist.out_of_domain} of {hist.records_read} records ({share:.0%}) fall outside the domain; "
            "a wrong column or unit? Nothing was sent. Pass --accept-out-of-domain to submit the rest anyway"
        )


def cmd_submit(args: argparse.Namespace) -> int:
    from .computation.client import ComputationClient
    from .data_owner.client import DataOwnerClient, SubmitInterrupted
    from .data_owner.dataset import ContributionBounds, DomainSpec, read_histogram

    tls = _tls(args)
    with ComputationClient(args.computation, tls=tls, insecure=args.insecure) as cs:
        contract = cs.study_status(args.study).contract
        domain_text = args.domain or contract.domain_spec
        if not domain_text:
            raise DPAggError(f"study {args.study} records no domain spec; pass --domain COLUMN:LO:HI:BINS")
        domain = DomainSpec.parse(domain_text)
        if args.value_column:
            domain = dataclasses.replace(domain, column=args.value_column)
        bounds = ContributionBounds(per_bin=args.per_bin, max_bins=args.max_bins)
        hist = read_histogram(args.csv, domain, person_column=args.person_column, bounds=bounds,
                              on_bad_value="drop" if args.drop_bad_values else "error", drop_hint="--drop-bad-values")
        _check_careless_csv(args, hist)
        if not args.json:
            print(f"{args.csv}: {hist.records_read} records read, {hist.out_of_domain} outside the domain or "
                  f"unreadable, {hist.records_dropped} dropped by the contribution bound; submitting {hist.total} "
                  f"to study {args.study} (final: a study counts one submission per owner)", file=sys.stderr,
                  flush=True)
        key = _upload_key(args)
        signing_key = None
        if args.signing_key:
            from .common.signing import load_private_key

            signing_key = load_private_key(args.signing_key)
        with DataOwnerClient(args.owner, computation=cs, decryption=args.decryption, tls=tls, insecure=args.insecure,
                             signing_key=signing_key, progress=not args.no_progress and not args.json) as owner:
            try:
                res = owner.submit(args.study, hist, idempotency_key=key, resume_dir=_state_dir(args))
            except SubmitInterrupted as stop:
                print(f"\n{stop}.\nRun the same command again to resume: it sends only the chunks the server lacks "
                      f"(the encrypted chunks are kept in {_state_dir(args)} until the upload commits).",
                      file=sys.stderr)
                return 130
    if args.json:
        _print_json({"study_id": res.study_id, "owner_id": res.owner_id, "idempotency_key": res.idempotency_key,
                     "committed": res.committed, "duplicate": res.duplicate, "chunks": res.chunk_count,
                     "chunks_sent": res.chunks_sent,
                     "bytes_sent": res.bytes_sent, "records_read": hist.records_read,
                     "records_dropped": hist.records_dropped, "out_of_domain": hist.out_of_domain})
    elif res.duplicate:
        print(f"{args.owner} had already submitted to study {args.study} (upload {key}); nothing sent. "
              "A study counts one submission per owner.")
    else:
        print(f"{args.owner} submitted {hist.total} records ({hist.records_dropped} dropped by the contribution "
              f"bound, {hist.out_of_domain} outside the domain) to study {args.study}: {res.chunk_count} ciphertext "
              f"chunk(s), {res.bytes_sent / 1e6:.2f} MB, upload {key}")
    return 0


def _print_release(st: Any, as_json: bool) -> None:
    if as_json:
        _print_json({"release_id": st.release_id, "study_id": st.study_id, "state": st.state, "epsilon": st.epsilon,
                     "owners": list(st.owners), "error_code": st.error_code, "error_message": st.error_message,
                     "seconds": st.seconds, "summary": st.summary.to_dict() if st.summary else None})
        return
    print(f"release {st.release_id} of study {st.study_id}: {st.state}, epsilon {st.epsilon:g}, "
          f"owners {', '.join(st.owners)}")
    if st.summary is not None:
        s = st.summary
        print(f"  {s.n_partitions} partitions over {s.domain_size} bins, total {sum(s.sums)} "
              f"+- {sum(s.sum_variance) ** 0.5:.1f}, computed in {st.seconds:.2f} s")
    if st.error_message:
        print(f"  {st.error_code}: {st.error_message}")


def _epsilon_or_rest(text: str) -> float | str:
    """--epsilon for a release: a number > 0 and finite, or the word `rest` (what is left of the budget)."""
    if text.strip().lower() == "rest":
        return "rest"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0 or the word 'rest', got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"epsilon must be > 0 and finite, got {text}; "
                                         "use `--epsilon rest` to spend what is left")
    return value


def _pending_path(args: argparse.Namespace) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{args.computation}-{args.study}")
    return Path(args.state_dir).expanduser() / "pending-releases" / f"{safe}.json"


def _release_finished(cs: Any, release_id: str) -> bool:
    """True when the release is DONE or FAILED; False while it runs or the server cannot say."""
    try:
        return bool(cs.release_status(release_id).state != "RUNNING")
    except ServiceError:
        return False


def cmd_release_run(args: argparse.Namespace) -> int:
    """Start a release with a request key kept on disk until it finishes, so a re-run attaches to it."""
    from .computation.client import ComputationClient

    pending = _pending_path(args)
    spec = str(args.epsilon)
    key = ""
    if pending.is_file():
        saved = json.loads(pending.read_text())
        if saved.get("epsilon") == spec:
            key = str(saved.get("request_key", ""))
    key = key or args.request_key or f"cli-{uuid.uuid4().hex[:16]}"
    pending.parent.mkdir(parents=True, exist_ok=True)
    pending.write_text(json.dumps({"request_key": key, "epsilon": spec, "study": args.study}))
    with ComputationClient(args.computation, **_conn(args)) as cs:
        st = cs.run_release(args.study, epsilon=args.epsilon, force=args.force, wait=False, request_key=key)
        if not args.json:
            print(f"release {st.release_id} of study {args.study} started (request key {key})", flush=True)
        if not args.no_wait:
            try:
                st = cs.wait_release(st.release_id)
            except KeyboardInterrupt:
                print(f"\ninterrupted: release {st.release_id} continues on the server; see `dpagg release status "
                      f"{st.release_id}`, or re-run this command to attach to it (it spends nothing again)",
                      file=sys.stderr)
                return 130
            except ServiceError:
                if _release_finished(cs, st.release_id):  # keep the key while the release may still run
                    pending.unlink(missing_ok=True)
                raise
    if st.state != "RUNNING":
        pending.unlink(missing_ok=True)
    _print_release(st, args.json)
    return 0


def cmd_release_status(args: argparse.Namespace) -> int:
    from .computation.client import ComputationClient

    with ComputationClient(args.computation, **_conn(args)) as cs:
        st = cs.release_status(args.release)
    _print_release(st, args.json)
    return 0 if st.state != "FAILED" else 1


def cmd_query(args: argparse.Namespace) -> int:
    from .analyst.client import AnalystClient

    with AnalystClient(args.analyst, **_conn(args)) as an:
        if args.list or not args.release:
            infos = an.list_releases(args.study or "")
            if args.json:
                _print_json([vars(i) for i in infos])
            else:
                for i in infos:
                    print(f"{i.release_id}  study {i.study_id}  epsilon {i.epsilon:g}  {i.domain_size} bins  "
                          f"{i.partitions} partitions  {i.created_at}")
                if not infos and args.study:
                    from .computation.client import ComputationClient

                    try:
                        with ComputationClient(args.analyst, **_conn(args)) as cs:
                            cs.study_status(args.study)
                    except ServiceError as exc:
                        if exc.code == grpc.StatusCode.NOT_FOUND:
                            print(f"dpagg: unknown study {args.study!r}: no such study on {args.analyst}",
                                  file=sys.stderr)
                            return 1
                    print(f"no finished releases of study {args.study} yet")
                elif not infos:
                    print("no finished releases")
            return 0
        release_id = args.release
        if release_id == "latest":
            if not args.study:
                raise DPAggError("`dpagg query latest` needs --study: the newest finished release of which study?")
            newest = max(an.list_releases(args.study), key=lambda i: i.created_at, default=None)
            if newest is None:
                raise DPAggError(f"study {args.study} has no finished release yet")
            release_id = newest.release_id
        rel = an.get_release(release_id)
        ranges = args.range or [(0, rel.summary.domain_size)]
        counts = an.range_counts(release_id, ranges)
    if args.json:
        out: dict[str, Any] = {"release_id": rel.release_id, "study_id": rel.study_id,
                               "range_counts": [vars(c) for c in counts]}
        if args.show:
            out["summary"] = rel.summary.to_dict()
            out["estimates"] = [float(v) for v in rel.summary.estimate()]
        _print_json(out)
        return 0
    if args.show:
        s = rel.summary
        print(f"release {rel.release_id} of study {rel.study_id}: {s.n_partitions} partitions, epsilon {s.epsilon:g}")
        bdp = s.params.get("bayesian_dp")
        if isinstance(bdp, dict):
            print(f"  correlated records: {bdp.get('epsilon', 0):g}-Bayesian-DP (noise calibrated at DP epsilon "
                  f"{bdp.get('dp_epsilon', 0):g}, multiplier {bdp.get('noise_multiplier', 1):g})")
        for start, length, total in zip(s.starts, s.lengths, s.sums):
            print(f"  bins [{start}, {start + length}): {total}")
    else:
        print(f"release {rel.release_id} of study {rel.study_id} (epsilon {rel.summary.epsilon:g}):")
    join = rel.summary.params.get("join")
    if isinstance(join, dict) and (args.table or not args.range):
        from he_partition.join.release import cell_table

        rows, cols = join["shape"]
        est, se = cell_table(rel.summary)
        spread = f"+- {se.min():.1f}" if np.ptp(se) < 0.05 else f"+- {se.min():.1f} to {se.max():.1f}"
        how = ("every cell noised" if join.get("release", "cells") == "cells" else
               f"{join['release']} partitions over the {join.get('order', 'row')}-ordered cells, each partition's "
               "sum spread evenly over its cells")
        print(f"joint table, {rows} rows ({join.get('row_spec') or 'owner 1'}) x {cols} columns "
              f"({join.get('col_spec') or 'owner 2'}): {how}; cells {spread} (noise only)")
        for r in range(rows):
            print(" ".join(f"{v:>7.0f}" for v in est[r]))
        return 0
    domain = _release_domain(args, rel.study_id)
    for c in counts:
        where = f"  ({domain.describe_range(c.lo, c.hi)})" if domain is not None else ""
        print(f"bins [{c.lo}, {c.hi}){where}: {c.value:.1f} +- {c.standard_error:.1f}")
    return 0


def _release_domain(args: argparse.Namespace, study_id: str) -> Any:
    """The study's DomainSpec (to print ranges in the domain's values), or None when unknown or unreadable."""
    from .computation.client import ComputationClient
    from .data_owner.dataset import DomainSpec

    try:
        with ComputationClient(args.analyst, **_conn(args)) as cs:
            spec = cs.study_status(study_id).contract.domain_spec
        return DomainSpec.parse(spec) if spec else None
    except (ServiceError, DPAggError, ValueError):
        return None


def cmd_direct_query(args: argparse.Namespace) -> int:
    from .computation.client import ComputationClient

    with ComputationClient(args.computation, **_conn(args)) as cs:
        r = cs.direct_range_counts(args.study, args.range, args.epsilon, force=args.force,
                                   request_key=args.request_key or "")
    if args.json:
        _print_json({"request_id": r.request_id, "study_id": args.study, "epsilon": args.epsilon,
                     "range_counts": [vars(c) for c in r.counts], "epsilon_charged": r.epsilon_charged,
                     "epsilon_sequential": r.epsilon_sequential, "epsilon_remaining": r.epsilon_remaining,
                     "owners": list(r.owners)})
        return 0
    for c in r.counts:
        print(f"[{c.lo}, {c.hi}): {c.value:.0f} +- {c.standard_error:.1f}")
    print(f"charged epsilon {r.epsilon_charged:g} (max-overlap rule; plain sum would be {r.epsilon_sequential:g}); "
          f"{r.epsilon_remaining:g} left in study {args.study}")
    return 0


def cmd_budget(args: argparse.Namespace) -> int:
    from .decryption.client import DecryptionClient

    with DecryptionClient(args.decryption, **_conn(args)) as ds:
        b = ds.budget(args.study)
    if args.json:
        _print_json({"study_id": b.study_id, "total": b.total, "spent": b.spent, "remaining": b.remaining,
                     "available": b.available,
                     "charges": [vars(c) for c in b.charges], "chain_problem": b.chain_problem})
    else:
        print(f"study {b.study_id}: spent {b.spent:.12g} of {b.total:.12g}; a new release may spend "
              f"{b.available:.12g} (exact)")
        for c in b.charges:
            print(f"  #{c.charge_id} {c.created_at} release {c.release_id}: {c.kind} {c.epsilon:.12g}")
    if args.verify:
        if b.chain_problem:
            print(f"dpagg: ledger hash chain BROKEN: {b.chain_problem}", file=sys.stderr)
            return 1
        if not args.json:
            print("ledger hash chain verified (every charge row commits to the previous one)")
    return 0


def cmd_ledger_backup(args: argparse.Namespace) -> int:
    """Copy the decryption server's ledger (it may be running) to one file and verify the copy's hash chain."""
    from .decryption.ledger import backup_ledger
    from .decryption.server import LEDGER_FILE

    rows = backup_ledger(Path(args.data_dir) / LEDGER_FILE, args.out)
    print(f"ledger backed up to {args.out}: {rows} charge row(s), hash chain verified (no key material in it)")
    return 0


def cmd_ledger_restore(args: argparse.Namespace) -> int:
    """Restore a ledger backup with an acknowledged, logged rollback (parties.decryption.rollback)."""
    from .decryption.rollback import restore_ledger
    from .decryption.server import LEDGER_FILE

    r = restore_ledger(args.data_dir, args.backup, LEDGER_FILE, acknowledge_rollback=args.acknowledge_rollback)
    for study, lost in r.lost.items():
        print(f"study {study}: rolled back {len(lost)} charge(s); re-booked epsilon {r.rebooked.get(study, 0.0):.12g}")
    print(f"ledger restored from {args.backup}" + (f"; the replaced ledger was unreadable ({r.unreadable}): nothing "
                                                     "could be re-booked" if r.unreadable else ""))
    return 0


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    """Check a ledger file's (or backup's) hash chain; exit 1 if a charge row was changed, removed or replaced."""
    from .decryption.ledger import SqliteLedgerStore, available, verify_ledger_file

    rows = verify_ledger_file(args.file)
    store = SqliteLedgerStore(args.file)
    try:
        for c in store.list_studies():
            charges = store.charges(c.study_id)
            print(f"study {c.study_id}: {len(charges)} charge(s), {c.epsilon - available(c.epsilon, charges):.12g} "
                  f"of {c.epsilon:g} spent")
    finally:
        store.close()
    print(f"{args.file}: {rows} charge row(s), hash chain verified")
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    from .common.client import BaseClient

    with BaseClient(args.target, **_conn(args)) as c:
        c.wait_ready(args.service, timeout=args.timeout)
    print(f"{args.target} {args.service or '(server)'}: SERVING")
    return 0


def cmd_sample_csv(args: argparse.Namespace) -> int:
    from .data_owner.dataset import write_sample_csv

    out = Path(args.out)
    for i in range(args.owners):
        name = f"owner-{i + 1}"
        where = out / name if args.per_owner_dirs else out
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"{name}.csv"
        write_sample_csv(path, seed=args.seed, n_records=args.records, owner_index=i)
        print(path)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import format_demo, plot_demo, run_demo

    if args.plot:
        try:
            import matplotlib  # noqa: F401  (checked before the demo runs, not after)
        except ImportError:
            raise DPAggError("--plot needs matplotlib: pip install 'dpagg[plot]' (or run the demo without --plot)") \
                from None

    result = run_demo(owners=args.owners, records=args.records, domain=args.domain, epsilon=args.epsilon,
                      seed=args.seed, data_dir=Path(args.data_dir) if args.data_dir else None,
                      noise_seed=args.insecure_noise_seed, tls=not args.insecure)
    if args.plot:
        plot_demo(result, Path(args.plot))
        result["plot"] = str(args.plot)
    if args.json:
        _print_json(result)
    else:
        print(format_demo(result))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


# ----------------------------------------------------------------------------------------- parser
def _server_args(p: argparse.ArgumentParser, default_port: int) -> None:
    p.add_argument("--data-dir", required=True, help="directory for this server's state (created if missing)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in containers)")
    p.add_argument("--port", type=int, default=default_port, help=f"port (0 = any free port; default {default_port})")
    p.add_argument("--port-file", help="write the bound port to this file once listening")


def _tls_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("mutual TLS (required unless --insecure)")
    g.add_argument("--ca-cert", default=os.environ.get(ENV_CA_CERT), metavar="PATH",
                   help=f"the deployment CA's certificate (env {ENV_CA_CERT})")
    g.add_argument("--cert", default=os.environ.get(ENV_CERT), metavar="PATH",
                   help=f"this party's certificate; its id and role are what servers check (env {ENV_CERT})")
    g.add_argument("--key", default=os.environ.get(ENV_KEY), metavar="PATH",
                   help=f"this party's private key, mode 0600 (env {ENV_KEY})")
    g.add_argument("--tls-server-name", metavar="NAME",
                   help="name to verify in the server certificate instead of the dialled host")
    g.add_argument("--insecure", action="store_true",
                   help="TESTS ONLY: plaintext gRPC without identities; servers then skip every role check")


def _seed_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--insecure-noise-seed", type=int, default=None, metavar="N",
                   help="TESTS ONLY: draw this server's DP noise from a seeded stream (predictable noise gives "
                        "no privacy)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="dpagg",
        description="Secure multi-party differentially private histograms: BFV-encrypted uploads, two "
                    "non-colluding servers, a privacy-budget ledger. Try `dpagg demo`.")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=fn)
        return p

    comp = {"default": default_target(ENV_COMPUTATION),
            "help": f"computation server host:port (env {ENV_COMPUTATION}; default %(default)s)"}
    dec = {"default": default_target(ENV_DECRYPTION),
           "help": f"decryption server host:port (env {ENV_DECRYPTION}; default %(default)s)"}

    p = add("serve-decryption", cmd_serve_decryption, "run the decryption server (key holder and budget ledger)")
    _server_args(p, 50051)
    p.add_argument("--computation-id", action="append", metavar="ID",
                   help="party id of a computation server allowed to open studies and request decryptions "
                        "(repeatable; default: any certificate with role computation)")
    _seed_arg(p)
    _tls_args(p)

    p = add("serve-computation", cmd_serve_computation,
            "run the computation server (uploads, aggregation, releases; hosts the analyst service)")
    _server_args(p, 50052)
    p.add_argument("--decryption", **dec)  # type: ignore[arg-type]
    p.add_argument("--no-analyst", action="store_true", help="do not host the analyst service in this process")
    _seed_arg(p)
    _tls_args(p)

    p = add("serve-analyst", cmd_serve_analyst,
            "serve the analyst queries from a computation server's data directory (read-only)")
    _server_args(p, 50053)
    _tls_args(p)

    p = add("open-study", cmd_open_study, "open a study (operator)")
    p.add_argument("--computation", **comp)  # type: ignore[arg-type]
    p.add_argument("--study-id", help="study id (default: generated)")
    p.add_argument("--domain", help="binning every owner uses, COLUMN:LO:HI:BINS (e.g. age:0:100:50), "
                                    "COLUMN:edges:E0,E1,... or COLUMN:categories:A,B,...")
    p.add_argument("--domain-size", type=int, default=0, help="number of bins, if no --domain is recorded")
    p.add_argument("--epsilon", type=float, required=True, help="total privacy budget of the study")
    p.add_argument("--owners", type=_owners, required=True, help="expected data owner ids, comma-separated")
    p.add_argument("--contribution-bound", type=int, default=1,
                   help="max records per person in one owner's data (owners bound with per_bin*max_bins = this)")
    p.add_argument("--max-organizations", type=int, default=1, metavar="K",
                   help="the most data owners one person may appear in (default 1); every sensitivity is "
                        "multiplied by K, since each owner bounds its own records")
    p.add_argument("--noise-parties", type=int, choices=(2,), default=2,
                   help="both servers add noise (2, the only value a study accepts: with one, the computation "
                        "server would hold exact values)")
    p.add_argument("--strategy", default="auto", help="release strategy: auto (default), gap, hier, dawa or privelet")
    p.add_argument("--strategy-params", help="strategy parameters as a JSON object")
    p.add_argument("--owner-key", action="append", metavar="ID=HEX",
                   help="an owner's Ed25519 public key (hex, or ID=@FILE); repeatable. Servers with mutual TLS "
                        "require one per owner and then count only uploads signed with it")
    p.add_argument("--owner-keys-dir", metavar="DIR",
                   help="read missing owner keys from DIR/<owner>.signing.pub (as `dpagg certs --signing-keys` and "
                        "`dpagg keygen` write them)")
    corr = p.add_mutually_exclusive_group()
    corr.add_argument("--correlation-graph", metavar="PATH",
                      help="correlated records (seed 003): weighted adjacency W of the records' Gaussian correlation "
                           "model (.csv, .npy or JSON). Its max leakage L makes --epsilon a Bayesian-DP budget and "
                           "multiplies every noise scale by 1 + L")
    corr.add_argument("--correlation-leakage", type=float, metavar="L",
                      help="a precomputed max leakage coefficient L >= 0 (e.g. from `dpagg bayes-scale`) instead of "
                           "--correlation-graph")
    p.add_argument("--correlation-tau", type=float, metavar="T",
                   help="prior precision tau >= 0 of the correlation model (default 0, which needs a connected graph)")
    p.add_argument("--correlation-source", metavar="TEXT",
                   help="with --correlation-leakage: where L came from (recorded in the contract)")
    p.add_argument("--json", action="store_true", help="print JSON")
    _tls_args(p)

    p = add("open-join", cmd_open_join, "open a join study (operator): the DP table of two owners' attributes over "
                                         "the customers both hold (docs/join.md)")
    p.add_argument("--computation", **comp)  # type: ignore[arg-type]
    p.add_argument("--study-id", help="study id (default: generated)")
    p.add_argument("--owners", type=_owners, required=True, help="the two owners, rows first: A,B")
    p.add_argument("--rows", required=True, metavar="SPEC", help="the first owner's binning (rows), e.g. age:17:97:16")
    p.add_argument("--cols", required=True, metavar="SPEC",
                   help="the second owner's binning (columns), e.g. education:1:17:16")
    p.add_argument("--id-column", default="id", help="the identifier column both owners join on (default id)")
    p.add_argument("--capacity", type=int, required=True,
                   help="public bound on the records of both owners together, a multiple of 8192 (each owner "
                        "encrypts capacity/8192 x its bins ciphertexts)")
    p.add_argument("--epsilon", type=float, required=True, help="total budget: padding plus the table's release")
    p.add_argument("--padding-epsilon", type=float, default=0.1,
                   help="epsilon booked at once for the dummy padding that hides the intersection size from the "
                        "computation server (default 0.1)")
    p.add_argument("--padding-offset", type=int, default=100,
                   help="mean number of shared dummy records (default 100; delta about exp(-eps*offset)/2)")
    p.add_argument("--release", choices=JOIN_RELEASES, default=DEFAULT_JOIN_RELEASE,
                   help="how the table is released: 'cells' noises every cell; gap, hier, dawa, privelet and auto "
                        f"are the strategies of ordinary studies over the flattened table (default "
                        f"{DEFAULT_JOIN_RELEASE}; docs/join.md compares them)")
    p.add_argument("--order", choices=("auto", *JOIN_ORDERS), default="auto",
                   help="how the table is flattened for --release: row-major, or along the Hilbert curve (square "
                        "tables with a power-of-two side); auto picks hilbert where it can (default auto)")
    p.add_argument("--owner-key", action="append", metavar="ID=HEX", help="an owner's Ed25519 public key; repeatable")
    p.add_argument("--owner-keys-dir", metavar="DIR", help="read owner keys from DIR/<owner>.signing.pub")
    p.add_argument("--json", action="store_true", help="print JSON")
    _tls_args(p)

    p = add("join-submit", cmd_join_submit, "join owner: pseudonymize, get a placement, encrypt and upload your "
                                             "side of a join study (waits for the other owner)")
    p.add_argument("--study", required=True, help="join study id")
    p.add_argument("--owner", required=True, help="your owner id")
    p.add_argument("--csv", required=True, type=Path, help="CSV with a header row")
    p.add_argument("--id-column", help="identifier column (default: the study's)")
    p.add_argument("--value-column", metavar="NAME", help="the attribute column (default: the one your binning names)")
    p.add_argument("--domain", help="your binning (default: the study's for your side)")
    p.add_argument("--drop-bad-values", action="store_true",
                   help="skip rows with an empty identifier or value or a wrong number of fields")
    p.add_argument("--wait", type=float, default=600.0, help="seconds to wait for the other owner (default 600)")
    p.add_argument("--idempotency-key", help="upload key (default: kept in the state dir)")
    p.add_argument("--state-dir", help=f"where the upload key and your join key are kept (env {ENV_STATE_DIR}; "
                                       "default ~/.dpagg)")
    p.add_argument("--signing-key", default=os.environ.get("DPAGG_SIGNING_KEY"), metavar="PATH",
                   help="your Ed25519 signing key (env DPAGG_SIGNING_KEY)")
    p.add_argument("--computation", **comp)  # type: ignore[arg-type]
    p.add_argument("--decryption", default=os.environ.get(ENV_DECRYPTION) or None, metavar="HOST:PORT",
                   help="fetch the join key from the decryption server directly (default: through the computation "
                        "server; its fingerprint is checked either way)")
    p.add_argument("--json", action="store_true", help="print JSON")
    _tls_args(p)

    p = add("status", cmd_status, "show a study: contract, who submitted, releases")
    p.add_argument("study", help="study id")
    p.add_argument("--computation", **comp)  # type: ignore[arg-type]
    p.add_argument("--json", action="store_true", help="print JSON")
    _tls_args(p)

    p = add("submit", cmd_submit, "data owner: bin a CSV, bound contributions, encrypt, upload (resumable)")
    p.add_argument("--study", required=True, help="study id")
    p.add_argument("--owner", required=True, help="your owner id (as listed in the study)")
    p.add_argument("--csv", required=True, type=Path, help="CSV file with a header row")
    p.add_argument("--domain", help="binning (default: the study's recorded domain spec)")
    p.add_argument("--person-column", help="column identifying a person (default: every record is a person)")
    p.add_argument("--per-bin", type=int, default=1, help="max records of one person per bin (default 1)")
    p.add_argument("--max-bins", type=int, default=1, help="max bins one person counts in (default 1)")
    p.add_argument("--value-column", metavar="NAME",
                   help="the CSV column holding the study's value (default: the column the domain spec names)")
    p.add_argument("--drop-bad-values", action="store_true",
                   help="skip records with an empty or non-numeric value, no person id, or a wrong number of "
                        "fields (default: stop at the first, naming its line)")
    p.add_argument("--accept-out-of-domain", action="store_true",
                   help=f"submit even when more than {MAX_OUT_OF_DOMAIN_SHARE:.0%} of the records fall outside the "
                        "domain (refused by default: usually a wrong column or unit)")
    p.add_argument("--idempotency-key", help="upload key (default: kept in the state dir, so a re-run resumes)")
    p.add_argument("--state-dir", help=f"where upload keys and the encrypted chunks of an unfinished upload are "
                                       f"kept, so a re-run resumes (env {ENV_STATE_DIR}; default ~/.dpagg)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--signing-key", default=os.environ.get("DPAGG_SIGNING_KEY"), metavar="PATH",
                   help="your Ed25519 signing key (from `dpagg keygen`); required by signed studies "
                        "(env DPAGG_SIGNING_KEY)")
    p.add_argument("--computation", **comp)  # type: ignore[arg-type]
    p.add_argument("--decryption", default=os.environ.get(ENV_DECRYPTION) or None, metavar="HOST:PORT",
                   help="fetch the study key from the decryption server directly (env "
                        f"{ENV_DECRYPTION}); default: through the computation server. Either way its fingerprint "
                        "must match the study contract's")
    p.add_argument("--json", action="store_true", help="print JSON")
    _tls_args(p)

    rel = add("release", lambda a: 2, "run or inspect a release (operator)")
    rsub = rel.add_subparsers(dest="release_command", required=True, metavar="ACTION")
    text = "release a study (waits for the summary unless --no-wait); spends epsilon from its budget"
    p = rsub.add_parser("run", help=text, description=text)
    p.set_defaults(func=cmd_release_run)
    p.add_argument("study", help="study id")
    p.add_argument("--epsilon", type=_epsilon_or_rest, required=True, metavar="EPS|rest",
                   help="epsilon to spend (> 0), or `rest` for exactly what is left of the study's budget")
    p.add_argument("--force", action="store_true", help="release even if some expected owners have not submitted")
    p.add_argument("--no-wait", action="store_true", help="return at once; poll with `dpagg release status`")
    p.add_argument("--request-key", default="", metavar="KEY",
                   help="idempotency key (default: generated, kept in --state-dir until the release finishes, so "
                        "re-running after an interrupt attaches to the same release)")
    p.add_argument("--state-dir", default=os.environ.get("DPAGG_STATE_DIR", "~/.dpagg"), metavar="DIR",
                   help="where pending request keys are kept (env DPAGG_STATE_DIR; default ~/.dpagg)")
    p.add_argument("--computation", **comp)  # type: ignore[arg-type]
    p.add_argument("--json", action="store_true", help="print JSON")
    _tls_args(p)
    p = rsub.add_parser("status", help="show a release", description="show a release: state, epsilon, owners, "
                                                                       "partitions; exit 1 if it FAILED")
    p.set_defaults(func=cmd_release_status)
    p.add_argument("release", help="release id")
    p.add_argument("--computation", **comp)  # type: ignore[arg-type]
    p.add_argument("--json", action="store_true", help="print JSON")
    _tls_args(p)

    p = add("query", cmd_query, "analyst: list releases, show a summary, range counts with standard errors")
    p.add_argument("release", nargs="?", help="release id, or `latest` (the newest finished release of --study); "
                                              "omit with --list")
    p.add_argument("--list", action="store_true", help="list finished releases")
    p.add_argument("--study", help="with --list: only this study; with `latest`: the study whose newest release to read")
    p.add_argument("--range", type=_range, action="append", metavar="LO:HI",
                   help="bin range [LO, HI) to count (repeatable; default the whole domain)")
    p.add_argument("--show", action="store_true", help="also print the partitions and their noisy sums")
    p.add_argument("--table", action="store_true",
                   help="a join study's release: print the joint table (the default when no --range is given)")
    p.add_argument("--analyst", default=default_target(ENV_ANALYST),
                   help=f"analyst service host:port (env {ENV_ANALYST}, else {ENV_COMPUTATION}; default %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON")
    _tls_args(p)

    p = add("direct-query", cmd_direct_query, "analyst: noisy range counts straight from the encrypted aggregate "
                                              "(spends budget: max-overlap charge)")
    p.add_argument("study", help="study id")
    p.add_argument("--range", type=_range, action="append", metavar="LO:HI", required=True,
                   help="bin range [LO, HI) to count (repeatable)")
    p.add_argument("--epsilon", type=float, required=True, help="epsilon of each answer")
    p.add_argument("--force", action="store_true", help="count even if some expected owners have not submitted")
    p.add_argument("--request-key", help="idempotency key: a retry returns the first answers and charges nothing")
    p.add_argument("--computation", **comp)  # type: ignore[arg-type]
    p.add_argument("--json", action="store_true", help="print JSON")
    _tls_args(p)

    p = add("budget", cmd_budget, "show a study's privacy budget and ledger")
    p.add_argument("study", help="study id")
    p.add_argument("--verify", action="store_true",
                   help="check the ledger's hash chain; exit 1 if a charge row was changed, removed or replaced")
    p.add_argument("--decryption", **dec)  # type: ignore[arg-type]
    p.add_argument("--json", action="store_true", help="print JSON")
    _tls_args(p)

    led = add("ledger", lambda a: 2, "back up or verify the decryption server's budget ledger (offline, no TLS)")
    lsub = led.add_subparsers(dest="ledger_command", required=True, metavar="ACTION")
    p = lsub.add_parser("backup", help="copy the ledger of a (running) decryption server to one file and verify it",
                        description="Copy DATA_DIR/ledger.sqlite3 with SQLite's online backup (safe while the server "
                                    "runs), then verify the copy's hash chain. The copy holds contracts and charges, "
                                    "no key material.")
    p.set_defaults(func=cmd_ledger_backup)
    p.add_argument("--data-dir", required=True, help="the decryption server's data directory")
    p.add_argument("--out", required=True, type=Path, help="backup file to create (must not exist)")
    p = lsub.add_parser("verify", help="check a ledger file's hash chain (exit 1 if a row was altered)",
                        description="Check the hash chain of a ledger file or backup and list each study's spend; "
                                    "exit 1 if a charge row was changed, removed or replaced.")
    p.set_defaults(func=cmd_ledger_verify)
    p.add_argument("file", type=Path, help="ledger file (DATA_DIR/ledger.sqlite3) or a backup")
    p = lsub.add_parser("restore", help="put a backup in place of a stopped server's ledger, re-booking what it lost",
                        description="Restore a ledger backup. It rolls the ledger back, so it needs "
                                    "--acknowledge-rollback; every charge made since the backup is logged and its "
                                    "epsilon re-booked (a restore refunds nothing).")
    p.set_defaults(func=cmd_ledger_restore)
    p.add_argument("backup", type=Path, help="backup file made by `dpagg ledger backup`")
    p.add_argument("--data-dir", required=True, type=Path, help="the (stopped) decryption server's data directory")
    p.add_argument("--acknowledge-rollback", action="store_true", help="restore although it rolls the ledger back")

    p = add("health", cmd_health, "check a server's gRPC health (exit 0 when SERVING); for container probes")
    p.add_argument("target", help="host:port")
    p.add_argument("--service", default="", help="service name, e.g. dpagg.v1.Computation (default: the server)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait (default 5)")
    _tls_args(p)

    p = add("certs", cmd_certs, "create a private CA and one mutual-TLS certificate per party (keys 0600, never "
                                "printed)")
    p.add_argument("--out", required=True, help="directory for the party certificates and keys")
    p.add_argument("--ca", help="directory of the CA (dpagg-ca.crt/.key): reused if present, else created "
                                "(default: --out)")
    p.add_argument("--party", type=_party, action="append", required=True, metavar="ID:ROLE[:HOSTS]",
                   help="a party and its role (data_owner, computation, decryption, analyst, operator), optionally "
                        "the comma-separated host names it serves under (default: ID, localhost, 127.0.0.1); "
                        "repeatable")
    p.add_argument("--signing-keys", action="store_true",
                   help="also create an Ed25519 submission-signing key for every data_owner (ID.signing.key, 0600, "
                        "and ID.signing.pub); in a real deployment each owner runs `dpagg keygen` itself")
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

    p = add("sample-csv", cmd_sample_csv, "write seeded synthetic owner CSVs (person_id, age, income) for trying dpagg")
    p.add_argument("--out", required=True, help="directory to write owner-1.csv ... into")
    p.add_argument("--owners", type=int, default=3, help="number of files (default 3)")
    p.add_argument("--records", type=int, default=3000, help="records per file (default 3000)")
    p.add_argument("--seed", type=int, default=7, help="seed (default 7)")
    p.add_argument("--per-owner-dirs", action="store_true",
                   help="write OUT/owner-N/owner-N.csv (one directory per owner) instead of OUT/owner-N.csv")

    p = add("demo", cmd_demo, "run every party on loopback with three generated data owners, release, query")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of true vs released histogram (needs matplotlib)")
    p.add_argument("--owners", type=int, default=3, help="number of data owners (default 3)")
    p.add_argument("--records", type=int, default=3000, help="records per owner (default 3000)")
    p.add_argument("--domain", default="age:0:100:100", help="binning (default age:0:100:100)")
    p.add_argument("--epsilon", type=float, default=1.0, help="study budget (default 1.0)")
    p.add_argument("--seed", type=int, default=7, help="seed of the generated data (default 7)")
    p.add_argument("--data-dir", help="keep the servers' state here (default: a temporary directory)")
    p.add_argument("--insecure", action="store_true",
                   help="run the parties without mutual TLS (default: TLS with a throwaway CA in the data dir)")
    _seed_arg(p)

    # Method subcommands (epsilon guidance, audit, accounting, p-views) live in their own module.
    from .methods_cli import register as register_methods

    register_methods(sub)
    return ap


def _verbosity_first(argv: Sequence[str]) -> list[str]:
    """Accept -v/-vv/--verbose anywhere (before or after the subcommand) by moving them to the front."""
    flags = [a for a in argv if a == "--verbose" or (len(a) > 1 and a.startswith("-") and set(a[1:]) == {"v"})]
    return [*flags, *(a for a in argv if a not in flags)]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(_verbosity_first(sys.argv[1:] if argv is None else list(argv)))
    # Servers say what they do (start-up, commits, releases) at INFO; client commands stay quiet unless -v.
    base = logging.INFO if args.command.startswith("serve-") else logging.WARNING
    level = base - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args.func(args))
    except ServiceError as exc:
        print(f"dpagg: {exc.code.name}: {exc.details}", file=sys.stderr)
        return 1
    except DPAggError as exc:
        print(f"dpagg: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
