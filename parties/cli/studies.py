"""Operator commands: certificates and signing keys, opening studies and join studies, study status."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from he_partition.core.errors import DPAggError
from he_partition.join.protocol import DEFAULT_JOIN_RELEASE, JOIN_ORDERS, JOIN_RELEASES

if TYPE_CHECKING:
    from ..common.contract import StudyContract

from .holder_words import holder_counts, noise_tolerates_line
from .options import (domain_size, domain_spec, Subparsers, approval_key, approval_key_arg, command_adder,
                      computation_target, conn, nonempty_id, owner_list, print_json, tls_args)


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


def cmd_open_study(args: argparse.Namespace) -> int:
    from ..computation.client import ComputationClient

    domain_size = args.domain_size
    if args.domain:
        from ..data_owner.domain import DomainSpec

        n = DomainSpec.parse(args.domain).n_bins
        if domain_size and domain_size != n:
            raise DPAggError(f"--domain {args.domain} has {n} bins but --domain-size says {domain_size}")
        domain_size = n
    if not domain_size:
        raise DPAggError("give the domain: --domain COLUMN:LO:HI:BINS (or --domain-size N)")
    owner_keys = _owner_keys(args)
    correlation = _correlation_terms(args)
    with ComputationClient(args.computation, approval_key=approval_key(args), **conn(args)) as cs:
        contract, existed = cs.open_study(
            study_id=args.study_id or "", domain_size=domain_size, epsilon=args.epsilon, expected_owners=args.owners,
            strategy=args.strategy, contribution_bound=args.contribution_bound, noise_parties=args.noise_parties,
            strategy_params_json=args.strategy_params or "", domain_spec=args.domain or "", owner_keys=owner_keys,
            max_organizations=args.max_organizations, noise_tolerates=args.noise_tolerates, **correlation)
        holders = holder_counts(cs, contract) if contract.noise_tolerates and not args.json else (0, 0)
    from he_partition.methods.guidance import assess_epsilon

    guide = assess_epsilon(contract.epsilon)
    for w in guide.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.json:
        print_json({**contract.to_dict(), "contract_hash": contract.contract_hash, "already_existed": existed,
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
        if contract.noise_tolerates:
            print(noise_tolerates_line(contract, *holders))
        if guide.warnings or not guide.guessing_bound_is_vacuous:  # else nothing worth a line (`dpagg epsilon`)
            alpha = "" if guide.guessing_bound_is_vacuous else (
                f"; an adversary rounding one is wrong with probability at most alpha = {guide.guessing_bound:.4g} "
                "(4/(e^eps-1)^2, a Chebyshev bound: the smaller alpha, the weaker the protection)")
            print(f"epsilon {contract.epsilon:g}: any unbiased estimate of one count has variance >= "
                  f"{guide.variance_lower_bound:.4g} (1/(e^eps-1)^2){alpha}; see `dpagg epsilon`")
        print(f"contract hash {contract.contract_hash}")
        print(f"key fingerprint {contract.context_fingerprint}")
    return 0


def _join_capacity(capacity: int | None, max_records: str | None, padding_epsilon: float, offset: int) -> int:
    """--capacity as given, or sized from --max-records (he_partition.join.protocol.capacity_for)."""
    from he_partition.join.protocol import capacity_for

    if (capacity is None) == (max_records is None):
        raise DPAggError("open-join needs exactly one of --capacity and --max-records N_A,N_B")
    if capacity is not None:
        return capacity
    try:
        counts = [int(x) for x in str(max_records).split(",")]
    except ValueError:
        raise DPAggError(f"--max-records must be two whole numbers N_A,N_B, got {max_records!r}") from None
    return capacity_for(counts, padding_epsilon, offset)


def cmd_open_join(args: argparse.Namespace) -> int:
    """Open a join study: two owners, a rows x cols table of their attributes over the customers both hold."""
    from ..computation.client import ComputationClient
    from ..data_owner.domain import DomainSpec

    if len(args.owners) != 2:
        raise DPAggError(f"a join study has exactly two owners (rows, then columns), got {len(args.owners)}")
    rows, cols = DomainSpec.parse(args.rows).n_bins, DomainSpec.parse(args.cols).n_bins
    order = args.order
    if order == "auto":
        order = "hilbert" if rows == cols and not rows & (rows - 1) else "row"
    from he_partition.join.protocol import CURRENT_JOIN_VERSION, min_padding_offset, padding_delta

    offset = args.padding_offset if args.padding_offset is not None else min_padding_offset(args.padding_epsilon)
    args.capacity = _join_capacity(args.capacity, args.max_records, args.padding_epsilon, offset)
    terms = {"shape": [rows, cols], "capacity": args.capacity, "padding_epsilon": args.padding_epsilon,
             "padding_offset": offset, "padding_delta": padding_delta(args.padding_epsilon, offset), "row_spec": args.rows, "col_spec": args.cols,
             "identifier": args.id_column, "release": args.release, "order": order,
             "join_version": CURRENT_JOIN_VERSION, "pseudonyms": "oprf"}
    if args.max_records is not None:  # each owner's quota of oblivious evaluations follows its declared records
        terms["max_records"] = [int(x) for x in str(args.max_records).split(",")]
    with ComputationClient(args.computation, approval_key=approval_key(args), **conn(args)) as cs:
        contract, existed = cs.open_study(
            study_id=args.study_id or "", domain_size=rows * cols, epsilon=args.epsilon, expected_owners=args.owners,
            strategy="join", contribution_bound=1, strategy_params_json=json.dumps(terms),
            owner_keys=_owner_keys(args))
    if args.json:
        print_json({**contract.to_dict(), "contract_hash": contract.contract_hash, "already_existed": existed})
        return 0
    print(f"join study {contract.study_id} {'already open' if existed else 'opened'}: {rows} x {cols} table of "
          f"{args.owners[0]}'s {args.rows} by {args.owners[1]}'s {args.cols} over the {args.id_column} values both "
          f"hold; epsilon {contract.epsilon:g} ({args.padding_epsilon:g} booked now for the padding that hides the "
          f"intersection size), capacity {args.capacity} records; released with {args.release} ({order} order)")
    print(f"contract hash {contract.contract_hash}")
    print(f"key fingerprint {contract.context_fingerprint}")
    return 0


def _correlation_line(contract: "StudyContract") -> str:
    return (f"correlated records: max leakage L = {contract.correlation_leakage:g}, noise multiplier "
            f"{contract.noise_multiplier:g} (epsilon {contract.epsilon:g} is Bayesian DP under the Gaussian "
            f"correlation model; each release's noise is {contract.noise_multiplier:g}x that of plain DP)"
            + (f"; model {contract.correlation_source}" if contract.correlation_source else ""))


def _load_adjacency(path: str) -> Any:
    """A weighted adjacency matrix, read as `dpagg bayes-scale` reads it (.csv, .npy or JSON)."""
    from .methods import load_matrix

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


def cmd_status(args: argparse.Namespace) -> int:
    from ..computation.client import ComputationClient

    with ComputationClient(args.computation, **conn(args)) as cs:
        st = cs.study_status(args.study)
    if args.json:
        print_json({"contract": st.contract.to_dict(), "contract_hash": st.contract.contract_hash,
                     "submitted_owners": list(st.submitted_owners), "missing_owners": list(st.missing_owners),
                     "release_ids": list(st.release_ids), "key_holders": st.key_holders,
                     "holders_per_measurement": st.holders_per_measurement})
    else:
        c = st.contract
        print(f"study {c.study_id}: {c.domain_size} bins{f' ({c.domain_spec})' if c.domain_spec else ''}, "
              f"epsilon {c.epsilon:g}, contract {c.contract_hash[:16]}")
        if c.correlated or c.correlation_source:
            print(f"  {_correlation_line(c)}")
        if c.noise_tolerates:
            print(f"  {noise_tolerates_line(c, st.key_holders, st.holders_per_measurement)}")
        from ..analyst.join_table import join_shape_line

        if (shape := join_shape_line(c)) is not None:
            print(f"  {shape}")
        print(f"  contract hash   {c.contract_hash}")
        print(f"  key fingerprint {c.context_fingerprint}")
        print(f"  submitted: {', '.join(st.submitted_owners) or '-'}")
        print(f"  missing:   {', '.join(st.missing_owners) or '-'}")
        print(f"  releases:  {', '.join(st.release_ids) or '-'}")
    return 0



def add_parser(sub: Subparsers) -> None:
    """Add this group's commands to the `dpagg` parser."""
    add = command_adder(sub)
    comp = computation_target()
    p = add("open-study", cmd_open_study, "open a study (operator)")
    p.add_argument("--computation", **comp)
    p.add_argument("--study-id", type=nonempty_id, help="study id (default: generated)")
    p.add_argument("--domain", type=domain_spec, help="binning every owner uses, COLUMN:LO:HI:BINS (e.g. age:0:100:50), "
                                    "COLUMN:edges:E0,E1,... or COLUMN:categories:A,B,...")
    p.add_argument("--domain-size", type=domain_size, default=0, help="number of bins, if no --domain is recorded")
    p.add_argument("--epsilon", type=float, required=True, help="total privacy budget of the study")
    p.add_argument("--owners", type=owner_list, required=True, help="expected data owner ids, comma-separated")
    p.add_argument("--contribution-bound", type=int, default=1,
                   help="max records per person in one owner's data (owners bound with per_bin*max_bins = this)")
    p.add_argument("--max-organizations", type=int, default=1, metavar="K",
                   help="the most data owners one person may appear in (default 1); every sensitivity is "
                        "multiplied by K, since each owner bounds its own records")
    p.add_argument("--noise-parties", type=int, choices=(2,), default=2,
                   help="both servers add noise (2, the only value a study accepts: with one, the computation "
                        "server would hold exact values)")
    p.add_argument("--noise-tolerates", type=int, default=None, metavar="T",
                   help="threshold mode (K key-share holders): how many holders may collude with the computation "
                        "server while the holders' noise still gives every value one full discrete Laplace draw, "
                        "0..K-1 (default K-1, the coalition the key tolerates; 0 with a single decryption server). "
                        "Cost: the holders' noise variance is K/(K-T) draws instead of 1")
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
                      help="correlated records (Bayesian DP): weighted adjacency W of the records' Gaussian correlation "
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
    approval_key_arg(p)
    tls_args(p)

    p = add("open-join", cmd_open_join, "open a join study (operator): the DP table of two owners' attributes over "
                                         "the customers both hold (docs/join.md)")
    p.add_argument("--computation", **comp)
    p.add_argument("--study-id", type=nonempty_id, help="study id (default: generated)")
    p.add_argument("--owners", type=owner_list, required=True, help="the two owners, rows first: A,B")
    p.add_argument("--rows", required=True, metavar="SPEC", help="the first owner's binning (rows), e.g. age:17:97:16")
    p.add_argument("--cols", required=True, metavar="SPEC",
                   help="the second owner's binning (columns), e.g. education:1:17:16")
    p.add_argument("--id-column", default="id", help="the identifier column both owners join on (default id)")
    p.add_argument("--capacity", type=int, default=None,
                   help="public bound on the records of both owners together, a multiple of 8192 (each owner "
                        "encrypts capacity/8192 x its bins ciphertexts); or give --max-records")
    p.add_argument("--max-records", default=None, metavar="N_A,N_B",
                   help="each owner's largest record count: the capacity is sized for them and the padding, and "
                        "checked before the study opens (instead of --capacity); each owner's quota of oblivious "
                        "pseudonym evaluations is its count plus its dummies' allowance (with --capacity alone: the "
                        "capacity); each owner's join-submit shows both counts and takes part only if the other's "
                        "quota is within its --max-partner-records (default 4 x its own records)")
    p.add_argument("--epsilon", type=float, required=True, help="total budget: padding plus the table's release")
    p.add_argument("--padding-epsilon", type=float, default=0.1,
                   help="epsilon booked at once for the dummy padding that hides the intersection size from the "
                        "computation server (default 0.1)")
    p.add_argument("--padding-offset", type=int, default=None,
                   help="mean number of dummy records of each kind (default: the smallest offset whose delta is at "
                        "most 1e-6, e.g. 428 at padding epsilon 0.1; docs/join.md)")
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
    approval_key_arg(p)
    tls_args(p)

    p = add("status", cmd_status, "show a study: contract, who submitted, releases")
    p.add_argument("study", help="study id")
    p.add_argument("--computation", **comp)
    p.add_argument("--json", action="store_true", help="print JSON")
    tls_args(p)

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
