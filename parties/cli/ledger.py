"""The privacy-budget ledger: a study's budget over gRPC, and offline backup / verify of the ledger file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from he_partition.core.accounting import epsilon_left

from he_partition.core.errors import DPAggError

from ..common.config import ENV_DECRYPTION, default_target
from .budgets import budget_json, budget_lines, holder_endpoint, view_of
from .options import Subparsers, command_adder, conn, decryption_target, print_json, tls_args

if TYPE_CHECKING:
    from ..decryption.client import BudgetInfo


def cmd_budget(args: argparse.Namespace) -> int:
    from ..decryption.client import DecryptionClient

    endpoints = args.decryption or [holder_endpoint(default_target(ENV_DECRYPTION))]
    if len(endpoints) > 1:
        return _budget_across_holders(args, endpoints)
    with DecryptionClient(endpoints[0][1], **conn(args)) as ds:
        b = ds.budget(args.study)
    if args.json:
        print_json({"study_id": b.study_id, "total": b.total, "spent": b.spent, "remaining": b.remaining,
                     "available": b.available,
                     "charges": [vars(c) for c in b.charges], "chain_problem": b.chain_problem})
    else:
        left = epsilon_left(b.available, b.total)
        print(f"study {b.study_id}: spent {b.spent:.12g} of {b.total:.12g}; a new release may spend {left}"
              + (f" (nothing usable is left; exactly {b.available:.3g})" if left == "0" and b.available else ""))
        for n, c in enumerate(b.charges, 1):  # numbered within the study (ledger rows are numbered globally)
            print(f"  #{n} {c.created_at} release {c.release_id}: {c.kind} {c.epsilon:.12g}")
    if args.verify:
        if b.chain_problem:
            print(f"dpagg: ledger hash chain BROKEN: {b.chain_problem}", file=sys.stderr)
            return 1
        if not args.json:
            print("ledger hash chain verified (every charge row commits to the previous one)")
    return 0


def _budget_across_holders(args: argparse.Namespace, endpoints: list[tuple[str, str]]) -> int:
    """Every key-share holder's view of the study; exit 1 on a disagreement (or a broken chain) with --verify."""
    from ..decryption.client import DecryptionClient

    names = [name for name, _ in endpoints]
    if len(set(names)) != len(names):
        raise DPAggError(f"--decryption names a holder twice ({', '.join(names)}); give each holder once")

    def fetch(address: str) -> BudgetInfo:
        with DecryptionClient(address, **conn(args)) as ds:
            return ds.budget(args.study)

    views = [view_of(name, address, fetch) for name, address in endpoints]
    report = budget_json(args.study, views)
    if args.json:
        print_json(report)
    else:
        print("\n".join(budget_lines(args.study, views)))
    broken = [f"{v.name}: {v.budget.chain_problem}" for v in views if v.budget and v.budget.chain_problem]
    if args.verify:
        for b in broken:
            print(f"dpagg: ledger hash chain BROKEN at holder {b}", file=sys.stderr)
        if broken or not report["agree"]:
            return 1
        if not args.json:
            print(f"ledger hash chains verified at all {len(views)} holders (every charge row commits to the "
                  "previous one)")
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
                   help="check the ledger's hash chain; exit 1 if a charge row was changed, removed or replaced")
    p.add_argument("--decryption", type=holder_endpoint, action="append", metavar="[NAME=]HOST:PORT",
                   help=f"decryption server host:port (env {ENV_DECRYPTION}; default {dec['default']}); repeat it "
                        "for K key-share holders (NAME names a holder in the report, default its address): every "
                        "holder's view is shown and any disagreement flagged (DISAGREE:, exit 1 with --verify)")
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
