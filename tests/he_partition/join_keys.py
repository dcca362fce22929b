"""K holders' collective keys made in one process (tests): every holder's part of each round, honest unless told.

A deployment runs these rounds through `he_partition.he.threshold.setup.HolderSetup`, one holder per
machine; here one process plays every holder, as the library's tests of the rounds need.
"""
from __future__ import annotations

from typing import Any, Sequence

from he_partition.he.threshold.keys import HolderSecret, collective_public_key, holder_keygen
from he_partition.he.threshold.relin import collective_relin_keys, relin_round_one, relin_round_two
from he_partition.he.threshold.wire import key_share_commitment


def commit(seed: bytes, parts: dict[int, bytes]) -> dict[int, bytes]:
    return {h: key_share_commitment(h, seed, b) for h, b in parts.items()}


def holder_keys(ctx: Any, seed: bytes, holders: Sequence[int]) -> tuple[dict[int, HolderSecret], bytes]:
    """Each holder's secret share and the collective public key."""
    keys = {h: holder_keygen(ctx, seed, h) for h in holders}
    reveals = {h: keys[h][1] for h in holders}
    return {h: keys[h][0] for h in holders}, collective_public_key(ctx, seed, commit(seed, reveals), reveals)


def relin_rounds(ctx: Any, seed: bytes, secrets_: dict[int, HolderSecret],
                 seeds: dict[int, bytes] | None = None) -> dict[str, Any]:
    """Both relinearization rounds and the key; holder h's round 1 over `seeds[h]` instead when given."""
    seeds = seeds or {}
    one = {h: relin_round_one(ctx, secrets_[h], seeds.get(h, seed)) for h in secrets_}
    r1 = {h: one[h].share for h in secrets_}
    c1 = commit(seed, r1)
    r2 = {h: relin_round_two(ctx, secrets_[h], one[h], seed, c1, r1) for h in secrets_}
    c2 = commit(seed, r2)
    return {"one": one, "r1": r1, "c1": c1, "r2": r2, "c2": c2,
            "rk": collective_relin_keys(ctx, seed, (c1, r1), c2, r2)}
