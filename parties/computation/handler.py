"""Transport-neutral logic of the computation server: uploads, aggregation under encryption, releases.

Size: over 500 lines on purpose: the upload, aggregation and release state machines share the
store's transactions and the recovery after a restart; split, each would re-derive the others' state.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generator, Iterator

import numpy as np
import numpy.typing as npt

from he_partition.core.backend import n_chunks
from he_partition.execution import ChunkExecutor, InProcessExecutor
from he_partition.execution.base import ChunkFiles, ChunkSource, noise_in_c0_context
from he_partition.he.bfv import BfvBackend, context_fingerprint, load_context
from he_partition.core.errors import BudgetExhaustedError, InvalidInputError
from he_partition.join.release import join_strategy, summary_params
from he_partition.core.accounting import exact_decimal
from he_partition.core.measurements import Measurement
from he_partition.core.noise import RandomSource
from he_partition.protocol import EPSILON_TOLERANCE, MIN_RELEASE_EPSILON, ComputationSide, make_strategy, run_strategy
from he_partition.core.summary import Summary

from ..common.contract import StudyContract, check_id
from ..common.errors import FailedPreconditionError, NotFoundError, PermissionDeniedError, status_for
from ..common.signing import SIGNATURE_SIZE, SignatureError, StreamHasher, submission_digest, verify_submission
from ..common.util import new_id, utc_now, write_file_atomic
from ..decryption.client import DecryptionClient
from ..common.sealing import Commitment, is_sealed
from .threshold.c1_forward import C1Signatures, owner_c1_parts
from .sealed_uploads import SealedUploads, check_commitment
from .join import JoinCoordinator, JoinUploadBackend
from .running import RunningAggregates
from .store import ComputationStore, ReleaseRecord, ReleaseState, Submission, UploadMeta, owner_conflict

__all__ = ["ComputationHandler", "UploadSession", "UploadOutcome", "UploadState", "StudyState"]

log = logging.getLogger("dpagg.computation")

IntArray = npt.NDArray[np.int64]

PUBLIC_CONTEXT_FILE = "public_context.bin"


class UploadState:
    NONE = "NONE"
    PARTIAL = "PARTIAL"
    COMMITTED = "COMMITTED"
    CONFLICT = "CONFLICT"


@dataclass(frozen=True)
class UploadOutcome:
    """Where an upload stands after a stream (or for UploadStatus)."""

    state: str
    received: tuple[int, ...]
    chunk_count: int
    bytes_received: int = 0
    duplicate: bool = False

    @property
    def committed(self) -> bool:
        return self.state == UploadState.COMMITTED


@dataclass(frozen=True)
class StudyState:
    """A study as this server sees it."""

    contract: StudyContract
    submitted: tuple[str, ...]
    missing: tuple[str, ...]
    release_ids: tuple[str, ...]


class UploadSession:
    """One SubmitHistogram stream: validates every chunk before storing it; `finish` commits when complete.

    In a signed study the upload counts only once the owner's signature verifies over
    every stored chunk (in index order) together with the study id, owner id,
    idempotency key and contract hash; otherwise the whole upload is discarded.
    """

    def __init__(self, handler: "ComputationHandler", meta: UploadMeta, backend: Any, duplicate: bool,
                 contract: StudyContract | None = None, signature: bytes = b"", sealed: bool = False) -> None:
        self._h = handler
        #: The chunks are sealed (`parties.common.sealing`): checked for their form only, opened at the close.
        self.sealed = sealed
        self.meta = meta
        self._backend = backend
        self.duplicate = duplicate
        self.contract = contract
        self.signature = bytes(signature)
        self.bytes_this_stream = 0
        self._started = False

    def add(self, index: int, data: bytes) -> None:
        """Validate (deserialize under the study's public key) and store one chunk.

        An invalid chunk discards the whole partial upload, so nothing from a bad upload
        is ever stored or counted. Chunks of an already committed upload are ignored.
        """
        if self.duplicate:
            return
        if not 0 <= index < self.meta.chunk_count:
            self.abort()
            raise InvalidInputError(f"chunk index {index} is outside [0, {self.meta.chunk_count})")
        try:
            if self.sealed:
                if not is_sealed(data):
                    raise InvalidInputError("study uploads are sealed, this chunk is not")
            else:
                self._backend.deserialize_chunk(data)
        except InvalidInputError as exc:
            self.abort()
            raise InvalidInputError(
                f"chunk {index} of owner {self.meta.owner_id}'s upload is not a valid ciphertext for study "
                f"{self.meta.study_id} ({exc}); the upload was discarded, nothing is stored. Re-encrypt with the "
                "study's public context and upload again"
            ) from exc
        if not self._started:
            # Begin (or resume) the partial upload. A different signature under the same key
            # (a re-encryption) discards the chunks held so far, which it would not match.
            self._h.store.start_upload(self.meta, self.signature)
            self._started = True
        self._h.store.put_chunk(self.meta, index, data)
        self.bytes_this_stream += len(data)

    def abort(self) -> None:
        self._h.store.discard_upload(self.meta)

    def _verify(self) -> bytes:
        """Recompute the stream digest from the stored chunks and verify the owner's signature (signed studies).

        Returns the ciphertext digest ("" for an unsigned study). On failure the upload
        is discarded and SignatureError (UNAUTHENTICATED) raised: nothing counts.
        """
        contract = self.contract
        if contract is None or not contract.signed:
            return b""
        public = contract.owner_public_key(self.meta.owner_id)
        assert public is not None  # open_upload checked that the owner is expected
        hasher = StreamHasher()
        for i in range(self.meta.chunk_count):
            hasher.update(self._h.store.read_upload_chunk(self.meta, i))
        digest = submission_digest(self.meta.study_id, self.meta.owner_id, self.meta.idempotency_key,
                                   contract.contract_hash, hasher)
        try:
            verify_submission(public, digest, self.signature, owner_id=self.meta.owner_id)
        except SignatureError:
            self.abort()
            raise
        return hasher.digest()

    def finish(self) -> UploadOutcome:
        """Commit if every chunk has arrived (and, in a signed study, the signature verifies); else report what is held."""
        held = self._h.store.received_chunks(self.meta)
        if not self.duplicate and len(held) == self.meta.chunk_count:
            ciphertext_digest = self._verify()
            self._h.store.commit_upload(self.meta, self.signature if ciphertext_digest else b"", ciphertext_digest)
            self._h.fold_committed(self.meta.study_id, self._backend)
            log.info("study %s: committed owner %s (%d chunks, %d bytes)", self.meta.study_id, self.meta.owner_id,
                     len(held), sum(held.values()))
            self._h.forward_when_complete(self.meta.study_id)
        state = UploadState.COMMITTED if self.duplicate or len(held) == self.meta.chunk_count else UploadState.PARTIAL
        return UploadOutcome(state, tuple(sorted(held)), self.meta.chunk_count, sum(held.values()), self.duplicate)


@dataclass
class _KeyCache:
    fingerprint: str = ""
    backend: BfvBackend | None = None
    context: bytes = b""
    lock: threading.Lock = field(default_factory=threading.Lock)


def _close_when_idle(stream: Generator[Any, None, None], timeout: float = 120.0) -> None:
    """Close a request stream gRPC may still be reading in its sender thread (close() fails while it runs)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            stream.close()
            return
        except ValueError:  # "generator already executing": the sender is inside one chunk's work
            if time.monotonic() > deadline:
                log.warning("a measurement stream was still being read %.0f s after its call ended", timeout)
                return
            time.sleep(0.01)


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


class ComputationHandler:
    """The computation server's operations. It holds public material only: no secret key ever reaches it.

    Studies are owned by the decryption server (which keeps contracts next to the budget
    ledger); this server forwards OpenStudy there and caches each contract it uses
    (fetching unknown ones with GetStudy), so the two servers can never disagree on terms.
    """

    def __init__(self, store: ComputationStore, decryption: DecryptionClient, rng: RandomSource, *,
                 data_dir: Path | None = None, executor: ChunkExecutor | None = None) -> None:
        self.store = store
        #: Where the chunk work runs (he_partition.execution): in-process unless the server passes another.
        self.executor: ChunkExecutor = executor or InProcessExecutor()
        self.decryption = decryption
        self.rng = rng
        self.data_dir = data_dir
        self._keys = _KeyCache()
        self.c1_signatures = C1Signatures(data_dir / "c1_signatures" if data_dir is not None else None)
        self.sealed = SealedUploads(data_dir / "sealed" if data_dir is not None else None)
        self.joins = JoinCoordinator(data_dir / "join" if data_dir is not None else None, rng)
        self._running: set[str] = set()
        self._running_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        root = store.aggregates_root()
        #: Running encrypted aggregates (one per study), folded at each commit; None for in-memory stores.
        self.running = RunningAggregates(root, durable=getattr(store, "durable", True)) if root else None
        self._recover_interrupted_releases()

    # -- keys and studies -----------------------------------------------------------------
    def _recover_interrupted_releases(self) -> None:
        for r in self.store.list_releases():
            if r.state == ReleaseState.RUNNING:
                self.store.save_release(replace(
                    r, state=ReleaseState.FAILED, finished_at=utc_now(), error_code="ABORTED",
                    error_message="interrupted by a restart of the computation server; epsilon already charged "
                                  "at the decryption server stays spent. Run a new release"))

    def backend_for(self, contract: StudyContract) -> BfvBackend:
        """A public-key BFV backend for the study's key (fetched from the decryption server, cached on disk)."""
        want = contract.context_fingerprint
        with self._keys.lock:
            if self._keys.backend is not None and self._keys.fingerprint == want:
                return self._keys.backend
            data = self._cached_context()
            if data is None or context_fingerprint(data) != want:
                data = self.decryption.public_context()
            got = context_fingerprint(data)
            if got != want:
                raise FailedPreconditionError(
                    f"study {contract.study_id} was opened under key {want[:16]} but the decryption server now "
                    f"serves key {got[:16]}; the study cannot continue, open a new one"
                )
            ctx = load_context(data)
            if ctx.is_private():
                raise InvalidInputError("the decryption server served a context holding a secret key; refusing it")
            self._keys.backend = BfvBackend(ctx)
            self._keys.backend.noise_in_c0 = bool(getattr(self.decryption, "noise_in_c0", False))
            self._keys.fingerprint = got
            self._keys.context = data
            if self.data_dir is not None:
                write_file_atomic(self.data_dir / PUBLIC_CONTEXT_FILE, data)
            return self._keys.backend

    def public_context(self, study_id: str = "") -> bytes:
        """The decryption server's public context as it serves it now (relayed to parties that cannot reach it);
        for a join study, its join key."""
        return self.decryption.public_context(study_id=study_id)

    def _cached_context(self) -> bytes | None:
        if self.data_dir is None:
            return None
        p = self.data_dir / PUBLIC_CONTEXT_FILE
        return p.read_bytes() if p.exists() else None

    @property
    def key_holders(self) -> int:
        """K: the key-share holders in threshold mode, 1 with the single decryption server."""
        return int(getattr(self.decryption, "k", 1))

    def holder_noise_variance(self, contract: StudyContract) -> float:
        """The key holders' summed noise variance per value in discrete Laplace draws: K/(K - T) (1 for T = 0)."""
        return contract.holder_noise_variance(self.key_holders)

    def noise_variance_units(self, contract: StudyContract) -> float:
        """Total noise variance per released value in discrete Laplace draws of its scale: this server's one draw
        plus the key holders' K/(K - T); `noise_parties` (2) when T = 0. Adds no noise."""
        if not contract.noise_tolerates:
            return float(contract.noise_parties)
        return contract.noise_parties - 1 + self.holder_noise_variance(contract)

    def open_study(self, **terms: object) -> tuple[StudyContract, bool]:
        """Forward to the decryption server (which creates the contract and its ledger) and keep the contract."""
        contract, existed = self.decryption.open_study(**terms)  # type: ignore[arg-type]
        self.store.put_study(contract)
        return contract, existed

    def study(self, study_id: str) -> StudyContract:
        """The study's contract, from the local cache or from the decryption server (NOT_FOUND if unknown)."""
        check_id("study_id", study_id)
        contract = self.store.get_study(study_id)
        if contract is None:
            contract = self.decryption.get_study(study_id)
            self.store.put_study(contract)
        return contract

    def study_state(self, study_id: str) -> StudyState:
        contract = self.study(study_id)
        submitted = tuple(s.owner_id for s in self.store.submissions(study_id))
        missing = tuple(o for o in contract.expected_owners if o not in submitted)
        releases = tuple(r.release_id for r in self.store.list_releases(study_id))
        return StudyState(contract, submitted, missing, releases)

    def submissions_to_include(self, contract: StudyContract, *, force: bool, action: str) -> list[Submission]:
        """The study's committed submissions, for a release or a direct count (`action` names it in errors).

        FailedPreconditionError when nobody has submitted, or when expected owners are
        still missing and `force` is not given.
        """
        subs = self.store.submissions(contract.study_id)
        if not subs:
            raise FailedPreconditionError(
                f"no data owner has submitted to study {contract.study_id} yet; nothing to {action}")
        submitted = {s.owner_id for s in subs}
        missing = [o for o in contract.expected_owners if o not in submitted]
        if missing and not force:
            raise FailedPreconditionError(
                f"study {contract.study_id} still waits for {len(missing)} owner(s): {', '.join(missing)}; wait "
                f"until they have submitted, or force the {action} with the owners present"
            )
        if contract.sealed:  # the first time: the key holders close the uploads on these owners, chunks opened
            backend = self.backend_for(contract)
            subs = self.sealed.include(contract, subs, self.store, self.decryption.close_uploads, backend.context)
            self.fold_committed(contract.study_id, backend)
        return subs

    # -- uploads -------------------------------------------------------------------------
    def open_upload(self, *, study_id: str, owner_id: str, idempotency_key: str, domain_length: int,
                    context_fingerprint: str, chunk_count: int, contract_hash: str = "",
                    signature: bytes = b"", c1_signature: bytes = b"",
                    commitment: tuple[bytes, tuple[bytes, ...], bytes] | None = None) -> UploadSession:
        """Check an upload header against the study; nothing is stored unless every check passes.

        `contract_hash` must be the study's (the owner encrypted for these terms). In a
        signed study `signature` must be a 64-byte Ed25519 signature; it is verified over
        the stored chunks when the upload completes (`UploadSession.finish`).
        """
        check_id("owner_id", owner_id)
        check_id("idempotency_key", idempotency_key)
        contract = self.study(study_id)
        if owner_id not in contract.expected_owners:
            raise PermissionDeniedError(
                f"owner {owner_id!r} is not expected by study {study_id} (expected: "
                f"{', '.join(contract.expected_owners)}); check --owner, or ask the operator to open a study "
                "that includes you"
            )
        if not contract_hash:
            raise InvalidInputError("contract_hash is required in the upload header: send the hash of the study "
                                    "contract you encrypted for")
        if contract_hash != contract.contract_hash:
            raise FailedPreconditionError(
                f"contract_hash {contract_hash[:16]} does not match study {study_id}'s contract "
                f"{contract.contract_hash[:16]}: fetch the study again (its terms differ from what you hold)"
            )
        if contract.signed and len(signature) != SIGNATURE_SIZE:
            raise SignatureError(
                f"study {study_id} requires signed uploads but the header carries "
                f"{'no' if not signature else f'a {len(signature)}-byte'} signature: sign the upload with owner "
                f"{owner_id}'s Ed25519 key (DataOwnerClient(signing_key=...), `dpagg submit --signing-key`)"
            )
        if domain_length != contract.domain_size:
            raise InvalidInputError(
                f"histogram has {domain_length} bins but study {study_id} has domain size {contract.domain_size}; "
                f"bin your data with the study's domain{f' ({contract.domain_spec})' if contract.domain_spec else ''}"
            )
        if context_fingerprint != contract.context_fingerprint:
            raise InvalidInputError(
                f"the histogram was encrypted under public key {context_fingerprint[:16] or '(none)'} but study "
                f"{study_id} uses key {contract.context_fingerprint[:16]}; fetch the decryption server's public "
                "context again and re-encrypt"
            )
        backend: Any
        if contract.is_join:
            self.joins.require_placement(contract, owner_id)
            backend = JoinUploadBackend(self.joins.scheme(contract, self.public_context))
            expected = self.joins.expected_chunks(contract, owner_id, backend.slots)
            what = f"owner {owner_id}'s indicator planes for join study {study_id}"
        else:
            backend = self.backend_for(contract)
            expected = n_chunks(contract.domain_size, backend.slots)
            what = f"a {contract.domain_size}-bin histogram"
        if chunk_count != expected:
            raise InvalidInputError(
                f"{what} is {expected} ciphertext chunks of {backend.slots} slots, header says {chunk_count}"
            )
        meta = UploadMeta(study_id, owner_id, idempotency_key, int(chunk_count), int(domain_length),
                          context_fingerprint)
        existing = self.store.get_submission(study_id, owner_id)
        if existing is not None and existing.meta == meta:
            return UploadSession(self, meta, backend, duplicate=True, contract=contract)
        if existing is not None:
            raise owner_conflict(existing)  # one submission per owner, ever
        sig = bytes(signature) if contract.signed else b""
        if contract.sealed:  # the chunks are sealed: keep the owner's commitment, checked, before any chunk
            self.sealed.refuse_late(contract, owner_id)
            digest, shares, commit_sig = commitment or (b"", (), b"")
            owner_commitment = Commitment(owner_id, idempotency_key, bytes(digest), tuple(shares), bytes(commit_sig))
            check_commitment(contract, owner_commitment)
            self.sealed.keep(study_id, owner_commitment)
        if contract.signed and c1_signature:  # forwarded to the key holders with the owner's c1 parts
            self.c1_signatures.keep(study_id, owner_id, idempotency_key, c1_signature)
        # Nothing is stored yet: the upload starts with its first valid chunk (UploadSession.add).
        return UploadSession(self, meta, backend, duplicate=False, contract=contract, signature=sig,
                             sealed=contract.sealed)

    def upload_status(self, study_id: str, owner_id: str, idempotency_key: str) -> UploadOutcome:
        check_id("owner_id", owner_id)
        check_id("idempotency_key", idempotency_key)
        self.study(study_id)
        sub = self.store.get_submission(study_id, owner_id)
        if sub is not None:
            state = UploadState.COMMITTED if sub.idempotency_key == idempotency_key else UploadState.CONFLICT
            held = self.store.received_chunks(sub.meta) if state == UploadState.COMMITTED else {}
            return UploadOutcome(state, tuple(sorted(held)), sub.meta.chunk_count, sum(held.values()))
        up = self.store.get_upload(study_id, owner_id)
        if up is None or up.idempotency_key != idempotency_key:
            return UploadOutcome(UploadState.NONE, (), 0)
        held = self.store.received_chunks(up)
        return UploadOutcome(UploadState.PARTIAL, tuple(sorted(held)), up.chunk_count, sum(held.values()))

    # -- releases ------------------------------------------------------------------------
    def release(self, release_id: str) -> ReleaseRecord:
        check_id("release_id", release_id)
        rec = self.store.get_release(release_id)
        if rec is None:
            raise NotFoundError(f"unknown release {release_id!r}; list releases with `dpagg query --list`")
        return rec

    def run_release(self, study_id: str, *, epsilon: float = 0.0, force: bool = False, wait: bool = True,
                    request_key: str = "", spend_rest: bool = False) -> ReleaseRecord:
        """Release the study's aggregate with its strategy; see `_execute` for the privacy statement.

        Checks before anything is computed: every expected owner submitted (or `force`),
        `epsilon` (> 0 and finite; or, with `spend_rest` and epsilon 0, exactly what is left)
        fits the budget left at the decryption server (RESOURCE_EXHAUSTED otherwise, and
        nothing is decrypted), and no other release of the study is running.
        """
        contract = self.study(study_id)
        if request_key:
            check_id("request_key", request_key)
            previous = self.store.release_by_request_key(study_id, request_key)
            if previous is not None:
                return previous
        if spend_rest:
            if epsilon:
                raise InvalidInputError(f"spend_rest spends what is left; epsilon must then be 0, got {epsilon}")
            eps = self.decryption.budget(study_id).available
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
        subs = self.submissions_to_include(contract, force=force, action="release")
        owners = tuple(s.owner_id for s in subs)
        budget = self.decryption.budget(study_id)
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
        try:
            self.store.save_release(record)
        except BaseException:
            self._done(study_id)
            raise
        if wait:
            return self._execute(record, contract, subs, raise_errors=True)
        t = threading.Thread(target=self._execute, args=(record, contract, subs), kwargs={"raise_errors": False},
                             name=f"release-{record.release_id}", daemon=True)
        self._threads.append(t)
        t.start()
        return record

    def _done(self, study_id: str) -> None:
        with self._running_lock:
            self._running.discard(study_id)

    def fold_committed(self, study_id: str, backend: Any) -> None:
        """Add the study's committed submissions not yet in its running aggregate to it (called at each commit).

        A fold that fails leaves the previous aggregate in place (the commit stands): a
        release then adds the owners missing from it itself, so nothing is lost.
        """
        contract = self.store.get_study(study_id)
        if self.running is None or contract is None or contract.is_join:
            return
        if contract.sealed and self.sealed.closed_on(study_id) is None:
            return  # sealed chunks are folded once the uploads close and open
        store = self.store

        def read(template: str, i: int) -> bytes:
            return Path(template.format(index=i)).read_bytes()

        try:
            self.running.fold(store.submissions(study_id), read, backend.deserialize_chunk, backend.serialize_chunk,
                              store.chunk_template)
        except (OSError, InvalidInputError) as exc:
            log.warning("study %s: the running aggregate was not updated (%s); releases sum the owners missing "
                        "from it themselves", study_id, exc)

    @contextmanager
    def chunk_source(self, subs: list[Submission]) -> Iterator[ChunkSource]:
        """Where the executor reads the aggregate of `subs`: the running aggregate plus owners not yet folded."""
        if self.running is None:
            yield self.store.chunk_source(subs)
            return
        with self.running.reading(subs, self.store.chunk_template) as templates:
            yield ChunkFiles(templates)

    def wants_c1_signatures(self, study_id: str) -> bool:
        """True when the key holders take the study's c1 from the owners' signed c1 parts (the owners of a signed
        study then sign them); never for a join study (its cells are decrypted as sent)."""
        if not callable(getattr(self.decryption, "forward_uploads", None)):
            return False
        contract = self.store.get_study(study_id)
        return contract is None or not contract.is_join

    def _forward_c1(self, contract: StudyContract, subs: list[Submission]) -> bytes | None:
        """Send `subs`' signed c1 parts to the key holders in the background; the marker for the workers, or None.

        Threshold mode: every study (the holders refuse an unsigned one), noise in c0, no flood.
        The single decryption server: signed studies, noise and flood in c0 (it decrypts the whole
        polynomial, with the aggregate c1 it verified itself); unsigned studies keep a fresh
        encryption of the noise (only a server without TLS opens them). Join studies: None.
        """
        forward = getattr(self.decryption, "forward_uploads", None)
        threshold = bool(getattr(self.decryption, "noise_in_c0", False))
        if forward is None or contract.is_join or not (contract.signed or threshold):
            return None  # a join's cells are decrypted as sent (DecryptJoinCells)
        backend = self.backend_for(contract)
        forward(contract, lambda: [owner_c1_parts(backend.context, s, self.store.read_chunk, self.c1_signatures.get(
            contract.study_id, s.meta.owner_id, s.meta.idempotency_key),
            self.sealed.take_parts(contract.study_id, s.meta.owner_id, s.meta.idempotency_key)) for s in subs],
            [(s.meta.owner_id, s.meta.idempotency_key) for s in subs], background=True)
        return noise_in_c0_context(b"", flood=not threshold)

    def forward_when_complete(self, study_id: str) -> None:
        """Signed studies: once every expected owner has committed, start sending their c1 parts to the key holders.

        The release that follows then finds them on their way or delivered (`load_aggregate`);
        a failure here is only logged: the release forwards again.
        """
        try:
            contract = self.study(study_id)
            if contract.sealed:  # close and open as soon as every owner is in; the release finds it done
                if all(o in {s.owner_id for s in self.store.submissions(study_id)} for o in contract.expected_owners):
                    t = threading.Thread(target=self._close_in_background, args=(contract,),
                                         name=f"close-{study_id}", daemon=True)
                    self._threads.append(t)
                    t.start()
                return
            if getattr(self.decryption, "forward_uploads", None) is None or not contract.signed:
                return
            try:
                subs = self.submissions_to_include(contract, force=False, action="forward")
            except FailedPreconditionError:  # owners still missing: the last one's commit starts it
                return
            self._forward_c1(contract, subs)
        except Exception as failed:  # noqa: BLE001 - an early start only; the release forwards and reports
            log.warning("study %s: the c1 parts were not sent ahead of the release: %s", study_id, failed)

    def _close_in_background(self, contract: StudyContract) -> None:
        try:
            subs = self.submissions_to_include(contract, force=False, action="close")
            if getattr(self.decryption, "forward_uploads", None) is not None:
                self._forward_c1(contract, subs)
        except Exception as failed:  # noqa: BLE001 - an early start only; the release closes again and reports
            log.warning("study %s: the uploads were not closed ahead of the release: %s", contract.study_id, failed)

    def load_aggregate(self, key: str, contract: StudyContract, source: ChunkSource,
                       subs: list[Submission] | None = None) -> None:
        """Have the executor's workers sum their chunk ranges of `source` and keep the sums under `key`.

        A signed study (every study in threshold mode): first the included owners' signed c1 parts
        go to the key holders (once per study), and the workers add the noise (and, for the single
        decryption server, the flood) to c0 only (`noise_in_c0_context`).
        """
        backend = self.backend_for(contract)
        context = self._keys.context
        marker = self._forward_c1(contract, list(subs or []))
        if marker is not None:
            context = marker + context
        self.executor.load(key, context, source, n_chunks(contract.domain_size, backend.slots))

    def decrypt_on_executor(self, cs: ComputationSide, contract: StudyContract, key: str, release_epsilon: float,
                            m: Measurement) -> tuple[IntArray, int]:
        """Measure `m` on the aggregate loaded under `key` and have the decryption server decrypt it.

        Privacy: as `ComputationSide.measure_on` (this server's discrete Laplace draw of
        scale m.sensitivity / m.epsilon per measured value, m.epsilon-DP under add/remove of
        one person with at most c records, and pads; only this server knows them, all drawn
        before the first chunk leaves); the decryption server charges `release_epsilon`'s
        share and adds its own draw. Returns (decrypted values, bytes sent). Only chunks with
        a measured slot travel; the executor's workers encrypt the next chunks while one is sent.
        """
        slots = cs.backend.slots
        stream = cs.measure_on(self.executor, key, m)
        sent = [0]

        def chunks() -> Generator[bytes, None, None]:
            try:
                for _, data in stream:
                    sent[0] += len(data)
                    yield data
            finally:
                stream.close()  # type: ignore[attr-defined]

        sending = chunks()
        try:
            values = self.decryption.decrypt_measurement(
                study_id=contract.study_id, release_id=key, release_epsilon=release_epsilon, measurement=m,
                chunks=sending, chunk_count=len(m.measured_chunks(slots)), contract_hash=contract.contract_hash).values
        finally:
            _close_when_idle(sending)  # a refused stream frees the executor now, not at garbage collection
        return values, sent[0]

    def _execute(self, record: ReleaseRecord, contract: StudyContract, subs: list[Submission], *,
                 raise_errors: bool) -> ReleaseRecord:
        """Compute the release (`_strategy_summary`, or `_join_summary` for a join study) and store its outcome."""
        started = time.monotonic()
        compute = self._join_summary if contract.is_join else self._strategy_summary
        try:
            summary, sent = compute(record, contract, subs)
            text = summary.to_json()
            done = replace(record, state=ReleaseState.DONE, finished_at=utc_now(), summary_json=text,
                           seconds=time.monotonic() - started, bytes_to_decryption=sent, summary_cache=(text, summary))
            self.store.save_release(done)
            log.info("release %s of study %s done in %.2f s (%d partitions)", record.release_id, record.study_id,
                     done.seconds, summary.n_partitions)
            return done
        except Exception as exc:
            code, message = status_for(exc)
            failed = replace(record, state=ReleaseState.FAILED, finished_at=utc_now(), error_code=code.name,
                             error_message=message, seconds=time.monotonic() - started)
            self.store.save_release(failed)
            log.warning("release %s of study %s failed: %s", record.release_id, record.study_id, message)
            if raise_errors:
                raise
            return failed
        finally:
            self._done(record.study_id)

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
        backend = self.backend_for(contract)
        cs = ComputationSide(backend, self.rng)
        strategy = make_strategy(contract.strategy, contract.domain_size, contract.dp_epsilon(record.epsilon),
                                 noise_parties=contract.noise_parties,
                                 contribution_bound=contract.person_bound,
                                 params=contract.strategy_params or None)

        sent = [0]

        def measure(m: Measurement) -> IntArray:
            values, n = self.decrypt_on_executor(cs, contract, record.release_id, record.epsilon, m)
            sent[0] += n
            return values

        with self.chunk_source(subs) as source:
            try:
                # The executor's workers sum their chunk ranges and keep the sums for the whole release.
                self.load_aggregate(record.release_id, contract, source, subs)
                summary: Summary = run_strategy(strategy, measure)
            finally:
                self.executor.drop(record.release_id)
        # Every summary states how many organizations one person may appear in (its noise assumes it).
        summary = replace(summary, params={**summary.params, "max_organizations": contract.max_organizations})
        if contract.noise_tolerates:  # the key holders' shares carry K/(K - T) draws' variance, not one draw's
            k, holder_var = self.key_holders, self.holder_noise_variance(contract)
            summary = summary.with_noise_variance_factor(
                self.noise_variance_units(contract) / contract.noise_parties,
                holder_noise={"key_holders": k, "noise_tolerates": contract.noise_tolerates,
                              "holder_variance_factor": holder_var})
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
        self.joins.forget(contract)  # both uploads are committed: keys and pseudonym lists are no longer needed
        sent = [0]
        with self.joins.evaluator(contract, self.public_context,
                                  lambda o, i: self.store.read_chunk(by_owner[o], i), self.executor) as evaluator:

            def measure(m: Measurement) -> IntArray:
                cts = evaluator.measure(m)
                sent[0] += sum(len(c) for c in cts)
                return self.decryption.decrypt_join_cells(
                    study_id=contract.study_id, release_id=record.release_id, release_epsilon=record.epsilon,
                    contract_hash=contract.contract_hash, cells=iter(cts), cell_count=len(cts),
                    measurement=m).values

            summary: Summary = run_strategy(join_strategy(terms, record.epsilon,
                                                          noise_parties=contract.noise_parties), measure)
        return replace(summary, params={**summary.params, **summary_params(terms)}), sent[0]

    def join(self, timeout: float | None = None) -> None:
        """Wait for background releases (used before shutdown and in tests)."""
        for t in list(self._threads):
            t.join(timeout)

