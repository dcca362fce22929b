"""The computation server in threshold mode: K key-share holders in place of one decryption server.

`ThresholdDecryption` has the decryption client's interface (`ComputationHandler.decryption`),
so releases and direct queries run unchanged: for each measurement it sends the noised and
flooded chunks to every holder, collects every holder's shares, and combines them only when
all K are in (n-of-n: the combine needs every share; a holder down or refusing stops the
measurement before anything is combined, with an error naming the holder and its reason).
Studies open at every holder (each keeps its own copy of the contract and its own ledger; the
copies must be identical); budgets are read from every holder and the most spent one counts.
It also relays the deployment (`setup_key`: t and the holders' identity keys, once) and each
study's collective key setup (`setup_study_key`, run by `open_study`: a key per study), and serves
each study's collective public context.

t-of-N deployments (`setup_key(threshold=t)`): a measurement needs only t holders. Before anything is
charged, this server asks every holder whether it is up and fixes the participant set, the first t
that answered (fewer than t: refused, naming the holders missing, nothing charged); it then has
those t sign the measurement's charge on the study's whole charge log (`SignCharge`, kept here in
`charges/<study>.json` and shown to every holder with each request), asks them for their shares
with the log, and combines their t shares. Studies and budgets are read from the holders that
answer. A direct query's ranges are charged the same way, one charge per range. A participant lost
during a measurement hands it to another t-set under a charge of its own (`failover`). What a study
has left is one view (`_log_view`): the signed log's charges plus what the running release declared
and has not charged; a release that ended, done or failed, holds nothing more (`end_release`). A
sealed study's uploads close with any t holders up (`close_uploads`: the owners split their upload
keys t-of-N), and a holder that was down closes on the same set before it takes the owners' c1 parts.

Size: one class that stands in for the decryption client, method for method; the failover, the t-of-N
close and the key setup already live in modules of their own (`failover`, `upload_close`, `key_setup`).
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TypeVar

import grpc
import numpy as np

from he_partition.core.errors import InvalidInputError
from he_partition.core.backend import DEFAULT_PLAIN_MODULUS, n_chunks
from he_partition.core.measurements import Measurement, refuse_implausible
from he_partition.he.bfv import context_fingerprint, generate_secret_context
from he_partition.he.threshold.context import vector_ciphertext
from he_partition.he.join_scheme import join_plain_modulus
from he_partition.he.threshold.decrypt import combine

from ...common.contract import StudyContract, check_id, join_terms_of
from ...common.errors import FailedPreconditionError, reason_of
from ...common.receipts import ReceiptBook
from ...common.sealing import Commitment, upload_key_from_shares
from ...common.tls import TlsConfig
from ...common.util import new_id
from ...decryption.client import BudgetInfo, DecryptResult, DirectChargeInfo, JoinCellsResult
from ...decryption.forwarding import UploadForwarding
from ...decryption.keyshare.charges import SignedCharge, below, chain_total, dump_log, exact_text, log_epsilon
from ...decryption.keyshare.client import HolderShares, KeyShareClient
from .charge_log import StudyChargeLogs
from .failover import HolderFailedError, decrypt_failing_over, failover_release_id, raise_if_lost
from .join_holders import combine_shares, run_check, send_planes
from .key_setup import fix_deployment, setup_study_key
from .upload_close import UploadClosing
from ...decryption.keyshare.study_keys import join_template
from ...decryption.keyshare.uploads import OwnerC1Parts

__all__ = ["ThresholdDecryption", "HolderFailedError", "failover_release_id", "parse_holders"]

log = logging.getLogger("dpagg.computation.threshold")

T = TypeVar("T")

JOINS_SINGLE_HOLDER = ("a join's check seed and residues are the single key holder's: key-share holders run the "
                       "check among themselves (docs/threshold.md, section 8)")


#: Seconds a step that needs every holder (an N-of-N release or direct query, closing a study's uploads) waits for
#: each holder's health check before it is refused (a restarted holder is reconnected within gRPC's 2 s backoff).
HOLDER_UP_SECONDS = 3.0


def parse_holders(specs: Sequence[str]) -> list[tuple[str, str]]:
    """NAME=HOST:PORT specs (K >= 2 distinct names) as (name, target) pairs, in order."""
    out = []
    for spec in specs:
        name, sep, target = spec.partition("=")
        if not sep or not name or not target:
            raise InvalidInputError(f"--holder must be NAME=HOST:PORT, got {spec!r}")
        out.append((name, target))
    names = [n for n, _ in out]
    if len(out) < 2 or len(set(names)) != len(names):
        raise InvalidInputError(f"threshold mode needs at least 2 distinct holders, got {names}")
    return out


class ThresholdDecryption:
    """K key-share holders behind the decryption client's interface (see the module docstring)."""

    def __init__(self, holders: Sequence[tuple[str, str]], *, tls: TlsConfig | None = None, insecure: bool = False,
                 data_dir: Path | None = None, outage_seconds: float = 0.0) -> None:
        self.names = [n for n, _ in holders]
        self.clients: list[KeyShareClient] = []
        for name, target in holders:
            c = KeyShareClient(name, target, tls=tls, insecure=insecure)
            c.outage_seconds = outage_seconds
            if data_dir is not None:
                c.receipts = ReceiptBook(Path(data_dir) / f"ledger_receipts.{name}.jsonl")
            self.clients.append(c)
        self._template = generate_secret_context()  # parameters only; its own keys are never used
        #: t of a t-of-N key (learned from the holders' status or the setup); None: N-of-N or not yet known.
        self.threshold: int | None = None
        self._known_threshold = False
        #: Each t-of-N study's signed charge log (charges/<study>.json).
        self.charges = StudyChargeLogs(Path(data_dir) / "charges" if data_dir is not None else None, self.names,
                                       lambda i, study, entry, log_: self._pool.submit(
                                           self.clients[i].sign_charge, study, entry, log_), HolderFailedError)
        #: The holders that hold each join study's planes and checked them in its running release (join_holders).
        self._join_sets: dict[str, list[int]] = {}
        self._contexts: dict[str, bytes] = {}  # study id -> its collective public context ("": the legacy key)
        self._fps: dict[str, str] = {}
        self._uploads = UploadForwarding(self._send_uploads)  # the owners' signed c1 parts, once per study
        #: t-of-N: sealed uploads closed with any t holders, and the holders that missed the close caught up.
        self._closing = UploadClosing(self, Path(data_dir) / "closes" if data_dir is not None else None,
                                      HolderFailedError)
        #: release id -> what happened to its measurements when a t-of-N participant was lost (for the release's
        #: summary: `ReleaseRunner` takes them when the release ends).
        self.failovers: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        # several calls at once (a release and another study's reads) do not queue behind each other
        self._pool: ThreadPoolExecutor = ThreadPoolExecutor(max_workers=4 * len(self.clients),
                                                            thread_name_prefix="holders")

    @property
    def k(self) -> int:
        return len(self.clients)

    def close(self) -> None:
        self._uploads.close()
        self._pool.shutdown(wait=False)
        for c in self.clients:
            c.close()

    # -- fan-out ---------------------------------------------------------------------------
    def _all(self, what: str, call: Callable[[KeyShareClient], T], holders: Sequence[int] | None = None) -> list[T]:
        """`call` at every holder (or each holder index in `holders`, in that order) in parallel; the first failure
        (in that order) as HolderFailedError."""
        asked = range(self.k) if holders is None else list(holders)
        return self._collect(what, [self._pool.submit(call, self.clients[i]) for i in asked], holders)

    def _outcomes(self, futures: Sequence[Future[T]],
                  holders: Sequence[int] | None = None) -> tuple[dict[int, T], list[tuple[str, Exception]]]:
        """(holder index -> result, [(holder name, failure)]) of `futures`, one per holder index in `holders`
        (default: every holder, in order); every outcome is collected before anything is decided."""
        got: dict[int, T] = {}
        failures: list[tuple[str, Exception]] = []
        for i, f in zip(range(self.k) if holders is None else holders, futures):
            try:
                got[i] = f.result()
            except Exception as failed:  # noqa: BLE001 - reported, with the holder's name, by the caller
                failures.append((self.names[i], failed))
        return got, failures

    def _collect(self, what: str, futures: list[Future[T]], holders: Sequence[int] | None = None) -> list[T]:
        """Every holder's result of `futures` (one per holder index in `holders`, default every holder, in order);
        the first failure as HolderFailedError, naming the others that failed."""
        got, failures = self._outcomes(futures, holders)
        if failures:
            name, first = failures[0]
            code, reason = reason_of(first)
            others = f" (also failed: {', '.join(n for n, _ in failures[1:])})" if len(failures) > 1 else ""
            raise HolderFailedError(code, f"key-share holder {name} {what}: {reason}{others}")
        return list(got.values())

    def _quorum(self, what: str, call: Callable[[KeyShareClient], T]) -> dict[int, T]:
        """t-of-N: `call` at every holder in parallel, the answers of those that gave one (holder index -> result);
        fewer than t answers: HolderFailedError naming the holders missing and why, before anything else runs."""
        assert self.threshold is not None
        got, failures = self._outcomes([self._pool.submit(call, c) for c in self.clients])
        if len(got) < self.threshold:
            def short(e: Exception) -> str:
                text = reason_of(e)[1]
                return text if len(text) <= 120 else text[:117] + "..."

            reasons = "; ".join(f"{n}: {short(e)}" for n, e in failures)
            raise HolderFailedError(grpc.StatusCode.UNAVAILABLE,
                                    f"the t-of-N key needs {self.threshold} of {self.k} key-share holders and only "
                                    f"{len(got)} {what}; missing: {', '.join(n for n, _ in failures)} ({reasons}); "
                                    "nothing was charged or decrypted")
        return got

    def tofn(self) -> int | None:
        """t of the holders' active t-of-N key, None for N-of-N (asked once; a holder down is tolerated)."""
        with self._lock:
            if self._known_threshold:
                return self.threshold
        replies: list[Any] = []
        for c in self.clients:
            try:
                replies.append(c.key_setup("status", b"", self.names, retry=False, timeout=5.0))
            except Exception:  # noqa: BLE001 - a holder down: the others tell the threshold
                continue
        ts_ = {r.threshold for r in replies if r.state == "deployed"}
        with self._lock:
            if len(ts_) == 1:
                t = ts_.pop()
                self.threshold = t if t < self.k else None
                self._known_threshold = True
            return self.threshold

    def combining(self) -> int:
        """How many holders' shares (and DP noise shares) each decryption combines: t with a t-of-N key, else K."""
        t = self.tofn()
        return t if t is not None else self.k

    # -- deployment and each study's key ----------------------------------------------------
    def setup_key(self, threshold: int = 0) -> tuple[str, bool]:
        """Fix the deployment at every holder (`key_setup.fix_deployment`); (identities digest, already_deployed)."""
        return fix_deployment(self, threshold)

    def setup_study_key(self, study_id: str, join_version: int = 0) -> str:
        """Set up `study_id`'s own collective key at every holder (`key_setup.setup_study_key`; a join study's at
        its scheme's `join_version`); its fingerprint."""
        return setup_study_key(self, study_id, join_version)

    # -- the decryption client's interface -------------------------------------------------
    def public_context(self, *, study_id: str = "", timeout: float | None = None) -> bytes:
        """The collective public context of `study_id`'s key (each study has its own); every holder asked must
        serve the same one. Without a study: the holders' legacy collective key, where they have one."""
        with self._lock:
            if study_id in self._contexts:
                return self._contexts[study_id]
        if self.tofn() is not None:
            contexts = list(self._quorum("served the collective public context",
                                         lambda c: c.public_context(study_id=study_id, timeout=timeout)).values())
        else:
            contexts = self._all("did not serve the collective public context",
                                 lambda c: c.public_context(study_id=study_id, timeout=timeout))
        fps = {context_fingerprint(d) for d in contexts}
        if len(fps) != 1:
            raise FailedPreconditionError(f"the key-share holders serve {len(fps)} different public contexts")
        with self._lock:
            self._contexts[study_id] = contexts[0]
        return contexts[0]

    def open_study(self, **terms: Any) -> tuple[StudyContract, bool]:
        """Set up the study's own collective key at every holder, then open the study at every holder under one
        id; their contracts must be identical and name that key (each holder fills in the key it built).

        A study already open at every holder is found again (no new key). `noise_tolerates` not
        given (None) is filled with K - 1: the holders' noise then tolerates the same coalition as
        the key (the computation server with any K - 1 holders still faces one full discrete Laplace
        draw), at K times the holders' noise variance. Every holder gets the same number, so the
        contracts agree; a holder refuses T >= K.
        """
        terms = dict(terms)
        # a join study's key is made at its scheme's parameters, with Galois and relinearization keys (key_setup)
        join_version = (join_terms_of(str(terms.get("strategy_params_json") or ""), int(terms["domain_size"])).version
                        if terms.get("strategy") == "join" else 0)
        terms["study_id"] = check_id("study_id", terms.get("study_id") or new_id("study"))
        if terms.get("owner_keys"):  # owners seal their uploads to every holder (parties.common.sealing)
            status = self._all("did not report its seal key", lambda c: c.key_setup("status", b"", self.names))
            terms["holder_seal_keys"] = [s.seal_public_key for s in status]
        if terms.get("noise_tolerates") is None:
            t = self.tofn()
            terms["noise_tolerates"] = (t if t is not None else self.k) - 1
        if not self._open_everywhere(terms["study_id"]):
            t0 = time.monotonic()
            self.setup_study_key(terms["study_id"], join_version)
            log.info("study %s: its key set up in %.2f s", terms["study_id"], time.monotonic() - t0)
        opened = self._all("refused the study", lambda c: c.open_study(**terms))
        hashes = {c.contract_hash for c, _ in opened}
        if len(hashes) != 1:
            raise FailedPreconditionError(f"the key-share holders hold different contracts for study "
                                          f"{terms['study_id']}")
        return opened[0][0], all(existed for _, existed in opened)

    def _open_everywhere(self, study_id: str) -> bool:
        """True when every holder has `study_id` open already (a repeated open-study: its key stands)."""
        found = self._outcomes([self._pool.submit(lambda c: c.get_study(study_id), c) for c in self.clients])[0]
        return len(found) == self.k

    def get_study(self, study_id: str, *, timeout: float | None = None) -> StudyContract:
        if self.tofn() is not None:
            contracts = list(self._quorum("returned the study", lambda c: c.get_study(study_id, timeout=timeout))
                             .values())
        else:
            contracts = self._all("did not return the study", lambda c: c.get_study(study_id, timeout=timeout))
        if len({c.contract_hash for c in contracts}) != 1:
            raise FailedPreconditionError(f"the key-share holders hold different contracts for study {study_id}")
        return contracts[0]

    def budget(self, study_id: str, *, timeout: float | None = None) -> BudgetInfo:
        """Every holder's view (each checked against its receipts); the most spent one counts."""
        if self.tofn() is not None:
            got = self._quorum("reported the budget", lambda c: c.budget(study_id, timeout=timeout))
            return self._log_view(study_id, list(got.values()))
        self._every_holder_up(f"the key of study {study_id} is {self.k}-of-{self.k}: every key-share holder must "
                              "be up to release or answer a query", " (only a t-of-N deployment, `dpagg setup-key "
                              "--threshold T`, releases with holders down)")
        views = self._all("did not report the budget", lambda c: c.budget(study_id, timeout=timeout))
        spent = {n: v.spent for n, v in zip(self.names, views)}
        if len(set(spent.values())) > 1:
            log.warning("study %s: the holders' ledgers disagree on spend: %s", study_id, spent)
        return min(views, key=lambda v: (v.available, -v.spent))

    def _every_holder_up(self, need: str, hint: str = "") -> None:
        """Every holder's health check, in parallel, before a step that needs all K (an N-of-N release or direct
        query, closing a study's uploads): a holder that does not answer SERVING within HOLDER_UP_SECONDS refuses
        the request at once (FAILED_PRECONDITION: `need`, the holders down, that nothing was charged, `hint`)
        instead of after every call's retries (9 s on a 2-core machine). Asks nothing of a study; reveals nothing."""
        _, failures = self._outcomes([self._pool.submit(c.wait_ready, "", HOLDER_UP_SECONDS)
                                      for c in self.clients])
        if not failures:
            return
        down = ", ".join(n for n, _ in failures)
        reasons = "; ".join(f"{n}: {reason_of(e)[1]}" for n, e in failures)
        raise HolderFailedError(grpc.StatusCode.FAILED_PRECONDITION,
                                f"{need}, and {down} {'is' if len(failures) == 1 else 'are'} not ({reasons}); nothing "
                                f"was charged or decrypted. Start {down} again{hint}", method="the key-share holders")

    def _log_view(self, study_id: str, views: Sequence[BudgetInfo]) -> BudgetInfo:
        """t-of-N: the study's budget as the signed charge log and the running release make it
        (`StudyChargeLogs.view`, exact decimals), with the ledger rows of the holder that answered the most: what a
        release and a direct query check, and what `dpagg budget` and every holder's BudgetStatus show (a holder's
        own ledger holds only the requests it answered)."""
        most = max(views, key=lambda b: (len(b.charges), b.spent))  # the holder that answered the most requests
        contract = self.get_study(study_id)
        padding = Fraction(contract.epsilon) - log_epsilon(contract)  # a join's padding, charged before any entry
        v = self.charges.view(float(Fraction(most.total) - padding), study_id)
        return dataclasses.replace(most, spent=float(v.spent + padding), remaining=float(v.total - v.spent),
                                   reserved=float(v.reserved), available=below(v.available),
                                   charge_log_entries=len(self.charges.log(study_id)),
                                   charge_log_spent=float(v.spent))

    def charge_log_view(self, study_id: str) -> tuple[int, str] | None:
        """t-of-N: (charges, their epsilon as an exact decimal) of this server's copy of the study's signed log;
        None with an N-of-N key (`dpagg budget` compares it with each holder's view)."""
        if self.tofn() is None:
            return None
        log_ = self.charges.log(study_id)
        return len(log_), str(chain_total(log_))

    def end_release(self, study_id: str, release_id: str) -> None:
        """A release ended (done or failed): what it declared and did not charge is free again in the t-of-N view
        (and its failover charges' ids with it). The holders' own ledgers reserve nothing with a t-of-N key: the
        signed log is every holder's budget check, so a failed release holds nothing at any holder either."""
        for rid in [release_id] + [failover_release_id(release_id, a) for a in range(1, self.k + 1)]:
            self.charges.end_release(study_id, rid)
        with self._lock:  # a release that failed after a failover: its notes are in its error's log lines
            self.failovers.pop(release_id, None)

    def decrypt_measurement(self, *, study_id: str, release_id: str, release_epsilon: float, measurement: Measurement,
                            chunks: Iterable[bytes], chunk_count: int, contract_hash: str,
                            timeout: float | None = None) -> DecryptResult:
        """Every holder's shares of the measurement (t-of-N: the charged participants'), combined; then decoded.

        Privacy: each holder charges its own ledger `measurement.epsilon` (times 1 + L) and
        adds its share of the discrete Laplace noise of scale sensitivity / epsilon per
        measured value (sensitivity `measurement.sensitivity`, add/remove of one person with
        at most c records), drawn for K - T holders (T the contract's noise_tolerates: any
        K - T shares sum to at least one full draw, all K to K/(K - T) draws' variance); only
        it knows its share. The combined values carry this server's draw and the sum of the
        holders' shares, as the single key holder's answer carries its draw. A holder down (after `outage_seconds`) or refusing: HolderFailedError
        naming it, nothing combined. Draws no noise itself.

        t-of-N failover: a participant lost while the measurement runs (`failover.LOST_CODES`: its server
        stopped, unreachable, out of time) does not fail it when another t-set of live holders is left. The lost set's
        charge fixed its participants and no holder issues the request's shares to another set, so
        the whole measurement is decrypted again under a charge of its own (`failover_release_id`:
        the same measurement, epsilon `measurement.epsilon` again, signed by the new set on the whole
        log): no chunk is decrypted under two sets without the second being charged, and only the
        new set's combination is kept (docs/threshold.md, section 10, "A holder lost mid-measurement").
        """
        self._await_forward(study_id)
        t = self.tofn()
        if t is None:
            return self._decrypt_with(list(range(self.k)), {}, study_id=study_id, release_id=release_id,
                                      release_epsilon=release_epsilon, measurement=measurement, chunks=chunks,
                                      chunk_count=chunk_count, contract_hash=contract_hash, timeout=timeout)
        return decrypt_failing_over(self, t, study_id=study_id, release_id=release_id,
                                    release_epsilon=float(release_epsilon), measurement=measurement, chunks=chunks,
                                    chunk_count=chunk_count, contract_hash=contract_hash, timeout=timeout)


    def _decrypt_with(self, members: list[int], extra: dict[str, Any], *, study_id: str, release_id: str,
                      release_epsilon: float, measurement: Measurement, chunks: Iterable[bytes], chunk_count: int,
                      contract_hash: str, timeout: float | None) -> DecryptResult:
        """The shares of `members` (holder indices) for the measurement, combined chunk by chunk, then decoded
        (see `decrypt_measurement`). t-of-N (`extra` names the participants): a participant lost on the way raises
        `_LostParticipants` with the ciphertexts sent, so that another set can take the measurement."""
        t0 = time.monotonic()
        clients = [self.clients[i] for i in members]
        t1 = time.monotonic()
        arrived: list[list[bytes | None]] = [[None] * chunk_count for _ in clients]
        ready = threading.Condition()

        def on_share(i: int, j: int, share: bytes) -> None:
            with ready:
                if arrived[i][j] is None:
                    arrived[i][j] = share
                    ready.notify_all()

        def ask(i: int, c: KeyShareClient) -> HolderShares:
            try:
                return c.issue_shares(study_id=study_id, release_id=release_id, release_epsilon=release_epsilon,
                                      measurement=measurement, chunk_count=chunk_count, contract_hash=contract_hash,
                                      timeout=timeout, on_share=lambda j, share: on_share(i, j, share), **extra)
            finally:
                with ready:
                    ready.notify_all()

        # the holders compute on the owners' signed c1, so they work while this server builds its chunks, and each
        # chunk is combined as soon as its K shares are in (the holders charged before their first share)
        asked = [self._pool.submit(ask, i, c) for i, c in enumerate(clients)]
        try:
            sent = list(chunks)
        except BaseException:
            for f in asked:
                f.cancel()
            raise
        t2 = time.monotonic()
        if len(sent) != chunk_count:
            self._collect("issued no shares", asked, members)
            raise InvalidInputError(f"{len(sent)} chunks for a measurement announced with {chunk_count}")
        ctx = self._template
        slots = int(ctx.seal_context().data.first_context_data().parms().poly_modulus_degree())
        fp = b""
        full = np.zeros(n_chunks(measurement.domain_size, slots) * slots, dtype=np.int64)
        for j, index in enumerate(measurement.measured_chunks(slots)):
            with ready:
                while any(a[j] is None for a in arrived) and not any(f.done() and f.exception() for f in asked):
                    ready.wait(1.0)
                shares = [a[j] for a in arrived]
            if any(s is None for s in shares):  # a holder failed: its error, naming it (nothing more is combined)
                raise_if_lost(self, asked, members, sent, extra, j, chunk_count)
                self._collect("issued no shares", asked, members)
                raise HolderFailedError(grpc.StatusCode.DATA_LOSS, f"a key-share holder stopped before chunk {j}")
            fp = fp or bytes.fromhex(self._fingerprint(study_id))  # once every holder answered (t-of-N: kept by _charge)
            full[index * slots:(index + 1) * slots] = combine(ctx, vector_ciphertext(sent[j]),
                                                              [s for s in shares if s is not None],
                                                              members, fp, bound_to_c1=True)
        t3 = time.monotonic()
        got = self._collect("issued no shares", asked, members)
        values = measurement.decode(full[:measurement.domain_size], DEFAULT_PLAIN_MODULUS, check=False)
        refuse_implausible(values)
        log.info("study %s, release %s: %s of %d chunks: forward waited %.2f s, chunks built %.2f s, shares in and "
                 "combined %.2f s", study_id, release_id, measurement.kind, chunk_count, t1 - t0, t2 - t1, t3 - t2)
        return DecryptResult(np.asarray(values, dtype=np.int64), got[0].charge_id,
                             min(g.epsilon_remaining for g in got))


    def _answering(self) -> list[int]:
        """The holders (indices, in order) that answer a status call now: t-of-N, at least t of them, or refused
        naming the holders missing (`_quorum`)."""
        return sorted(self._quorum("answered", lambda c: c.key_setup("status", b"", self.names, retry=False,
                                                                    timeout=10.0)))

    def _charge(self, t: int, study_id: str, release_id: str, release_epsilon: float,
                measurement: Measurement, *, avoid: Sequence[int] = ()) -> SignedCharge:
        """The measurement's valid charge in the study's signed log, the participants the first t holders that
        answer now (`StudyChargeLogs.charge`).

        Privacy: spends the measurement's charged epsilon (sensitivity `measurement.sensitivity`,
        neighbouring relation add/remove of one person with at most c records) once t holders
        signed it. Draws no noise, so nobody knows noise from it. `avoid`: holders lost during this
        measurement, never chosen again for it (a failover)."""
        def up() -> list[int]:
            live = [i for i in self._answering() if i not in avoid]
            if len(live) < t:
                raise HolderFailedError(grpc.StatusCode.UNAVAILABLE, (
                    f"the t-of-N key needs {t} of {self.k} key-share holders; up and not lost during this measurement: "
                    f"{', '.join(self.names[i] for i in live) or 'none'}; lost: "
                    f"{', '.join(self.names[i] for i in avoid)}. Nothing was overspent: the study's signed charge log "
                    f"spends {exact_text(self.charges.spent(study_id))}, every charge with its measurement"))
            return live

        contract = self.get_study(study_id)
        with self._lock:  # the combine reads it from here: a participant lost later does not stop it
            self._fps.setdefault(study_id, contract.context_fingerprint)
        return self.charges.charge(t, contract, release_id, release_epsilon, measurement, up)

    def close_uploads(self, contract: StudyContract, commitments: Sequence[Commitment], *,
                      timeout: float | None = None) -> list[bytes]:
        """Close a sealed study's uploads at the key holders; each owner's upload key from their shares.

        XOR split (`seal_threshold` 0): every holder closes, the key is the XOR of the K shares; a
        holder down or refusing: HolderFailedError naming it, and no upload opens. t-of-N split:
        any t holders that are up (`upload_close.UploadClosing.close`).
        """
        if contract.seal_threshold:
            return self._closing.close(contract, commitments, timeout)
        self._every_holder_up(f"closing the uploads of study {contract.study_id} needs all {self.k} key-share "
                              "holders (each owner's upload key is XOR-shared among every one of them)")
        per_holder = self._all("did not close the uploads",
                               lambda c: c.close_upload_shares(contract, commitments, timeout=timeout))
        return [upload_key_from_shares(h[i] for h in per_holder) for i in range(len(commitments))]

    #: The CS adds its noise to c0 only (`BfvBackend.noise_in_c0`) in every study, and does not flood it:
    #: the holders compute on the owners' signed c1 and never see c0.
    noise_in_c0 = True

    def forward_uploads(self, contract: StudyContract, uploads: Callable[[], list[OwnerC1Parts]],
                        included: Sequence[tuple[str, str]], *, background: bool = False) -> None:
        """Send the included owners' signed c1 parts to every holder, once per study and set of uploads.

        As the single decryption server's client (`parties.decryption.forwarding.UploadForwarding`):
        `uploads()` builds them only when they must travel; with `background` the study's next
        `decrypt_measurement` waits for the forward first, so a holder that refuses it (a signature
        that does not verify, an owner missing) stops the release before any share is asked for.
        """
        self._uploads.forward(contract, uploads, included, background=background)
        if self.tofn() is not None:  # holders that missed the close or the forward, up again: closed and sent now
            self._closing.catch_up(contract, uploads)

    def _send_uploads(self, contract: StudyContract, parts: list[OwnerC1Parts]) -> None:
        if self.tofn() is not None:  # t holders suffice; a holder down closes and takes them when it is back
            self._closing.forward(contract, parts)
            return
        self._all("refused the owners' c1 parts", lambda c: c.send_uploads(contract.study_id,
                                                                           contract.contract_hash, parts))
        log.info("study %s: c1 parts of %d owners forwarded to %d holders (%d bytes each)", contract.study_id,
                 len(parts), self.k, sum(len(p) for u in parts for p in u.parts))

    def _await_forward(self, study_id: str) -> None:
        """Wait for a running forward of `study_id`'s c1 parts; its failure (a holder refused them) is raised here."""
        self._uploads.wait(study_id)

    def _fingerprint(self, study_id: str) -> str:
        """The collective key fingerprint of a study's contract (fetched once per study)."""
        with self._lock:
            fp = self._fps.get(study_id)
        if fp is None:
            fp = self.get_study(study_id).context_fingerprint
            with self._lock:
                self._fps[study_id] = fp
        return fp

    def charge_direct_queries(self, **kwargs: Any) -> DirectChargeInfo:
        """Pay for a batch of direct range counts at every holder (each charges its own ledger).

        Privacy: each holder charges as `DecryptionHandler.charge_direct_queries` (epsilon per
        range, sensitivity c, neighbouring relation add/remove of one person with at most c
        records, max-overlap accounting); draws no noise, so nobody knows noise from it.
        Returns the most expensive holder's answer.
        """
        if self.tofn() is not None:
            return self._direct_precheck(**kwargs)
        paid = self._all("refused the direct-query charge", lambda c: c.charge_direct_queries(**kwargs))
        return max(paid, key=lambda p: (p.epsilon_charged, -p.epsilon_remaining))

    def _direct_precheck(self, *, study_id: str, request_id: str, contract_hash: str,
                         ranges: Sequence[tuple[int, int]], epsilon: float) -> DirectChargeInfo:
        """t-of-N: a batch of direct range counts is charged range by range in the signed charge log, each in full
        (charged_epsilon of the range, as a release measurement: sequential composition; the heaviest-overlap
        accounting of one ledger is not built over the log), when its range is decrypted. Here: refuse a batch
        whose ranges not yet charged do not fit what the log leaves (RESOURCE_EXHAUSTED), before anything is
        charged or decrypted.

        Privacy: spends nothing itself; each range later spends its epsilon (sensitivity c, add/remove of one
        person with at most c records) through `_charge`. Draws no noise."""
        from he_partition.core.measurements import range_count_batch

        contract = self.get_study(study_id)
        if contract.contract_hash != contract_hash:
            raise FailedPreconditionError(f"the direct queries name another contract than study {study_id}'s; "
                                          "nothing was charged")
        ms = range_count_batch(contract.domain_size, epsilon, contract.person_bound, ranges,
                               max_ranges=max(1, len(ranges)))
        cost, spent, left = self.charges.direct_cost(contract, request_id, epsilon, ms)
        return DirectChargeInfo(float(cost), float(spent + cost), below(left - cost), 0, cost == 0)

    #: A join study's values are computed and shared by the holders themselves (`join_holders`): the release
    #: forwards the planes (`prepare_join`) and sends each measurement's values with this server's draw in c0.
    joins_at_holders = True

    def prepare_join(self, contract: StudyContract, uploads: list[OwnerC1Parts]) -> None:
        """Forward both owners' signed planes to the release's holders and relay their check of them: every holder
        of an N-of-N key; t-of-N, the first t that answer now, who then take every measurement of the release."""
        t = self.tofn()
        if t is None:
            parts = list(range(self.k))
        else:
            parts = self._answering()[:t]
        with self._lock:
            self._join_sets[contract.study_id] = parts
        send_planes(self, contract, uploads, parts)
        run_check(self, contract, parts)

    def decrypt_join_cells(self, *, study_id: str, release_id: str, release_epsilon: float, contract_hash: str,
                           cells: Iterable[bytes], cell_count: int, measurement: Measurement) -> JoinCellsResult:
        """Every holder's shares of the measurement's values combined with `cells` (this server's values, its draw
        in c0: `holders.noised_for_holders`); see `join_holders.combine_shares` for who charges and draws what."""
        contract = self.get_study(study_id)
        if contract.contract_hash != contract_hash:
            raise FailedPreconditionError(f"the join measurement names another contract than study {study_id}'s")
        version = contract.join_terms().version
        values = list(cells)
        if len(values) != cell_count:
            raise InvalidInputError(f"{len(values)} join values for {cell_count} announced")
        with self._lock:
            parts = self._join_sets.get(study_id)
        if parts is None:
            raise FailedPreconditionError(f"join study {study_id}: no holder holds its planes for this release")
        charge_log = ""
        t = self.tofn()
        if t is not None:  # charged in the signed log with the holders that checked the planes as participants
            signed = self._charge(t, study_id, release_id, release_epsilon, measurement,
                                  avoid=[i for i in range(self.k) if i not in parts])
            parts = list(signed.entry.participants)
            charge_log = dump_log(self.charges.log(study_id))
        return combine_shares(self, contract, release_id=release_id, release_epsilon=release_epsilon,
                              measurement=measurement, values=values, ctx=join_template(version),
                              plain_modulus=join_plain_modulus(version), parts=parts, charge_log=charge_log)

    def join_check_seed(self, **kwargs: Any) -> tuple[bytes, int]:
        raise FailedPreconditionError(JOINS_SINGLE_HOLDER)

    def check_join_upload(self, **kwargs: Any) -> bool:
        raise FailedPreconditionError(JOINS_SINGLE_HOLDER)
