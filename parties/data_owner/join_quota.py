"""What a join owner accepts of the other owner's quota of oblivious evaluations before it takes part (docs/join.md).

The key holder answers each owner of a join study at most its quota of oblivious pseudonym evaluations
(`JoinTerms.evaluation_quota`): its declared largest record count plus its private dummies' allowance, or
the capacity when the study declares no counts. Whoever opened the study wrote those counts, and an owner
colluding with the computation server can test as many guessed identifiers against the other owner's list
as its quota leaves beyond its own records. So each owner's client shows both sides' counts and quotas and
refuses a partner quota above a bound the owner sets, before it sends anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from he_partition.core.errors import InvalidInputError

from ..common.contract import StudyContract
from ..common.errors import FailedPreconditionError

__all__ = ["JoinQuotas", "join_quotas", "DEFAULT_PARTNER_FACTOR"]

#: Without `max_partner_records`, an owner accepts a partner that declares at most this many times its own
#: records (docs/join.md, "The quota"): comparable partners pass, a lopsided or inflated claim needs a decision.
DEFAULT_PARTNER_FACTOR = 4


@dataclass(frozen=True)
class JoinQuotas:
    """Both owners' declared record counts and quotas of oblivious evaluations in a join study, as this owner sees
    them before it takes part, and the bound it holds the other owner's quota to.

    The other owner's quota is how many guessed identifiers it could test against this owner's list with the
    computation server's help (its own records use part of it); the key holder enforces the quota the contract
    sets, and whoever opened the study wrote the counts, so this owner accepts them or not."""

    study_id: str
    owner_id: str
    partner_id: str
    #: The records this owner joins.
    records: int
    #: Each side's declared largest record count (None: the study declares none, each quota is the capacity).
    declared: int | None
    partner_declared: int | None
    #: Oblivious evaluations the key holder answers each side (`JoinTerms.evaluation_quota`; None: the study's
    #: pseudonyms are not oblivious, so the other owner with the computation server tests guesses offline, unbounded).
    quota: int | None
    partner_quota: int | None
    #: The private dummies' allowance in each quota (2 x padding offset).
    allowance: int
    capacity: int
    #: The most records this owner lets the other owner claim; its quota may be this plus the allowance.
    max_partner_records: int
    #: True when `max_partner_records` is the default, DEFAULT_PARTNER_FACTOR x `records`.
    default_bound: bool

    @property
    def accepted(self) -> bool:
        """Whether the other owner's quota is within this owner's bound."""
        return self.partner_quota is not None and self.partner_quota <= self.max_partner_records + self.allowance

    def as_dict(self) -> dict[str, Any]:
        return {"owner": self.owner_id, "records": self.records, "declared": self.declared, "quota": self.quota,
                "partner": self.partner_id, "partner_declared": self.partner_declared,
                "partner_quota": self.partner_quota, "dummy_allowance": self.allowance, "capacity": self.capacity,
                "max_partner_records": self.max_partner_records, "default_bound": self.default_bound}

    def describe(self) -> str:
        """Both sides' counts and quotas and this owner's bound, in one paragraph (what `join-submit` prints)."""
        def side(name: str, declared: int | None, quota: int | None) -> str:
            if quota is None:
                return f"{name}: no quota (HMAC pseudonyms: guesses are tested offline, without the key holder)"
            said = f"declared {declared:,} records" if declared is not None else "no declared count"
            return f"{name}: {said}, quota {quota:,} oblivious evaluations"
        how = (f"the default, {DEFAULT_PARTNER_FACTOR} x your {self.records:,} records" if self.default_bound
               else "yours: --max-partner-records / max_partner_records")
        counts = ("" if self.declared is not None or self.quota is None else
                  f"; the study declares no record counts, so each quota is its capacity, {self.capacity:,}")
        return (f"join study {self.study_id}: you ({self.owner_id}) join {self.records:,} records; "
                f"{side('you', self.declared, self.quota)}; "
                f"{side(f'the other owner {self.partner_id}', self.partner_declared, self.partner_quota)}"
                f"{counts}. The other owner's quota is how many guessed identifiers it could test against your "
                f"list with the computation server's help; you accept at most {self.max_partner_records:,} records "
                f"plus the dummies' allowance {self.allowance:,} ({how})")

    def check(self) -> None:
        """Refuse (FailedPreconditionError) a partner quota above this owner's bound; call before sending anything."""
        if self.accepted:
            return
        if self.partner_quota is None:
            raise FailedPreconditionError(
                f"refusing to take part in join study {self.study_id}: its pseudonyms are HMACs under the owners' "
                f"join key (a contract from before oblivious pseudonyms), so the other owner {self.partner_id} "
                "with the computation server could test any number of guessed identifiers against your list "
                "offline. Nothing was sent. Ask the operator to open a new join study (the key holder makes every "
                "new one oblivious)")
        said = (f"it declared {self.partner_declared:,} records" if self.partner_declared is not None else
                f"the study declares no record counts, so its quota is the capacity, {self.capacity:,}")
        bound = (f"the default {DEFAULT_PARTNER_FACTOR} x your {self.records:,}" if self.default_bound
                 else "your max_partner_records")
        need = self.partner_quota - self.allowance
        raise FailedPreconditionError(
            f"refusing to take part in join study {self.study_id}: the other owner {self.partner_id} may have "
            f"{self.partner_quota:,} oblivious evaluations ({said}), above your bound of "
            f"{self.max_partner_records + self.allowance:,} ({self.max_partner_records:,} records, {bound}, plus "
            f"the dummies' allowance {self.allowance:,}); with the computation server it could test that many "
            f"guessed identifiers against your {self.records:,} records. Nothing was sent. Ask the operator to "
            "open the study with counts you accept (dpagg open-join --max-records N_A,N_B), or, if you accept "
            f"this one, run again with --max-partner-records {need} (library: max_partner_records={need})")


def join_quotas(contract: StudyContract, owner_id: str, records: int, *,
                max_partner_records: int | None = None) -> JoinQuotas:
    """Owner `owner_id`'s view of join study `contract`'s quotas when it joins `records` records, with its bound
    on the other owner's records (None: DEFAULT_PARTNER_FACTOR x `records`). Nothing is sent; `.check()` refuses."""
    terms = contract.join_terms()
    if owner_id not in contract.expected_owners:
        raise InvalidInputError(f"owner {owner_id} is not one of join study {contract.study_id}'s owners")
    if max_partner_records is not None and (isinstance(max_partner_records, bool) or max_partner_records < 1):
        raise InvalidInputError(f"max_partner_records must be a whole number >= 1, got {max_partner_records!r}")
    side = contract.expected_owners.index(owner_id)
    declared = terms.max_records
    return JoinQuotas(
        contract.study_id, owner_id, contract.expected_owners[1 - side], int(records),
        declared[side] if declared is not None else None, declared[1 - side] if declared is not None else None,
        terms.evaluation_quota(side) if terms.oblivious else None,
        terms.evaluation_quota(1 - side) if terms.oblivious else None,
        terms.dummy_allowance(), terms.capacity,
        int(max_partner_records) if max_partner_records is not None else DEFAULT_PARTNER_FACTOR * int(records),
        max_partner_records is None)
