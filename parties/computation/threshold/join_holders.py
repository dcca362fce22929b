"""The computation server's side of a join study released by key-share holders (he_partition.join.holders).

The CS relays; every holder computes: it forwards both owners' committed uploads whole, with their
upload signatures, to every holder (`send_planes`); relays the holders' check, in which they fix the
seed together and each combines every holder's shares itself (`run_check`); and for each measurement
sends each holder only the measurement, combining the holders' shares with the values it computed
itself, its own draw added to c0 as a plaintext (`combine_shares`). A holder that refuses or is down
stops the step, named; nothing is combined then.

N-of-N deployments: every holder takes part. t-of-N: the first t holders up when the release starts
take part in all of it (the planes, the check and every measurement, each measurement charged in the
study's signed log with those t as its participants); a participant lost during the release fails it,
naming the holder, and the next release picks t holders again.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import numpy as np

from he_partition.core.measurements import Measurement
from he_partition.join.holders import combine_values

from ...common.contract import StudyContract
from ...decryption.client import JoinCellsResult
from ...decryption.keyshare.client import HolderShares, KeyShareClient
from ...decryption.keyshare.uploads import OwnerC1Parts
from .relay import HolderRelay

__all__ = ["send_planes", "run_check", "combine_shares"]

log = logging.getLogger("dpagg.computation.threshold")

_CHECK = ("seed_commit", "seed_reveal", "check_commit", "check_reveal", "verdict")


def send_planes(td: HolderRelay, contract: StudyContract, uploads: list[OwnerC1Parts], parts: Sequence[int]) -> None:
    """Both owners' planes (whole ciphertexts, in chunk order) with their upload signatures, to each holder of
    `parts`."""
    t0 = time.monotonic()
    td._all("refused the owners' join planes",
            lambda c: c.send_uploads(contract.study_id, contract.contract_hash, uploads, planes=True), parts)
    log.info("study %s: both owners' join planes (%d) forwarded to holders %s in %.2f s", contract.study_id,
             sum(len(u.parts) for u in uploads), list(parts), time.monotonic() - t0)


def run_check(td: HolderRelay, contract: StudyContract, parts: Sequence[int]) -> None:
    """Relay the holders' well-formedness check (`keyshare.join_release`) among `parts`: each step's messages of
    every holder to every holder. A holder that finds an owner's planes malformed refuses the verdict, naming the
    owner."""
    t0 = time.monotonic()
    messages: dict[int, bytes] | None = None
    for step in _CHECK:
        def call(c: KeyShareClient, step: str = step, sent: dict[int, bytes] | None = messages) -> bytes:
            return c.join_check(contract.study_id, contract.contract_hash, step, sent, list(parts))

        replies = td._all(f"refused join check step {step}", call, parts)
        messages = dict(zip(parts, replies))
    log.info("study %s: both owners' join planes passed every holder's check in %.2f s", contract.study_id,
             time.monotonic() - t0)


def combine_shares(td: HolderRelay, contract: StudyContract, *, release_id: str, release_epsilon: float,
                   measurement: Measurement, values: Sequence[bytes], ctx: Any, plain_modulus: int,
                   parts: Sequence[int], charge_log: str = "") -> JoinCellsResult:
    """Every holder's shares of the measurement's values, combined with `values` (the CS's own ciphertexts of
    them, its draw added to c0: `holders.noised_for_holders`).

    Privacy: each holder charges `measurement.epsilon` to its own ledger and adds its DP share (any holders
    short of the contract's noise_tolerates sum to a full discrete Laplace draw of scale
    sensitivity/epsilon); this server's draw is in `values`, known only to it. Draws no noise here. t-of-N:
    `charge_log` holds the measurement's signed charge, whose participants are `parts`."""
    def ask(c: KeyShareClient) -> HolderShares:
        return c.join_shares(study_id=contract.study_id, release_id=release_id, release_epsilon=release_epsilon,
                             contract_hash=contract.contract_hash, measurement=measurement, participants=list(parts),
                             charge_log=charge_log)

    got: list[HolderShares] = td._all(f"refused its shares of {measurement.kind}", ask, parts)
    combined = combine_values(ctx, values, [[g.shares[v] for g in got] for v in range(len(values))], list(parts),
                              bytes.fromhex(contract.context_fingerprint), plain_modulus)
    variance = measurement.noise_variance * (1 + (contract.holder_noise_variance(len(parts))
                                                  if contract.noise_parties == 2 else 0))
    remaining = min(g.epsilon_remaining for g in got)
    return JoinCellsResult(np.asarray(combined, dtype=np.int64), variance, float(measurement.epsilon), remaining)
