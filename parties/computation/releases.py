"""The computation server's releases: the checks before one, running its strategy, storing its outcome.

`Releases` keeps which studies have a release running (one at a time per study) and runs each,
blocking or in a thread, with the handler's keys, executor and decryption client.
`ComputationHandler.run_release` / `release` call it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import replace
from functools import partial
from contextlib import AbstractContextManager
from typing import Any, Callable, Iterator, Protocol

import grpc
import numpy as np
import numpy.typing as npt

from he_partition.core.accounting import exact_decimal
from he_partition.core.errors import BudgetExhaustedError, InvalidInputError
from he_partition.core.measurements import Measurement
from he_partition.core.summary import Summary
from he_partition.join.release import join_strategy, summary_params
from he_partition.protocol import EPSILON_TOLERANCE, MIN_RELEASE_EPSILON, ComputationSide, make_strategy, run_strategy

from ..common.contract import StudyContract, check_id
from ..common.errors import FailedPreconditionError, NotFoundError, status_for
from ..common.util import ReadOnDemand, new_id, utc_now
from .join_checks import PassedChecks, check_join_uploads
from .store import ComputationStore, ReleaseProgress, ReleaseRecord, ReleaseState, Submission

from he_partition.core.noise import RandomSource
from he_partition.execution import ChunkExecutor
from he_partition.execution.base import ChunkSource
from ..decryption.client import DecryptionClient
from ..decryption.keyshare.uploads import OwnerC1Parts
from .join import JoinCoordinator


class ReleaseHost(Protocol):
    """What the release path needs of the server it runs in (`ComputationHandler` is one): its store, studies and
    keys, the executor and the aggregate on it, the key holders (a decryption client or `ThresholdDecryption`),
    the noise source, and whether the server is stopping."""

    store: ComputationStore
    executor: ChunkExecutor
    decryption: DecryptionClient
    joins: JoinCoordinator
    rng: RandomSource
    stopping: threading.Event

    @property
    def key_holders(self) -> int: ...

    def study(self, study_id: str) -> StudyContract: ...

    def backend_for(self, contract: StudyContract) -> Any: ...

    def public_context(self, study_id: str = "") -> bytes: ...

    def submissions_to_include(self, contract: StudyContract, *, force: bool, action: str) -> list[Submission]: ...

    def chunk_source(self, subs: list[Submission]) -> AbstractContextManager[ChunkSource]: ...

    def load_aggregate(self, key: str, contract: StudyContract, source: ChunkSource,
                       subs: list[Submission] | None = None) -> None: ...

    def decrypt_on_executor(self, cs: ComputationSide, contract: StudyContract, key: str, release_epsilon: float,
                            m: Measurement, *, on_chunk: Callable[[], None] | None = None) -> tuple[IntArray, int]: ...

    def holder_noise_variance(self, contract: StudyContract) -> float: ...

    def noise_variance_units(self, contract: StudyContract) -> float: ...

__all__ = ["Releases"]

log = logging.getLogger("dpagg.computation")

IntArray = npt.NDArray[np.int64]


def _bayesian_dp_params(contract: StudyContract, epsilon: float, summary: Summary) -> dict[str, object]:
    """What a release of a study with correlated records guarantees, for the summary's params.

    "epsilon": the release's Bayesian-DP epsilon (study units, what the ledger charged);
    "dp_epsilon": the DP epsilon its noise is calibrated at (sum of the summary's
    measurement epsilons, epsilon / (1 + L) up to rounding); "max_leakage" L and
    "noise_multiplier" 1 + L; "source": the contract's correlation_source.
    """
    dp_epsilon = math.fsum(e for _, e in summary.epsilon_spent)
    charged = dp_epsilon * contract.noise_multiplier
    if charged > epsilon * (1 + EPSILON_TOLERANCE):
        raise InvalidInputError(  # the ledger would have refused it; never label an overspent release
            f"the strategy's measurements cost {charged:g} in Bayesian-DP epsilon, more than the release's {epsilon:g}"
        )
    return {"epsilon": float(epsilon), "dp_epsilon": dp_epsilon, "max_leakage": contract.correlation_leakage,
            "noise_multiplier": contract.noise_multiplier, "source": contract.correlation_source,
            "model": "gaussian_correlation (seed 003); neighbours: one person added or removed while correlated "
                     "records follow the model"}


class _Tracker:
    """The live progress of one release, updated by its thread and read by ReleaseStatus."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._p = ReleaseProgress()
        self._started = 0.0

    def start_measurement(self, kind: str, chunks_total: int) -> None:
        with self._lock:
            self._p = replace(self._p, phase="measuring", measurement_kind=kind, chunks_sent=0,
                              chunks_total=chunks_total)
            self._started = time.monotonic()

    def chunk_sent(self) -> None:
        with self._lock:
            self._p = replace(self._p, chunks_sent=self._p.chunks_sent + 1)

    def measurement_done(self) -> None:
        with self._lock:
            self._p = replace(self._p, measurements_done=self._p.measurements_done + 1, measurement_kind="",
                              chunks_sent=0, chunks_total=0)
            self._started = 0.0

    def snapshot(self) -> ReleaseProgress:
        with self._lock:
            return replace(self._p, measurement_seconds=time.monotonic() - self._started if self._started else 0.0)


class Releases:
    """The release path of one `ComputationHandler` (its studies, keys, executor and decryption client)."""

    def __init__(self, handler: ReleaseHost) -> None:
        self._h = handler
        self._running: set[str] = set()
        self._running_lock = threading.Lock()
        self._progress: dict[str, _Tracker] = {}
        #: Releases run with wait=False (`ComputationHandler.join` waits for them).
        self.threads: list[threading.Thread] = []
        #: Join uploads that passed the well-formedness check, by the key holder's seed (join_checks).
        self._passed_checks = PassedChecks()

    def recover_interrupted(self) -> None:
        for r in self._h.store.list_releases():
            if r.state == ReleaseState.RUNNING:
                self._h.store.save_release(replace(
                    r, state=ReleaseState.FAILED, finished_at=utc_now(), error_code="ABORTED",
                    error_message="interrupted by a restart of the computation server; epsilon already charged "
                                  "at the decryption server stays spent. Run a new release"))

    def progress(self, release_id: str) -> ReleaseProgress | None:
        """How far the release has got while this server runs it; None when it is not running here."""
        tracker = self._progress.get(release_id)
        return tracker.snapshot() if tracker is not None else None

    def release(self, release_id: str) -> ReleaseRecord:
        check_id("release_id", release_id)
        rec = self._h.store.get_release(release_id)
        if rec is None:
            raise NotFoundError(f"unknown release {release_id!r}; list releases with `dpagg query --list`")
        return rec

    def run(self, study_id: str, *, epsilon: float = 0.0, force: bool = False, wait: bool = True,
                    request_key: str = "", spend_rest: bool = False) -> ReleaseRecord:
        """Release the study's aggregate with its strategy; see `_execute` for the privacy statement.

        Checks before anything is computed: every expected owner submitted (or `force`),
        `epsilon` (> 0 and finite; or, with `spend_rest` and epsilon 0, exactly what is left)
        fits the budget left at the decryption server (RESOURCE_EXHAUSTED otherwise, and
        nothing is decrypted), and no other release of the study is running.
        """
        contract = self._h.study(study_id)
        if request_key:
            check_id("request_key", request_key)
            previous = self._h.store.release_by_request_key(study_id, request_key)
            if previous is not None:
                return previous
        if spend_rest:
            if epsilon:
                raise InvalidInputError(f"spend_rest spends what is left; epsilon must then be 0, got {epsilon}")
            eps = self._h.decryption.budget(study_id).available
            if not eps >= MIN_RELEASE_EPSILON:  # a rounding leftover is not a release (its noise would overflow)
                raise BudgetExhaustedError(f"study {study_id} has no budget left: {eps:.6g} of {contract.epsilon:g} "
                                           f"(a release needs at least {MIN_RELEASE_EPSILON:g}); nothing was "
                                           "decrypted. Open a new study for more releases")
        else:
            eps = float(epsilon)
            if not (math.isfinite(eps) and eps > 0):
                raise InvalidInputError(
                    f"epsilon must be > 0 and finite, got {epsilon}; to spend the rest of the budget ask for it "
                    "explicitly (spend_rest, `--epsilon rest`)"
                )
        if eps > contract.epsilon * (1 + EPSILON_TOLERANCE):
            raise InvalidInputError(f"epsilon {eps:g} exceeds study {study_id}'s total budget {contract.epsilon:g}")
        if contract.is_join and force:
            raise InvalidInputError(f"study {study_id} is a join study: its table needs both owners, so a release "
                                    "cannot be forced")
        subs = self._h.submissions_to_include(contract, force=force, action="release")
        owners = tuple(s.owner_id for s in subs)
        budget = self._h.decryption.budget(study_id)
        if exact_decimal(eps) > exact_decimal(budget.available):
            raise BudgetExhaustedError(
                f"a release needs epsilon {eps:.12g} but study {study_id} has {budget.available:.12g} left of "
                f"{budget.total:.12g}; nothing was decrypted. Open a new study for more releases (or spend exactly "
                "what is left: --epsilon rest)"
            )
        with self._running_lock:
            if study_id in self._running:
                raise FailedPreconditionError(f"a release of study {study_id} is already running; wait for it")
            self._running.add(study_id)
        signatures = tuple(sig for sig in (s.owner_signature for s in subs) if sig is not None)
        if contract.signed and len(signatures) != len(subs):
            raise FailedPreconditionError(
                f"study {study_id} is signed but {len(subs) - len(signatures)} stored submission(s) carry no "
                "verified signature; the data directory was altered"
            )
        record = ReleaseRecord(release_id=new_id("rel"), study_id=study_id, state=ReleaseState.RUNNING, epsilon=eps,
                               owners=owners, contract_hash=contract.contract_hash, started_at=utc_now(),
                               request_key=request_key, signatures=signatures)
        self._progress[record.release_id] = _Tracker()
        try:
            self._h.store.save_release(record)
        except BaseException:
            self._done(study_id, record.release_id)
            raise
        if wait:
            return self._execute(record, contract, subs, raise_errors=True)
        t = threading.Thread(target=self._execute, args=(record, contract, subs), kwargs={"raise_errors": False},
                             name=f"release-{record.release_id}", daemon=True)
        self.threads.append(t)
        t.start()
        return record

    def _done(self, study_id: str, release_id: str) -> None:
        with self._running_lock:
            self._running.discard(study_id)
            self._progress.pop(release_id, None)

    def _tracker(self, release_id: str) -> _Tracker:
        return self._progress.get(release_id) or _Tracker()

    def _execute(self, record: ReleaseRecord, contract: StudyContract, subs: list[Submission], *,
                 raise_errors: bool) -> ReleaseRecord:
        """Compute the release (`_strategy_summary`, or `_join_summary` for a join study) and store its outcome."""
        started = time.monotonic()
        compute = self._join_summary if contract.is_join else self._strategy_summary
        try:
            summary, sent = compute(record, contract, subs)
            began = time.monotonic()
            stored = self._h.store.summary_fields(record.release_id, summary)
            log.info("release %s: summary computed after %.2f s, stored in %.2f s", record.release_id,
                     began - started, time.monotonic() - began)
            done = replace(record, state=ReleaseState.DONE, finished_at=utc_now(),
                           seconds=time.monotonic() - started, bytes_to_decryption=sent, **stored)
            self._h.store.save_release(done)
            log.info("release %s of study %s done in %.2f s (%d partitions)", record.release_id, record.study_id,
                     done.seconds, summary.n_partitions)
            return done
        except Exception as exc:
            code, message = status_for(exc)
            if self._h.stopping.is_set():
                code, message = grpc.StatusCode.ABORTED, (
                    f"interrupted by the computation server's shutdown ({message}); epsilon the key holders charged "
                    "for what they already decrypted stays spent. Run a new release once the server is back")
            failed = replace(record, state=ReleaseState.FAILED, finished_at=utc_now(), error_code=code.name,
                             error_message=message, seconds=time.monotonic() - started)
            self._h.store.save_release(failed)
            log.warning("release %s of study %s failed: %s", record.release_id, record.study_id, message)
            if raise_errors:
                raise
            return failed
        finally:
            self._done(record.study_id, record.release_id)
            end = getattr(self._h.decryption, "end_release", None)
            if end is not None:  # what the release declared and did not charge is free again (t-of-N view)
                end(record.study_id, record.release_id)

    def _strategy_summary(self, record: ReleaseRecord, contract: StudyContract,
                          subs: list[Submission]) -> tuple[Summary, int]:
        """Run the strategy against the aggregate; (summary, bytes sent to the decryption server).

        Privacy: the strategy's measurements compose sequentially to `record.epsilon`
        (gap: eps_gap on adjacent differences, L1 sensitivity 2c; the rest on disjoint
        partition sums, sensitivity c), under add/remove of one person contributing at
        most c = contract.contribution_bound records. For each measurement this server
        draws discrete Laplace noise of scale sensitivity/epsilon (only it knows the draw)
        and adds it under encryption before the ciphertext leaves; the decryption server
        charges its ledger, rounds, and adds its own draw when noise_parties == 2. The
        partition is chosen from released values only (post-processing).

        Correlated records (contract.correlation_leakage L > 0): `record.epsilon` is a
        Bayesian-DP epsilon (seed 003). The strategy runs at DP epsilon
        record.epsilon / (1 + L), so every noise scale is (1 + L) times the plain one, and
        the decryption server charges each measurement (1 + L) times its DP epsilon: the
        release still spends `record.epsilon`. The summary's own epsilons are the DP ones
        the noise is calibrated at; params["bayesian_dp"] states the guarantee.
        """
        backend = self._h.backend_for(contract)
        cs = ComputationSide(backend, self._h.rng)
        strategy = make_strategy(contract.strategy, contract.domain_size, contract.dp_epsilon(record.epsilon),
                                 noise_parties=contract.noise_parties,
                                 contribution_bound=contract.person_bound,
                                 params=contract.strategy_params or None)

        sent = [0]
        tracker = self._tracker(record.release_id)

        def measure(m: Measurement) -> IntArray:
            began, chunks = time.monotonic(), len(m.measured_chunks(backend.slots))
            tracker.start_measurement(m.kind, chunks)
            values, n = self._h.decrypt_on_executor(cs, contract, record.release_id, record.epsilon, m,
                                                    on_chunk=tracker.chunk_sent)
            tracker.measurement_done()
            sent[0] += n
            log.info("release %s: measurement %s (%d chunks) took %.2f s", record.release_id, m.kind, chunks,
                     time.monotonic() - began)
            return values

        with self._h.chunk_source(subs) as source:
            try:
                # The executor's workers sum their chunk ranges and keep the sums for the whole release.
                began = time.monotonic()
                self._h.load_aggregate(record.release_id, contract, source, subs)
                log.info("release %s: the workers summed the aggregate in %.2f s", record.release_id,
                         time.monotonic() - began)
                summary: Summary = run_strategy(strategy, measure)
            finally:
                self._h.executor.drop(record.release_id)
        # Every summary states how many organizations one person may appear in (its noise assumes it), and the
        # study's domain, so its bins read as values wherever the release is read (e.g. `dpagg serve-analyst`).
        summary = replace(summary, params={**summary.params, "max_organizations": contract.max_organizations,
                                           **({"domain_spec": contract.domain_spec} if contract.domain_spec else {})})
        failovers = getattr(self._h.decryption, "failovers", {}).pop(record.release_id, None)
        if failovers:  # a t-of-N participant lost mid-measurement: which, which set took over, what it cost
            summary = replace(summary, params={**summary.params, "holder_failover": failovers})
        summary = self._with_holder_noise(summary, contract)
        if contract.correlated or contract.correlation_source:
            bdp = _bayesian_dp_params(contract, record.epsilon, summary)
            summary = replace(summary, params={**summary.params, "bayesian_dp": bdp})
        return summary, sent[0]

    def _join_summary(self, record: ReleaseRecord, contract: StudyContract,
                      subs: list[Submission]) -> tuple[Summary, int]:
        """A join study's release: the study's strategy (terms.release) over the encrypted joint table.

        Privacy: the strategy's measurements compose sequentially to `record.epsilon`, each
        with its own sensitivity under add/remove of one shared customer (contribution
        bound 1: one record per identifier per owner, so one cell changes by 1). For every
        measured value this server adds a discrete Laplace draw of scale sensitivity/epsilon
        (only it knows the draws), pads and flooding before the ciphertext leaves
        (he_partition.join.release); the decryption server charges the ledger and adds its
        own draw (DecryptionHandler.decrypt_join_cells). The partition is chosen from
        released values only (post-processing).
        """
        by_owner = {s.owner_id: s for s in subs}
        terms = contract.join_terms()
        self._h.joins.forget(contract)  # both uploads are committed: keys and pseudonym lists are no longer needed
        sent = [0]
        tracker = self._tracker(record.release_id)

        def counted(cts: list[bytes]) -> Iterator[bytes]:
            for c in cts:
                tracker.chunk_sent()
                yield c

        try:  # chunk files: each worker reads its rows and columns itself, a group at a time
            templates: dict[str, str] | None = {o: self._h.store.chunk_template(s) for o, s in by_owner.items()}
        except NotImplementedError:  # an in-memory store: the chunks are read here
            templates = None
        holders = bool(getattr(self._h.decryption, "joins_at_holders", False))
        if holders:  # key-share holders compute the values themselves from the owners' signed planes, and check them
            holder_relay: Any = self._h.decryption
            holder_relay.prepare_join(contract, [OwnerC1Parts(  # read chunk by chunk as each holder takes them
                o, sub.idempotency_key,
                ReadOnDemand(partial(self._h.store.read_chunk, sub), sub.meta.chunk_count),
                sub.signature) for o in contract.expected_owners for sub in [by_owner[o]]])
        else:
            # Both owners' indicator planes must be 0/1 and one-hot or empty before any cell is decrypted
            # (join_checks); the groups are spread over the workers, which read them as the cell totals do.
            check_join_uploads(contract, self._h.joins.scheme(contract, self._h.public_context),
                               self._h.joins.public_key(contract, self._h.public_context),
                               self._h.joins.uploads(contract, self._h.public_context,
                                                     lambda o, i: self._h.store.read_chunk(by_owner[o], i), templates),
                               self._h.decryption, self._h.executor, passed=self._passed_checks,
                               upload_keys=tuple((s.owner_id, s.idempotency_key) for s in subs))
        with self._h.joins.evaluator(contract, self._h.public_context,
                                     lambda o, i: self._h.store.read_chunk(by_owner[o], i), self._h.executor,
                                     templates) as evaluator:

            def measure(m: Measurement) -> IntArray:
                tracker.start_measurement(m.kind, 0)  # the cells are counted once they are computed
                cts = evaluator.measure_for_holders(m) if holders else evaluator.measure(m)
                tracker.start_measurement(m.kind, len(cts))
                sent[0] += sum(len(c) for c in cts)
                values = self._h.decryption.decrypt_join_cells(
                    study_id=contract.study_id, release_id=record.release_id, release_epsilon=record.epsilon,
                    contract_hash=contract.contract_hash, cells=counted(cts), cell_count=len(cts),
                    measurement=m).values
                tracker.measurement_done()
                return values

            summary: Summary = run_strategy(join_strategy(terms, record.epsilon,
                                                          noise_parties=contract.noise_parties), measure)
        summary = replace(summary, params={**summary.params, **summary_params(terms)})
        return self._with_holder_noise(summary, contract), sent[0]

    def _with_holder_noise(self, summary: Summary, contract: StudyContract) -> Summary:
        """`summary` with the key holders' noise: their shares carry K/(K - T) draws' variance, not one draw's
        (T = noise_tolerates > 0: key-share holders; unchanged with the single key holder). Adds no noise."""
        if not contract.noise_tolerates:
            return summary
        return summary.with_noise_variance_factor(
            self._h.noise_variance_units(contract) / contract.noise_parties,
            holder_noise={"key_holders": self._h.key_holders, "noise_tolerates": contract.noise_tolerates,
                          "holder_variance_factor": self._h.holder_noise_variance(contract)})
