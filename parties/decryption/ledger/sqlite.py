"""The production ledger store: one SQLite file (WAL, synchronous=FULL), append-only by triggers; backups."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from he_partition.core.accounting import RangeQuery
from he_partition.core.errors import InvalidInputError

from ...common.contract import StudyContract, check_id
from ...common.errors import FailedPreconditionError, NotFoundError
from ...common.util import ImmediateTransaction, utc_now
from .budget import DIRECT_KIND, Charge, _above, check_charge
from .chain import LedgerTamperedError, chain_hash, verify_chain_rows
from .direct import (
    DirectCharge,
    DirectPiece,
    _direct_result,
    _pieces_of,
    _price_direct,
    _unclaimed,
)
from .store import LedgerStore, _conflict, _same_terms

__all__ = ["SqliteLedgerStore", "LedgerUnreadableError", "backup_ledger", "verify_ledger_file"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS studies (
    study_id      TEXT PRIMARY KEY,
    contract_json TEXT NOT NULL,
    contract_hash TEXT NOT NULL,
    created_at    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS charges (
    charge_id       INTEGER PRIMARY KEY AUTOINCREMENT,
    study_id        TEXT NOT NULL REFERENCES studies(study_id),
    release_id      TEXT NOT NULL,
    kind            TEXT NOT NULL,
    epsilon         REAL NOT NULL CHECK (epsilon > 0),
    release_epsilon REAL NOT NULL,
    created_at      TEXT NOT NULL,
    detail          TEXT NOT NULL DEFAULT '',
    chain           TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS charges_by_study ON charges(study_id);
CREATE TABLE IF NOT EXISTS direct_pieces (
    piece_id    INTEGER PRIMARY KEY AUTOINCREMENT,
    study_id    TEXT NOT NULL REFERENCES studies(study_id),
    request_id  TEXT NOT NULL,
    position    INTEGER NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('count', 'prefix_mask')),
    lo          INTEGER NOT NULL,
    hi          INTEGER NOT NULL CHECK (hi > lo),
    epsilon     REAL NOT NULL CHECK (epsilon > 0),
    created_at  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS direct_pieces_by_study ON direct_pieces(study_id);
CREATE TABLE IF NOT EXISTS direct_decryptions (
    study_id    TEXT NOT NULL REFERENCES studies(study_id),
    request_id  TEXT NOT NULL,
    position    INTEGER NOT NULL,
    created_at  TEXT NOT NULL,
    detail      TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (study_id, request_id, position)
);
"""


def _immutable(table: str, why: str) -> str:
    return "".join(f"CREATE TRIGGER IF NOT EXISTS {table}_no_{op.lower()} BEFORE {op} ON {table}\n"
                   f"BEGIN SELECT RAISE(ABORT, '{why}'); END;\n" for op in ("UPDATE", "DELETE"))


def _no_reuse(table: str, key: str) -> str:
    # INSERT OR REPLACE deletes the old row without firing a DELETE trigger: refuse the reuse itself.
    return (f"CREATE TRIGGER IF NOT EXISTS {table}_no_reuse BEFORE INSERT ON {table}\n"
            f"WHEN EXISTS (SELECT 1 FROM {table} WHERE {key}) "
            f"BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only: {table} row exists'); END;\n")


# The ledger is append-only: a charge (and every direct-query row), once written, can be
# neither changed nor removed; contracts are immutable.
_SCHEMA += "".join(_immutable(t, "the privacy ledger is append-only")
                   for t in ("charges", "direct_pieces", "direct_decryptions"))
_SCHEMA += _immutable("studies", "study contracts are immutable")
_SCHEMA += _no_reuse("charges", "charge_id = NEW.charge_id")
_SCHEMA += _no_reuse("direct_pieces", "piece_id = NEW.piece_id")
_SCHEMA += _no_reuse("direct_decryptions", "study_id = NEW.study_id AND request_id = NEW.request_id "
                                           "AND position = NEW.position")
_SCHEMA += _no_reuse("studies", "study_id = NEW.study_id")



class LedgerUnreadableError(FailedPreconditionError):
    """The ledger file is not a SQLite database SQLite can read (corrupted, truncated)."""


class SqliteLedgerStore(LedgerStore):
    """The production ledger: one SQLite file, WAL journal, synchronous=FULL.

    Each charge runs in a `BEGIN IMMEDIATE` transaction (the write lock is taken before
    the budget is read), so two threads or processes can never both fit a charge into
    the same remaining budget; the row is committed to disk before `charge` returns, so
    it precedes any decrypted value leaving the server.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
            self._open()
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise
            raise LedgerUnreadableError(
                f"{self.path} is not a readable privacy ledger ({exc}): the file is corrupted or truncated. Nothing "
                "is decrypted from it; put the newest ledger back, or restore a backup with `dpagg ledger restore "
                "--acknowledge-rollback`") from None

    def _open(self) -> None:
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)
        cols = {r[1] for r in self._db.execute("PRAGMA table_info(charges)")}
        if "detail" not in cols:  # a ledger written before decryptions were described
            self._db.execute("ALTER TABLE charges ADD COLUMN detail TEXT NOT NULL DEFAULT ''")
        if "chain" not in cols:  # a ledger written before the hash chain: its rows form an unchained prefix
            self._db.execute("ALTER TABLE charges ADD COLUMN chain TEXT NOT NULL DEFAULT ''")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def create_study(self, contract: StudyContract) -> tuple[StudyContract, bool]:
        with self._lock:
            with self._transaction():
                row = self._db.execute("SELECT contract_json FROM studies WHERE study_id = ?",
                                       (contract.study_id,)).fetchone()
                if row is None:
                    self._db.execute(
                        "INSERT INTO studies (study_id, contract_json, contract_hash, created_at) VALUES (?, ?, ?, ?)",
                        (contract.study_id, contract.canonical_json(), contract.contract_hash, utc_now()),
                    )
                    return contract, False
            existing = StudyContract.from_json(row[0])
            if not _same_terms(existing, contract):
                raise _conflict(existing)
            return existing, True

    def _get(self, study_id: str) -> StudyContract:
        row = self._db.execute("SELECT contract_json FROM studies WHERE study_id = ?", (study_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"unknown study {study_id!r}; open it first (dpagg open-study)")
        return StudyContract.from_json(row[0])

    def get_study(self, study_id: str) -> StudyContract:
        with self._lock:
            return self._get(study_id)

    def list_studies(self) -> list[StudyContract]:
        with self._lock:
            rows = self._db.execute("SELECT contract_json FROM studies ORDER BY rowid").fetchall()
        return [StudyContract.from_json(r[0]) for r in rows]

    def _charges(self, study_id: str) -> list[Charge]:
        rows = self._db.execute(
            "SELECT charge_id, study_id, release_id, kind, epsilon, release_epsilon, created_at, detail FROM charges "
            "WHERE study_id = ? ORDER BY charge_id", (study_id,)).fetchall()
        return [Charge(int(r[0]), r[1], r[2], r[3], float(r[4]), float(r[5]), r[6], r[7]) for r in rows]

    def charge(self, study_id: str, release_id: str, kind: str, epsilon: float, release_epsilon: float,
               detail: str = "", *, reserve: bool = True) -> Charge:
        """Book `epsilon` for one measurement of a release, atomically (see `LedgerStore.charge`).

        Privacy: spends `epsilon` of the study's budget; the measurement's sensitivity and
        neighbouring relation (add/remove of one person with at most c records) are checked
        by the caller (`DecryptionHandler.check_measurement`); no noise is drawn here, so
        nobody knows noise from it. Nothing is written when the charge does not fit.
        """
        check_id("release_id", release_id)
        with self._lock, self._transaction():
            contract = self._get(study_id)
            booked = check_charge(contract.epsilon, self._charges(study_id), release_id, float(epsilon),
                                  float(release_epsilon), reserve=reserve)
            return self._insert_charge(study_id, release_id, kind, booked, float(release_epsilon), detail)

    def rebook(self, study_id: str, release_id: str, kind: str, epsilon: float, detail: str) -> Charge:
        """Append a charge row WITHOUT the budget check: re-book spend a restored backup lost.

        Only `dpagg ledger restore --acknowledge-rollback` calls it, for epsilon that was
        already spent (and decrypted against) in the ledger the backup replaced.

        Privacy: spends `epsilon` of the study's budget again on paper, so the restore
        refunds nothing; the measurements it stands for had their own sensitivity and
        neighbouring relation (add/remove of one person with at most c records) checked
        when they were first charged. No noise is drawn here, so nobody knows noise from it.
        """
        with self._lock, self._transaction():
            self._get(study_id)
            return self._insert_charge(study_id, release_id, kind, float(epsilon), float(epsilon), detail)

    def _insert_charge(self, study_id: str, release_id: str, kind: str, epsilon: float, release_epsilon: float,
                       detail: str) -> Charge:
        """Append one charge row, chained to the previous one (inside the caller's transaction, after its
        budget check). Refuses to write on a ledger whose chain does not verify."""
        last = self._verify_chain()
        created = utc_now()
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'charges'").fetchone()
        charge_id = max(int(row[0]) if row else 0, last[0]) + 1
        fields = (charge_id, study_id, release_id, kind, epsilon, release_epsilon, created, detail)
        self._db.execute(
            "INSERT INTO charges (charge_id, study_id, release_id, kind, epsilon, release_epsilon, created_at, "
            "detail, chain) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (*fields, chain_hash(last[1], fields)))
        return Charge(charge_id, study_id, release_id, kind, epsilon, release_epsilon, created, detail)

    def _verify_chain(self) -> tuple[int, str]:
        """Recompute the hash chain over every charge row; (last id, last hash), or LedgerTamperedError."""
        return verify_chain_rows(self._db.execute(
            "SELECT charge_id, study_id, release_id, kind, epsilon, release_epsilon, created_at, detail, chain "
            "FROM charges ORDER BY charge_id"), self.path)

    def verify_chain(self) -> int:
        """Check the whole hash chain; returns the number of charge rows (LedgerTamperedError if broken)."""
        with self._lock:
            self._verify_chain()
            return int(self._db.execute("SELECT COUNT(*) FROM charges").fetchone()[0])

    def charges(self, study_id: str) -> list[Charge]:
        with self._lock:
            self._get(study_id)
            return self._charges(study_id)

    def _direct_pieces(self, study_id: str, request_id: str | None = None) -> list[DirectPiece]:
        sql = "SELECT request_id, position, role, lo, hi, epsilon FROM direct_pieces WHERE study_id = ?"
        args: tuple[str, ...] = (study_id,)
        if request_id is not None:
            sql += " AND request_id = ?"
            args += (request_id,)
        rows = self._db.execute(sql + " ORDER BY piece_id", args).fetchall()
        return [DirectPiece(r[0], int(r[1]), r[2], RangeQuery((int(r[3]),), (int(r[4]),), float(r[5]))) for r in rows]

    def _transaction(self) -> ImmediateTransaction:
        return ImmediateTransaction(self._db)

    def charge_direct(self, study_id: str, request_id: str, queries: Sequence[Sequence[RangeQuery]],
                      detail: str = "") -> DirectCharge:
        """Pay for a batch of direct range counts atomically (see `LedgerStore.charge_direct`).

        Privacy: spends the growth of the heaviest weighted overlap (epsilon per piece,
        seed 004); each piece is a range count of sensitivity c under the neighbouring
        relation add/remove of one person with at most c records. No noise is drawn here,
        so nobody knows noise from it. Nothing is written when the charge does not fit.
        """
        check_id("request_id", request_id)
        new = _pieces_of(request_id, queries)
        with self._lock, self._transaction():
            contract = self._get(study_id)
            stored = self._direct_pieces(study_id)
            charges = self._charges(study_id)
            repeat, inc, after = _price_direct(contract, request_id, new, stored, charges)
            if repeat is not None:
                return repeat
            charge = self._insert_charge(study_id, request_id, DIRECT_KIND, _above(inc), _above(inc), detail) \
                if inc > 0 else None
            created = utc_now()
            self._db.executemany(
                "INSERT INTO direct_pieces (study_id, request_id, position, role, lo, hi, epsilon, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(study_id, p.request_id, p.position, p.role, p.query.lo[0], p.query.hi[0], float(p.query.epsilon),
                  created) for p in new])
            return _direct_result(contract, request_id, inc, after, charges, charge)

    def claim_direct_decryption(self, study_id: str, request_id: str, lo: int, hi: int, epsilon: float,
                                detail: str = "") -> int:
        with self._lock, self._transaction():
            self._get(study_id)
            pieces = self._direct_pieces(study_id, request_id)
            claimed = {int(r[0]) for r in self._db.execute(
                "SELECT position FROM direct_decryptions WHERE study_id = ? AND request_id = ?",
                (study_id, request_id))}
            position = _unclaimed(pieces, claimed, lo, hi, epsilon)
            self._db.execute(
                "INSERT INTO direct_decryptions (study_id, request_id, position, created_at, detail) "
                "VALUES (?, ?, ?, ?, ?)", (study_id, request_id, position, utc_now(), detail))
            return position

    def direct_pieces(self, study_id: str) -> list[DirectPiece]:
        with self._lock:
            self._get(study_id)
            return self._direct_pieces(study_id)

    def unclaimed_direct(self, study_id: str) -> int:
        with self._lock:
            self._get(study_id)
            paid = self._db.execute("SELECT COUNT(*) FROM direct_pieces WHERE study_id = ? AND role = 'count'",
                                    (study_id,)).fetchone()[0]
            done = self._db.execute("SELECT COUNT(*) FROM direct_decryptions WHERE study_id = ?",
                                    (study_id,)).fetchone()[0]
        return int(paid) - int(done)

    def check_consistency(self) -> list[str]:
        """SQLite's own integrity and foreign-key checks, then the budget replay of `LedgerStore`."""
        with self._lock:
            problems = [f"sqlite integrity: {r[0]}" for r in self._db.execute("PRAGMA integrity_check")
                        if r[0] != "ok"]
            problems += [f"sqlite foreign key: {tuple(r)}" for r in self._db.execute("PRAGMA foreign_key_check")]
            try:
                self._verify_chain()
            except LedgerTamperedError as exc:
                problems.append(str(exc))
        return problems + super().check_consistency()



def backup_ledger(source: Path | str, destination: Path | str) -> int:
    """Copy a ledger file consistently while its server runs (SQLite's online backup), then verify the copy.

    Returns the number of charge rows in the copy; raises LedgerTamperedError if its hash
    chain does not verify and InvalidInputError if `source` is not a ledger. The copy is a
    single self-contained file (no WAL) holding contracts and charges, no key material.
    """
    src_path, dst_path = Path(source), Path(destination)
    if not src_path.is_file():
        raise InvalidInputError(f"no ledger at {src_path} (the decryption server's DATA_DIR/ledger.sqlite3)")
    if dst_path.exists():
        raise InvalidInputError(f"{dst_path} exists; choose a new backup file name")
    dst_path.parent.mkdir(parents=True, exist_ok=True)
    src = sqlite3.connect(f"file:{src_path}?mode=ro", uri=True, timeout=30.0)
    dst = sqlite3.connect(dst_path)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return verify_ledger_file(dst_path)


def verify_ledger_file(path: Path | str) -> int:
    """Check a ledger file's (or a backup's) hash chain; the number of charge rows, or LedgerTamperedError."""
    if not Path(path).is_file():
        raise InvalidInputError(f"no ledger file at {path}")
    store = SqliteLedgerStore(path)
    try:
        return store.verify_chain()
    finally:
        store.close()
