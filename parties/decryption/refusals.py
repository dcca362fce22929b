"""The decryption server's refusals after the charge: one message for all of them, and a cap per study and per key.

Whether a ciphertext passes the integrity check (noise budget) or the magnitude check is a
function of its phase c0 + c1 s, so of the secret key s. Those checks run only after the
request's ledger row is committed (and after the key holder's own flood,
`BfvBackend.holder_flooded`), every refusal they cause is charged and recorded in `arrivals`
with the one text `refusal_after_charge` gives (it does not say which check refused, nor
which chunk), and the refusals are capped: after MAX_REFUSALS_PER_STUDY of a study, or
MAX_REFUSALS_PER_KEY of all studies under the same key (the contract's context fingerprint),
the server decrypts nothing more for that study (or key) and says so (FAILED_PRECONDITION,
before any charge: the count is what the computation server has already been told). A join
upload's failed well-formedness check (a verdict on a decryption, free of charge by design)
counts toward the same caps.
"""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Iterator

from he_partition.core.errors import PrecisionError

from ..common.errors import FailedPreconditionError
from .arrivals import ArrivalLog

__all__ = ["FAILED_JOIN_CHECK", "MAX_REFUSALS_PER_STUDY", "MAX_REFUSALS_PER_KEY", "REFUSED_AFTER_CHARGE", "RefusalGate",
           "refusal_after_charge"]

#: Refusals after the charge one study may cause; then the server decrypts nothing more for it.
MAX_REFUSALS_PER_STUDY = 8
#: Refusals after the charge all studies under one key may cause (while studies share a key,
#: a computation server cannot reset the count by opening another study); then nothing more under it.
MAX_REFUSALS_PER_KEY = 64
#: The words that open every refusal after the charge (and mark it in `arrivals`).
REFUSED_AFTER_CHARGE = "refused after the charge"
#: The `arrivals` reason of a join upload's failed well-formedness check (a decryption's verdict, uncharged:
#: it counts toward the same caps, and the owner's upload stays failed).
FAILED_JOIN_CHECK = "failed the join well-formedness check (counted with the refusals after the charge)"


def refusal_after_charge(study_id: str, cap: int) -> PrecisionError:
    """The one refusal the server gives for anything that went wrong after the charge (INVALID_ARGUMENT).

    The same text whatever refused (integrity, magnitude, decode) and wherever: it depends on
    public facts only (the study, the cap).
    """
    return PrecisionError(
        f"{REFUSED_AFTER_CHARGE}: the ciphertexts did not decrypt to a plausible measurement (made under another "
        "key, corrupt, not shaped like this measurement, or an owner's values out of range); the charge stays "
        f"spent, and study {study_id} may cause at most {cap} such refusals (MAX_REFUSALS_PER_STUDY)")


class RefusalGate:
    """Admits a decryption request only while its study and its key are below their refusal caps.

    Counts come from `arrivals` (refusals marked REFUSED_AFTER_CHARGE, so they survive a
    restart) plus the requests admitted and not finished: concurrent requests cannot overrun a
    cap (a request waits while the admitted ones could still take the study or key to its cap).
    `key_of(study_id)`: the study's key fingerprint. The caller records the outcome in
    `arrivals` before it leaves `admitted`.
    """

    def __init__(self, arrivals: ArrivalLog, key_of: Callable[[str], str], *,
                 per_study: int = MAX_REFUSALS_PER_STUDY, per_key: int = MAX_REFUSALS_PER_KEY) -> None:
        if per_study < 1 or per_key < 1:
            raise ValueError(f"refusal caps must be >= 1, got {per_study} per study and {per_key} per key")
        self._arrivals = arrivals
        self._key_of = key_of
        self.per_study = per_study
        self.per_key = per_key
        self._cond = threading.Condition()
        self._studies: Counter[str] = Counter()
        self._keys: Counter[str] = Counter()

    def refused(self, study_id: str, key: str) -> tuple[int, int]:
        """(refusals after the charge of `study_id`, of every study under `key`), from `arrivals`."""
        by_study = Counter(self._arrivals.refusals_containing(REFUSED_AFTER_CHARGE))
        by_study.update(self._arrivals.refusals_containing(FAILED_JOIN_CHECK))
        return by_study.get(study_id, 0), sum(n for s, n in by_study.items() if self._key_of(s) == key)

    @contextmanager
    def admitted(self, study_id: str, key: str) -> Iterator[None]:
        """Hold one of the study's (and key's) remaining refusals while the request runs; FailedPreconditionError
        naming the cap when one is reached (nothing is charged then)."""
        with self._cond:
            while True:
                study, under_key = self.refused(study_id, key)
                if study >= self.per_study:
                    raise FailedPreconditionError(
                        f"study {study_id} reached the cap of {self.per_study} refusals after the charge "
                        "(MAX_REFUSALS_PER_STUDY): this key holder decrypts nothing more for it; nothing was charged")
                if under_key >= self.per_key:
                    raise FailedPreconditionError(
                        f"the key of study {study_id} (fingerprint {key[:16]}) reached the cap of {self.per_key} "
                        "refusals after the charge over its studies (MAX_REFUSALS_PER_KEY): this key holder "
                        "decrypts nothing more under it; nothing was charged")
                if study + self._studies[study_id] < self.per_study and under_key + self._keys[key] < self.per_key:
                    break
                self._cond.wait(timeout=1.0)
            self._studies[study_id] += 1
            self._keys[key] += 1
        try:
            yield
        finally:
            with self._cond:
                self._studies[study_id] -= 1
                self._keys[key] -= 1
                self._cond.notify_all()
