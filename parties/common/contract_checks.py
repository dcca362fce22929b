"""Checks of single study contract terms (owner keys, seal keys, correlation terms, whole numbers).

Kept apart from `contract.py`, which assembles and hashes the terms; each check raises
InvalidInputError naming the term.
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

from he_partition.core.errors import InvalidInputError

#: Longest accepted `correlation_source` (provenance text, not the graph itself).
MAX_CORRELATION_SOURCE = 512

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _shown(value: object, limit: int = 48) -> str:
    """`value` for an error message, cut to `limit` characters: an error never echoes a huge input back
    (a 10 KB id once pushed the status past gRPC's metadata limit)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, (str, bytes)) else type(value).__name__
    return f"{text[:limit]}... ({size})"


def _whole(name: str, value: Any) -> int:
    """`value` as an int when it is a whole number (an int, or a float such as JSON may carry), else refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise InvalidInputError(f"{name} must be a whole number, got {_shown(value)}")
    return int(value)


def _check_leakage(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(f"correlation_leakage must be a number, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise InvalidInputError(
            f"correlation_leakage must be >= 0 and finite, got {value}; it is the maximum leakage coefficient L of "
            "the correlation model (he_partition.methods.bayesian.max_leakage), 0 for independent records"
        )
    return float(value)


def _check_source(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_CORRELATION_SOURCE or not value.isprintable():
        raise InvalidInputError(
            f"correlation_source must be printable text of at most {MAX_CORRELATION_SOURCE} characters "
            f"(where the correlation model came from), got {str(value)[:80]!r}"
        )
    return value


def _check_seal_keys(keys: Any, signed: bool) -> tuple[str, ...]:
    """The key holders' X25519 seal keys (64 hex digits each, distinct, holder order); they need owner keys."""
    from .sealing import check_seal_public_key

    if isinstance(keys, str):
        raise InvalidInputError("holder_seal_keys must be a list of hex X25519 public keys, one per key holder")
    out = tuple(check_seal_public_key(k, f"holder_seal_keys[{i}]") for i, k in enumerate(keys or ()))
    if len(set(out)) != len(out):
        raise InvalidInputError("holder_seal_keys names one key twice: every key holder has its own seal key")
    if out and not signed:
        raise InvalidInputError("holder_seal_keys needs owner_keys: the key holders accept only commitments the "
                                "owners signed with the keys the contract pins")
    return out


def _owner_key_pairs(keys: Any) -> tuple[tuple[str, str], ...]:
    if not keys:
        return ()
    items = keys.items() if isinstance(keys, Mapping) else keys
    out = []
    try:
        for owner, key in items:
            out.append((owner, key.hex() if isinstance(key, (bytes, bytearray)) else key))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"owner_keys must map owner ids to hex Ed25519 public keys: {exc}") from exc
    return tuple(out)


def _canonical_owner_keys(keys: Any, owners: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    pairs = _owner_key_pairs(keys)
    if not pairs:
        return ()
    seen: dict[str, str] = {}
    for owner, key in pairs:
        if not isinstance(owner, str) or owner in seen:
            raise InvalidInputError(f"owner_keys names owner {owner!r} twice or not as text")
        if not isinstance(key, str) or not _HEX64.match(key.lower()):
            raise InvalidInputError(
                f"owner_keys[{owner!r}] must be an Ed25519 public key as 64 hex digits, got {str(key)[:80]!r}; "
                "the owner prints it with `dpagg keygen`"
            )
        seen[owner] = key.lower()
    extra = sorted(set(seen) - set(owners))
    missing = sorted(set(owners) - set(seen))
    if extra or missing:
        raise InvalidInputError(
            "owner_keys must give exactly one public key per expected owner"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; not expected owners: {', '.join(extra)}" if extra else "")
        )
    return tuple(sorted(seen.items()))
