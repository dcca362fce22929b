"""The decryption server's study contracts and append-only privacy-budget ledger.

`budget` holds the exact arithmetic (one function, `budget`, for spent / reserved /
available, and the charge rule), `direct` the pricing of direct range counts, `chain` the
hash chain over charge rows, `store` the store interface and the in-memory store, `sqlite`
the production SQLite store and its backups. Only the decryption server imports this package.
"""

from .budget import (
                     DIRECT_KIND,
                     Budget,
                     Charge,
                     available,
                     budget,
                     check_charge,
                     exact_left,
                     exact_reserved,
                     exact_sum,
                     reserved_epsilon,
)
from .chain import LedgerTamperedError, chain_hash
from .direct import DirectCharge, DirectPiece, direct_increment
from .sqlite import LedgerUnreadableError, SqliteLedgerStore, backup_ledger, verify_ledger_file
from .store import LedgerStore, MemoryLedgerStore

__all__ = [
    "LedgerUnreadableError",
                     "DIRECT_KIND",
                     "Budget",
                     "Charge",
                     "DirectCharge",
                     "DirectPiece",
                     "LedgerStore",
                     "LedgerTamperedError",
                     "MemoryLedgerStore",
                     "SqliteLedgerStore",
                     "available",
                     "backup_ledger",
                     "budget",
                     "chain_hash",
                     "check_charge",
                     "direct_increment",
                     "exact_left",
                     "exact_reserved",
                     "exact_sum",
                     "reserved_epsilon",
                     "verify_ledger_file",
]
