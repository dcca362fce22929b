"""A key-share holder's copy of a join study's indicator planes: each owner's upload, taken only under its signature.

With K holders each holder computes the join's values and the well-formedness residues itself, from
the owners' planes (`he_partition.join.holders`): what it decrypts is then fixed by what the owners
uploaded. That holds only if the planes are the owners'. The computation server relays them, and
a plane it made up would let it choose what the holders decrypt again. So the holder takes each
owner's upload with that owner's signature (`parties.common.signing.sign_upload`: every chunk in
index order, group by group and value by value, under the study id, owner id, idempotency key and
contract hash), recomputes the digest from the chunks it got and verifies the signature under the
contract's key for that owner. It refuses:
- an unsigned study or one that is no join (FAILED_PRECONDITION);
- a missing, unknown or repeated owner (FAILED_PRECONDITION);
- an upload of another chunk count than the study's groups x that side's values (INVALID_ARGUMENT);
- a signature that does not verify (SignatureError, naming the owner).

Nothing is computed or decrypted before every check passed. Adds no noise and spends nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from he_partition.core.errors import InvalidInputError

from ...common.contract import StudyContract
from ...common.errors import FailedPreconditionError
from ...common.signing import SignatureError, verify_upload
from ...common.util import ReadOnDemand

__all__ = ["OwnerPlanes", "accept_planes"]

@dataclass(frozen=True)
class OwnerPlanes:
    """One owner's committed join upload as the CS relays it: chunk g x values + v is value v's plane of group g."""

    owner_id: str
    idempotency_key: str
    signature: bytes
    chunks: Sequence[bytes]


def accept_planes(contract: StudyContract, uploads: Iterable[OwnerPlanes]) -> tuple[list[Sequence[bytes]],
                                                                                   list[Sequence[bytes]]]:
    """Both owners' planes (groups x values, the contract's first owner first) after every check above; each group
    reads its planes from the upload's chunks when asked (nothing is copied)."""
    if not contract.is_join:
        raise FailedPreconditionError(f"study {contract.study_id} is no join study: it has no indicator planes")
    if not contract.signed:
        raise FailedPreconditionError(f"study {contract.study_id} lists no owner keys: a key-share holder takes join "
                                      "planes only under their owners' signatures, so it joins signed studies only")
    got = list(uploads)
    names = [u.owner_id for u in got]
    owners = list(contract.expected_owners)
    if sorted(names) != sorted(owners) or len(set(names)) != len(names):
        raise FailedPreconditionError(f"study {contract.study_id}: the planes must come from each of {owners} once, "
                                      f"got {names}: refused, nothing was computed")
    terms = contract.join_terms()
    groups = terms.groups(terms.scheme_params.slots)
    keys = dict(contract.owner_keys)
    out: list[list[Sequence[bytes]]] = []
    for side, owner in enumerate(owners):
        u = next(x for x in got if x.owner_id == owner)
        values = terms.values_of(side)
        if len(u.chunks) != groups * values:
            raise InvalidInputError(f"owner {owner!r}'s join upload has {len(u.chunks)} planes; the study has "
                                    f"{groups} groups x {values} values")
        try:
            verify_upload(bytes.fromhex(keys[owner]), u.signature, study_id=contract.study_id, owner_id=owner,
                          idempotency_key=u.idempotency_key, contract_hash=contract.contract_hash, chunks=u.chunks)
        except SignatureError:
            raise SignatureError(f"owner {owner!r}'s signature does not verify over the planes relayed for it (other "
                                 "planes than it uploaded, or another owner's): refused, nothing was computed or "
                                 "decrypted") from None
        out.append([ReadOnDemand(u.chunks.__getitem__, values, g * values) for g in range(groups)])
    return out[0], out[1]
