"""The key holder's record of each join study's well-formedness check (docs/join.md, "Checked uploads").

The key holder chooses the seed of the check's random coefficients (`seed`: once per study
and process, from the OS CSPRNG), decrypts the computation server's flooded residues for
each owner (`judge`) and records the outcome; `require_passed` is what DecryptJoinCells
asks before it decrypts any cell of the study, so a computation server cannot skip the
check. A failed owner stays failed (its committed upload cannot change). The record is kept
in memory: after a restart the seed is new and the computation server, which runs the check
at the start of every release, runs it again before the next cell is decrypted.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Sequence

from he_partition.core.errors import InvalidInputError
from he_partition.he.join_scheme import MIN_NOISE_BUDGET_BITS, JoinScheme
from he_partition.join.wellformed import SEED_BYTES, check_rounds, well_formed

from ..common.errors import FailedPreconditionError, PermissionDeniedError

__all__ = ["JoinCheckBook"]


@dataclass
class _Study:
    seed: bytes
    outcome: dict[str, bool] = field(default_factory=dict)  # owner -> well formed


class JoinCheckBook:
    """Per join study: the check's seed and each owner's outcome."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._studies: dict[str, _Study] = {}

    def seed(self, study_id: str, scheme: JoinScheme) -> tuple[bytes, int]:
        """(seed, rounds) of the study's check: chosen on the first call, the same on every later one."""
        with self._lock:
            st = self._studies.setdefault(study_id, _Study(os.urandom(SEED_BYTES)))
            return st.seed, check_rounds(scheme.plain_modulus)

    def judge(self, study_id: str, owners: Sequence[str], owner_id: str, seed: bytes, residues: Sequence[bytes],
              scheme: JoinScheme) -> bool:
        """Decrypt each round's residue and record whether `owner_id`'s upload is well formed (every slot 0).

        Reveals 0 for an honest upload, for a malformed one its deviations (he_partition.join.wellformed);
        charges nothing. A residue without noise budget left (another key, corruption) is a failure like a
        malformed upload (False, kept): the answer is one bit, and after it the owner's upload stays failed.
        """
        if owner_id not in owners:
            raise PermissionDeniedError(f"{owner_id!r} is not one of join study {study_id}'s owners "
                                        f"({', '.join(owners)})")
        with self._lock:
            st = self._studies.get(study_id)
        if st is None or bytes(seed) != st.seed:
            raise FailedPreconditionError(f"join study {study_id}'s check was not made with this key holder's seed "
                                          "(ask JoinCheckSeed, then check again); nothing was recorded")
        rounds = check_rounds(scheme.plain_modulus)
        if len(residues) != rounds:
            raise InvalidInputError(f"the well-formedness check has {rounds} rounds, {len(residues)} ciphertexts "
                                    "arrived")
        parsed = [scheme.deserialize_released(r) for r in residues]
        # Whether a residue has noise budget left is a function of the join key, as is the decoded residue: both
        # end in the one answer False (kept, as any failure), never in a refusal of its own.
        intact = [scheme.noise_budget(ct) >= MIN_NOISE_BUDGET_BITS for ct in parsed]
        ok = all(intact) and well_formed(scheme, parsed)
        with self._lock:
            if self._studies.get(study_id) is st:
                st.outcome[owner_id] = st.outcome.get(owner_id, True) and ok  # a failure stays
        return ok

    def failed(self, study_id: str) -> list[str]:
        """The owners whose upload failed the check (kept across later seeds of the process)."""
        with self._lock:
            st = self._studies.get(study_id)
            return sorted(o for o, ok in st.outcome.items() if not ok) if st is not None else []

    def require_passed(self, study_id: str, owners: Sequence[str]) -> None:
        """FailedPreconditionError unless every owner's upload passed the check under this key holder's seed."""
        with self._lock:
            st = self._studies.get(study_id)
            outcome = dict(st.outcome) if st is not None else {}
        bad = [o for o in owners if outcome.get(o) is False]
        if bad:
            raise FailedPreconditionError(
                f"join study {study_id}: the upload of owner {', '.join(bad)} is not well formed (indicators other "
                "than one-hot or empty 0/1 planes); nothing of the study is decrypted")
        missing = [o for o in owners if o not in outcome]
        if missing:
            raise FailedPreconditionError(
                f"join study {study_id}: the upload of owner {', '.join(missing)} has not passed the "
                "well-formedness check (JoinCheckSeed, CheckJoinUpload) with this key holder; nothing was "
                "charged or decrypted")
