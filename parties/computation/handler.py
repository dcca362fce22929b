"""Transport-neutral logic of the computation server: keys and studies, folding, forwarding, the executor.

`ComputationHandler` is the composition the servicers call: an upload's checks and chunk stream are
in `uploads.py`, the release path in `releases.py` (both reached through the handler's methods);
here are the study cache, the public key, the running aggregates an upload is folded into, the
signed c1 parts forwarded to the key holders, and a measurement's trip through the executor to
the decryption server (shared by releases and direct range counts).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generator, Iterator

import numpy as np
import numpy.typing as npt

from he_partition.core.backend import n_chunks
from he_partition.execution import ChunkExecutor, InProcessExecutor
from he_partition.execution.processes import ProcessExecutor
from he_partition.execution.base import ChunkFiles, ChunkSource, ChunkWorker, noise_in_c0_context
from he_partition.he.bfv import BfvBackend, context_fingerprint, load_context
from he_partition.core.errors import InvalidInputError, WorkerLostError
from he_partition.core.measurements import Measurement
from he_partition.core.noise import RandomSource
from he_partition.protocol import ComputationSide

from ..common.contract import StudyContract, check_id
from ..common.errors import FailedPreconditionError
from ..common.receipts import Receipt
from ..common.util import write_file_atomic
from ..decryption.client import DecryptionClient
from .threshold.c1_forward import C1Signatures, owner_c1_parts
from .sealed_uploads import SealedUploads
from .join import JoinCoordinator
from .folding import FoldQueue
from .running import RunningAggregates
from . import uploads
from .releases import Releases
from .store import ComputationStore, ReleaseProgress, ReleaseRecord, Submission
from .uploads import UploadOutcome, UploadSession

__all__ = ["ComputationHandler", "StudyState"]

log = logging.getLogger("dpagg.computation")

IntArray = npt.NDArray[np.int64]

#: The one public context kept before keys were per study (read if it is the key a study names).
PUBLIC_CONTEXT_FILE = "public_context.bin"
#: The studies' public contexts, one file per key: public_contexts/FINGERPRINT.bin.
PUBLIC_CONTEXTS_DIR = "public_contexts"
#: Most keys' backends kept loaded at once; others are read again from `PUBLIC_CONTEXTS_DIR`.
MAX_LOADED_KEYS = 16


@dataclass(frozen=True)
class StudyState:
    """A study as this server sees it."""

    contract: StudyContract
    submitted: tuple[str, ...]
    missing: tuple[str, ...]
    release_ids: tuple[str, ...]


@dataclass
class _KeyCache:
    """The public keys this server has loaded, by fingerprint (a key per study): (backend, context bytes)."""

    loaded: "OrderedDict[str, tuple[BfvBackend, bytes]]" = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def context_of(self, backend: Any) -> bytes:
        """The serialized context `backend` was loaded from (b"" when it is not one of ours)."""
        return next((data for b, data in self.loaded.values() if b is backend), b"")


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



def kept_context(data_dir: Path, fingerprint: str) -> bytes | None:
    """The public context of key `fingerprint` a computation server kept in `data_dir` (None: not kept, or not that
    key): its own file per key, or the single file of the server key from before keys were per study."""
    for p in (data_dir / PUBLIC_CONTEXTS_DIR / f"{fingerprint}.bin", data_dir / PUBLIC_CONTEXT_FILE):
        if p.exists():
            data = p.read_bytes()
            if context_fingerprint(data) == fingerprint:
                return data
    return None

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
        #: Background work started at a commit (closing sealed uploads); releases keep their own threads.
        self._threads: list[threading.Thread] = []
        root = store.aggregates_root()
        #: Running encrypted aggregates (one per study), folded at each commit; None for in-memory stores.
        self.running = RunningAggregates(root, durable=getattr(store, "durable", True)) if root else None
        #: Commits ask for folds here; they run in the background, a burst of commits in a few passes.
        self.folds = FoldQueue(self.fold_committed)
        #: Set when the server begins to shut down: a release it interrupts is recorded as interrupted by it.
        self.stopping = threading.Event()
        self.releases = Releases(self)
        self.releases.recover_interrupted()

    # -- keys and studies -----------------------------------------------------------------
    def backend_for(self, contract: StudyContract) -> BfvBackend:
        """A public-key BFV backend for the study's key, the one its contract names (a key per study): fetched
        from the decryption server for that study, checked against the contract's fingerprint, kept on disk."""
        return self._key_of(contract)[0]

    def _key_of(self, contract: StudyContract) -> tuple[BfvBackend, bytes]:
        want = contract.context_fingerprint
        with self._keys.lock:
            entry = self._keys.loaded.get(want)
            if entry is not None:
                self._keys.loaded.move_to_end(want)
                return entry
            data = self._cached_context(want)
            if data is None:
                data = self.decryption.public_context(study_id=contract.study_id)
            got = context_fingerprint(data)
            if got != want:
                raise FailedPreconditionError(
                    f"study {contract.study_id} was opened under key {want[:16]} but the decryption server now "
                    f"serves key {got[:16]} for it; the study cannot continue, open a new one"
                )
            ctx = load_context(data)
            if ctx.is_private():
                raise InvalidInputError("the decryption server served a context holding a secret key; refusing it")
            backend = BfvBackend(ctx)
            backend.noise_in_c0 = bool(getattr(self.decryption, "noise_in_c0", False))
            if self.data_dir is not None:
                (self.data_dir / PUBLIC_CONTEXTS_DIR).mkdir(exist_ok=True)
                write_file_atomic(self.data_dir / PUBLIC_CONTEXTS_DIR / f"{got}.bin", data)
            self._keys.loaded[got] = (backend, data)
            while len(self._keys.loaded) > MAX_LOADED_KEYS:
                self._keys.loaded.popitem(last=False)
            return backend, data

    def public_context(self, study_id: str = "") -> bytes:
        """The decryption server's public context as it serves it now (relayed to parties that cannot reach it);
        for a join study, its join key."""
        return self.decryption.public_context(study_id=study_id)

    def _cached_context(self, fingerprint: str) -> bytes | None:
        """The public context of key `fingerprint` this server kept on disk (None: not kept, or not that key)."""
        return None if self.data_dir is None else kept_context(self.data_dir, fingerprint)

    @property
    def key_holders(self) -> int:
        """The key holders whose shares every released value carries: K in N-of-N threshold mode, t with a t-of-N
        key (the t participants of each request), 1 with the single decryption server."""
        combining = getattr(self.decryption, "combining", None)
        return int(combining()) if callable(combining) else int(getattr(self.decryption, "k", 1))

    def ledger_receipts(self, study_id: str) -> list[tuple[str, list[Receipt]]]:
        """Every signed ledger receipt this server keeps for `study_id`: (holder name, receipts) per key holder
        ("" names the single decryption server), oldest first. Reads the receipt books only; asks nobody."""
        clients = getattr(self.decryption, "clients", None)
        if clients is None:  # the single decryption server
            book = getattr(self.decryption, "receipts", None)
            return [("", book.receipts(study_id) if book is not None else [])]
        return [(c.name, c.receipts.receipts(study_id) if c.receipts is not None else []) for c in clients]

    def key_holder_addresses(self) -> list[tuple[str, str]]:
        """(name, HOST:PORT) of each key holder as this server reaches it, in order; ("", target) for the single
        decryption server."""
        clients = getattr(self.decryption, "clients", None)
        if clients is None:
            return [("", str(getattr(self.decryption, "target", "") or ""))]
        return [(c.name, str(c.target)) for c in clients]

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
        if contract.seals_uploads:  # the first time: the key holders close the uploads on these owners, chunks opened
            backend, context = self._key_of(contract)
            local = isinstance(self.executor, ProcessExecutor) and getattr(self.store, "data_dir", None) is not None
            subs = self.sealed.include(contract, subs, self.store, self.decryption.close_uploads, backend.context,
                                       workers=self.executor if local else None, context_bytes=context)
            self.fold_committed(contract.study_id, backend)
        return subs

    # -- uploads -------------------------------------------------------------------------
    def open_upload(self, *, study_id: str, owner_id: str, idempotency_key: str, domain_length: int,
                    context_fingerprint: str, chunk_count: int, contract_hash: str = "",
                    signature: bytes = b"", c1_signature: bytes = b"",
                    commitment: tuple[bytes, tuple[bytes, ...], bytes] | None = None) -> UploadSession:
        """Check an upload header against the study; nothing is stored unless every check passes (`uploads.open_upload`)."""
        return uploads.open_upload(self, study_id=study_id, owner_id=owner_id, idempotency_key=idempotency_key,
                                   domain_length=domain_length, context_fingerprint=context_fingerprint,
                                   chunk_count=chunk_count, contract_hash=contract_hash, signature=signature,
                                   c1_signature=c1_signature, commitment=commitment)

    def upload_status(self, study_id: str, owner_id: str, idempotency_key: str) -> UploadOutcome:
        """Where an owner's upload under `idempotency_key` stands (`uploads.upload_status`)."""
        return uploads.upload_status(self, study_id, owner_id, idempotency_key)

    # -- releases ------------------------------------------------------------------------
    def release(self, release_id: str) -> ReleaseRecord:
        """A stored release (NOT_FOUND if unknown)."""
        return self.releases.release(release_id)

    def release_progress(self, release_id: str) -> ReleaseProgress | None:
        """How far a release this server is running has got; None when it is not running here."""
        return self.releases.progress(release_id)

    def run_release(self, study_id: str, *, epsilon: float = 0.0, force: bool = False, wait: bool = True,
                    request_key: str = "", spend_rest: bool = False) -> ReleaseRecord:
        """Release the study's aggregate with its strategy (`releases.Releases.run`)."""
        return self.releases.run(study_id, epsilon=epsilon, force=force, wait=wait, request_key=request_key,
                                 spend_rest=spend_rest)

    # -- folding, forwarding and the executor ---------------------------------------------
    def fold_committed(self, study_id: str, backend: Any) -> None:
        """Add the study's committed submissions not yet in its running aggregate to it (after commits, by `folds`).

        The executor's workers read, parse, sum and write the chunks, each its share (this
        process only while they serve a release); this process syncs and swaps the manifest.

        A fold that fails leaves the previous aggregate in place (the commit stands): a
        release then adds the owners missing from it itself, so nothing is lost.
        """
        contract = self.store.get_study(study_id)
        if self.running is None or contract is None or contract.is_join:
            return
        if contract.sealed and not self.sealed.opened(study_id):
            return  # sealed chunks are folded once the uploads are closed and opened, never while sealed
        store = self.store
        with self._keys.lock:
            context = self._keys.context_of(backend)

        def write_sums(templates: tuple[str, ...], count: int, out_template: str) -> None:
            # On the executor's workers, each its share of the chunks; while they serve a release, here.
            if not context or not self.executor.write_sums(context, ChunkFiles(templates), count, out_template,
                                                           wait=False):
                ChunkWorker(backend).write_sums(b"", ChunkFiles(templates), range(count), out_template)

        try:
            self.running.fold(store.submissions(study_id), write_sums, store.chunk_template)
        except (OSError, InvalidInputError, WorkerLostError) as exc:
            log.warning("study %s: the running aggregate was not updated (%s); releases sum the owners missing "
                        "from it themselves", study_id, exc)

    @contextmanager
    def chunk_source(self, subs: list[Submission]) -> Iterator[ChunkSource]:
        """Where the executor reads the aggregate of `subs`: the running aggregate plus owners not yet folded."""
        if self.running is None:
            yield self.store.chunk_source(subs)
            return
        with self.folds.reading(subs[0].meta.study_id) if subs else nullcontext():
            self._fold_before_reading(subs)
            with self.running.reading(subs, self.store.chunk_template) as templates:
                yield ChunkFiles(templates)

    def _fold_before_reading(self, subs: list[Submission]) -> None:
        """Fold the owners the running aggregate lacks before a release or direct count reads it.

        The reader would sum them anyway; summing them into a new generation first costs only
        the writing, and the next reader (and the background pass, which then finds nothing
        left) starts from one sum instead of doing it again.
        """
        assert self.running is not None
        if self.running.sources(subs) > 1:
            contract = self.store.get_study(subs[0].meta.study_id)
            if contract is not None and not contract.is_join:
                self.fold_committed(contract.study_id, self.backend_for(contract))

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
            if contract.seals_uploads:  # close and open as soon as every owner is in; the release finds it done
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
        backend, context = self._key_of(contract)
        marker = self._forward_c1(contract, list(subs or []))
        if marker is not None:
            context = marker + context
        self.executor.load(key, context, source, n_chunks(contract.domain_size, backend.slots))

    def decrypt_on_executor(self, cs: ComputationSide, contract: StudyContract, key: str, release_epsilon: float,
                            m: Measurement, *, on_chunk: Callable[[], None] | None = None) -> tuple[IntArray, int]:
        """Measure `m` on the aggregate loaded under `key` and have the decryption server decrypt it.

        Privacy: as `ComputationSide.measure_on` (this server's discrete Laplace draw of
        scale m.sensitivity / m.epsilon per measured value, m.epsilon-DP under add/remove of
        one person with at most c records, and pads; only this server knows them, all drawn
        before the first chunk leaves); the decryption server charges `release_epsilon`'s
        share and adds its own draw. Returns (decrypted values, bytes sent). Only chunks with
        a measured slot travel; the executor's workers encrypt the next chunks while one is sent.
        `on_chunk` is called as each chunk is handed to the stream (progress reports).
        """
        slots = cs.backend.slots
        stream = cs.measure_on(self.executor, key, m)
        sent = [0]

        def chunks() -> Generator[bytes, None, None]:
            try:
                for _, data in stream:
                    sent[0] += len(data)
                    if on_chunk is not None:
                        on_chunk()
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

    def join(self, timeout: float | None = None) -> None:
        """Wait for background releases and commit-time work, folds included (used before shutdown and in tests)."""
        for t in [*self._threads, *self.releases.threads]:
            t.join(timeout)
        self.folds.wait_idle(timeout)

