"""The computation server's join evaluation on the project's chunk executor (he_partition.execution).

`JoinEvaluator` keeps the cell totals for a whole release: each of the executor's workers
holds a contiguous block of bins of the flattened table, computes their totals once
(products, rotation-sum: the expensive part) and keeps them; for each measurement of the
release's strategy it computes the values whose bin ranges lie in its block, adds the noise
and pads it is given, floods, and returns the serialized ciphertexts. A value spanning
blocks (a partition across a block boundary, a Haar node above the blocks) comes back as
un-noised partial sums, which the evaluator adds and noises itself; partials never leave
this server.

Every worker receives only its block's ciphertexts (bytes: SEAL objects do not pickle).
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
from typing import Any, Callable, Sequence

import numpy as np
import numpy.typing as npt

from ..core.errors import InvalidInputError
from ..execution.base import ChunkExecutor
from ..execution.inprocess import InProcessExecutor
from ..he.join_scheme import JoinScheme
from .release import Terms, measurement_terms
from ..core.measurements import Measurement
from ..core.noise import CipherRandom, RandomSource, discrete_laplace

__all__ = ["JoinEvaluator"]

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


class _Block:
    """Bins [lo, lo + len(cells)) of the flattened table and their cell totals (ciphertexts)."""

    def __init__(self, public: bytes, a: Sequence[Sequence[bytes]], b: Sequence[Sequence[bytes]],
                 cells: Sequence[int], lo: int) -> None:
        self.scheme = JoinScheme.from_public(public)
        self.lo, self.hi = lo, lo + len(cells)
        d_b = len(b[0])
        rows = {c // d_b for c in cells}
        cols = {c % d_b for c in cells}
        # Group by group, so a worker holds one group's deserialized ciphertexts (plus one running sum per
        # cell) rather than all of them: at 1M x 1M customers that was 4.5 GB per worker. Each cell still
        # sums its groups in order, so the totals are those of a cell-by-cell loop.
        acc: list[Any] = [None] * len(cells)
        for g_a, g_b in zip(a, b):
            ga = {i: self.scheme.deserialize(g_a[i]) for i in rows}
            gb = {j: self.scheme.deserialize(g_b[j]) for j in cols}
            for k, cell in enumerate(cells):
                i, j = divmod(int(cell), d_b)
                acc[k] = self.scheme.multiply_accumulate(acc[k], ga[i], gb[j])
            for g in (g_a, g_b):  # the upload bytes of this group are not needed again (the caller's copy)
                if isinstance(g, list):
                    g[:] = [b""] * len(g)
        self.totals = [self.scheme.total(t) for t in acc]

    @staticmethod
    def peak_rss() -> float:
        """This worker's peak resident set in MB (benchmarks read it from the server's log)."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

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

    `a` and `b` are the owners' serialized uploads (groups x values), `bins[k]` the
    row-major cell of bin k (he_partition.join.release.bin_cells), `rng` the source of the
    discrete Laplace draws, `executor` where the blocks run (None: in this process), `pads`
    the source of the pads (None: a `CipherRandom`, AES-CTR under a fresh OS key).
    `measure(m)` returns the ciphertexts for the key holder.
    """

    def __init__(self, public: bytes, a: Sequence[Sequence[bytes]], b: Sequence[Sequence[bytes]],
                 bins: npt.ArrayLike, rng: RandomSource, *, executor: ChunkExecutor | None = None,
                 pads: RandomSource | None = None) -> None:
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

    def _planes_for(self, cells: Sequence[int]) -> tuple[list[list[bytes]], list[list[bytes]]]:
        """The uploads a block needs: the ciphertexts of its cells' rows (A) and columns (B); b"" elsewhere.

        A worker of a row-major half of the table then holds half of A's upload, not all of it.
        """
        d_b = len(self._b[0])
        rows, cols = {c // d_b for c in cells}, {c % d_b for c in cells}
        a = [[bytes(g[i]) if i in rows else b"" for i in range(len(g))] for g in self._a]
        b = [[bytes(g[j]) if j in cols else b"" for j in range(len(g))] for g in self._b]
        return a, b

    def _make(self, w: int) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """Worker w's block: its bins and only the ciphertexts they need (read again for a replacement worker)."""
        lo, hi = self._bounds[w]
        cells = self._bins[lo:hi]
        return _Block, (self._public, *self._planes_for(cells), cells, lo)

    def __enter__(self) -> "JoinEvaluator":
        self._key = f"join-{secrets.token_hex(8)}"
        try:
            self._executor.hold(self._key, self._make)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        rss = self._executor.call(self._key, "peak_rss", [()] * len(self._bounds))
        log.info("join totals: %d cells over %d workers, peak RSS per worker %s MB", self.n, len(self._bounds),
                 ", ".join(f"{r:.0f}" for r in rss))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._key:
            self._executor.drop(self._key)
            self._key = ""
        if self._owns_executor:
            self._executor.close()

    def _blocks_of(self, terms: Terms) -> list[int]:
        return [w for w, (lo, hi) in enumerate(self._bounds) if any(a < hi and lo < b for _, a, b in terms)]

    def measure(self, m: Measurement) -> list[bytes]:
        """Serialized ciphertexts, one per value `m` measures: value + this server's draw in slot 0, pads, flood.

        Privacy: as he_partition.join.release.noised_values (one discrete Laplace draw of
        scale m.sensitivity / m.epsilon per value from `rng`: only this server knows it;
        m.epsilon-DP, sensitivity m.sensitivity, neighbouring relation add/remove of one
        shared customer). Draws and pads (uniform mod t, from `pads`: by default a `CipherRandom`,
        AES-CTR under a fresh OS key) are fixed here before
        the workers get them; the workers only flood.
        """
        if m.domain_size != self.n:
            raise InvalidInputError(f"a {m.domain_size}-bin measurement of a {self.n}-cell table")
        if not self._key:
            raise InvalidInputError("enter the evaluator (with JoinEvaluator(...) as ev) before measuring")
        all_terms = measurement_terms(m)
        draws = [int(d) for d in discrete_laplace(m.scale, m.count, self.rng)]
        pads = [self._pads.integers(self.scheme.plain_modulus, self.scheme.slots - 1) for _ in draws]
        jobs: list[list[_Job]] = [[] for _ in self._bounds]
        where: list[list[tuple[int, int]]] = []  # per value: (block, index in its job list)
        for terms, draw, pad in zip(all_terms, draws, pads):
            blocks = self._blocks_of(terms)
            single = len(blocks) == 1
            where.append([(w, len(jobs[w])) for w in blocks])
            for w in blocks:
                jobs[w].append((terms, (draw, pad) if single else None))
        results = self._executor.call(self._key, "run", [(j,) for j in jobs])
        out = []
        for spots, draw, pad in zip(where, draws, pads):
            if len(spots) == 1:
                w, k = spots[0]
                out.append(results[w][k])
                continue
            parts = [(1, self.scheme.deserialize(results[w][k])) for w, k in spots]
            out.append(_noised(self.scheme, self.scheme.signed_sum(parts), draw, pad))
        return out
