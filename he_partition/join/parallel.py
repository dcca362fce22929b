"""The computation server's join evaluation on the project's chunk executor (he_partition.execution).

`JoinEvaluator` keeps the cell totals for a whole release: each of the executor's workers
holds a contiguous block of bins of the flattened table, computes their totals once
(products, rotation-sum: the expensive part) and keeps them; for each measurement of the
release's strategy it computes the values whose bin ranges lie in its block, adds the noise
and pads it is given, floods, and returns the serialized ciphertexts. A value spanning
blocks (a partition across a block boundary, a Haar node above the blocks) comes back as
un-noised partial sums, which the evaluator adds and noises itself; partials never leave
this server.

A worker reads only its block's ciphertexts, one group at a time: the services pass the owners'
committed chunk files (`UploadFiles`: a path template, so nothing but the template crosses the
pipe), the library path the bytes of its rows and columns (SEAL objects do not pickle). It keeps
one group's ciphertexts and at most `CELLS_PER_PASS` running sums at a time, then the totals of
its block: its memory does not grow with the record count.
The discrete Laplace draws (from the server's random source, so seeded tests stay
reproducible) and the pads (`CipherRandom`: AES-CTR under a fresh OS key) are fixed here before fan-out; workers add exactly
those and flood with fresh OS randomness, so every executor (in-process, local processes,
Ray) releases the same values under a seed, and a worker that dies is rebuilt and re-sent
the same values.
"""

from __future__ import annotations

import logging
import resource
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, overload

import numpy as np
import numpy.typing as npt

from ..core.errors import InvalidInputError
from ..execution.base import ChunkExecutor
from ..execution.inprocess import InProcessExecutor
from ..he.join_scheme import JoinScheme
from .release import Terms, measurement_terms
from ..core.measurements import Measurement
from ..core.noise import CipherRandom, RandomSource, discrete_laplace

__all__ = ["JoinEvaluator", "UploadFiles", "CELLS_PER_PASS"]

log = logging.getLogger("dpagg.join")

IntArray = npt.NDArray[np.int64]
#: A job for a block: (value's terms, (its draw, its pads) or None for an un-noised partial sum).
_Job = tuple[Terms, "tuple[int, IntArray] | None"]


def _noised(scheme: JoinScheme, value: Any, draw: int, pads: IntArray) -> bytes:
    """`value` + Enc(draw in slot 0, the given pads elsewhere) + a fresh flood, serialized (he_partition.join.release).

    Privacy: adds exactly the evaluator's draw (discrete Laplace of scale sensitivity/epsilon
    for the measurement's epsilon; neighbouring relation add/remove of one shared customer,
    who changes one cell by 1) and pads (uniform mod t); only the computation server knows
    them. Draws nothing itself but the flood (OS CSPRNG); spends nothing (the key holder charges).
    """
    return scheme.serialize(scheme.noised(value, [draw], 1, lambda k: pads[:k]))


@dataclass(frozen=True)
class UploadFiles(Sequence[Sequence[bytes]]):
    """One owner's committed join upload on storage every worker can read: the ciphertext of value v in group g
    is the file `template.format(index=g * values + v)` (the store's chunk files).

    It pickles as the template and two counts, so a worker reads the ciphertexts it needs itself,
    one group at a time, and neither the computation server nor the worker ever holds the upload.
    """

    template: str
    groups: int
    values: int

    def __len__(self) -> int:
        return self.groups

    @overload
    def __getitem__(self, g: int) -> Sequence[bytes]: ...

    @overload
    def __getitem__(self, g: slice) -> Sequence[Sequence[bytes]]: ...

    def __getitem__(self, g: int | slice) -> Any:
        if isinstance(g, slice):
            return [self[i] for i in range(*g.indices(self.groups))]
        if not 0 <= g < self.groups:
            raise IndexError(g)
        return _FileGroup(self.template, g * self.values, self.values)


@dataclass(frozen=True)
class _FileGroup(Sequence[bytes]):
    """One group of an `UploadFiles`: value v read from its file when asked for."""

    template: str
    first: int
    values: int

    def __len__(self) -> int:
        return self.values

    @overload
    def __getitem__(self, v: int) -> bytes: ...

    @overload
    def __getitem__(self, v: slice) -> Sequence[bytes]: ...

    def __getitem__(self, v: int | slice) -> Any:
        if isinstance(v, slice):
            return [self[i] for i in range(*v.indices(self.values))]
        if not 0 <= v < self.values:
            raise IndexError(v)
        path = Path(self.template.format(index=self.first + v))
        try:
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise InvalidInputError(f"chunk {self.first + v} of a committed join upload is missing from "
                                    f"{path.parent}: the data directory was altered") from exc


#: Most cells a worker accumulates at once: its running sums (3-part products, ~0.6 MB each at the
#: join's parameters) stay under ~40 MB whatever its block's size; a larger block takes several passes
#: over the groups, each reading only the ciphertexts of that pass's rows and columns.
CELLS_PER_PASS = 64


class _Block:
    """Bins [lo, lo + len(cells)) of the flattened table and their cell totals (ciphertexts).

    Built pass by pass (at most `CELLS_PER_PASS` cells each) and group by group within a pass:
    a worker holds one group's ciphertexts of the pass's rows and columns (read from `a` and `b`
    as it reaches them: files for the services' `UploadFiles`) plus one running sum per cell of
    the pass, so its memory does not grow with the record count (the number of groups). Each cell
    sums its groups in order, so the totals are those of a cell-by-cell loop.
    """

    def __init__(self, public: bytes, a: Sequence[Sequence[bytes]], b: Sequence[Sequence[bytes]],
                 cells: Sequence[int], lo: int, cells_per_pass: int = CELLS_PER_PASS) -> None:
        self.scheme = JoinScheme.from_public(public)
        self.lo, self.hi = lo, lo + len(cells)
        d_b = len(b[0])
        self.totals: list[Any] = []
        passes = [cells[k:k + cells_per_pass] for k in range(0, len(cells), max(1, cells_per_pass))]
        for n, part in enumerate(passes):
            rows = sorted({int(c) // d_b for c in part})
            cols = sorted({int(c) % d_b for c in part})
            acc: list[Any] = [None] * len(part)
            for g_a, g_b in zip(a, b):
                ga = {i: self.scheme.deserialize(g_a[i]) for i in rows}
                gb = {j: self.scheme.deserialize(g_b[j]) for j in cols}
                for k, cell in enumerate(part):
                    i, j = divmod(int(cell), d_b)
                    acc[k] = self.scheme.multiply_accumulate(acc[k], ga[i], gb[j])
                del ga, gb
                if n == len(passes) - 1:  # in-memory uploads: this group's bytes are not needed again
                    for g in (g_a, g_b):
                        if isinstance(g, list):
                            g[:] = [b""] * len(g)
            self.totals.extend(self.scheme.total(t) for t in acc)
            del acc

    @staticmethod
    def peak_rss() -> float:
        """This worker's peak resident set in MB (benchmarks read it from the server's log)."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    @staticmethod
    def usage() -> tuple[float, float]:
        """(peak resident set in MB, CPU seconds) of this worker process so far."""
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_maxrss / 1024, r.ru_utime + r.ru_stime

    def partial(self, terms: Terms) -> Any | None:
        """sum of coef * totals over the part of each range inside this block (None if none is)."""
        parts = [(c, self.totals[k - self.lo]) for c, lo, hi in terms
                 for k in range(max(lo, self.lo), min(hi, self.hi))]
        return self.scheme.signed_sum(parts) if parts else None

    def run(self, jobs: Sequence[_Job]) -> list[bytes]:
        out = []
        for terms, draw in jobs:  # draw: (discrete Laplace draw, pads), fixed by the evaluator
            value = self.partial(terms)
            if value is None:
                out.append(b"")
            elif draw is None:
                out.append(self.scheme.serialize(value))
            else:
                out.append(_noised(self.scheme, value, *draw))
        return out


class JoinEvaluator:
    """The cell totals of one join release, held for all of its measurements (use as a context manager).

    `a` and `b` are the owners' serialized uploads (groups x values; `UploadFiles` for uploads
    in files, which each worker then reads itself), `bins[k]` the
    row-major cell of bin k (he_partition.join.release.bin_cells), `rng` the source of the
    discrete Laplace draws, `executor` where the blocks run (None: in this process), `pads`
    the source of the pads (None: a `CipherRandom`, AES-CTR under a fresh OS key),
    `cells_per_pass` the most cells a worker accumulates at once (its memory; not the values).
    `measure(m)` returns the ciphertexts for the key holder.
    """

    def __init__(self, public: bytes, a: Sequence[Sequence[bytes]], b: Sequence[Sequence[bytes]],
                 bins: npt.ArrayLike, rng: RandomSource, *, executor: ChunkExecutor | None = None,
                 pads: RandomSource | None = None, cells_per_pass: int = CELLS_PER_PASS) -> None:
        if len(a) != len(b) or not a or any(len(g) != len(a[0]) for g in a) or any(len(g) != len(b[0]) for g in b):
            raise InvalidInputError("the two owners' uploads must have equal group counts and one ciphertext per "
                                    "value")
        self.n = len(a[0]) * len(b[0])
        self._bins = [int(c) for c in np.asarray(bins, dtype=np.int64)]
        if sorted(self._bins) != list(range(self.n)):
            raise InvalidInputError(f"bins must order the {self.n} cells of the table")
        self._public, self._a, self._b, self.rng = public, a, b, rng
        self._pads = pads or CipherRandom()
        self._executor = executor or InProcessExecutor()
        self._owns_executor = executor is None
        self.scheme = JoinScheme.from_public(public)
        bounds = np.linspace(0, self.n, self._executor.workers + 1).round().astype(int)
        self._bounds = [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]
        self._key = ""
        if cells_per_pass < 1:
            raise InvalidInputError(f"cells_per_pass must be >= 1, got {cells_per_pass}")
        self._cells_per_pass = cells_per_pass

    def _planes_for(self, cells: Sequence[int]) -> tuple[Sequence[Sequence[bytes]], Sequence[Sequence[bytes]]]:
        """The uploads a block needs: `UploadFiles` as they are (the worker reads its rows and columns from
        them, a group at a time); in-memory uploads as the ciphertexts of its cells' rows (A) and columns
        (B), b"" elsewhere (library path, tests: there the worker does receive them whole)."""
        d_b = len(self._b[0])
        rows, cols = {c // d_b for c in cells}, {c % d_b for c in cells}

        def plane(upload: Sequence[Sequence[bytes]], keep: set[int]) -> Sequence[Sequence[bytes]]:
            if isinstance(upload, UploadFiles):  # the worker reads the files itself, group by group
                return upload
            return [[bytes(g[i]) if i in keep else b"" for i in range(len(g))] for g in upload]

        return plane(self._a, rows), plane(self._b, cols)

    def _make(self, w: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """Worker w's block: its bins and only the ciphertexts they need (read again for a replacement worker)."""
        lo, hi = self._bounds[w]
        cells = self._bins[lo:hi]
        return _Block, (self._public, *self._planes_for(cells), cells, lo, self._cells_per_pass)

    def __enter__(self) -> "JoinEvaluator":
        self._key = f"join-{secrets.token_hex(8)}"
        try:
            self._executor.hold(self._key, self._make)
        except BaseException as exc:
            self.__exit__(type(exc), exc, None)
            raise
        rss = self._executor.call(self._key, "peak_rss", [()] * len(self._bounds))
        log.info("join totals: %d cells over %d workers, peak RSS per worker %s MB", self.n, len(self._bounds),
                 ", ".join(f"{r:.0f}" for r in rss))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._key and exc[0] is None:
            try:
                use = self._executor.call(self._key, "usage", [()] * len(self._bounds))
                log.info("join release measured: %d cells over %d workers, CPU per worker %s s, peak RSS per worker "
                         "%s MB", self.n, len(self._bounds), ", ".join(f"{c:.1f}" for _, c in use),
                         ", ".join(f"{r:.0f}" for r, _ in use))
            except Exception as exc_:  # noqa: BLE001 - a figure for the log: never fails a finished release
                log.info("join release measured; the workers' peak RSS is unknown (%s)", type(exc_).__name__)
        if self._key:
            self._executor.drop(self._key)
            self._key = ""
        if self._owns_executor:
            self._executor.close()

    def _blocks_of(self, terms: Terms) -> list[int]:
        return [w for w, (lo, hi) in enumerate(self._bounds) if any(a < hi and lo < b for _, a, b in terms)]

    def _fan_out(self, m: Measurement, noise: Sequence[tuple[int, IntArray] | None]
                 ) -> tuple[list[list[bytes]], list[list[tuple[int, int]]]]:
        """Every block's answers for `m`'s values (a value in one block gets its `noise`, if any; a value across
        blocks comes back as un-noised partial sums), and where each value's parts are. The caller ran `_check`."""
        jobs: list[list[_Job]] = [[] for _ in self._bounds]
        where: list[list[tuple[int, int]]] = []  # per value: (block, index in its job list)
        for terms, extra in zip(measurement_terms(m), noise):
            blocks = self._blocks_of(terms)
            where.append([(w, len(jobs[w])) for w in blocks])
            for w in blocks:
                jobs[w].append((terms, extra if len(blocks) == 1 else None))
        return self._executor.call(self._key, "run", [(j,) for j in jobs]), where

    def _check(self, m: Measurement) -> None:
        if m.domain_size != self.n:
            raise InvalidInputError(f"a {m.domain_size}-bin measurement of a {self.n}-cell table")
        if not self._key:
            raise InvalidInputError("enter the evaluator (with JoinEvaluator(...) as ev) before measuring")

    def _summed(self, results: list[list[bytes]], spots: list[tuple[int, int]]) -> Any:
        return self.scheme.signed_sum([(1, self.scheme.deserialize(results[w][k])) for w, k in spots])

    def measure(self, m: Measurement) -> list[bytes]:
        """Serialized ciphertexts, one per value `m` measures: value + this server's draw in slot 0, pads, flood.

        Privacy: as he_partition.join.release.noised_values (one discrete Laplace draw of
        scale m.sensitivity / m.epsilon per value from `rng`: only this server knows it;
        m.epsilon-DP, sensitivity m.sensitivity, neighbouring relation add/remove of one
        shared customer). Draws and pads (uniform mod t, from `pads`: by default a `CipherRandom`,
        AES-CTR under a fresh OS key) are fixed here before
        the workers get them; the workers only flood.
        """
        self._check(m)  # before any draw: a refused call consumes nothing of `rng`
        draws = [int(d) for d in discrete_laplace(m.scale, m.count, self.rng)]
        pads = [self._pads.integers(self.scheme.plain_modulus, self.scheme.slots - 1) for _ in draws]
        results, where = self._fan_out(m, list(zip(draws, pads)))
        out = []
        for spots, draw, pad in zip(where, draws, pads):
            if len(spots) == 1:
                w, k = spots[0]
                out.append(results[w][k])
            else:
                out.append(_noised(self.scheme, self._summed(results, spots), draw, pad))
        return out

    def measure_for_holders(self, m: Measurement) -> list[bytes]:
        """Serialized ciphertexts, one per value `m` measures, for key-share holders to decrypt: value + this
        server's draw in slot 0 as a plaintext (c0 only, so c1 stays the one every holder computes), no pads and
        no flood (each holder pads and smudges its share: he_partition.join.holders).

        Privacy: one discrete Laplace draw of scale m.sensitivity / m.epsilon per value from `rng` (only this
        server knows it; neighbouring relation add/remove of one shared customer); spends nothing here (each
        holder charges m.epsilon)."""
        values = self.values(m)  # checks before any draw
        draws = [int(d) for d in discrete_laplace(m.scale, m.count, self.rng)]
        # as holders.noised_for_holders: the draw in slot 0 as a plaintext (c0 only)
        return [self.scheme.serialize(self.scheme.plus_plain(self.scheme.deserialize(v), [d]))
                for v, d in zip(values, draws)]

    def values(self, m: Measurement) -> list[bytes]:
        """Serialized ciphertexts of the values `m` measures, un-noised: a key-share holder's own values
        (he_partition.join.holders), which never leave it. Draws nothing."""
        self._check(m)
        results, where = self._fan_out(m, [None] * m.count)
        return [results[spots[0][0]][spots[0][1]] if len(spots) == 1
                else self.scheme.serialize(self._summed(results, spots)) for spots in where]
