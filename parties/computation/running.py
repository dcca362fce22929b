"""The running encrypted aggregate of a study: each committed upload is added in once, so a release starts from the sum.

Layout (next to the uploads, under the store's data directory)::

    aggregates/<study>/gen-<token>/<index:07d>.ct   one generation of the summed chunks
    aggregates/<study>/manifest.json                which generation is current and which uploads it holds

A fold writes a whole new generation directory, then replaces the manifest atomically
(write + rename): the manifest names the generation and the (owner, idempotency key)
pairs summed into it, so the sum and the set of owners it holds change together. A crash
before the rename leaves the old manifest (the new generation is an orphan, removed at
the next fold): no owner is counted twice, and an owner committed but not yet folded is
simply added at the next fold or by the release itself (`sources`). Only committed (and,
in signed studies, verified) submissions are ever folded; a manifest naming an owner or
key that is not a current submission is ignored and the release sums every owner.

Privacy: the aggregate is a sum of ciphertexts the server already holds; BFV addition
is exact (mod q), so the stored sum does not depend on the order or timing of commits
and nothing derived from it is sent out before a release's fresh noise and flooding.
"""

from __future__ import annotations

import json
import secrets
from contextlib import contextmanager
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..common.util import sync_written_files, write_file_atomic
from .store import CHUNK_FILE, Submission

__all__ = ["RunningAggregates", "Folded"]

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Folded:
    """A study's current aggregate: its chunk-file template and the uploads summed into it."""

    template: str
    uploads: frozenset[tuple[str, str]]
    chunk_count: int
    context_fingerprint: str


def _key(s: Submission) -> tuple[str, str]:
    return (s.owner_id, s.idempotency_key)


def _unfolded(f: Folded | None, subs: list[Submission]) -> list[Submission]:
    """The submissions of `subs` the aggregate `f` does not hold (all of them without one)."""
    return [s for s in subs if f is None or _key(s) not in f.uploads]


class RunningAggregates:
    """Running aggregates under `root` (one directory per study); one lock per study orders folds and reads."""

    def __init__(self, root: Path, *, durable: bool = True) -> None:
        self.root = root
        self.durable = durable
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._pinned: dict[Path, int] = {}  # generation dir -> releases reading it (a fold keeps it until they end)
        self._folding: dict[str, threading.Lock] = {}  # one fold of a study at a time

    def lock(self, study_id: str) -> threading.Lock:
        """Held while a fold picks its inputs or swaps the manifest, and while a release picks (or lets go of) the
        generation its executor reads."""
        with self._guard:
            return self._locks.setdefault(study_id, threading.Lock())

    def current(self, study_id: str) -> Folded | None:
        p = self.root / study_id / MANIFEST
        try:
            m = json.loads(p.read_text())
            return Folded(str(self.root / study_id / m["generation"] / CHUNK_FILE),
                          frozenset((str(o), str(k)) for o, k in m["uploads"]), int(m["chunk_count"]),
                          str(m["context_fingerprint"]))
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def usable(self, subs: list[Submission]) -> Folded | None:
        """The current aggregate if it holds only current submissions of the same shape and key, else None."""
        if not subs:
            return None
        f = self.current(subs[0].meta.study_id)
        if f is None or not f.uploads <= {_key(s) for s in subs}:
            return None
        meta = subs[0].meta
        if f.chunk_count != meta.chunk_count or f.context_fingerprint != meta.context_fingerprint:
            return None
        return f

    def sources(self, subs: list[Submission]) -> int:
        """How many chunk files per index a reader of `subs` would sum now: the running sum (if usable) and each
        owner not yet in it."""
        f = self.usable(subs)
        return (f is not None) + len(_unfolded(f, subs))

    @contextmanager
    def reading(self, subs: list[Submission], owner_template: Callable[[Submission], str]) -> Iterator[tuple[str, ...]]:
        """Chunk-file templates whose sum is the aggregate of `subs`: the running sum plus owners not yet in it.

        The generation read stays on disk until the block ends (a worker that is replaced
        mid-release reads it again), even if folds replace it meanwhile. The sum is the same
        in any order (exact addition mod q).
        """
        if not subs:
            yield ()
            return
        study_id = subs[0].meta.study_id
        with self.lock(study_id):
            f = self.usable(subs)
            if f is None:
                templates = tuple(owner_template(s) for s in subs)
                gen = None
            else:
                templates = (f.template, *(owner_template(s) for s in _unfolded(f, subs)))
                gen = self._pin(f)
        try:
            yield templates
        finally:
            self._unpin(study_id, gen)

    def _pin(self, f: Folded) -> Path:
        """Keep `f`'s generation on disk while it is read (called under the study's lock)."""
        gen = Path(f.template).parent
        self._pinned[gen] = self._pinned.get(gen, 0) + 1
        return gen

    def _unpin(self, study_id: str, gen: Path | None) -> None:
        if gen is None:
            return
        with self.lock(study_id):
            self._pinned[gen] -= 1
            if not self._pinned[gen]:
                del self._pinned[gen]
                cur = self.current(study_id)
                if cur is None or Path(cur.template).parent != gen:
                    shutil.rmtree(gen, ignore_errors=True)

    def fold(self, subs: list[Submission], write_sums: Callable[[tuple[str, ...], int, str], None],
             owner_template: Callable[[Submission], str]) -> Folded | None:
        """Add every submission in `subs` not yet in the running sum to it; one new generation, one manifest swap.

        `write_sums(templates, chunk_count, out_template)` sums chunk i of every template
        and writes it to `out_template.format(index=i)` (the server's chunk workers do, in
        parallel; not synced). Folds of a study run one at a time (the one that waited adds
        every owner committed meanwhile); a release reading the aggregate meanwhile is not
        held up: the study's lock is taken only to pick the inputs and to swap the manifest.
        Returns the new aggregate (None if there was nothing to fold or no submission).
        """
        if not subs:
            return None
        study_id, meta = subs[0].meta.study_id, subs[0].meta
        study_dir = self.root / study_id
        with self._fold_lock(study_id):
            with self.lock(study_id):
                f = self.usable(subs)
                todo = _unfolded(f, subs)
                if not todo:
                    return f
                templates = ([f.template] if f is not None else []) + [owner_template(s) for s in todo]
                base = self._pin(f) if f is not None else None  # read below, without the lock
                gen = f"gen-{secrets.token_hex(8)}"
                out = study_dir / gen
                out.mkdir(parents=True)
            try:
                # No manifest names the new generation yet: plain writes, made durable together below.
                write_sums(tuple(templates), meta.chunk_count, str(out / CHUNK_FILE))
                if self.durable:  # the whole generation is on disk before the manifest names it
                    sync_written_files([out / CHUNK_FILE.format(index=i) for i in range(meta.chunk_count)], out)
                uploads = sorted((f.uploads if f is not None else frozenset()) | {_key(s) for s in todo})
                manifest = {"generation": gen, "uploads": [list(u) for u in uploads], "chunk_count": meta.chunk_count,
                            "context_fingerprint": meta.context_fingerprint}
                with self.lock(study_id):
                    write_file_atomic(study_dir / MANIFEST, json.dumps(manifest, sort_keys=True).encode(),
                                      fsync=self.durable)
                    for old in study_dir.iterdir():  # the previous generation and orphans of interrupted folds
                        if old.is_dir() and old.name != gen and old not in self._pinned:
                            shutil.rmtree(old, ignore_errors=True)
            except BaseException:
                shutil.rmtree(out, ignore_errors=True)
                raise
            finally:
                self._unpin(study_id, base)
            return self.current(study_id)

    def _fold_lock(self, study_id: str) -> threading.Lock:
        with self._guard:
            return self._folding.setdefault(study_id, threading.Lock())
