"""Restoring a ledger backup only with an explicit, logged acknowledgement, re-booking the spend it would refund."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from he_partition.core.errors import InvalidInputError

from ..common.contract import StudyContract, canonical_json
from ..common.util import lock_data_dir, utc_now
from .ledger import Charge, LedgerUnreadableError, SqliteLedgerStore, budget, verify_ledger_file
from .ledger.budget import _above
from .receipts import ROLLBACK_KIND, row_sha256

__all__ = ["RestoreReport", "restore_ledger"]

log = logging.getLogger("dpagg.decryption.ledger")


@dataclass
class RestoreReport:
    """What a restore rolled back: per study, the charges the backup lacks and the epsilon re-booked for them."""

    lost: dict[str, list[Charge]] = field(default_factory=dict)
    rebooked: dict[str, float] = field(default_factory=dict)
    #: "" when the replaced ledger could be read; else why not (then nothing could be re-booked).
    unreadable: str = ""


def _read(path: Path) -> tuple[list[StudyContract], dict[str, list[Charge]]]:
    store = SqliteLedgerStore(path)
    try:
        studies = store.list_studies()
        return studies, {c.study_id: store.charges(c.study_id) for c in studies}
    finally:
        store.close()


def restore_ledger(data_dir: Path, backup: Path, ledger_file: str, *, acknowledge_rollback: bool) -> RestoreReport:
    """Put `backup` in place of `data_dir/ledger_file` (server stopped) and re-book what it would refund.

    A backup is older than the ledger it replaces: every charge made since would be
    refunded, and the computation server's receipts then refuse the rolled-back ledger.
    So a restore needs `acknowledge_rollback`, logs every charge it rolls back, and appends
    to the restored ledger one `rollback_rebooked` row per study for the epsilon the
    backup lacks (its detail names the lost charges and `through_charge`, the newest
    charge id it covers, which the key holder accepts for older receipts).
    """
    if not acknowledge_rollback:
        raise InvalidInputError(
            f"restoring {backup} rolls the ledger back to the backup: every charge made since would be refunded. "
            "Pass --acknowledge-rollback to restore it anyway; what it rolls back is then re-booked and logged")
    rows = verify_ledger_file(backup)
    unlock = lock_data_dir(data_dir, "decryption server (stop it before restoring its ledger)")
    try:
        target = data_dir / ledger_file
        report = RestoreReport()
        current: tuple[list[StudyContract], dict[str, list[Charge]]] = ([], {})
        if target.exists():
            try:
                current = _read(target)
            except (LedgerUnreadableError, sqlite3.DatabaseError, OSError, ValueError) as exc:
                report.unreadable = f"{type(exc).__name__}: {exc}"
                log.error("the ledger being replaced (%s) is unreadable (%s): nothing it spent can be re-booked",
                          target, report.unreadable)
        staged = target.with_name(target.name + ".restoring")
        shutil.copyfile(backup, staged)
        for suffix in ("-wal", "-shm"):
            Path(str(target) + suffix).unlink(missing_ok=True)
        os.replace(staged, target)
        store = SqliteLedgerStore(target)
        try:
            _rebook(store, current, backup, report)
        finally:
            store.close()
        log.warning("ledger restored from %s (%d charge rows) with --acknowledge-rollback; %d lost charge(s) "
                    "re-booked: %s", backup, rows, sum(len(v) for v in report.lost.values()),
                    {k: f"{v:.12g}" for k, v in report.rebooked.items()} or "none")
        return report
    finally:
        unlock()


def _rebook(store: SqliteLedgerStore, current: tuple[list[StudyContract], dict[str, list[Charge]]], backup: Path,
            report: RestoreReport) -> None:
    contracts, by_study = current
    through = max((c.charge_id for cs in by_study.values() for c in cs), default=0)
    for contract in contracts:
        store.create_study(contract)  # a study opened after the backup comes back with its terms
        kept = {(c.charge_id, row_sha256(c)) for c in store.charges(contract.study_id)}
        lost = [c for c in by_study[contract.study_id] if (c.charge_id, row_sha256(c)) not in kept]
        if not lost:
            continue
        report.lost[contract.study_id] = lost
        missing = budget(0.0, by_study[contract.study_id]).spent - budget(0.0, store.charges(contract.study_id)).spent
        eps = _above(missing) if missing > 0 else 0.0
        if eps <= 0:
            continue
        for c in lost:
            log.warning("rolled back: study %s charge #%d release %s %s epsilon %.12g (re-booked)", c.study_id,
                        c.charge_id, c.release_id, c.kind, c.epsilon)
        detail = canonical_json({"restored_from": str(backup), "through_charge": through, "acknowledged_at": utc_now(),
                                 "lost_charges": [c.charge_id for c in lost]})
        store.rebook(contract.study_id, f"rollback-{through}", ROLLBACK_KIND, eps, detail)
        report.rebooked[contract.study_id] = eps

