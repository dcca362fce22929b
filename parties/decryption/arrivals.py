"""The decryption server's record of every ciphertext stream that reached it, answered or refused."""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from ..common.util import utc_now

__all__ = ["Arrival", "ArrivalLog", "ARRIVALS_FILE"]

#: The arrivals table's file in the decryption server's data directory (next to the ledger).
ARRIVALS_FILE = "arrivals.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS arrivals (
    arrival_id INTEGER PRIMARY KEY AUTOINCREMENT,
    received_at TEXT NOT NULL,
    study_id TEXT NOT NULL,
    release_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    chunks INTEGER NOT NULL,
    ciphertext_digest TEXT NOT NULL,
    outcome TEXT NOT NULL CHECK (outcome IN ('answered', 'refused')),
    epsilon_charged REAL NOT NULL,
    reason TEXT NOT NULL
)
"""


@dataclass(frozen=True)
class Arrival:
    """One request's ciphertexts as the decryption server saw them, and what became of them.

    `epsilon_charged`: what the ledger booked for this request (0 when it was refused before
    the charge, or the charge failed); `reason`: the refusal's exception and text.
    """

    arrival_id: int
    received_at: str
    study_id: str
    release_id: str
    kind: str
    chunks: int
    ciphertext_digest: str
    outcome: str
    epsilon_charged: float
    reason: str


class ArrivalLog:
    """Append-only SQLite table of arrivals (`path` None: in memory, for servers without a data directory).

    It is an operator's record, not the privacy ledger: it holds digests and outcomes, never
    ciphertexts or values, and a row is written whatever happened to the charge.
    """

    def __init__(self, path: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path) if path is not None else ":memory:", check_same_thread=False,
                                   isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL" if path is not None else "PRAGMA journal_mode=MEMORY")
        self._db.execute(_SCHEMA)

    def record(self, *, study_id: str, release_id: str, kind: str, chunks: int, ciphertext_digest: str,
               outcome: str, epsilon_charged: float = 0.0, reason: str = "") -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO arrivals (received_at, study_id, release_id, kind, chunks, ciphertext_digest, outcome, "
                "epsilon_charged, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (utc_now(), study_id, release_id, kind, int(chunks), ciphertext_digest, outcome,
                 float(epsilon_charged), reason))

    def rows(self, study_id: str | None = None) -> list[Arrival]:
        """Every arrival (of one study), oldest first."""
        query = "SELECT * FROM arrivals" + (" WHERE study_id = ?" if study_id is not None else "")
        with self._lock:
            cur = self._db.execute(query + " ORDER BY arrival_id", (study_id,) if study_id is not None else ())
            return [Arrival(*row) for row in cur.fetchall()]

    def refusals_containing(self, marker: str) -> dict[str, int]:
        """Per study, how many refused arrivals' reasons contain `marker` (the refusals after the charge)."""
        pattern = "%" + marker.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        with self._lock:
            cur = self._db.execute("SELECT study_id, COUNT(*) FROM arrivals WHERE outcome = 'refused' AND reason LIKE ? "
                                   "ESCAPE '\\' GROUP BY study_id", (pattern,))
            return {str(s): int(n) for s, n in cur.fetchall()}

    def close(self) -> None:
        with self._lock:
            self._db.close()
