"""The release of a join study's table: a DP strategy measured on the encrypted cell totals.

The joint table (rows x cols) is flattened into one domain of rows * cols bins: row-major,
or along the Hilbert curve for a square table with a power-of-two side (`bin_cells`), so a
strategy's contiguous partitions are compact 2-D regions, as for ordinary 2-D studies
(he_partition.strategies.hilbert). Then the table goes through a strategy like any histogram: "cells"
(the identity: one value per cell) or gap, hier, dawa, privelet, auto (`join_strategy`).

Every value a strategy measures is linear in the bins with coefficients +-1 over contiguous
bin ranges (`measurement_terms`: adjacent differences, partition sums, Haar details), so
the computation server computes it from the cell totals with ciphertext additions only
(`JoinScheme.signed_sum`), adds its noise (`noised_values`), and the decryption server
decrypts slot 0 and adds its own (`decrypt_values`). The privacy of each measurement is the
strategy's, with contribution bound 1: a shared customer added or removed changes one cell
by 1.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Generator, Sequence

import numpy as np
import numpy.typing as npt

from ..core.errors import InvalidInputError
from ..strategies.hilbert import grid_order, hilbert_order
from .protocol import JoinTerms
from ..he.join_scheme import JoinScheme
from ..core.measurements import HaarCoefficients, Measurement, PartitionSums, PrefixDifferences
from ..core.noise import CipherRandom, RandomSource, discrete_laplace
from ..protocol import make_strategy, run_strategy
from ..core.summary import Summary

__all__ = ["Terms", "bin_cells", "measurement_terms", "apply_terms", "join_strategy", "cells_strategy",
           "noised_values", "noised_value", "decrypt_values", "release_table", "summary_params", "cell_table"]

IntArray = npt.NDArray[np.int64]
#: One measured value: ((coef, lo, hi), ...) = sum of coef * (bins lo..hi-1), coef +-1.
Terms = tuple[tuple[int, int, int], ...]


def bin_cells(terms: JoinTerms) -> IntArray:
    """perm with perm[k] = row-major cell (row * cols + col) of bin k of the flattened table."""
    if terms.order == "hilbert":
        return hilbert_order(grid_order(terms.rows))
    return np.arange(terms.rows * terms.cols, dtype=np.int64)


def measurement_terms(m: Measurement) -> list[Terms]:
    """Each value `m` measures, as +-1 sums of contiguous bin ranges (the decode map of its prefix layout)."""
    n = m.domain_size
    if isinstance(m, PrefixDifferences):  # d[i] = x[i] - x[i-1], x[-1] = 0
        return [((1, 0, 1),)] + [((1, i, i + 1), (-1, i - 1, i)) for i in range(1, n)]
    if isinstance(m, PartitionSums):
        ends = [int(e) + 1 for e in m.ends]
        return [((1, int(s), e),) for s, e in zip(m.starts, ends)]
    if isinstance(m, HaarCoefficients):  # value mid-1: S[a, mid) - S[mid, b); value n-1: the total
        out: list[Terms] = []
        for mid in range(1, n):
            half = mid & -mid
            a, b = mid - half, min(mid + half, n)
            out.append(((1, a, mid), (-1, mid, b)))
        out.append(((1, 0, n),))
        return out
    raise InvalidInputError(f"a join release cannot measure {m.kind!r}")


def apply_terms(terms: Sequence[Terms], x: npt.ArrayLike) -> IntArray:
    """The values `terms` describe, in plaintext (the reference the encrypted path must match)."""
    prefix = np.concatenate([[0], np.cumsum(np.asarray(x, dtype=np.int64))])
    return np.array([sum(c * (prefix[hi] - prefix[lo]) for c, lo, hi in t) for t in terms], dtype=np.int64)


def cells_strategy(domain_size: int, epsilon: float, *,
                   noise_parties: int) -> Generator[Measurement, IntArray, Summary]:
    """The identity release: every bin measured once, as a partition of its own.

    Privacy: one measurement, PartitionSums over singleton partitions at `epsilon` (L1
    sensitivity 1 under add/remove of one shared customer, who is in one cell; parallel
    composition over the cells). Each noise party's draw of scale 1/epsilon alone gives it.
    """
    m = PartitionSums(domain_size, epsilon, 1, starts=tuple(range(domain_size)))
    values = yield m
    return Summary(domain_size=domain_size, epsilon=epsilon, strategy="cells", noise_parties=noise_parties,
                   contribution_bound=1, starts=m.starts, sums=tuple(int(v) for v in values),
                   sum_variance=(noise_parties * m.noise_variance,) * domain_size,
                   epsilon_spent=((m.kind, epsilon),), params={})


def join_strategy(terms: JoinTerms, epsilon: float, *, noise_parties: int) -> Generator[Measurement, IntArray, Summary]:
    """The strategy `terms.release` over the flattened table at `epsilon` (its privacy statement is the
    strategy's, with contribution bound 1: one record per identifier per owner)."""
    n = terms.rows * terms.cols
    if terms.release == "cells":
        return cells_strategy(n, epsilon, noise_parties=noise_parties)
    return make_strategy(terms.release, n, epsilon, noise_parties=noise_parties, contribution_bound=1)


def noised_values(scheme: JoinScheme, values: Sequence[Any], m: Measurement, rng: RandomSource) -> list[Any]:
    """The computation server's half: each measured value + its discrete Laplace draw, pads, flooding.

    Privacy: one draw of scale m.sensitivity / m.epsilon per value from `rng` (the
    computation server's source; only it knows the draws): m.epsilon-DP for the measured
    values, neighbouring relation add/remove of one shared customer (m.sensitivity is the strategy's L1
    sensitivity with contribution bound 1). Every other slot gets a pad uniform mod t and
    every ciphertext the flood, the pads from a `CipherRandom` (AES-CTR under a fresh OS
    key), the flood from the OS CSPRNG: the key holder learns slot 0 only.
    """
    if len(values) != m.count:
        raise InvalidInputError(f"{m.kind} measures {m.count} values, {len(values)} ciphertexts given")
    draws = discrete_laplace(m.scale, m.count, rng)
    pads = CipherRandom()
    return [noised_value(scheme, v, int(d), pads) for v, d in zip(values, draws)]


def noised_value(scheme: JoinScheme, value: Any, draw: int, pads: RandomSource | None = None) -> Any:
    """One value's ciphertext for the key holder: `draw` in slot 0, CSPRNG pads elsewhere, flooded.

    The pads come from `pads` (None: a fresh `CipherRandom`, AES-CTR under a fresh OS key).
    """
    source = pads if pads is not None else CipherRandom()
    return scheme.noised(value, [draw], 1, lambda k: source.integers(scheme.plain_modulus, k))


def decrypt_values(scheme: JoinScheme, cts: Sequence[Any], m: Measurement, rng: RandomSource, *,
                   noise_parties: int = 2) -> IntArray:
    """The decryption server's half: slot 0 of each ciphertext, plus its own draw when noise_parties == 2.

    Privacy: the decrypted values already carry the computation server's draw of scale
    m.sensitivity / m.epsilon; this server adds an independent one of the same scale
    (only this server knows it), so the values are m.epsilon-DP against the computation
    server too (sensitivity m.sensitivity; neighbouring relation add/remove of one shared
    customer). The caller charges m.epsilon before calling.
    """
    if len(cts) != m.count:
        raise InvalidInputError(f"{m.kind} measures {m.count} values, {len(cts)} ciphertexts arrived")
    first = np.array([scheme.decrypt(c)[0] for c in cts], dtype=np.int64)
    if noise_parties == 2:
        first = first + discrete_laplace(m.scale, m.count, rng)
    return first


def release_table(measure: Callable[[Measurement], list[bytes]], key_holder: JoinScheme, terms: JoinTerms,
                  epsilon: float, rng: RandomSource, *, noise_parties: int = 2) -> tuple[Summary, int]:
    """A whole join release in one process (tests, benchmarks): (summary with its join params, bytes decrypted).

    `measure(m)` is the computation server's half (JoinEvaluator.measure); the key holder's
    half is `decrypt_values` with `rng`. Privacy: as `join_strategy` (the study's strategy
    at `epsilon`, contribution bound 1), each value noised by both halves.
    """
    sent = [0]

    def both(m: Measurement) -> IntArray:
        cts = measure(m)
        sent[0] += sum(len(c) for c in cts)
        return decrypt_values(key_holder, [key_holder.deserialize_released(c) for c in cts], m, rng,
                              noise_parties=noise_parties)

    summary = run_strategy(join_strategy(terms, epsilon, noise_parties=noise_parties), both)
    return replace(summary, params={**summary.params, **summary_params(terms)}), sent[0]


def summary_params(terms: JoinTerms) -> dict[str, Any]:
    """What a join release's summary states about its table (analysts read the shape, binnings and order)."""
    return {"join": {"shape": [terms.rows, terms.cols], "row_spec": terms.row_spec, "col_spec": terms.col_spec,
                     "padding_epsilon": terms.padding_epsilon, "padding_offset": terms.padding_offset,
                     "padding_delta": terms.delta, "capacity": terms.capacity,
                     "release": terms.release, "order": terms.order},
            "max_organizations": 1}


def cell_table(summary: Summary) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(estimate, standard error) per cell, rows x cols, of a join release's summary.

    A cell's estimate is its partition's noisy sum spread evenly over the partition
    (Summary.estimate); its standard error counts only the noise, not that spreading.
    """
    join = summary.params.get("join")
    if not isinstance(join, dict):
        raise InvalidInputError("this summary is not a join release (no 'join' in its params)")
    rows, cols = (int(v) for v in join["shape"])
    terms = JoinTerms(rows, cols, 8192, 1.0, 0, order=str(join.get("order", "row")))
    perm = bin_cells(terms)
    est = np.empty(rows * cols)
    se = np.empty(rows * cols)
    est[perm] = summary.estimate()
    se[perm] = [summary.range_count(k, k + 1).standard_error for k in range(rows * cols)]
    return est.reshape(rows, cols), se.reshape(rows, cols)

