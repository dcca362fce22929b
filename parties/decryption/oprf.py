"""The key holder's oblivious evaluations of join pseudonyms (docs/join.md, "Oblivious pseudonyms").

Each join study with oblivious pseudonyms has an OPRF key (`he_partition.join.oprf.study_key`,
derived from `oprf_key.bin` in the key store: 0600, never served). An owner sends its blinded
identifiers in pages; the key holder multiplies each by the study's key and answers. It never
sees an identifier (a blinded element is a uniformly random group element), and it answers
each owner at most its quota of elements per study (`JoinTerms.evaluation_quota`: its declared
records plus its private dummies' allowance), each page once: a page sent again with the same
elements is answered again (the same answer: evaluation is deterministic), a page with other
elements under an index already answered is refused. Every page answered is a row of
`EvaluationLog` (oprf.sqlite3 next to the ledger): study, owner, page, count, digest, time.
So an owner colluding with the computation server tests at most its quota of guessed identifiers.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from he_partition.core.errors import InvalidInputError

from ..common.errors import FailedPreconditionError, QuotaExhaustedError
from ..common.util import utc_now

__all__ = ["EvaluationLog", "Evaluation", "EVALUATIONS_FILE", "OPRF_KEY_FILE", "PAGE_ELEMENTS",
           "load_or_create_oprf_key"]

#: The evaluations table's file in the key holder's data directory.
EVALUATIONS_FILE = "oprf.sqlite3"
#: The master secret every join study's OPRF key is derived from (in the key store, mode 0600).
OPRF_KEY_FILE = "oprf_key.bin"
#: Most blinded elements per EvaluatePseudonyms page: 32,768 x 32 bytes = 1 MiB each way.
PAGE_ELEMENTS = 32_768
#: Most pages of one owner in one study (pages x PAGE_ELEMENTS covers the largest join capacity).
MAX_PAGES = 256

_SCHEMA = """
CREATE TABLE IF NOT EXISTS oprf_evaluations (
    study_id TEXT NOT NULL,
    owner_id TEXT NOT NULL,
    page INTEGER NOT NULL,
    elements INTEGER NOT NULL,
    digest TEXT NOT NULL,
    evaluated_at TEXT NOT NULL,
    PRIMARY KEY (study_id, owner_id, page)
)
"""


def load_or_create_oprf_key(directory: Path | str, *, seed: int | None = None) -> bytes:
    """The 32-byte master OPRF secret (oprf_key.bin, 0600), generated on first use (from `seed` for a seeded
    test server); every join study's key is derived from it, so a restart answers every study alike."""
    from .keys import load_or_create_secret

    return load_or_create_secret(directory, OPRF_KEY_FILE, "oprf key", seed=seed)


@dataclass(frozen=True)
class Evaluation:
    """One page of blinded elements the key holder answered."""

    study_id: str
    owner_id: str
    page: int
    elements: int
    digest: str
    evaluated_at: str


class EvaluationLog:
    """The quota book and log of oblivious evaluations (SQLite; `path` None: in memory)."""

    def __init__(self, path: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path) if path is not None else ":memory:", check_same_thread=False,
                                   isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL" if path is not None else "PRAGMA journal_mode=MEMORY")
        self._db.execute(_SCHEMA)

    def used(self, study_id: str, owner_id: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT COALESCE(SUM(elements), 0) FROM oprf_evaluations WHERE study_id = ? AND "
                                   "owner_id = ?", (study_id, owner_id)).fetchone()
        return int(row[0])

    def admit(self, study_id: str, owner_id: str, page: int, elements: int, digest: str, quota: int) -> int:
        """Book page `page` of `elements` blinded elements (their SHA-256 `digest`) against `quota`; returns the
        elements this owner has been answered in the study, this page included.

        A page booked before with the same digest is admitted again (an idempotent retry: nothing new is
        learned, the answer is the same); with another digest it is refused (FAILED_PRECONDITION). A page that
        would take the owner past its quota is refused (RESOURCE_EXHAUSTED naming the quota), and nothing is
        booked."""
        if not 0 <= page < MAX_PAGES:
            raise InvalidInputError(f"page {page} is outside [0, {MAX_PAGES})")
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT elements, digest FROM oprf_evaluations WHERE study_id = ? AND "
                                       "owner_id = ? AND page = ?", (study_id, owner_id, page)).fetchone()
                used = int(self._db.execute("SELECT COALESCE(SUM(elements), 0) FROM oprf_evaluations WHERE "
                                            "study_id = ? AND owner_id = ?", (study_id, owner_id)).fetchone()[0])
                if row is not None:
                    if row[1] != digest or int(row[0]) != elements:
                        raise FailedPreconditionError(
                            f"owner {owner_id!r} was already answered page {page} of study {study_id!r} with other "
                            "blinded elements: each page is evaluated once per study (a re-run must send the same "
                            "elements: keep the owner's state dir); nothing was evaluated")
                    self._db.execute("COMMIT")
                    return used
                if used + elements > quota:
                    raise QuotaExhaustedError(
                        f"owner {owner_id!r} asked for {elements} oblivious evaluations in study {study_id!r} after "
                        f"{used}: its quota is {quota} (its declared records plus its private dummies' allowance); "
                        "nothing was evaluated")
                self._db.execute("INSERT INTO oprf_evaluations (study_id, owner_id, page, elements, digest, "
                                 "evaluated_at) VALUES (?, ?, ?, ?, ?, ?)",
                                 (study_id, owner_id, page, elements, digest, utc_now()))
                self._db.execute("COMMIT")
                return used + elements
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def rows(self, study_id: str | None = None) -> list[Evaluation]:
        """Every page answered (of one study), in booking order."""
        query = "SELECT * FROM oprf_evaluations" + (" WHERE study_id = ?" if study_id is not None else "")
        with self._lock:
            cur = self._db.execute(query + " ORDER BY rowid", (study_id,) if study_id is not None else ())
            return [Evaluation(*row) for row in cur.fetchall()]

    def close(self) -> None:
        with self._lock:
            self._db.close()
