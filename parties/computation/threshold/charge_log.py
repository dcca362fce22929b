"""The computation server's copy of each t-of-N study's signed charge log, and the signing round.

With a t-of-N key every measurement is paid by an entry of the study's charge log that t holders
signed (`parties.decryption.keyshare.charges`: why, and why no routing overspends). This server
keeps the log (`charges/<study>.json`, and in memory), proposes each entry at its end, gathers the
participants' signatures and shows the whole log with every request. An entry that did not get its
t signatures stays `pending`: the holders that signed it sign no other entry at its position, so
the next charge of the study first completes it with the holders that answer.

Privacy promise: holds no secret and draws no noise; a charge spends the study's budget only once
t holders signed it, each after checking the whole log against the budget.
"""
from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Sequence

import grpc

from he_partition.core.errors import BudgetExhaustedError

from ...common.contract import StudyContract, charged_epsilon
from ...common.convert import measurement_json
from ...common.errors import reason_of
from ...decryption.keyshare.charges import (ChargeEntry, LogBudget, SignedCharge, chain_total, charge_epsilon,
                                            charge_request, dump_log, exact_text, load_log, log_budget)

__all__ = ["StudyChargeLogs"]

log = logging.getLogger("dpagg.computation.threshold")

#: ask(holder index, study id, entry JSON, log JSON) -> the holder's signature, as a future.
AskSignature = Callable[[int, str, str, str], "Future[bytes]"]


class StudyChargeLogs:
    """Every t-of-N study's signed charge log at this server (`directory` None: memory only)."""

    def __init__(self, directory: Path | None, names: Sequence[str], ask: AskSignature,
                 failed: Callable[[grpc.StatusCode, str], Exception]) -> None:
        self._dir, self._names, self._ask, self._failed = directory, list(names), ask, failed
        self._logs: dict[str, list[SignedCharge]] = {}
        self._pending: dict[str, SignedCharge] = {}
        self._lock = threading.Lock()
        self._study_locks: dict[str, threading.Lock] = {}
        #: study -> release id -> [declared epsilon, what the log charged for it so far]: the running releases'
        #: reservations (memory only: a release that ended, or a restarted server's, holds nothing beyond its charges).
        self._running: dict[str, dict[str, list[Fraction]]] = {}

    def start_release(self, study_id: str, release_id: str, release_epsilon: float) -> None:
        """Hold `release_epsilon` for a release from its first charge until `end_release` (idempotent)."""
        with self._lock:
            self._running.setdefault(study_id, {}).setdefault(release_id,
                                                               [charge_epsilon(release_epsilon), Fraction(0)])

    def end_release(self, study_id: str, release_id: str) -> None:
        """A release ended (done or failed): it holds nothing beyond what the log charged for it."""
        with self._lock:
            self._running.get(study_id, {}).pop(release_id, None)

    def view(self, total: float, study_id: str, *, excluding: str = "") -> LogBudget:
        """What the study has left (`charges.log_budget`): the log's charges and what running releases still hold
        (`excluding`: the release being charged, which may spend what it holds)."""
        log_ = self.log(study_id)
        with self._lock:
            held = sum((max(Fraction(0), d - c) for r, (d, c) in self._running.get(study_id, {}).items()
                        if r != excluding), Fraction(0))
        return log_budget(total, log_, held)

    def _path(self, study_id: str) -> Path | None:
        return self._dir / f"{study_id}.json" if self._dir is not None else None

    def log(self, study_id: str) -> list[SignedCharge]:
        """The study's log as this server keeps it (loaded from its file at first use)."""
        with self._lock:
            got = self._logs.get(study_id)
            if got is None:
                path = self._path(study_id)
                raw = json.loads(path.read_text()) if path is not None and path.exists() else {}
                got = self._logs[study_id] = load_log(json.dumps(raw.get("log", [])))
                if raw.get("pending"):
                    self._pending[study_id] = SignedCharge.from_dict(raw["pending"])
            return got

    def spent(self, study_id: str) -> Fraction:
        return chain_total(self.log(study_id))

    def _save(self, study_id: str) -> None:
        path = self._path(study_id)
        if path is None:
            return
        pending = self._pending.get(study_id)
        body = {"log": json.loads(dump_log(self._logs[study_id])), "pending": pending.to_dict() if pending else None}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        tmp.replace(path)

    def _sign(self, t: int, charge: SignedCharge, log_: list[SignedCharge], holders: Sequence[int]) -> SignedCharge:
        """Ask `holders` (in parallel) to sign `charge` on `log_`; the charge with every signature gathered, or the
        refusals together (the status of the first) when fewer than t signed."""
        entry_json, log_json = json.dumps(charge.entry.to_dict()), dump_log(log_)
        futures = {i: self._ask(i, charge.entry.study_id, entry_json, log_json) for i in holders}
        refusals: list[str] = []
        first: Exception | None = None
        for i, f in futures.items():
            try:
                charge = charge.with_signature(i, f.result())
            except Exception as failed:  # every holder's answer is collected; the refusals are reported together
                refusals.append(f"{self._names[i]}: {reason_of(failed)[1]}")
                first = first or failed
        if len(charge.signatures) < t:
            code = reason_of(first)[0] if first is not None else grpc.StatusCode.UNAVAILABLE
            raise self._failed(code, f"the charge of study {charge.entry.study_id} has {len(charge.signatures)} of "
                                     f"the {t} holder signatures it needs ({'; '.join(refusals)}); nothing was "
                                     "decrypted")
        return charge

    def charge(self, t: int, contract: StudyContract, release_id: str, release_epsilon: float, measurement: Any,
               up: Callable[[], list[int]]) -> SignedCharge:
        """This measurement's valid charge in the study's log: found (a retry), or proposed at the log's end with
        the first t holders of `up()` (those answering now) as participants and signed by them.

        Privacy: the charge spends charged_epsilon (the measurement's epsilon times 1 + L, for L1
        sensitivity `measurement.sensitivity`, neighbouring relation add/remove of one person with
        at most c records) of the study's budget once t holders signed it; each holder signs only
        when the whole log plus it fits the budget (`charges.ChargeBook.sign`). Draws no noise, so
        nobody knows noise from it."""
        study_id = contract.study_id
        request = charge_request(study_id, release_id, release_epsilon, measurement_json(measurement))
        with self._lock:
            lock = self._study_locks.setdefault(study_id, threading.Lock())
        with lock:
            log_ = self.log(study_id)
            for c in log_:
                if c.entry.request == request:
                    return c
            self.start_release(study_id, release_id, release_epsilon)
            holders = up()
            pending = self._pending.get(study_id)
            if pending is not None and pending.entry.index == len(log_):  # an earlier charge short of signatures
                done = self._sign(t, pending, log_, holders)  # the holders that signed it sign no other entry there
                log_.append(done)
                self._pending.pop(study_id, None)
                self._save(study_id)
                if done.entry.request == request:
                    return done
            entry = ChargeEntry(study_id, len(log_), log_[-1].entry.digest() if log_ else "", request,
                                charge_epsilon(charged_epsilon(contract, measurement, release_epsilon)), tuple(holders[:t]))
            self._pending[study_id] = SignedCharge(entry)
            self._save(study_id)
            signed = self._sign(t, SignedCharge(entry), log_, entry.participants)
            log_.append(signed)
            self._pending.pop(study_id, None)
            self._save(study_id)
            with self._lock:
                held = self._running.get(study_id, {}).get(release_id)
                if held is not None:
                    held[1] += entry.epsilon
            log.info("study %s: charge %d (%.6g) signed by holders %s", study_id, entry.index, float(entry.epsilon),
                     ", ".join(self._names[i] for i in entry.participants))
            return signed

    def direct_cost(self, contract: StudyContract, request_id: str, epsilon: float,
                    measurements: Sequence[Any]) -> tuple[Fraction, Fraction, Fraction]:
        """(what the batch's ranges not yet in the log cost, spent, left) for a batch of direct range counts, each
        range charged in full (sequential composition); BudgetExhaustedError when it does not fit what the log
        leaves. Spends nothing, draws no noise."""
        study_id = contract.study_id
        done = {c.entry.request for c in self.log(study_id)}
        cost = sum((charge_epsilon(charged_epsilon(contract, m, epsilon)) for m in measurements
                    if charge_request(study_id, request_id, epsilon, measurement_json(m)) not in done),
                   Fraction(0))
        view = self.view(contract.epsilon, study_id)
        spent, left = view.spent, view.available
        if cost > left:
            held = f" ({exact_text(view.held)} held by a running release)" if view.held else ""
            raise BudgetExhaustedError(f"study {study_id}: {len(measurements)} direct range(s) cost {exact_text(cost)} "
                                       "with a t-of-N key (each range in full); the signed charge log leaves "
                                       f"{exact_text(left)} of {exact_text(view.total)}{held}; nothing was charged or "
                                       "decrypted")
        return cost, spent, left
