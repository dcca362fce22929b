"""Signed ledger receipts: the second, independent record of privacy spend, kept by the computation server.

The key holder's ledger is the authority on spend, but a ledger file can be rolled back
(a restored backup, a lost WAL after kill -9) and a hash chain cannot see its own tail cut
off. So for every charge the key holder returns a receipt it signs with an Ed25519 key
(`parties.decryption.receipts`); the computation server appends each one to its own
`ReceiptBook` and (a) shows the newest receipt of a study with its next request (the key
holder refuses when its ledger does not hold that charge) and (b) refuses to start a
release or a direct query when the key holder reports less spend than its receipts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .errors import FailedPreconditionError

__all__ = ["Receipt", "ReceiptBook", "parse_receipt", "verify_receipt", "LedgerRolledBackError", "RECEIPT_VERSION"]

log = logging.getLogger("dpagg.receipts")

RECEIPT_VERSION = 1


class LedgerRolledBackError(FailedPreconditionError):
    """The key holder's ledger holds less than a receipt it signed: it was rolled back (restored, WAL lost)."""


@dataclass(frozen=True)
class Receipt:
    """One signed charge: what the key holder's ledger held right after it (see the module docstring)."""

    body: bytes
    signature: bytes
    public_key: bytes
    study_id: str
    release_id: str
    kind: str
    charge_id: int
    epsilon: float
    row_sha256: str
    #: The study's total spend right after this charge, exactly (a decimal fraction "p/q").
    study_spent: Fraction
    study_charges: int


def parse_receipt(body: bytes, signature: bytes = b"", public_key: bytes = b"") -> Receipt:
    """Decode a receipt body (ValueError when it is not one); the signature is not checked here."""
    d = json.loads(body.decode("utf-8"))
    if not isinstance(d, dict) or d.get("v") != RECEIPT_VERSION:
        raise ValueError("not a version-1 ledger receipt")
    return Receipt(body, signature, public_key, str(d["study_id"]), str(d["release_id"]), str(d["kind"]),
                   int(d["charge_id"]), float(d["epsilon"]), str(d["row_sha256"]), Fraction(str(d["study_spent"])),
                   int(d["study_charges"]))


def verify_receipt(public_key: bytes, body: bytes, signature: bytes) -> bool:
    """True when `signature` is `public_key`'s Ed25519 signature over SHA-256(`body`)."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, hashlib.sha256(body).digest())
    except (InvalidSignature, ValueError):
        return False
    return True


class ReceiptBook:
    """The computation server's own append-only record of the key holder's receipts, newest per study.

    `path`: a JSON-lines file (appended and fsynced before the measured values are used);
    None keeps the book in memory (tests, one-shot clients). The first key holder key seen
    is pinned: a receipt under another key is refused.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._newest: dict[str, Receipt] = {}
        self._all: dict[str, list[Receipt]] = {}
        self._key: bytes = b""
        if path is not None and path.exists():
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                    r = parse_receipt(bytes.fromhex(d["body"]), bytes.fromhex(d["signature"]),
                                      bytes.fromhex(d["public_key"]))
                except (ValueError, KeyError, TypeError):
                    log.error("%s line %d is not a receipt; ignored (a torn last write after a crash)", path, n)
                    continue
                self._remember(r)

    def _remember(self, r: Receipt) -> None:
        self._key = self._key or r.public_key
        self._all.setdefault(r.study_id, []).append(r)
        old = self._newest.get(r.study_id)
        if old is None or r.charge_id > old.charge_id or r.study_spent > old.study_spent:
            self._newest[r.study_id] = r

    def newest(self, study_id: str) -> Receipt | None:
        with self._lock:
            return self._newest.get(study_id)

    def receipts(self, study_id: str) -> list[Receipt]:
        """Every receipt kept for the study, in the order received (`dpagg budget --verify` checks ledgers
        against them)."""
        with self._lock:
            return list(self._all.get(study_id, ()))

    def record(self, body: bytes, signature: bytes, public_key: bytes) -> Receipt | None:
        """Check and keep one receipt (None when the reply carried none). A receipt that does not verify
        under the pinned key is refused: the reply did not come from the key holder this book knows."""
        if not body:
            return None
        with self._lock:
            if self._key and public_key != self._key:
                raise FailedPreconditionError(
                    "the decryption server signed a ledger receipt with another receipt key than before: it is not "
                    "the key holder this computation server has receipts from; nothing more is decrypted")
            if not verify_receipt(public_key, body, signature):
                raise FailedPreconditionError("the decryption server's ledger receipt does not verify; refusing it")
            r = parse_receipt(body, signature, public_key)
            if self.path is not None:
                line = json.dumps({"body": body.hex(), "signature": signature.hex(), "public_key": public_key.hex()})
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(line + "\n")
                    f.flush()
                    os.fsync(f.fileno())
            self._remember(r)
            return r

    def check_spend(self, study_id: str, spent: float) -> None:
        """Refuse (LedgerRolledBackError) when the key holder reports less spend than the newest receipt.

        `spent`: what the key holder's BudgetStatus says now. A study the key
        holder signed a receipt for must still hold that spend; a rollback acknowledged with
        `dpagg ledger restore --acknowledge-rollback` re-books the lost epsilon, so it passes.
        """
        r = self.newest(study_id)
        if r is None:
            return
        if Fraction(spent) < r.study_spent * (1 - Fraction(1, 10**9)):
            raise LedgerRolledBackError(
                f"the decryption server reports epsilon {spent:.12g} spent in study {study_id}, but it signed a "
                f"receipt for charge #{r.charge_id} when the study had spent {float(r.study_spent):.12g}: its "
                "ledger was rolled back (a restored backup or a lost WAL). Nothing was decrypted. Restore the "
                "newest ledger, or acknowledge the rollback with `dpagg ledger restore --acknowledge-rollback` "
                "(it re-books what was lost)")
