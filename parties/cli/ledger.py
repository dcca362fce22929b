"""The privacy-budget ledger: a study's budget over gRPC, and offline backup / verify of the ledger file."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from he_partition.core.accounting import epsilon_left

from he_partition.core.errors import DPAggError

from ..common.config import ENV_COMPUTATION, ENV_DECRYPTION, default_target
from .budgets import HolderView, budget_json, budget_lines, check_receipts, holder_endpoint, view_of
from .options import Subparsers, command_adder, conn, decryption_target, print_json, server_address, tls_args

if TYPE_CHECKING:
    from ..common.receipts import Receipt
    from ..decryption.client import BudgetInfo


def _receipts_target(args: argparse.Namespace) -> str | None:
    """The computation server whose receipts --verify checks: --computation, else $DPAGG_COMPUTATION, else none."""
    if args.computation:
        return str(args.computation)
    return default_target(ENV_COMPUTATION) if os.environ.get(ENV_COMPUTATION) else None


def _cs_receipts(args: argparse.Namespace) -> list[Receipt] | None:
    """Every receipt the computation server keeps for the study (all holders' books), or None when not asked."""
    from ..computation.client import ComputationClient

    target = _receipts_target(args)
    if target is None:
        return None
    with ComputationClient(target, **conn(args)) as cs:
        return [r for _, kept in cs.ledger_receipts(args.study) for r in kept]


def _cs_charge_log(args: argparse.Namespace) -> tuple[int, str] | None:
    """t-of-N: the computation server's (charges, spent) of the study's signed log, when a computation server is
    known (--computation, $DPAGG_COMPUTATION) and answers; None otherwise (the report then says nothing of it)."""
    from ..common.errors import ServiceError
    from ..computation.client import ComputationClient

    target = _receipts_target(args)
    if target is None:
        return None
    try:
        with ComputationClient(target, **conn(args)) as cs:
            entries, spent = cs.charge_log(args.study)
    except ServiceError as exc:
        print(f"dpagg: could not read the computation server's charge log ({exc.code.name}: {exc.details})",
              file=sys.stderr)
        return None
    return (entries, spent) if spent else None


#: Error codes of a holder that could not be reached at the address tried (`HolderView.error` starts with one).
_UNREACHABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED")

_NOT_CHECKED = ("ledger NOT checked against the computation server's signed receipts (give --computation HOST:PORT "
                f"or set {ENV_COMPUTATION}): a ledger rolled back to an older copy keeps an intact hash chain")


def _holders_from_computation(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The key-share holders the computation server asks (name, HOST:PORT), when no holder is named (no
    --decryption, no $DPAGG_DECRYPTION) and a computation server is (--computation, $DPAGG_COMPUTATION); [] when
    it has one decryption server, reports no addresses, or cannot be asked (then the default address is used)."""
    from ..common.errors import ServiceError
    from ..computation.client import ComputationClient

    target = _receipts_target(args)
    if args.decryption or os.environ.get(ENV_DECRYPTION) or target is None:
        return []
    try:
        with ComputationClient(target, **conn(args)) as cs:
            holders = cs.key_holders(args.study)
    except ServiceError as exc:
        print(f"dpagg: could not ask the computation server {target} for its key holders ({exc.code.name}: "
              f"{exc.details}); name them with --decryption NAME=HOST:PORT", file=sys.stderr)
        return []
    if len(holders) < 2 or not all(name and address for name, address in holders):
        return []  # the single decryption server: its default address (the server's may be a compose name)
    return holders


def cmd_budget(args: argparse.Namespace) -> int:
    from ..decryption.client import DecryptionClient

    found_at = _holders_from_computation(args)
    endpoints = args.decryption or found_at or [holder_endpoint(default_target(ENV_DECRYPTION))]
    if len(endpoints) > 1:
        return _budget_across_holders(args, endpoints, from_computation=bool(found_at))
    if args.reconcile:
        raise DPAggError("--reconcile brings key-share holders level with each other: give every holder with "
                         "--decryption (a single decryption server has no other holder to reconcile with)")
    with DecryptionClient(endpoints[0][1], **conn(args)) as ds:
        b = ds.budget(args.study)
    receipts = _cs_receipts(args) if args.verify else None
    name = endpoints[0][0] if endpoints[0][0] != endpoints[0][1] else f"the decryption server ({endpoints[0][1]})"
    found = check_receipts(args.study, [HolderView(name, endpoints[0][1], b)], receipts) \
        if receipts is not None else None
    if args.json:
        out = {"study_id": b.study_id, "total": b.total, "spent": b.spent, "remaining": b.remaining,
               "available": b.available, "charges": [vars(c) for c in b.charges], "chain_problem": b.chain_problem}
        if found is not None:
            out.update(rolled_back=found.rolled_back, receipt_notes=found.notes)
        print_json(out)
    else:
        left = epsilon_left(b.available, b.total)
        print(f"study {b.study_id}: spent {b.spent:.12g} of {b.total:.12g}; a new release may spend {left}"
              + (f" (nothing usable is left; exactly {b.available:.3g})" if left == "0" and b.available else ""))
        for n, c in enumerate(b.charges, 1):  # numbered within the study (ledger rows are numbered globally)
            print(f"  #{n} {c.created_at} release {c.release_id}: {c.kind} {c.epsilon:.12g}")
    if args.verify:
        failed = False
        if b.chain_problem:
            print(f"dpagg: ledger hash chain BROKEN: {b.chain_problem}", file=sys.stderr)
            failed = True
        if found is None:
            print(f"dpagg: {_NOT_CHECKED}", file=sys.stderr)
        else:
            for line in found.rolled_back:
                print(line if not args.json else f"dpagg: {line}", file=sys.stdout if not args.json else sys.stderr)
            for note in found.notes:
                print(f"dpagg: {note}", file=sys.stderr)
            failed = failed or bool(found.rolled_back)
        if failed:
            return 1
        if not args.json:
            print("ledger hash chain verified (every charge row commits to the previous one)")
            if found is not None and not found.notes:
                print(f"ledger holds every charge the computation server holds a signed receipt for "
                      f"({_receipt_count(receipts)})")
    return 0


def _receipt_count(receipts: list[Receipt] | None) -> str:
    n = len(receipts or [])
    return f"{n} receipt" + ("" if n == 1 else "s")


def _budget_across_holders(args: argparse.Namespace, endpoints: list[tuple[str, str]], *,
                           from_computation: bool = False) -> int:
    """Every key-share holder's view of the study; exit 1 on a disagreement, a rollback (or a broken chain) with
    --verify. With --reconcile, first book at each holder the charges it missed (other holders' signed receipts).
    `from_computation`: the endpoints are the computation server's own addresses for the holders (a holder that
    cannot be reached at one is named with the address tried, and --decryption overrides them)."""
    from ..decryption.client import DecryptionClient

    names = [name for name, _ in endpoints]
    if len(set(names)) != len(names):
        raise DPAggError(f"--decryption names a holder twice ({', '.join(names)}); give each holder once")
    if args.reconcile and _receipts_target(args) is None:
        raise DPAggError("--reconcile books charges from the computation server's signed receipts: give "
                         f"--computation HOST:PORT (or set {ENV_COMPUTATION})")

    def fetch(address: str) -> BudgetInfo:
        with DecryptionClient(address, **conn(args)) as ds:
            return ds.budget(args.study)

    def ask(name: str, address: str) -> HolderView:
        view = view_of(name, address, fetch)
        if from_computation and view.budget is None and view.error.startswith(_UNREACHABLE):
            view = replace(view, error=f"{view.error} [{address} is the address the computation server "
                                      f"{_receipts_target(args)} has for {name}; it may not resolve from here (a "
                                      "compose service name): name every holder with --decryption "
                                      "NAME=HOST:PORT, which overrides the computation server's addresses]")
        return view

    if from_computation:
        print(f"dpagg: key holders from the computation server {_receipts_target(args)}: "
              + ", ".join(f"{n}={a}" for n, a in endpoints) + " (--decryption NAME=HOST:PORT overrides them)",
              file=sys.stderr)
    views = [ask(name, address) for name, address in endpoints]
    receipts = _cs_receipts(args) if args.verify or args.reconcile else None
    found = check_receipts(args.study, views, receipts) if receipts is not None else None
    if args.reconcile and found is not None:
        broken = [v.name for v in views if v.budget is None or v.budget.chain_problem]
        if found.rolled_back or broken:
            for line in found.rolled_back:
                print(line)
            print("dpagg: nothing reconciled: " + ("a ledger was rolled back (restore the newest ledger or "
                  "`dpagg ledger restore --acknowledge-rollback` it first)" if found.rolled_back else
                  f"holder(s) {', '.join(broken)} did not answer or have a broken hash chain"), file=sys.stderr)
            return 1
        for line in found.missed_lines():
            print(line)
        address = dict(endpoints)
        for name, proofs in found.proofs.items():
            with DecryptionClient(address[name], **conn(args)) as ds:
                booked, spent = ds.reconcile_charges(args.study, proofs)
            print(f"reconciled {name}: booked {len(booked)} charge(s)"
                  + (f" ({'; '.join(f'#{c.charge_id} release {c.release_id} {c.kind} {c.epsilon:.12g}' for c in booked)})"
                     if booked else "") + f"; it has spent {spent:.12g} now")
        if not found.proofs:
            print("nothing to reconcile: no holder lacks a charge the others hold signed receipts for")
        views = [ask(name, address) for name, address in endpoints]
        found = check_receipts(args.study, views, receipts or [])
    cs_log = _cs_charge_log(args) if any(v.budget is not None and v.budget.key_threshold for v in views) else None
    report = budget_json(args.study, views, found, cs_log)
    if args.json:
        print_json(report)
    else:
        print("\n".join(budget_lines(args.study, views, found, cs_log)))
    broken = [f"{v.name}: {v.budget.chain_problem}" for v in views if v.budget and v.budget.chain_problem]
    if args.verify:
        for b in broken:
            print(f"dpagg: ledger hash chain BROKEN at holder {b}", file=sys.stderr)
        if found is None:
            print(f"dpagg: {_NOT_CHECKED}", file=sys.stderr)
        else:
            for note in found.notes:
                print(f"dpagg: {note}", file=sys.stderr)
        if broken or not report["agree"] or (found is not None and found.rolled_back):
            return 1
        if not args.json:
            print(f"ledger hash chains verified at all {len(views)} holders (every charge row commits to the "
                  "previous one)" + ("" if found is None or found.notes else
                                     f"; every ledger holds each charge its holder signed a receipt for "
                                     f"({_receipt_count(receipts)} at the computation server)"))
    return 0


def cmd_ledger_backup(args: argparse.Namespace) -> int:
    """Copy the decryption server's ledger (it may be running) to one file and verify the copy's hash chain."""
    from ..decryption.ledger import backup_ledger
    from ..decryption.server import LEDGER_FILE

    rows = backup_ledger(Path(args.data_dir) / LEDGER_FILE, args.out)
    print(f"ledger backed up to {args.out}: {rows} charge row(s), hash chain verified (no key material in it)")
    return 0


def cmd_ledger_restore(args: argparse.Namespace) -> int:
    """Restore a ledger backup with an acknowledged, logged rollback (parties.decryption.rollback)."""
    from ..decryption.rollback import restore_ledger
    from ..decryption.server import LEDGER_FILE

    r = restore_ledger(args.data_dir, args.backup, LEDGER_FILE, acknowledge_rollback=args.acknowledge_rollback)
    for study, lost in r.lost.items():
        print(f"study {study}: rolled back {len(lost)} charge(s); re-booked epsilon {r.rebooked.get(study, 0.0):.12g}")
    print(f"ledger restored from {args.backup}" + (f"; the replaced ledger was unreadable ({r.unreadable}): nothing "
                                                     "could be re-booked" if r.unreadable else ""))
    return 0


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    """Check a ledger file's (or backup's) hash chain; exit 1 if a charge row was changed, removed or replaced."""
    from ..decryption.ledger import SqliteLedgerStore, available, verify_ledger_file

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



def add_parser(sub: Subparsers) -> None:
    """Add this group's commands to the `dpagg` parser."""
    add = command_adder(sub)
    dec = decryption_target()
    p = add("budget", cmd_budget, "show a study's privacy budget and ledger")
    p.add_argument("study", help="study id")
    p.add_argument("--verify", action="store_true",
                   help="check the ledger's hash chain and, with the computation server (--computation), that the "
                        "ledger holds every charge its key holder signed a receipt for; exit 1 if a charge row was "
                        "changed, removed or replaced, or the ledger was rolled back (ROLLED BACK:)")
    p.add_argument("--computation", type=server_address, metavar="HOST:PORT", default=None,
                   help=f"computation server whose signed ledger receipts --verify and --reconcile use (env "
                        f"{ENV_COMPUTATION}; without either the receipts are not checked)")
    p.add_argument("--reconcile", action="store_true",
                   help="key-share holders: first book at each holder the charges it missed while it was "
                        "unreachable (MISSED BY:), proved by the other holders' signed receipts at the computation "
                        "server; only ever adds spend, and does nothing when a ledger was rolled back")
    p.add_argument("--decryption", type=holder_endpoint, action="append", metavar="[NAME=]HOST:PORT",
                   help=f"decryption server host:port (env {ENV_DECRYPTION}; default {dec['default']}); repeat it "
                        "for K key-share holders (NAME names a holder in the report, default its address): every "
                        "holder's view is shown and any disagreement flagged (DISAGREE:, exit 1 with --verify). "
                        "Without it (and without the env) but with a computation server, the holders and "
                        "addresses the computation server uses are asked; --decryption overrides them")
    p.add_argument("--json", action="store_true", help="print JSON")
    tls_args(p)

    led = add("ledger", lambda a: 2, "back up, verify or restore the decryption server's budget ledger (offline, no TLS)")
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
