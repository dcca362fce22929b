"""t-of-N failover: a participant lost during a measurement hands the measurement to another t-set, charged anew.

Why a new charge. A measurement's charge fixes its participant set P, and every holder refuses the
request's shares to any other set, so a lost participant's measurement cannot simply continue with
another set. Continuing with the chunks not yet combined is not safe either: the holders stream
their shares ahead, so a holder of P may have sent chunk j's share (the lost one included, whose
progress nobody else knows), and a share of chunk j under P next to shares of chunk j under P'
gives the combiner a second noisy view of chunk j (the Lagrange weights of the two sets are small
rationals: scaled by small integers, one set's share cancels against the other's). So the whole
measurement is decrypted again under a charge of its own, for a new request
(`failover_release_id`), signed by the new set on the study's whole log; only the new set's
combination is kept, and the release states what happened (`ThresholdDecryption.failovers`).
Budget: the lost measurement's epsilon is spent twice, each time in the signed log, so the study's
spend never passes its budget (a failover that does not fit is refused like any charge).
Holds no secret, draws no noise.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any, Iterable, Sequence

import grpc

from he_partition.core.measurements import Measurement

from ...common.contract import check_id
from ...common.errors import ServiceError, reason_of
from ...decryption.client import DecryptResult
from ...decryption.keyshare.charges import dump_log, exact_text
from ...decryption.keyshare.client import HolderShares
from .relay import HolderRelay


__all__ = ["HolderFailedError", "LOST_CODES", "LostParticipants", "decrypt_failing_over", "failover_release_id",
           "raise_if_lost"]

log = logging.getLogger("dpagg.computation.threshold")


class HolderFailedError(ServiceError):
    """A key-share holder did not answer or refused: keeps the holder's status code, names it and its reason."""


#: The status codes of a holder lost during a call (down, unreachable, its stream cut by its server, out of time): a
#: t-of-N measurement fails over to another t-set on these; any other failure is the holder's answer and fails it.
#: Not CANCELLED: this server's own shutdown cancels its calls, and that is no reason to charge a measurement again.
LOST_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class LostParticipants(Exception):
    """Participants of a t-of-N measurement lost on the way (holder indices), with the ciphertexts already sent."""

    def __init__(self, holders: list[int], sent: list[bytes], reason: str) -> None:
        super().__init__(reason)
        self.holders, self.sent, self.reason = holders, sent, reason


def failover_release_id(release_id: str, attempt: int) -> str:
    """The charge id of a measurement decrypted again by another t-set after a participant was lost (attempt >= 1):
    a request of its own, charged in the study's log and in each new participant's ledger under this id."""
    return check_id("release_id", f"{release_id[:56]}.fo{int(attempt)}")


def _short(text: str) -> str:
    return text if len(text) <= 120 else text[:117] + "..."



def decrypt_failing_over(dec: HolderRelay, t: int, *, study_id: str, release_id: str, release_epsilon: float,
                         measurement: Measurement, chunks: Iterable[bytes], chunk_count: int, contract_hash: str,
                         timeout: float | None) -> DecryptResult:
    """A t-of-N measurement through `dec`: charged for the first t holders up, their shares combined; a participant
    lost on the way hands it to another t-set under a charge of its own (the module docstring).

    Privacy: spends the measurement's charged epsilon (sensitivity `measurement.sensitivity`,
    neighbouring relation add/remove of one person with at most c records) once per set that
    decrypts it, each time signed in the study's log within its budget; each set's holders draw
    their DP shares keyed by their own request and set, so each combination carries a full draw
    and only one is kept. Draws no noise itself, so nobody knows noise from it."""
    lost: list[int] = []
    rid, reps, attempt = release_id, float(release_epsilon), 0
    source: Iterable[bytes] = chunks
    while True:  # fix the participants and have them sign the charge, before any share is asked for
        try:
            signed = dec._charge(t, study_id, rid, reps, measurement, avoid=lost)
        except HolderFailedError as short:
            if not attempt:
                raise
            why = short.details.replace("; nothing was charged or decrypted", "")
            if "Nothing was overspent" not in why:
                why += (f". Nothing was overspent: the study's signed charge log spends "
                        f"{exact_text(dec.charges.spent(study_id))}, every charge with its measurement")
            raise HolderFailedError(short.code, (
                f"key-share holder(s) {', '.join(dec.names[i] for i in lost)} lost during measurement "
                f"{measurement.kind} of release {release_id}, and no other t-set could take it: {why}; the "
                "failed release holds nothing more")) from None
        members = list(signed.entry.participants)
        extra = {"charge_log": dump_log(dec.charges.log(study_id)), "participants": members}
        try:
            result = dec._decrypt_with(members, extra, study_id=study_id, release_id=rid, release_epsilon=reps,
                                       measurement=measurement, chunks=source, chunk_count=chunk_count,
                                       contract_hash=contract_hash, timeout=timeout)
        except LostParticipants as gone:
            source = gone.sent  # the same ciphertexts (this server's draw) go to the next set
            lost.extend(i for i in gone.holders if i not in lost)
            attempt += 1
            names = ", ".join(dec.names[i] for i in gone.holders)
            live = [i for i in range(dec.k) if i not in lost]
            if len(live) < t:
                raise HolderFailedError(grpc.StatusCode.UNAVAILABLE, (
                    f"key-share holder(s) {names} lost during measurement {measurement.kind} of release "
                    f"{release_id}; the t-of-N key needs {t} of {dec.k} and the holders down are "
                    f"{', '.join(dec.names[i] for i in lost)}: no t-set is left ({gone.reason}). Nothing was "
                    f"overspent: the study's signed charge log spends {exact_text(dec.charges.spent(study_id))}, "
                    "every charge with its measurement")) from None
            rid = failover_release_id(release_id, attempt)
            reps = float(signed.entry.epsilon)  # the measurement's charged epsilon, again
            log.warning("study %s, release %s: key-share holder(s) %s lost during measurement %s (%s); decrypting "
                        "it again with another t-set under its own charge (%s)", study_id, release_id, names,
                        measurement.kind, gone.reason, rid)
            continue
        if attempt:
            note = (f"key-share holder(s) {', '.join(dec.names[i] for i in lost)} lost during measurement "
                    f"{measurement.kind}; continued with {{{', '.join(dec.names[i] for i in members)}}}: the "
                    f"measurement was decrypted again under its own charge ({exact_text(signed.entry.epsilon)} more, "
                    f"charge {rid}); nothing was decrypted twice without a charge")
            log.warning("study %s, release %s: %s", study_id, release_id, note)
            with dec._lock:
                dec.failovers.setdefault(release_id, []).append(note)
        return result


def raise_if_lost(dec: HolderRelay, asked: Sequence["Future[HolderShares]"], members: Sequence[int],
                  sent: list[bytes], extra: dict[str, Any], j: int, chunk_count: int) -> None:
    """t-of-N, chunk `j` short of a share: raise `LostParticipants` when a participant's call failed as a lost
    holder's does (`LOST_CODES`: UNAVAILABLE, a deadline) and no participant refused (a refusal is an
    answer: it fails the measurement, naming the holder, as before)."""
    if not extra:
        return
    done = [(i, f) for i, f in zip(members, asked) if f.done()]
    failures = dec._outcomes([f for _, f in done], [i for i, _ in done])[1]
    if not failures or any(reason_of(e)[0] not in LOST_CODES for _, e in failures):
        return
    gone = [dec.names.index(n) for n, _ in failures]
    reason = "; ".join(f"{n}: {_short(reason_of(e)[1])}" for n, e in failures)
    raise LostParticipants(gone, sent, f"{reason}; {j} of {chunk_count} chunks were combined")
