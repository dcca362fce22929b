"""Data-owner commands: submit a CSV, submit one side of a join study, write sample CSVs."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

from he_partition.core.errors import DPAggError

from ..common.config import ENV_DECRYPTION
from ..data_owner.join_quota import DEFAULT_PARTNER_FACTOR
from .options import (bounding_random, domain_spec, ENV_STATE_DIR, Subparsers, command_adder, computation_target, conn,
                      positive_int, print_json,
                      server_address, state_dir, tls_args, tls_config, upload_key, upload_key_path)


def _record_count(text: str) -> int:
    """argparse type of --max-partner-records: a whole number of records >= 1."""
    try:
        n = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of records") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"give a number of records >= 1, got {n}")
    return n


def cmd_join_submit(args: argparse.Namespace) -> int:
    """A join owner's whole side: key agreement, pseudonyms, placement, encrypted signed upload (waits for the peer)."""
    from ..computation.client import ComputationClient
    from ..data_owner.client import DataOwnerClient
    from ..data_owner.domain import DomainSpec
    from ..data_owner.join import join_quotas, read_join_csv, submit_join
    from ..decryption.client import DecryptionClient

    tls = tls_config(args)
    with ComputationClient(args.computation, **conn(args)) as cs:
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
        # Both sides' counts and the other owner's quota, shown and accepted (or refused) before anything is sent.
        quotas = join_quotas(contract, args.owner, len(recs.values), max_partner_records=args.max_partner_records)
        if not args.json:
            print(f"{args.csv}: {recs.records_read} records read, {recs.out_of_domain} outside the domain or "
                  f"unreadable; joining {len(recs.values)}", file=sys.stderr, flush=True)
            print(quotas.describe(), file=sys.stderr, flush=True)
        quotas.check()
        if not args.json:
            print("waiting for the other owner if needed", file=sys.stderr, flush=True)
        signing_key = None
        if args.signing_key:
            from ..common.signing import load_private_key

            signing_key = load_private_key(args.signing_key)
        holders = [DecryptionClient(target, tls=tls, insecure=args.insecure) for target in args.key_holders]
        if holders and len(holders) != len(contract.holder_seal_keys):
            raise DPAggError(f"join study {args.study} has {len(contract.holder_seal_keys)} key-share holders; "
                             f"{len(holders)} --key-holder given (one per holder, in the study's holder order)")
        try:
            with DataOwnerClient(args.owner, computation=cs, decryption=args.decryption, tls=tls,
                                 insecure=args.insecure, signing_key=signing_key, progress=False) as owner:
                res = submit_join(owner, args.study, recs.values, idempotency_key=upload_key(args),
                                  state_dir=state_dir(args), wait_timeout=args.wait,
                                  max_partner_records=args.max_partner_records, key_holders=holders or None)
        finally:
            for h in holders:
                h.close()
    if args.json:
        print_json({"study_id": res.study_id, "owner_id": res.owner_id, "committed": res.committed,
                     "duplicate": res.duplicate, "chunks": res.chunk_count, "bytes_sent": res.bytes_sent,
                     "records": len(recs.values), "quotas": quotas.as_dict()})
    elif res.duplicate:
        print(f"{args.owner} had already submitted to join study {args.study}; nothing sent")
    else:
        print(f"{args.owner} submitted {len(recs.values)} records to join study {args.study}: {res.chunk_count} "
              f"ciphertexts, {res.bytes_sent / 1e6:.1f} MB")
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
    from ..computation.client import ComputationClient
    from ..common.errors import ServiceError
    from ..data_owner.client import RESUMABLE_CODES, DataOwnerClient, SubmitInterrupted
    from ..data_owner.dataset import ContributionBounds, read_histogram
    from ..data_owner.domain import DomainSpec

    tls = tls_config(args)
    with ComputationClient(args.computation, tls=tls, insecure=args.insecure) as cs:
        contract = cs.study_status(args.study).contract
        domain_text = args.domain or contract.domain_spec
        if not domain_text:
            raise DPAggError(f"study {args.study} records no domain spec; pass --domain COLUMN:LO:HI:BINS")
        domain = DomainSpec.parse(domain_text)
        if args.value_column:
            domain = dataclasses.replace(domain, column=args.value_column)
        bounds = ContributionBounds(per_bin=args.per_bin, max_bins=args.max_bins)
        key = upload_key(args)
        hist = read_histogram(args.csv, domain, person_column=args.person_column, bounds=bounds,
                              on_bad_value="drop" if args.drop_bad_values else "error", drop_hint="--drop-bad-values",
                              rng=bounding_random(args, key))  # a re-run keeps the same records, so it resumes
        _check_careless_csv(args, hist)
        if not args.json:
            print(f"{args.csv}: {hist.records_read} records read, {hist.out_of_domain} outside the domain or "
                  f"unreadable, {hist.records_dropped} dropped by the contribution bound; submitting {hist.total} "
                  f"to study {args.study} (final: a study counts one submission per owner)", file=sys.stderr,
                  flush=True)
        signing_key = None
        if args.signing_key:
            from ..common.signing import load_private_key

            signing_key = load_private_key(args.signing_key)
        with DataOwnerClient(args.owner, computation=cs, decryption=args.decryption, tls=tls, insecure=args.insecure,
                             signing_key=signing_key, progress=not args.no_progress and not args.json,
                             streams=args.streams) as owner:
            try:
                res = owner.submit(args.study, hist, idempotency_key=key, resume_dir=state_dir(args))
            except ServiceError as exc:
                if exc.code in RESUMABLE_CODES and not args.json:  # said only where a re-run can resume
                    print(f"upload key {key} kept in {state_dir(args)} (--state-dir): re-running this command "
                          "resumes the upload instead of sending it twice", file=sys.stderr, flush=True)
                raise
            except SubmitInterrupted as stop:
                print(f"\n{stop}.\nRun the same command again to resume: it sends only the chunks the server lacks "
                      f"(the encrypted chunks are kept in {state_dir(args)} until the upload commits).",
                      file=sys.stderr)
                return 130
    sent = upload_key_path(args).with_suffix(".sent")  # what this machine submitted: a digest of the CSV file
    digest = _file_digest(args.csv)
    if not res.duplicate:
        sent.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        sent.write_text(digest + "\n")
    elif sent.is_file() and sent.read_text().strip() != digest:
        raise DPAggError(f"{args.owner} already submitted another file to study {args.study} (upload {key}); "
                         f"the records in {args.csv} differ and were NOT sent: a study counts one submission per "
                         "owner")
    if args.json:
        print_json({"study_id": res.study_id, "owner_id": res.owner_id, "idempotency_key": res.idempotency_key,
                     "committed": res.committed, "duplicate": res.duplicate, "chunks": res.chunk_count,
                     "chunks_sent": res.chunks_sent,
                     "bytes_sent": res.bytes_sent, "records_read": hist.records_read,
                     "records_dropped": hist.records_dropped, "out_of_domain": hist.out_of_domain})
    elif res.duplicate:
        print(f"{args.owner} had already submitted to study {args.study} (upload {key}); nothing sent. "
              "A study counts one submission per owner.")
        if not sent.is_file():  # submitted from elsewhere: this machine cannot tell whether the data is the same
            print(f"warning: if {args.csv} is not the data {args.owner} submitted, it was ignored", file=sys.stderr)
    else:
        print(f"{args.owner} submitted {hist.total} records ({hist.records_dropped} dropped by the contribution "
              f"bound, {hist.out_of_domain} outside the domain) to study {args.study}: {res.chunk_count} ciphertext "
              f"chunk(s), {res.bytes_sent / 1e6:.2f} MB, upload {key}")
    return 0


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cmd_sample_csv(args: argparse.Namespace) -> int:
    from ..data_owner.dataset import write_sample_csv

    out = Path(args.out)
    for i in range(args.owners):
        name = f"owner-{i + 1}"
        where = out / name if args.per_owner_dirs else out
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"{name}.csv"
        write_sample_csv(path, seed=args.seed, n_records=args.records, owner_index=i)
        print(path)
    return 0



def add_parser(sub: Subparsers) -> None:
    """Add this group's commands to the `dpagg` parser."""
    add = command_adder(sub)
    comp = computation_target()
    p = add("join-submit", cmd_join_submit, "join owner: pseudonymize, get a placement, encrypt and upload your "
                                             "side of a join study (waits for the other owner)")
    p.add_argument("--study", required=True, help="join study id")
    p.add_argument("--owner", required=True, help="your owner id")
    p.add_argument("--csv", required=True, type=Path, help="CSV with a header row")
    p.add_argument("--id-column", help="identifier column (default: the study's)")
    p.add_argument("--value-column", metavar="NAME", help="the attribute column (default: the one your binning names)")
    p.add_argument("--domain", type=domain_spec, help="your binning (default: the study's for your side)")
    p.add_argument("--drop-bad-values", action="store_true",
                   help="skip rows with an empty identifier or value or a wrong number of fields")
    p.add_argument("--wait", type=float, default=600.0, help="seconds to wait for the other owner (default 600)")
    p.add_argument("--max-partner-records", type=_record_count, default=None, metavar="N",
                   help="the most records you let the other owner claim: its quota of oblivious evaluations (its "
                        "declared records plus the dummies' allowance, or the capacity when the study declares no "
                        "counts) is how many guessed identifiers it could test against your list with the "
                        "computation server; above N plus that allowance, nothing is sent (default "
                        f"{DEFAULT_PARTNER_FACTOR} x your records; both sides' counts are printed first)")
    p.add_argument("--idempotency-key", help="upload key (default: kept in the state dir)")
    p.add_argument("--state-dir", help=f"where the upload key and your join key are kept (env {ENV_STATE_DIR}; "
                                       "default ~/.dpagg)")
    p.add_argument("--signing-key", default=os.environ.get("DPAGG_SIGNING_KEY"), metavar="PATH",
                   help="your Ed25519 signing key (env DPAGG_SIGNING_KEY)")
    p.add_argument("--computation", **comp)
    p.add_argument("--decryption", default=os.environ.get(ENV_DECRYPTION) or None, metavar="HOST:PORT",
                   type=server_address,
                   help="the decryption server (key holder): it evaluates the study's oblivious pseudonyms, so a "
                        "join study opened with them needs it; the join key is fetched from it too (without it, "
                        "through the computation server; its fingerprint is checked either way)")
    p.add_argument("--key-holder", action="append", default=[], metavar="HOST:PORT", type=server_address,
                   dest="key_holders",
                   help="a key-share holder of the study, once per holder in the study's holder order (the order its "
                        "contract pins their seal keys; `dpagg status` shows them): with key-share holders the "
                        "pseudonyms are evaluated by them, each page by t of them")
    p.add_argument("--json", action="store_true", help="print JSON")
    tls_args(p)

    p = add("submit", cmd_submit, "data owner: bin a CSV, bound contributions, encrypt, upload (resumable)")
    p.add_argument("--study", required=True, help="study id")
    p.add_argument("--owner", required=True, help="your owner id (as listed in the study)")
    p.add_argument("--csv", required=True, type=Path, help="CSV file with a header row")
    p.add_argument("--domain", type=domain_spec, help="binning (default: the study's recorded domain spec)")
    p.add_argument("--person-column", help="column identifying a person (default: every record is a person)")
    p.add_argument("--per-bin", type=int, default=1, help="max records of one person per bin (default 1)")
    p.add_argument("--max-bins", type=int, default=1, help="max bins one person counts in (default 1)")
    p.add_argument("--value-column", metavar="NAME",
                   help="the CSV column holding the study's value (default: the column the domain spec names)")
    p.add_argument("--drop-bad-values", action="store_true",
                   help="skip records with an empty or non-numeric value, no person id, or a wrong number of "
                        "fields (default: stop at the first, naming its line)")
    p.add_argument("--accept-out-of-domain", action="store_true",
                   help=f"submit even when more than {MAX_OUT_OF_DOMAIN_SHARE:.0%}% of the records fall outside the "
                        "domain (refused by default: usually a wrong column or unit)")
    p.add_argument("--idempotency-key", help="upload key (default: kept in the state dir, so a re-run resumes)")
    p.add_argument("--state-dir", help=f"where upload keys and the encrypted chunks of an unfinished upload are "
                                       f"kept, so a re-run resumes (env {ENV_STATE_DIR}; default ~/.dpagg)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--streams", type=positive_int, default=None, metavar="N",
                   help="upload streams at once, each taking the next chunk none has taken (default: 1 for small "
                        "uploads, up to 4 for large ones, one per 64 chunks)")
    p.add_argument("--signing-key", default=os.environ.get("DPAGG_SIGNING_KEY"), metavar="PATH",
                   help="your Ed25519 signing key (from `dpagg keygen`); required by signed studies "
                        "(env DPAGG_SIGNING_KEY)")
    p.add_argument("--computation", **comp)
    p.add_argument("--decryption", default=os.environ.get(ENV_DECRYPTION) or None, metavar="HOST:PORT",
                   type=server_address,
                   help="fetch the study key from the decryption server directly (env "
                        f"{ENV_DECRYPTION}); default: through the computation server. Either way its fingerprint "
                        "must match the study contract's")
    p.add_argument("--json", action="store_true", help="print JSON")
    tls_args(p)

    p = add("sample-csv", cmd_sample_csv, "write seeded synthetic owner CSVs (person_id, age, income) for trying dpagg")
    p.add_argument("--out", required=True, help="directory to write owner-1.csv ... into")
    p.add_argument("--owners", type=int, default=3, help="number of files (default 3)")
    p.add_argument("--records", type=int, default=3000, help="records per file (default 3000)")
    p.add_argument("--seed", type=int, default=7, help="seed (default 7)")
    p.add_argument("--per-owner-dirs", action="store_true",
                   help="write OUT/owner-N/owner-N.csv (one directory per owner) instead of OUT/owner-N.csv")
