"""The computation server's half of a join study's well-formedness check (docs/join.md, "Checked uploads").

Before the first join cell of a release is decrypted, each owner's committed upload is
checked under encryption with coefficients from the key holder's seed
(he_partition.join.wellformed): the residues go to the key holder, which records the outcome
and refuses DecryptJoinCells until both owners passed. An owner whose upload fails is named
and the release is refused (FAILED_PRECONDITION) before anything is charged or decrypted.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

from he_partition.he.join_scheme import JoinScheme
from he_partition.join.wellformed import check_rounds, residues

from ..common.contract import StudyContract
from ..common.errors import FailedPreconditionError

__all__ = ["check_join_uploads"]

log = logging.getLogger("dpagg.join")


def _groups(chunks_of: Callable[[str, int], bytes], owner: str, groups: int, values: int) -> Iterator[list[bytes]]:
    """The owner's committed upload group by group (one group's ciphertexts in memory at a time)."""
    for g in range(groups):
        yield [chunks_of(owner, g * values + v) for v in range(values)]


def check_join_uploads(contract: StudyContract, scheme: JoinScheme, chunks_of: Callable[[str, int], bytes],
                       decryption: Any) -> None:
    """Check both owners' uploads with the key holder's coefficients; FailedPreconditionError naming any owner whose
    upload is not one-hot-or-empty 0/1 indicator planes (nothing is charged or decrypted then).

    `chunks_of(owner, index)` reads a committed chunk; `decryption` is the key holder's client
    (join_check_seed, check_join_upload). Privacy: the key holder decrypts, per owner and round,
    z = 0 in every slot for an honest upload (flooded): nothing of the records.
    """
    terms = contract.join_terms()
    seed, rounds = decryption.join_check_seed(study_id=contract.study_id, contract_hash=contract.contract_hash)
    if rounds != check_rounds(scheme.plain_modulus):
        raise FailedPreconditionError(f"the key holder asks for {rounds} check rounds, this server computes "
                                      f"{check_rounds(scheme.plain_modulus)}: the servers' versions differ")
    groups = terms.groups(scheme.slots)
    failed = []
    for side, owner in enumerate(contract.expected_owners):
        cts = residues(scheme, _groups(chunks_of, owner, groups, terms.values_of(side)), seed, owner)
        if not decryption.check_join_upload(study_id=contract.study_id, contract_hash=contract.contract_hash,
                                            owner_id=owner, seed=seed, residues=cts):
            failed.append(owner)
    if failed:
        log.warning("study %s: the join upload of owner %s is not well formed; the release is refused",
                    contract.study_id, ", ".join(failed))
        raise FailedPreconditionError(
            f"join study {contract.study_id}: the upload of owner {', '.join(failed)} is not well formed (its "
            "indicator planes are not one-hot or empty 0/1 planes, checked under encryption): the release is "
            "refused and nothing was charged or released")
