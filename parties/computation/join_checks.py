"""The computation server's half of a join study's well-formedness check (docs/join.md, "Checked uploads").

Before the first join cell of a release is decrypted, each owner's committed upload is
checked under encryption with coefficients from the key holder's seed
(he_partition.join.wellformed): the residues go to the key holder, which records the outcome
and refuses DecryptJoinCells until both owners passed. An owner whose upload fails is named
and the release is refused (FAILED_PRECONDITION) before anything is charged or decrypted.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Sequence

from he_partition.he.join_scheme import JoinScheme
from he_partition.execution.base import ChunkExecutor
from he_partition.join.check_workers import parallel_residues
from he_partition.join.wellformed import check_rounds, residues

from ..common.contract import StudyContract
from ..common.errors import FailedPreconditionError

__all__ = ["PassedChecks", "check_join_uploads"]

log = logging.getLogger("dpagg.join")


#: (study, contract hash, the uploads' sorted (owner, idempotency key) pairs, the key holder's seed).
_CheckKey = tuple[str, str, tuple[tuple[str, str], ...], bytes]


class PassedChecks:
    """The checks this server saw pass: (study, contract hash, the uploads' (owner, idempotency key), seed).

    A study released again while the key holder keeps the same seed (it has not restarted) need
    not be checked again: the key holder still holds both owners' passes under that seed and lets
    DecryptJoinCells through. A new seed, or other uploads, and the check runs again. The key
    holder's record decides; this one only saves the work (in memory: a restart checks again).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._passed: set[_CheckKey] = set()

    def seen(self, key: _CheckKey) -> bool:
        with self._lock:
            return key in self._passed

    def add(self, key: _CheckKey) -> None:
        with self._lock:
            self._passed.add(key)


def check_join_uploads(contract: StudyContract, scheme: JoinScheme, public: bytes,
                       uploads: dict[str, Sequence[Sequence[bytes]]], decryption: Any,
                       executor: ChunkExecutor | None = None, *,
                       passed: PassedChecks | None = None, upload_keys: tuple[tuple[str, str], ...] = ()) -> None:
    """Check both owners' uploads with the key holder's coefficients; FailedPreconditionError naming any owner whose
    upload is not one-hot-or-empty 0/1 indicator planes (nothing is charged or decrypted then).

    `uploads[owner]` is the owner's committed upload group by group (`UploadFiles` where the
    store keeps chunk files: each worker then reads its groups itself); `scheme` the study's join
    scheme and `public` its public key's bytes (what the workers load); `decryption` the key holder's client (join_check_seed, check_join_upload); `executor` the
    server's workers, over which the groups are spread (None: this process). Privacy: the key
    holder decrypts, per owner and round, z = 0 in every slot for an honest upload (flooded):
    nothing of the records.
    """
    seed, rounds = decryption.join_check_seed(study_id=contract.study_id, contract_hash=contract.contract_hash)
    if rounds != check_rounds(scheme.plain_modulus):
        raise FailedPreconditionError(f"the key holder asks for {rounds} check rounds, this server computes "
                                      f"{check_rounds(scheme.plain_modulus)}: the servers' versions differ")
    key: _CheckKey = (contract.study_id, contract.contract_hash, tuple(sorted(upload_keys)), bytes(seed))
    if passed is not None and upload_keys and passed.seen(key):
        log.info("study %s: both join uploads already passed the check under the key holder's current seed",
                 contract.study_id)
        return
    began = time.monotonic()
    owners = {owner: uploads[owner] for owner in contract.expected_owners}
    computed = (parallel_residues(scheme, public, owners, seed, executor) if executor is not None
                else {owner: residues(scheme, (up[g] for g in range(len(up))), seed, owner)
                      for owner, up in owners.items()})
    failed = [owner for owner in owners
              if not decryption.check_join_upload(study_id=contract.study_id, contract_hash=contract.contract_hash,
                                                  owner_id=owner, seed=seed, residues=computed[owner])]
    log.info("study %s: both join uploads checked in %.2f s (%d groups each, %d workers)", contract.study_id,
             time.monotonic() - began, len(uploads[contract.expected_owners[0]]),
             executor.workers if executor is not None else 1)
    if failed:
        log.warning("study %s: the join upload of owner %s is not well formed; the release is refused",
                    contract.study_id, ", ".join(failed))
        raise FailedPreconditionError(
            f"join study {contract.study_id}: the upload of owner {', '.join(failed)} is not well formed (its "
            "indicator planes are not one-hot or empty 0/1 planes, checked under encryption): the release is "
            "refused and nothing was charged or released")
    if passed is not None and upload_keys:
        passed.add(key)
