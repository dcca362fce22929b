"""Direct noisy range counts from the encrypted aggregate, charged by maximum overlap (seed 004)."""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

from he_partition.core.measurements import range_count_batch
from he_partition.protocol import ComputationSide
from he_partition.core.summary import RangeCount
from he_partition.core.validation import positive_finite

from ..common.contract import check_id
from ..common.errors import AlreadyExistsError, FailedPreconditionError
from ..common.util import new_id
from .client import DirectAnswers
from .handler import ComputationHandler

__all__ = ["DirectQueries", "MAX_DIRECT_RANGES"]

#: Most ranges one DirectRangeCounts call may ask. Each range is one masked ciphertext
#: per 4,096 bins sent to the decryption server, so the cost grows with ranges x domain.
MAX_DIRECT_RANGES = 1_000


class DirectQueries:
    """Answers range counts directly: pay at the decryption server first, then one masked measurement per range.

    Privacy: each answer is the range's count over all submitted owners plus the discrete
    Laplace draws of both servers (noise_parties == 2) of scale c / eps_dp, where eps_dp =
    epsilon / noise multiplier (1 for independent records): eps-DP per range under
    add/remove of one person with at most c records. This server draws its noise and the
    prefix mask (`he_partition.core.measurements.RangeCount`) and alone knows them; the
    decryption server sees each count with this server's noise and the prefix in front
    of it behind the mask, and charges the whole batch before anything is decrypted: the
    growth of the heaviest weighted overlap of every range the study has answered (plus
    the masked prefixes at 2^-20 each), never more than the plain sum.
    """

    def __init__(self, handler: ComputationHandler) -> None:
        self.handler = handler

    def answer(self, study_id: str, ranges: Sequence[tuple[int, int]], epsilon: float, *, force: bool = False,
               request_key: str = "") -> DirectAnswers:
        """Answer `ranges` ([lo, hi) each) at `epsilon` each.

        Privacy (the class has the full statement): epsilon-DP per range, sensitivity c,
        neighbouring relation add/remove of one person with at most c records; this server
        alone knows its noise and prefix masks, the decryption server alone knows its
        draw; the whole batch is charged before anything is decrypted.

        Raises InvalidInputError (no ranges, too many, a range outside the domain, a bad
        epsilon), FailedPreconditionError (no submissions, owners missing without `force`),
        AlreadyExistsError (a request key reused for other ranges), BudgetExhaustedError
        (the batch does not fit the budget; nothing is charged or decrypted).
        """
        h = self.handler
        contract = h.study(study_id)
        if contract.is_join:
            raise FailedPreconditionError(f"study {study_id} is a join study: query its released table "
                                          "(RangeCounts); direct range counts are not available")
        eps = positive_finite("epsilon", epsilon)
        eps_dp = contract.dp_epsilon(eps)
        ms = range_count_batch(contract.domain_size, eps_dp, contract.person_bound, ranges,
                               max_ranges=MAX_DIRECT_RANGES)
        rs = [(m.lo, m.hi) for m in ms]
        if request_key:
            check_id("request_key", request_key)
            stored = h.store.direct_answers(study_id, request_key)
            if stored is not None:
                return _repeat(DirectAnswers.from_json(stored), rs, eps, request_key)
        subs = h.submissions_to_include(contract, force=force, action="count")
        owners = tuple(s.owner_id for s in subs)
        request_id = _request_id(study_id, request_key)
        h.decryption.budget(study_id)  # refuses a key holder reporting less spend than its receipts (rollback)
        paid = h.decryption.charge_direct_queries(study_id=study_id, request_id=request_id,
                                                  contract_hash=contract.contract_hash, ranges=rs, epsilon=eps_dp)
        backend = h.backend_for(contract)
        cs = ComputationSide(backend, h.rng)
        # one scale for the whole batch; the key holders' part is K/(K - T) draws (noise_tolerates T)
        se = math.sqrt(h.noise_variance_units(contract) * ms[0].noise_variance)
        counts = []
        # The same chunk work as a release: the executor's workers load the running aggregate (plus owners not
        # yet folded into it) once for the batch; every draw is made here, before fan-out (`measure_on`).
        with h.chunk_source(subs) as source:
            try:
                h.load_aggregate(request_id, contract, source, subs)
                for m in ms:
                    values, _ = h.decrypt_on_executor(cs, contract, request_id, eps_dp, m)
                    counts.append(RangeCount(m.lo, m.hi, float(values[0]), se))
            finally:
                h.executor.drop(request_id)
                end = getattr(h.decryption, "end_release", None)
                if end is not None:  # t-of-N: the request holds nothing once it ended (done or failed)
                    end(study_id, request_id)
        answers = DirectAnswers(request_id, study_id, eps, tuple(counts), paid.epsilon_charged, eps * len(rs),
                                paid.epsilon_remaining, owners)
        if request_key:
            h.store.save_direct_answers(study_id, request_key, answers.to_json())
        return answers


def _request_id(study_id: str, request_key: str) -> str:
    """A fresh id, or one derived from the key, so a retry after a lost reply is charged once."""
    if not request_key:
        return new_id("dq")
    return "dq-" + hashlib.sha256(f"{study_id}/{request_key}".encode()).hexdigest()[:24]


def _repeat(stored: DirectAnswers, ranges: list[tuple[int, int]], epsilon: float, key: str) -> DirectAnswers:
    if [(c.lo, c.hi) for c in stored.counts] != ranges or stored.epsilon != epsilon:
        raise AlreadyExistsError(
            f"request_key {key!r} was used for other ranges or another epsilon in study {stored.study_id}; "
            "use a new key"
        )
    return DirectAnswers(stored.request_id, stored.study_id, stored.epsilon, stored.counts, 0.0,
                         stored.epsilon_sequential, stored.epsilon_remaining, stored.owners)
