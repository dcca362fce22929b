"""Operator commands: opening studies and join studies, study status."""

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

    from .accuracy import open_study_preview

    guide = assess_epsilon(contract.epsilon)
    for w in guide.warnings:
        print(f"warning: {w}", file=sys.stderr)
    preview_lines, preview = open_study_preview(contract)
    if args.json:
        print_json({**contract.to_dict(), "contract_hash": contract.contract_hash, "already_existed": existed,
                     "noise_multiplier": contract.noise_multiplier, "accuracy_preview": preview,
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
        print("\n".join(preview_lines))
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


def cmd_status(args: argparse.Namespace) -> int:
    from ..computation.client import ComputationClient

    with ComputationClient(args.computation, **conn(args)) as cs:
        st = cs.study_status(args.study)
        cs_log = _charge_log(cs, args.study)
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
        if cs_log is not None:  # t-of-N: what is left, the one view (parties/cli/budgets.py)
            from .budgets import log_status_line
            print(f"  {log_status_line(c.epsilon, cs_log)}")
    return 0


def _charge_log(cs: Any, study_id: str) -> tuple[int, str] | None:
    """The CS's (charges, spent) of a t-of-N study's signed log; None otherwise or when this role may not read it."""
    from ..common.errors import ServiceError

    try:
        entries, spent = cs.charge_log(study_id)
    except ServiceError:
        return None
    return (entries, spent) if spent else None



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
