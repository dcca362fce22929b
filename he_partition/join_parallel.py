"""The computation server's join evaluation spread over worker processes (one per core).

Every cell of the joint table is independent: its products, rotation-sum, noise, pads and
flood touch no other cell. `noised_table` draws every cell's noise and pads in the calling
process (from the server's own random source, so seeded tests stay reproducible), hands
each worker a share of the cells with the serialized uploads, and collects the serialized
cell ciphertexts in row-major order. The flood of each cell is drawn in the worker from
the OS CSPRNG (he_partition.join_he), as in the single-process path.

SEAL's bindings hold the GIL, so threads would not help; workers are spawned processes
(never forked: the caller may be a gRPC server with live threads).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import resource
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Sequence

import numpy as np
import numpy.typing as npt

from .errors import InvalidInputError
from .join import joint_totals, noised_cells
from .join_he import JoinScheme
from .noise import RandomSource, discrete_laplace, laplace_scale

__all__ = ["noised_table"]

log = logging.getLogger("dpagg.join")

_WORKER: dict[str, Any] = {}


def _init(public: bytes, a: list[list[bytes]], b: list[list[bytes]]) -> None:
    scheme = JoinScheme.from_public(public)
    _WORKER.update(scheme=scheme, a=[[scheme.deserialize(x) for x in g] for g in a],
                   b=[[scheme.deserialize(x) for x in g] for g in b])


def _cells(cells: list[int], draws: list[int], pads: npt.NDArray[np.int64]) -> tuple[list[bytes], float]:
    scheme: JoinScheme = _WORKER["scheme"]
    a, b = _WORKER["a"], _WORKER["b"]
    d_b = len(b[0])
    out = []
    for k, cell in enumerate(cells):
        i, j = divmod(cell, d_b)
        acc = None
        for ga, gb in zip(a, b):
            acc = scheme.multiply_accumulate(acc, ga[i], gb[j])
        total = scheme.total(acc)
        row = pads[k]
        out.append(scheme.serialize(scheme.noised(total, [draws[k]], 1, lambda n, row=row: row[:n])))
    return out, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def noised_table(public: bytes, a: Sequence[Sequence[bytes]], b: Sequence[Sequence[bytes]], epsilon: float,
                 rng: RandomSource, *, workers: int | None = None) -> list[bytes]:
    """Serialized noised cell ciphertexts (row-major) of the join of uploads `a` (groups x d_a) and `b`.

    Privacy: as `he_partition.join.noised_cells`: one discrete Laplace draw of scale
    1/epsilon per cell (sensitivity 1 under add/remove of one shared customer, who is in
    one cell), known only to this server; pads uniform mod t from `rng`; flooding from the
    OS CSPRNG. With one worker (or one core) it runs in this process.
    """
    if len(a) != len(b) or not a or any(len(g) != len(a[0]) for g in a) or any(len(g) != len(b[0]) for g in b):
        raise InvalidInputError("the two owners' uploads must have equal group counts and one ciphertext per value")
    d_a, d_b = len(a[0]), len(b[0])
    n = d_a * d_b
    n_workers = max(1, min(workers or os.cpu_count() or 1, n))
    if n_workers == 1:
        scheme = JoinScheme.from_public(public)
        planes = [[[scheme.deserialize(x) for x in g] for g in side] for side in (a, b)]
        return [scheme.serialize(c) for c in noised_cells(scheme, joint_totals(scheme, planes[0], planes[1]),
                                                          epsilon, rng)]
    probe = JoinScheme.from_public(public)
    draws = discrete_laplace(laplace_scale(1, epsilon), n, rng)
    pads = rng.integers(probe.plain_modulus, n * (probe.slots - 1)).reshape(n, probe.slots - 1)
    shares = [list(range(w, n, n_workers)) for w in range(n_workers)]
    args = ([list(map(bytes, g)) for g in a], [list(map(bytes, g)) for g in b])
    with ProcessPoolExecutor(n_workers, mp_context=mp.get_context("spawn"), initializer=_init,
                             initargs=(public, *args)) as pool:
        futures = [pool.submit(_cells, share, [int(draws[c]) for c in share], pads[share]) for share in shares]
        results = [f.result() for f in futures]
    log.info("join table: %d cells over %d worker processes, peak RSS per worker %s MB", n, n_workers,
             ", ".join(f"{rss:.0f}" for _, rss in results))
    out: list[bytes] = [b""] * n
    for share, (cts, _) in zip(shares, results):
        for c, ct in zip(share, cts):
            out[c] = ct
    return out
