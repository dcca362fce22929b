"""Decryption role: the key holder, its budget ledger, and the service that decrypts noised measurements."""
