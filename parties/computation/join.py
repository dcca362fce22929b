"""The computation server's part of a join study (docs/join.md): key relay, placement, the encrypted product.

`JoinCoordinator` keeps, per join study, each owner's signed X25519 public key and pseudonym
list and the placement (files under DATA_DIR/join/<study>/, written atomically, never
rewritten): a posted key or list cannot change, so a retry is idempotent and nobody can
swap a list after seeing the other side. The placement is computed once, when both lists
are in, from this server's random source. All of it is deleted when the study's first
release starts (`forget`; both uploads are committed then), and later posts are refused.
"""

from __future__ import annotations

import logging
import threading
from functools import partial
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from he_partition.he.bfv import context_fingerprint
from he_partition.core.errors import InvalidInputError
from he_partition.execution import ChunkExecutor
from he_partition.join.protocol import PSEUDONYM_BYTES, JoinTerms, place
from he_partition.he.join_scheme import JoinScheme
from he_partition.join.parallel import JoinEvaluator, UploadFiles
from he_partition.join.release import bin_cells
from he_partition.core.noise import RandomSource

from ..common.contract import StudyContract
from ..common.errors import AlreadyExistsError, FailedPreconditionError, PermissionDeniedError
from ..common.join_keys import verify_join_key
from ..common.util import ReadOnDemand, write_file_atomic

__all__ = ["JoinCoordinator", "JoinUploadBackend"]

#: What the coordinator keeps per owner until the first release of the study starts (`forget`).
_PER_OWNER = ("x25519", "x25519.sig", "pseudonyms", "positions")
#: Most parts a pseudonym list may come in (the owner sends parts of PART_PSEUDONYMS, 16 MB each).
_MAX_PARTS = 64
#: Marks a study whose per-owner join state was deleted.
_RELEASED = "released"

log = logging.getLogger("dpagg.join")


@dataclass
class JoinUploadBackend:
    """What an upload session needs to validate join chunks: parse each under the study's join key."""

    scheme: JoinScheme

    @property
    def slots(self) -> int:
        return self.scheme.slots

    def deserialize_chunk(self, data: bytes) -> Any:
        return self.scheme.deserialize(data)


class JoinCoordinator:
    """Join state of every join study of one computation server (files under `root`, or memory when None)."""

    def __init__(self, root: Path | None, rng: RandomSource) -> None:
        self.root = root
        self.rng = rng
        self._mem: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._schemes: dict[str, tuple[bytes, JoinScheme]] = {}
        self._fetching: dict[str, threading.Lock] = {}

    # -- storage -----------------------------------------------------------------------
    def _get(self, study_id: str, name: str) -> bytes | None:
        if self.root is None:
            return self._mem.get(f"{study_id}/{name}")
        p = self.root / study_id / name
        return p.read_bytes() if p.exists() else None

    def _put(self, study_id: str, name: str, data: bytes) -> None:
        if self.root is None:
            self._mem[f"{study_id}/{name}"] = data
            return
        (self.root / study_id).mkdir(parents=True, exist_ok=True, mode=0o700)
        write_file_atomic(self.root / study_id / name, data)

    def _delete(self, study_id: str, name: str) -> None:
        if self.root is None:
            self._mem.pop(f"{study_id}/{name}", None)
            return
        (self.root / study_id / name).unlink(missing_ok=True)

    def _require_open(self, contract: StudyContract) -> None:
        if self._get(contract.study_id, _RELEASED) is not None:
            raise FailedPreconditionError(f"join study {contract.study_id} has been released: its join keys and "
                                          "pseudonym lists were deleted and nothing more can be posted (an owner "
                                          "whose upload committed needs to do nothing)")

    def forget(self, contract: StudyContract) -> None:
        """Delete both owners' X25519 keys, signatures, pseudonym lists and placements (called when a release
        starts: both uploads are committed, so nothing needs them); later posts are refused."""
        with self._lock:
            self._put(contract.study_id, _RELEASED, b"1")
            for owner in contract.expected_owners:
                declared = self._get(contract.study_id, f"{owner}.parts")
                parts = [f"part{k}" for k in range(int(declared))] if declared is not None else []
                for name in (*_PER_OWNER, *parts, "parts"):
                    self._delete(contract.study_id, f"{owner}.{name}")

    @staticmethod
    def _side(contract: StudyContract, owner_id: str) -> int:
        if owner_id not in contract.expected_owners:
            raise PermissionDeniedError(f"owner {owner_id!r} is not one of join study {contract.study_id}'s owners "
                                        f"({', '.join(contract.expected_owners)})")
        return contract.expected_owners.index(owner_id)

    # -- step 1: key relay ---------------------------------------------------------------
    def exchange(self, contract: StudyContract, owner_id: str, public_key: bytes,
                 signature: bytes = b"") -> tuple[bytes, bytes]:
        """Store this owner's X25519 public key and its signature (once; checked against the contract's key for
        the owner first) and return the other owner's key and signature, or (b"", b"") until it posts."""
        contract.join_terms()  # refuses a study that is not a join study
        side = self._side(contract, owner_id)
        if len(public_key) != 32:
            raise InvalidInputError(f"an X25519 public key is 32 bytes, got {len(public_key)}")
        verify_join_key(contract, owner_id, public_key, signature)
        with self._lock:
            self._require_open(contract)
            held = self._get(contract.study_id, f"{owner_id}.x25519")
            if held is None:
                self._put(contract.study_id, f"{owner_id}.x25519.sig", bytes(signature))
                self._put(contract.study_id, f"{owner_id}.x25519", bytes(public_key))
            elif held != bytes(public_key):
                raise AlreadyExistsError(f"owner {owner_id} already posted another join key for study "
                                         f"{contract.study_id}; run again with the state dir that holds the key "
                                         "you posted, or, if it is lost, ask the operator to open a new study")
            peer = contract.expected_owners[1 - side]
            return (self._get(contract.study_id, f"{peer}.x25519") or b"",
                    self._get(contract.study_id, f"{peer}.x25519.sig") or b"")

    # -- step 2: placement ----------------------------------------------------------------
    def placement(self, contract: StudyContract, owner_id: str, pseudonyms: bytes, *, part: int = 0,
                  parts: int = 0) -> tuple[bool, list[int], int]:
        """Store this owner's pseudonyms (once; a long list in `parts` consecutive parts); when both lists are
        complete, (True, its positions in posted order, capacity)."""
        side = self._side(contract, owner_id)
        terms = contract.join_terms()
        with self._lock:
            self._require_open(contract)
            held = self._get(contract.study_id, f"{owner_id}.pseudonyms")
            if pseudonyms:
                if len(pseudonyms) % PSEUDONYM_BYTES:
                    raise InvalidInputError(f"pseudonyms must be whole {PSEUDONYM_BYTES}-byte values, got "
                                            f"{len(pseudonyms)} bytes")
                if parts > 1:
                    held = self._store_part(contract, owner_id, terms, bytes(pseudonyms), part, parts, held)
                elif part or parts < 0:
                    raise InvalidInputError(f"part {part} of {parts}: a list in one message is part 0 of 0 or 1")
                elif held is None:
                    held = self._store_list(contract, owner_id, terms, bytes(pseudonyms))
                elif held != bytes(pseudonyms):
                    raise AlreadyExistsError(f"owner {owner_id} already posted a different pseudonym list for study "
                                             f"{contract.study_id}; a list cannot change once posted")
            if held is None:
                if not pseudonyms:
                    raise FailedPreconditionError(f"owner {owner_id} has posted no pseudonyms for study "
                                                  f"{contract.study_id} yet")
                return False, [], terms.capacity
            owners = contract.expected_owners
            lists = [self._get(contract.study_id, f"{o}.pseudonyms") for o in owners]
            if any(x is None for x in lists):
                return False, [], terms.capacity
            positions = self._positions(contract, terms, [_split(x) for x in lists])  # type: ignore[arg-type]
        return True, positions[side], terms.capacity

    def _store_list(self, contract: StudyContract, owner_id: str, terms: JoinTerms, data: bytes) -> bytes:
        """Check a whole list (fits the capacity alone, no duplicates, sorted) and store it; refuses before
        storing anything."""
        _refuse_too_long(contract, owner_id, terms, data)  # fails now, not after the other owner posts
        values = _split(data)
        if values != sorted(values):
            raise InvalidInputError("post the pseudonyms sorted: a list in any other order can show the order of "
                                    "your file (update the data-owner software)")
        self._put(contract.study_id, f"{owner_id}.pseudonyms", data)
        return data

    def _store_part(self, contract: StudyContract, owner_id: str, terms: JoinTerms, data: bytes, part: int,
                    parts: int, held: bytes | None) -> bytes | None:
        """Keep part `part` of `parts` (each part once; the part count once); the whole list once all are in."""
        study = contract.study_id
        if not 0 <= part < parts or parts > _MAX_PARTS:
            raise InvalidInputError(f"part {part} of {parts}: parts are numbered from 0, at most {_MAX_PARTS}")
        declared = self._get(study, f"{owner_id}.parts")
        if declared is not None and int(declared) != parts:
            raise AlreadyExistsError(f"owner {owner_id} posts its list for study {study} in {int(declared)} parts, "
                                     f"not {parts}")
        kept = self._get(study, f"{owner_id}.part{part}")
        if kept is not None:
            if kept != data:
                raise AlreadyExistsError(f"owner {owner_id} already posted a different part {part} for study "
                                         f"{study}; a list cannot change once posted")
            return held
        if held is not None:
            raise AlreadyExistsError(f"owner {owner_id}'s list for study {study} is complete; it cannot change")
        _refuse_too_long(contract, owner_id, terms, data)
        if declared is None:
            self._put(study, f"{owner_id}.parts", str(parts).encode())
        self._put(study, f"{owner_id}.part{part}", data)
        pieces = [self._get(study, f"{owner_id}.part{k}") for k in range(parts)]
        if any(p is None for p in pieces):
            return None
        try:
            return self._store_list(contract, owner_id, terms, b"".join(pieces))  # type: ignore[arg-type]
        except InvalidInputError:  # a refused list leaves nothing behind: the owner may post a corrected one
            for name in (*(f"part{k}" for k in range(parts)), "parts"):
                self._delete(study, f"{owner_id}.{name}")
            raise

    def _positions(self, contract: StudyContract, terms: JoinTerms, lists: list[list[bytes]]) -> list[list[int]]:
        owners = contract.expected_owners
        stored = [self._get(contract.study_id, f"{o}.positions") for o in owners]
        if all(s is not None for s in stored):
            return [np.frombuffer(s, dtype="<i8").tolist() for s in stored]  # type: ignore[arg-type]
        pa, pb = place(lists[0], lists[1], terms.capacity, self.rng)
        out = [[pa[p] for p in lists[0]], [pb[p] for p in lists[1]]]
        for o, pos in zip(owners, out):
            self._put(contract.study_id, f"{o}.positions", np.asarray(pos, dtype="<i8").tobytes())
        return out

    def require_placement(self, contract: StudyContract, owner_id: str) -> None:
        self._side(contract, owner_id)
        if self._get(contract.study_id, f"{owner_id}.positions") is None:
            raise FailedPreconditionError(f"study {contract.study_id} has no placement for owner {owner_id} yet: "
                                          "post the pseudonyms first (JoinPlacement), then upload")

    # -- uploads and the product --------------------------------------------------------------
    def scheme(self, contract: StudyContract, fetch: Any) -> JoinScheme:
        """The study's join key (public), fetched once with `fetch(study_id)` and checked against the contract."""
        return self._key(contract, fetch)[1]

    def prefetch(self, contract: StudyContract, fetch: Any) -> None:
        """Fetch and check the study's join key in the background (both owners' uploads need it soon; fetched at
        the key exchange, it is no longer on their critical path). A failure is left to the call that needs it."""
        with self._lock:
            if contract.context_fingerprint in self._schemes:
                return

        def run() -> None:
            try:
                self._key(contract, fetch)
            except Exception as exc:  # noqa: BLE001 - the upload that needs the key fetches again and reports it
                log.info("prefetching study %s's join key failed (%s); it is fetched when needed", contract.study_id,
                         type(exc).__name__)

        threading.Thread(target=run, daemon=True, name="dpagg-join-key").start()

    def _key(self, contract: StudyContract, fetch: Any) -> tuple[bytes, JoinScheme]:
        """(key bytes, scheme), fetched once per key: concurrent callers wait for one fetch (single flight)."""
        fp = contract.context_fingerprint
        with self._lock:
            cached = self._schemes.get(fp)
            if cached is not None:
                return cached
            flight = self._fetching.setdefault(fp, threading.Lock())
        with flight:
            with self._lock:
                cached = self._schemes.get(fp)
            if cached is not None:
                return cached
            data = fetch(contract.study_id)
            if context_fingerprint(data) != fp:
                raise FailedPreconditionError(f"the decryption server's join key does not match study "
                                              f"{contract.study_id}'s contract; the study cannot continue")
            entry = (data, JoinScheme.from_public(data, contract.join_terms().scheme_params))
            with self._lock:
                self._schemes[fp] = entry
            return entry

    @staticmethod
    def expected_chunks(contract: StudyContract, owner_id: str, slots: int) -> int:
        terms = contract.join_terms()
        return terms.groups(slots) * terms.values_of(contract.expected_owners.index(owner_id))

    def evaluator(self, contract: StudyContract, fetch: Any, chunks_of: Any,
                  executor: ChunkExecutor | None = None, templates: dict[str, str] | None = None) -> JoinEvaluator:
        """The release's evaluator over the committed uploads (a context manager; he_partition.join.parallel).

        `templates[owner_id]`, where the store keeps chunks in files, is the path template of the
        owner's chunk files: each worker then reads the ciphertexts of its block itself, one group
        at a time (`UploadFiles`); otherwise `chunks_of(owner_id, index)` reads a committed chunk
        here and the workers are sent the bytes of their rows and columns. The cell totals are spread over
        the workers of `executor` (the server's chunk executor; None: this process). Privacy: each measurement gets this server's discrete
        Laplace draws (scale sensitivity/epsilon per value, known only here), pads and
        flooding before it leaves (he_partition.join.release.noised_values).
        """
        public = self.public_key(contract, fetch)
        planes = self.uploads(contract, fetch, chunks_of, templates)
        a, b = (planes[o] for o in contract.expected_owners)
        return JoinEvaluator(public, a, b, bin_cells(contract.join_terms()), self.rng, executor=executor)

    def public_key(self, contract: StudyContract, fetch: Any) -> bytes:
        """The study's join key as public key bytes (what the workers load), fetched once (`scheme`)."""
        return self._key(contract, fetch)[0]

    def uploads(self, contract: StudyContract, fetch: Any, chunks_of: Any,
                templates: dict[str, str] | None = None) -> dict[str, Sequence[Sequence[bytes]]]:
        """Each owner's committed upload group by group: `UploadFiles` over `templates[owner_id]` (workers read the
        files themselves), else read here with `chunks_of(owner_id, index)` when a group is asked for."""
        terms = contract.join_terms()
        groups = terms.groups(self.scheme(contract, fetch).slots)
        return {owner: UploadFiles(templates[owner], groups, terms.values_of(side)) if templates
                else [ReadOnDemand(partial(chunks_of, owner), terms.values_of(side), g * terms.values_of(side))
                      for g in range(groups)]
                for side, owner in enumerate(contract.expected_owners)}


def _refuse_too_long(contract: StudyContract, owner_id: str, terms: JoinTerms, data: bytes) -> None:
    if len(data) // PSEUDONYM_BYTES > terms.capacity:
        raise InvalidInputError(f"owner {owner_id}'s pseudonyms alone do not fit study {contract.study_id}'s join "
                                f"capacity {terms.capacity}: the operator must open a new study with a larger capacity")


def _split(data: bytes) -> list[bytes]:
    values = [data[i:i + PSEUDONYM_BYTES] for i in range(0, len(data), PSEUDONYM_BYTES)]
    if len(set(values)) != len(values):
        raise InvalidInputError("a pseudonym appears twice in the list (one record per identifier)")
    return values
