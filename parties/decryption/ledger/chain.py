"""The hash chain over the ledger's charge rows: a changed, removed or replaced row breaks it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ...common.errors import FailedPreconditionError

__all__ = ["LedgerTamperedError", "chain_hash", "verify_chain_rows"]


def chain_hash(previous: str, row: Sequence[object]) -> str:
    """The hash chain over charge rows: SHA-256 of the previous row's hash and this row's fields."""
    fields = [previous, *(repr(v) if isinstance(v, float) else str(v) for v in row)]
    return hashlib.sha256("\x1f".join(fields).encode()).hexdigest()


class LedgerTamperedError(FailedPreconditionError):
    """The ledger's hash chain does not verify: a charge row was changed, removed or replaced."""




def verify_chain_rows(rows: Iterable[Sequence[Any]], where: Path | str) -> tuple[int, str]:
    """Recompute the chain over charge rows (fields..., stored chain hash), oldest first.

    Returns (last charge id, last hash), or raises LedgerTamperedError naming the first row
    that does not verify. Rows written before the chain existed (empty stored hash, before
    any chained row) are hashed, not checked.
    """
    previous, last_id, chained = "", 0, False
    for r in rows:
        fields = (int(r[0]), r[1], r[2], r[3], float(r[4]), float(r[5]), r[6], r[7])
        want = chain_hash(previous, fields)
        if r[8] == "" and not chained:
            previous = want
        elif r[8] != want:
            raise LedgerTamperedError(
                f"the ledger's hash chain breaks at charge {r[0]} (study {r[1]}): a charge row was changed, "
                f"removed or replaced in {where}. Decryption is stopped; restore the ledger from a backup "
                "and check it with `dpagg budget --verify`"
            )
        else:
            chained, previous = True, want
        last_id = fields[0]
    return last_id, previous
