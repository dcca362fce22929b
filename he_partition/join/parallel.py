"""The computation server's join evaluation spread over worker processes (one per core).

`JoinEvaluator` keeps the cell totals for a whole release: each worker owns a contiguous
block of bins of the flattened table, computes their totals once (products, rotation-sum:
the expensive part) and keeps them; for each measurement of the release's strategy it
computes the values whose bin ranges lie in its block, adds their noise, pads and flood,
and returns the serialized ciphertexts. A value spanning blocks (a partition across a block
boundary, a Haar node above the blocks) comes back as un-noised partial sums, which the
evaluator adds and noises itself; partials never leave this server.

The discrete Laplace draws come from the server's own random source in the calling process
(so seeded tests stay reproducible); pads and floods from the OS CSPRNG where the ciphertext
is finished. SEAL's bindings hold the GIL, so threads would not help; workers are spawned
processes (never forked: the caller may be a gRPC server with live threads). With one
worker everything runs in the calling process.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import resource
from typing import Any, Sequence

import numpy as np
import numpy.typing as npt

from ..core.errors import InvalidInputError
from ..he.join_scheme import JoinScheme
from .release import Terms, measurement_terms, noised_value
from ..core.measurements import Measurement
from ..core.noise import RandomSource, discrete_laplace

__all__ = ["JoinEvaluator"]

log = logging.getLogger("dpagg.join")

#: A job for a block: (value's terms, its draw or None for an un-noised partial sum).
_Job = tuple[Terms, int | None]


class _Block:
    """Bins [lo, lo + len(cells)) of the flattened table and their cell totals (ciphertexts)."""

    def __init__(self, public: bytes, a: Sequence[Sequence[bytes]], b: Sequence[Sequence[bytes]],
                 cells: Sequence[int], lo: int) -> None:
        self.scheme = JoinScheme.from_public(public)
        self.lo, self.hi = lo, lo + len(cells)
        d_b = len(b[0])
        rows = {c // d_b for c in cells}
        cols = {c % d_b for c in cells}
        pa = [{i: self.scheme.deserialize(g[i]) for i in rows} for g in a]
        pb = [{j: self.scheme.deserialize(g[j]) for j in cols} for g in b]
        self.totals = []
        for cell in cells:
            i, j = divmod(int(cell), d_b)
            acc = None
            for ga, gb in zip(pa, pb):
                acc = self.scheme.multiply_accumulate(acc, ga[i], gb[j])
            self.totals.append(self.scheme.total(acc))

    def partial(self, terms: Terms) -> Any | None:
        """sum of coef * totals over the part of each range inside this block (None if none is)."""
        parts = [(c, self.totals[k - self.lo]) for c, lo, hi in terms
                 for k in range(max(lo, self.lo), min(hi, self.hi))]
        return self.scheme.signed_sum(parts) if parts else None

    def run(self, jobs: Sequence[_Job]) -> list[bytes]:
        out = []
        for terms, draw in jobs:
            value = self.partial(terms)
            if value is None:
                out.append(b"")
            elif draw is None:
                out.append(self.scheme.serialize(value))
            else:
                out.append(self.scheme.serialize(noised_value(self.scheme, value, draw)))
        return out


def _serve(conn: Any, public: bytes, a: list[list[bytes]], b: list[list[bytes]], cells: list[int], lo: int) -> None:
    """A worker process: build the block, then answer job lists until told to stop (None)."""
    try:
        block = _Block(public, a, b, cells, lo)
        del a, b
        conn.send(("ok", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
        while (jobs := conn.recv()) is not None:
            conn.send(("ok", block.run(jobs)))
    except EOFError:
        return
    except Exception as exc:  # reported to the evaluator, which raises it there
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


class JoinEvaluator:
    """The cell totals of one join release, held for all of its measurements (use as a context manager).

    `a` and `b` are the owners' serialized uploads (groups x values), `bins[k]` the
    row-major cell of bin k (he_partition.join.release.bin_cells), `rng` the source of the
    discrete Laplace draws. `measure(m)` returns the ciphertexts for the key holder.
    """

    def __init__(self, public: bytes, a: Sequence[Sequence[bytes]], b: Sequence[Sequence[bytes]],
                 bins: npt.ArrayLike, rng: RandomSource, *, workers: int | None = None) -> None:
        if len(a) != len(b) or not a or any(len(g) != len(a[0]) for g in a) or any(len(g) != len(b[0]) for g in b):
            raise InvalidInputError("the two owners' uploads must have equal group counts and one ciphertext per "
                                    "value")
        self.n = len(a[0]) * len(b[0])
        self._bins = [int(c) for c in np.asarray(bins, dtype=np.int64)]
        if sorted(self._bins) != list(range(self.n)):
            raise InvalidInputError(f"bins must order the {self.n} cells of the table")
        self._public, self._a, self._b, self.rng = public, a, b, rng
        self._workers = max(1, min(workers or os.cpu_count() or 1, self.n))
        self.scheme = JoinScheme.from_public(public)
        bounds = np.linspace(0, self.n, self._workers + 1).round().astype(int)
        self._bounds = [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]
        self._local: _Block | None = None
        self._conns: list[Any] = []
        self._procs: list[Any] = []

    def _planes_for(self, cells: Sequence[int]) -> tuple[list[list[bytes]], list[list[bytes]]]:
        """The uploads a block needs: the ciphertexts of its cells' rows (A) and columns (B); b"" elsewhere.

        A worker of a row-major half of the table then holds half of A's upload, not all of it.
        """
        d_b = len(self._b[0])
        rows, cols = {c // d_b for c in cells}, {c % d_b for c in cells}
        a = [[bytes(g[i]) if i in rows else b"" for i in range(len(g))] for g in self._a]
        b = [[bytes(g[j]) if j in cols else b"" for j in range(len(g))] for g in self._b]
        return a, b

    def __enter__(self) -> "JoinEvaluator":
        if self._workers == 1:
            self._local = _Block(self._public, *self._planes_for(self._bins), self._bins, 0)
            return self
        ctx = mp.get_context("spawn")
        try:
            for lo, hi in self._bounds:
                parent, child = ctx.Pipe()
                a, b = self._planes_for(self._bins[lo:hi])
                p = ctx.Process(target=_serve, args=(child, self._public, a, b, self._bins[lo:hi], lo), daemon=True)
                p.start()
                del a, b  # the child has its copy once started (spawn pickles the arguments)
                child.close()
                self._conns.append(parent)
                self._procs.append(p)
            rss = [self._receive(c) for c in self._conns]
        except BaseException:
            self.__exit__(None, None, None)
            raise
        log.info("join totals: %d cells over %d worker processes, peak RSS per worker %s MB", self.n,
                 len(self._procs), ", ".join(f"{r:.0f}" for r in rss))
        return self

    def __exit__(self, *exc: Any) -> None:
        for c in self._conns:
            try:
                c.send(None)
            except (OSError, ValueError):
                pass
        for p in self._procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
                p.join()
        for c in self._conns:
            c.close()
        self._conns, self._procs, self._local = [], [], None

    @staticmethod
    def _receive(conn: Any) -> Any:
        try:
            status, payload = conn.recv()
        except EOFError:
            raise RuntimeError("a join worker process died (out of memory?); the release was not computed") from None
        if status != "ok":
            raise RuntimeError(f"a join worker failed: {payload}")
        return payload

    def _blocks_of(self, terms: Terms) -> list[int]:
        return [w for w, (lo, hi) in enumerate(self._bounds) if any(a < hi and lo < b for _, a, b in terms)]

    def measure(self, m: Measurement) -> list[bytes]:
        """Serialized ciphertexts, one per value `m` measures: value + this server's draw in slot 0, pads, flood.

        Privacy: as he_partition.join.release.noised_values (one discrete Laplace draw of
        scale m.sensitivity / m.epsilon per value from `rng`: only this server knows it;
        m.epsilon-DP, sensitivity m.sensitivity, neighbouring relation add/remove of one
        shared customer).
        """
        if m.domain_size != self.n:
            raise InvalidInputError(f"a {m.domain_size}-bin measurement of a {self.n}-cell table")
        all_terms = measurement_terms(m)
        draws = [int(d) for d in discrete_laplace(m.scale, m.count, self.rng)]
        if self._local is not None:
            return self._local.run(list(zip(all_terms, draws)))
        jobs: list[list[_Job]] = [[] for _ in self._bounds]
        where: list[list[tuple[int, int]]] = []  # per value: (block, index in its job list)
        for terms, draw in zip(all_terms, draws):
            blocks = self._blocks_of(terms)
            single = len(blocks) == 1
            where.append([(w, len(jobs[w])) for w in blocks])
            for w in blocks:
                jobs[w].append((terms, draw if single else None))
        for c, j in zip(self._conns, jobs):
            c.send(j)
        results = [self._receive(c) for c in self._conns]
        out = []
        for spots, draw in zip(where, draws):
            if len(spots) == 1:
                w, k = spots[0]
                out.append(results[w][k])
                continue
            parts = [(1, self.scheme.deserialize(results[w][k])) for w, k in spots]
            out.append(self.scheme.serialize(noised_value(self.scheme, self.scheme.signed_sum(parts), draw)))
        return out
