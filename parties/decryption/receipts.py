"""The key holder's side of ledger receipts: sign one per charge, and refuse a ledger older than a receipt shown.

See `parties.common.receipts` for why: a second party (the computation server) keeps the
receipts, so a rolled-back ledger (restored backup, lost WAL) cannot refund budget.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

from he_partition.core.errors import InvalidInputError

from ..common.contract import canonical_json
from ..common.errors import NotFoundError
from ..common.receipts import RECEIPT_VERSION, LedgerRolledBackError, Receipt, parse_receipt, verify_receipt
from ..common.signing import generate_signing_key, load_private_key, public_key_of, save_private_key, sign_submission
from .ledger import Charge, LedgerStore, budget, chain_hash

__all__ = ["ReceiptSigner", "ROLLBACK_KIND", "RECEIPT_KEY_FILE", "RECONCILED_FROM", "reconcile_charges", "row_sha256"]

#: The key file, next to the BFV key (keys/): not in the ledger file, so restoring a ledger backup keeps it.
RECEIPT_KEY_FILE = "receipt_key.pem"

#: The `kind` of the ledger row `dpagg ledger restore --acknowledge-rollback` writes to re-book lost spend.
ROLLBACK_KIND = "rollback_rebooked"


def row_sha256(c: Charge) -> str:
    """SHA-256 of one charge row's own fields (the chain hash of the row alone)."""
    return chain_hash("", (c.charge_id, c.study_id, c.release_id, c.kind, c.epsilon, c.release_epsilon, c.created_at,
                           c.detail))


class ReceiptSigner:
    """Signs a receipt for every charge and checks receipts shown back against the ledger."""

    def __init__(self, private_key: bytes) -> None:
        self._private = private_key
        self.public_key = public_key_of(private_key)

    @classmethod
    def load_or_create(cls, directory: Path | None) -> "ReceiptSigner":
        """The key in `directory/receipt_key.pem` (created 0600 on first use); None: a key for this process only."""
        if directory is None:
            return cls(generate_signing_key()[0])
        path = directory / RECEIPT_KEY_FILE
        if not path.exists():
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            save_private_key(path, generate_signing_key()[0])
        return cls(load_private_key(path))

    def issue(self, ledger: LedgerStore, charge: Charge) -> tuple[bytes, bytes]:
        """(body, signature) of the receipt for `charge`, with the study's exact spend right after it."""
        charges = ledger.charges(charge.study_id)
        spent = budget(0.0, charges).spent
        body = canonical_json({"v": RECEIPT_VERSION, "study_id": charge.study_id, "release_id": charge.release_id,
                               "kind": charge.kind, "charge_id": charge.charge_id, "epsilon": repr(charge.epsilon),
                               "row_sha256": row_sha256(charge), "study_spent": str(spent),
                               "study_charges": len(charges)}).encode("utf-8")
        return body, sign_submission(self._private, hashlib.sha256(body).digest())

    def check(self, ledger: LedgerStore, study_id: str, body: bytes, signature: bytes) -> None:
        """Refuse (LedgerRolledBackError) a ledger that does not hold the charge of a receipt this key signed.

        Held means: the row with the receipt's charge id and the same fields is there, or an
        acknowledged rollback (`ROLLBACK_KIND` row) re-booked every charge up to it. A receipt
        of another study, or not signed by this key, is ignored (it proves nothing about this
        ledger; a computation server cannot forge one to block a study).
        """
        if not body or not verify_receipt(self.public_key, body, signature):
            return
        try:
            r = parse_receipt(body)
        except (ValueError, KeyError, TypeError):
            return
        if r.study_id != study_id:
            return
        try:
            charges = ledger.charges(study_id)
        except NotFoundError:
            charges = []
        if any(c.charge_id == r.charge_id and row_sha256(c) == r.row_sha256 for c in charges):
            return
        if any(c.kind == ROLLBACK_KIND and _through(c) >= r.charge_id for c in charges):
            return
        raise LedgerRolledBackError(
            f"the ledger does not hold charge #{r.charge_id} of study {study_id} (release {r.release_id}, epsilon "
            f"{r.epsilon:.12g}; the study had spent {float(r.study_spent):.12g}), for which this server signed a "
            "receipt: the ledger was rolled back (a restored backup or a lost WAL). Nothing was charged or "
            "decrypted. Put the newest ledger back, or acknowledge the rollback with `dpagg ledger restore "
            "--acknowledge-rollback` (it re-books what was lost)")


def _through(c: Charge) -> int:
    try:
        return int(json.loads(c.detail).get("through_charge", 0))
    except (ValueError, AttributeError, TypeError):
        return 0


#: The `detail` key of a ledger row `reconcile_charges` booked (the receipts it was booked from).
RECONCILED_FROM = "reconciled_from"


def reconcile_charges(ledger: LedgerStore, own_key: bytes, study_id: str,
                      receipts: list[tuple[bytes, bytes, bytes]]) -> list[Charge]:
    """Book the charges other key holders signed receipts for and `ledger` lacks; the rows written.

    `receipts`: (body, signature, public_key) of the other holders' receipts. A key-share
    holder that was unreachable while the others were charged (a release or a direct query
    that then failed) lacks those charges; it charged nothing and issued no share for them,
    so nothing was decrypted with them (every decryption needs all K shares), but the others
    did spend them. Booking them here makes this ledger agree with theirs.

    Each receipt must verify under the public key it names, that key must not be `own_key`
    (this holder's own receipts prove what this ledger held: a ledger lacking one was rolled
    back, which `dpagg ledger restore --acknowledge-rollback` handles), and it must be of
    `study_id`; anything else is refused (InvalidInputError) and nothing is booked. A charge
    (release, kind, epsilon) is booked as many times as the holder that signed it most often
    did, less the times this ledger already holds it: a repeat books nothing.

    Privacy: adds spend only (never removes any), without the budget check, with the epsilon
    of the receipt; it stands for a measurement (sensitivity c, neighbouring relation
    add/remove of one person with at most c records) or a direct-query batch whose
    sensitivity was checked by the holders that charged it. No noise is drawn, so nobody
    knows noise from it.
    """
    rebook = getattr(ledger, "rebook", None)
    if rebook is None:
        raise InvalidInputError("this ledger cannot book reconciled charges (it is not a SQLite ledger)")
    proved: dict[tuple[str, str, float], list[Receipt]] = {}
    per_signer: dict[bytes, Counter[tuple[str, str, float]]] = {}
    seen: set[tuple[bytes, int]] = set()
    for body, signature, public_key in receipts:
        if public_key == own_key:
            raise InvalidInputError("a receipt signed by this key holder itself cannot be reconciled: its own ledger "
                                    "lacking it means the ledger was rolled back (`dpagg ledger restore "
                                    "--acknowledge-rollback`)")
        if not verify_receipt(public_key, body, signature):
            raise InvalidInputError("a receipt does not verify under the receipt key it names; nothing was booked")
        try:
            r = parse_receipt(body, signature, public_key)
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidInputError(f"not a ledger receipt ({exc}); nothing was booked") from exc
        if r.study_id != study_id:
            raise InvalidInputError(f"a receipt of study {r.study_id} was sent to reconcile study {study_id}; "
                                    "nothing was booked")
        if (public_key, r.charge_id) in seen:
            continue
        seen.add((public_key, r.charge_id))
        key = (r.release_id, r.kind, r.epsilon)
        per_signer.setdefault(public_key, Counter())[key] += 1
        proved.setdefault(key, []).append(r)
    held = Counter((c.release_id, c.kind, c.epsilon) for c in ledger.charges(study_id))
    booked: list[Charge] = []
    for key, rs in proved.items():
        want = max(counts[key] for counts in per_signer.values())
        for _ in range(want - held[key]):
            release_id, kind, epsilon = key
            detail = canonical_json({RECONCILED_FROM: [{"public_key": r.public_key.hex(), "charge_id": r.charge_id,
                                                        "row_sha256": r.row_sha256} for r in rs]})
            booked.append(rebook(study_id, release_id, kind, epsilon, detail))
    return booked
