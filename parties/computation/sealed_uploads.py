"""The computation server's side of sealed uploads (`parties.common.sealing`): keep, close, open.

An owner of a sealed study uploads AES-sealed chunks and a signed commitment (its c1 parts'
digest and its upload key, shared to the key holders). This server keeps the commitment next
to the upload (`keep`), and cannot read the chunks until the key holders close the study's
uploads (`include`): it names the set of commitments (every committed owner; with `--force`,
the owners present), records the set here first (so a restart closes on the same set, and no
owner uploads into a closed study), asks every key holder for its shares, opens each chunk in
place (atomic per chunk, so a crash leaves only sealed or opened chunks), checks each owner's
opened c1 against its commitment, and marks the study opened. Nothing here adds noise or
spends budget.
"""
from __future__ import annotations

import json
import secrets
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from he_partition.core.errors import InvalidInputError
from he_partition.he.threshold.c1 import c1_bytes, c1_of_vector, c1_stream_digest

from ..common.contract import StudyContract, check_id
from ..common.errors import FailedPreconditionError
from ..common.sealing import Commitment, is_sealed, open_chunk, sealed_share_bytes
from ..common.util import write_file_atomic
from .sealed_open import OpenJob, opener_of
from .store import ComputationStore, Submission

__all__ = ["SealedUploads", "check_commitment"]

log = logging.getLogger("dpagg.computation.sealed")

#: Threads that open owners' sealed chunks at once (each chunk: AES-GCM, a c1 parse, an atomic durable write).
OPEN_THREADS = 4


def check_commitment(contract: StudyContract, c: Commitment) -> None:
    """Refuse (InvalidInputError, SignatureError) a commitment that cannot be the owner's, before anything is stored."""
    if len(c.c1_parts_digest) != 32:
        raise InvalidInputError(f"study {contract.study_id} is sealed: the upload header must carry the 32-byte "
                                f"digest of the chunks' c1 parts, got {len(c.c1_parts_digest)} bytes (a current "
                                "data-owner client sends it)")
    if len(c.key_shares) != len(contract.holder_seal_keys):
        raise InvalidInputError(f"study {contract.study_id} is sealed to {len(contract.holder_seal_keys)} key "
                                f"holder(s); the upload header carries {len(c.key_shares)} sealed key shares")
    want = sealed_share_bytes(contract.seal_threshold)
    if any(len(s) != want for s in c.key_shares):
        raise InvalidInputError(f"study {contract.study_id} splits each upload key "
                                f"{f'{contract.seal_threshold}-of-N' if contract.seal_threshold else 'by XOR'}: every "
                                f"sealed key share has {want} bytes, the upload header carries "
                                f"{sorted({len(s) for s in c.key_shares})} (a current data-owner client seals them)")
    c.verify(contract, "nothing was stored")


class SealedUploads:
    """Commitments by (study, owner, upload key) and each study's closed set: files under `directory`, or memory."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._mem: dict[tuple[str, ...], bytes] = {}
        self._lock = threading.Lock()
        self._study_locks: dict[str, threading.Lock] = {}
        #: The c1 parts read while opening, by (study, owner, upload key), until the forward takes them.
        self._parts: dict[tuple[str, str, str], tuple[bytes, ...]] = {}

    def _path(self, *parts: str) -> Path | None:
        return None if self.directory is None else self.directory.joinpath(*parts)

    def _write(self, data: bytes, *parts: str) -> None:
        with self._lock:
            self._mem[parts] = data
        path = self._path(*parts)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_file_atomic(path, data)

    def _read(self, *parts: str) -> bytes | None:
        with self._lock:
            data = self._mem.get(parts)
        path = self._path(*parts)
        if data is None and path is not None and path.exists():
            data = path.read_bytes()
        return data

    def keep(self, study_id: str, c: Commitment) -> None:
        """Keep an owner's checked commitment (the key holders verify it again when the uploads close)."""
        for name, value in (("study_id", study_id), ("owner_id", c.owner_id), ("idempotency_key", c.idempotency_key)):
            check_id(name, value)
        self._write(json.dumps(c.to_json()).encode(), study_id, f"{c.owner_id}.{c.idempotency_key}.commitment")

    def get(self, study_id: str, owner_id: str, key: str) -> Commitment:
        data = self._read(study_id, f"{owner_id}.{key}.commitment")
        if data is None:
            raise FailedPreconditionError(f"owner {owner_id!r} uploaded to sealed study {study_id} without a "
                                          "commitment: it must upload again with a current data-owner client")
        return Commitment.from_json(json.loads(data))

    def closed_on(self, study_id: str) -> tuple[str, ...] | None:
        """The owners `study_id`'s uploads close (or closed) on, once this server named them; else None."""
        data = self._read(study_id, "closed.json")
        return None if data is None else tuple(json.loads(data))

    def opened(self, study_id: str) -> bool:
        """Whether `study_id`'s uploads are closed and every included chunk is opened (only then may a fold read them)."""
        return self._read(study_id, "opened") is not None

    def take_parts(self, study_id: str, owner_id: str, key: str) -> tuple[bytes, ...] | None:
        """The c1 parts of an upload this server just opened (each is handed out once; None otherwise)."""
        with self._lock:
            return self._parts.pop((study_id, owner_id, key), None)

    def refuse_late(self, contract: StudyContract, owner_id: str) -> None:
        """FailedPrecondition for an owner outside a study whose uploads are closed (it could never be included)."""
        closed = self.closed_on(contract.study_id)
        if closed is not None and owner_id not in closed:
            raise FailedPreconditionError(
                f"study {contract.study_id}'s uploads closed on the owners {', '.join(closed)}: an upload of owner "
                f"{owner_id} can no longer be included (the key holders accept no commitment after the close). Ask "
                "the operator to open a new study")

    def include(self, contract: StudyContract, subs: Sequence[Submission], store: ComputationStore,
                close: Callable[[StudyContract, list[Commitment]], list[bytes]], context: Any,
                workers: Any = None, context_bytes: bytes = b"") -> list[Submission]:
        """The submissions a release of the sealed study includes, with their chunks opened.

        The first call closes the uploads on `subs` (every key holder's shares through
        `close`, e.g. `DecryptionClient.close_uploads`; any t holders' for a t-of-N split,
        `ThresholdDecryption.close_uploads`) and opens every chunk; later calls
        return the closed set's submissions. FailedPreconditionError when a key holder
        refuses, or when an owner's opened chunks are not what it committed to. With `workers` (the
        server's local chunk workers) and the study's public context as `context_bytes`, the chunks
        are opened on the workers (`parties.computation.sealed_open`).
        """
        study_id = contract.study_id
        with self._lock:
            lock = self._study_locks.setdefault(study_id, threading.Lock())
        with lock:
            owners = self.closed_on(study_id)
            if owners is None:
                owners = tuple(sorted(s.owner_id for s in subs))
                self._write(json.dumps(list(owners)).encode(), study_id, "closed.json")  # before any holder is asked
            chosen = [s for s in subs if s.owner_id in owners]
            if len(chosen) != len(owners):
                raise FailedPreconditionError(f"study {study_id}'s uploads close on {list(owners)} but this server "
                                              f"holds submissions of {sorted(s.owner_id for s in subs)}")
            if self.opened(study_id):
                return chosen
            commitments = [self.get(study_id, s.owner_id, s.idempotency_key) for s in chosen]
            keys = close(contract, commitments)
            if workers is not None and context_bytes:
                self._open_on_workers(contract, chosen, commitments, keys, store, workers, context_bytes)
            else:  # owners in parallel: the AES pass, the c1 parse and the writes overlap
                with ThreadPoolExecutor(max_workers=OPEN_THREADS, thread_name_prefix="open-uploads") as pool:
                    for done in [pool.submit(self._open_submission, contract, sub, c, key, store, context)
                                 for sub, c, key in zip(chosen, commitments, keys)]:
                        done.result()
            self._write(b"1", study_id, "opened")
            log.info("study %s: uploads closed on %d owners' commitments and opened", study_id, len(chosen))
            return chosen

    def _open_on_workers(self, contract: StudyContract, chosen: list[Submission], commitments: list[Commitment],
                         keys: list[bytes], store: ComputationStore, workers: Any, context_bytes: bytes) -> None:
        """Every chunk opened and parsed by the chunk workers (worker w: every W-th); then every owner's c1 parts
        checked against its commitment, and only then the opened files made current, owner by owner."""
        jobs = [OpenJob(store.chunk_template(sub).format(index=i), i, key, contract.study_id, sub.owner_id,
                        sub.idempotency_key, contract.contract_hash)
                for sub, key in zip(chosen, keys) for i in range(sub.meta.chunk_count)]
        count = int(workers.workers)
        shares = [jobs[w::count] for w in range(count)]
        held = f"open/{contract.study_id}/{secrets.token_hex(4)}"
        workers.hold(held, opener_of(context_bytes))
        try:
            replies = workers.call(held, "open", [(share,) for share in shares])
        finally:
            workers.drop(held)
        done = {(job.owner_id, job.index): reply for share, got in zip(shares, replies) for job, reply in zip(share, got)}
        staged_all = [Path(staged) for _, staged, _ in done.values() if staged]
        try:
            checked = []
            for sub, c in zip(chosen, commitments):  # every owner checked before any file is replaced
                got = [done[(sub.owner_id, i)] for i in range(sub.meta.chunk_count)]
                failed = next((err for _, _, err in got if err), "")
                if failed:
                    raise FailedPreconditionError(f"owner {sub.owner_id!r}'s upload to study {contract.study_id} "
                                                  f"does not open to a valid ciphertext: {failed}")
                parts = tuple(part for part, _, _ in got)
                if c1_stream_digest(list(parts)) != c.c1_parts_digest:
                    raise FailedPreconditionError(
                        f"owner {sub.owner_id!r}'s opened chunks are not the ones it committed to (their c1 parts "
                        f"differ from its commitment): study {contract.study_id} cannot be released with this upload")
                checked.append((sub, got, parts))
            for sub, got, parts in checked:
                store.replace_staged(sub, [(staged, i) for i, (_, staged, _) in enumerate(got) if staged])
                with self._lock:
                    self._parts[(contract.study_id, sub.owner_id, sub.idempotency_key)] = parts
        finally:
            for path in staged_all:  # what was not installed (an owner refused, or an error) is removed
                path.unlink(missing_ok=True)

    def _open_submission(self, contract: StudyContract, sub: Submission, c: Commitment, key: bytes,
                         store: ComputationStore, context: Any) -> None:
        """Open every chunk of `sub` in place and check its c1 against the owner's commitment."""
        place = dict(study_id=contract.study_id, owner_id=sub.owner_id, idempotency_key=sub.idempotency_key,
                     contract_hash=contract.contract_hash)
        parts = []

        def opened_chunks() -> Iterator[tuple[int, bytes]]:
            for i in range(sub.meta.chunk_count):
                data = store.read_chunk(sub, i)
                try:
                    opened = open_chunk(key, i, data, **place) if is_sealed(data) else data  # else: opened before
                    parts.append(c1_bytes(c1_of_vector(context, opened)))
                except InvalidInputError as exc:  # the owner's upload, not the caller's request, is at fault
                    raise FailedPreconditionError(f"owner {sub.owner_id!r}'s upload to study {contract.study_id} "
                                                  f"does not open to a valid ciphertext: {exc}") from None
                if opened is not data:
                    yield i, opened

        store.replace_chunks(sub, opened_chunks())  # durable together, not one flush per chunk
        if c1_stream_digest(parts) == c.c1_parts_digest:
            with self._lock:  # the forward to the key holders takes them instead of parsing every chunk again
                self._parts[(contract.study_id, sub.owner_id, sub.idempotency_key)] = tuple(parts)
        else:
            raise FailedPreconditionError(f"owner {sub.owner_id!r}'s opened chunks are not the ones it committed to "
                                          f"(their c1 parts differ from its commitment): study {contract.study_id} "
                                          "cannot be released with this upload")
