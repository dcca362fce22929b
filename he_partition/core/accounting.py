"""Privacy accounting for directly answered range counts: charge the heaviest overlap (seed 004)."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from .errors import BudgetExhaustedError
from .validation import positive_finite

__all__ = [
    "USABLE_SHARE",
    "epsilon_left",
    "RangeQuery",
    "Clique",
    "ChargeEvent",
    "BudgetExceeded",
    "DirectQueryAccountant",
    "overlap_graph_max_clique",
    "charged_epsilon",
    "sequential_epsilon",
    "exact_decimal",
]

#: An epsilon left below this share of the study's total is float dust of the exact budget arithmetic (e.g.
#: 9e-17 after `--epsilon rest`): no release can use it, so every message prints it as 0.
USABLE_SHARE = 1e-9


def epsilon_left(value: float, total: float) -> str:
    """An epsilon that is left, as every command and refusal prints it: 0 when nothing usable is left."""
    return "0" if value <= total * USABLE_SHARE else f"{value:.12g}"

# Privacy arithmetic is done on exact rationals. A float epsilon is read as the decimal it
# prints as (Fraction(repr(x))), so three queries at 0.1 fit a budget of 0.3 exactly; the
# float a mechanism calibrates with differs from that decimal by less than one ulp, and
# mechanisms in this package round their epsilon *down* before sampling.


def exact_decimal(x: float) -> Fraction:
    """A float as the exact decimal it prints as (0.1 -> 1/10), for exact privacy arithmetic."""
    return Fraction(repr(float(x)))


def _as_int_tuple(name: str, values: Sequence[int]) -> tuple[int, ...]:
    try:
        items = tuple(values)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}") from None
    out: list[int] = []
    for v in items:
        if isinstance(v, bool):
            raise TypeError(f"{name} must contain ints, got bool {v!r}")
        try:
            out.append(operator.index(v))
        except TypeError:
            raise TypeError(f"{name} must contain ints, got {v!r}") from None
    return tuple(out)


@dataclass(frozen=True)
class RangeQuery:
    """A noisy count over the half-open box [lo, hi) (per dimension), answered at `epsilon`.

    The box covers the integer points x with lo[d] <= x[d] < hi[d] in every dimension d;
    boxes that only touch ([0, 5) and [5, 9)) share no point. Use `from_inclusive` for
    SQL-style predicates `a <= x <= b`.

    Raises:
        ValueError: lo and hi differ in length or are empty, some lo[d] >= hi[d], or
            epsilon is not > 0 and finite.
        TypeError: coordinates are not ints or epsilon is not a real number.
    """

    lo: tuple[int, ...]
    hi: tuple[int, ...]
    epsilon: float

    def __post_init__(self) -> None:
        lo = _as_int_tuple("lo", self.lo)
        hi = _as_int_tuple("hi", self.hi)
        if not lo:
            raise ValueError("lo must have at least one dimension, got ()")
        if len(lo) != len(hi):
            raise ValueError(f"lo and hi must have the same length, got {len(lo)} and {len(hi)}")
        for d, (a, b) in enumerate(zip(lo, hi)):
            if a >= b:
                raise ValueError(
                    f"each range must be non-empty (lo < hi), got lo[{d}]={a} >= hi[{d}]={b}"
                )
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)
        object.__setattr__(self, "epsilon", positive_finite("epsilon", self.epsilon))

    @classmethod
    def from_inclusive(
        cls, lo: Sequence[int], hi_inclusive: Sequence[int], epsilon: float
    ) -> RangeQuery:
        """Build the query for `lo[d] <= x[d] <= hi_inclusive[d]` (i.e. [lo, hi + 1))."""
        hi = _as_int_tuple("hi_inclusive", hi_inclusive)
        return cls(tuple(lo), tuple(h + 1 for h in hi), epsilon)

    @property
    def ndim(self) -> int:
        """Number of dimensions of the box."""
        return len(self.lo)

    def contains(self, point: Sequence[int]) -> bool:
        """True when the integer point lies in the half-open box."""
        return all(a <= p < b for a, p, b in zip(self.lo, point, self.hi))

    def overlaps(self, other: RangeQuery) -> bool:
        """True when the two boxes share at least one integer point."""
        return all(
            max(a, c) < min(b, d) for a, b, c, d in zip(self.lo, self.hi, other.lo, other.hi)
        )


@dataclass(frozen=True)
class Clique:
    """A set of queries whose boxes share a common point, with their exact epsilon sum.

    Attributes:
        indices: positions of the member queries in the input sequence, ascending.
        epsilon_exact: sum of the members' epsilons as an exact rational.
        witness: an integer point contained in every member's box (None for no queries).
    """

    indices: tuple[int, ...]
    epsilon_exact: Fraction
    witness: tuple[int, ...] | None

    @property
    def size(self) -> int:
        """Number of queries in the clique."""
        return len(self.indices)

    @property
    def epsilon(self) -> float:
        """The exact epsilon sum rounded to the nearest float."""
        return float(self.epsilon_exact)


def _validate_queries(queries: Sequence[RangeQuery]) -> tuple[RangeQuery, ...]:
    qs = tuple(queries)
    for i, q in enumerate(qs):
        if not isinstance(q, RangeQuery):
            raise TypeError(f"queries[{i}] must be a RangeQuery, got {type(q).__name__}")
    if qs:
        k = qs[0].ndim
        for i, q in enumerate(qs):
            if q.ndim != k:
                raise ValueError(
                    f"all queries must have the same number of dimensions; queries[0] has {k}, "
                    f"queries[{i}] has {q.ndim}"
                )
    return qs


def _integer_weights(fracs: Sequence[Fraction]) -> tuple[np.ndarray, int]:
    """Scale exact rationals to integers over a common denominator (object dtype if huge)."""
    den = 1
    for f in fracs:
        den = den * f.denominator // math.gcd(den, f.denominator)
    ints = [f.numerator * (den // f.denominator) for f in fracs]
    # int64 cumulative sums are exact while the total stays below 2**62.
    if sum(ints) < (1 << 62):
        return np.asarray(ints, dtype=np.int64), den
    return np.asarray(ints, dtype=object), den


def _best_1d(
    lo: np.ndarray, hi: np.ndarray, w: np.ndarray
) -> tuple[int | None, object]:
    """Max weighted depth of half-open intervals; returns (a point attaining it, depth)."""
    n = lo.shape[0]
    if n == 0:
        return None, 0
    coords = np.concatenate([hi, lo])
    # Removals (kind 0) sort before additions (kind 1) at the same coordinate, so touching
    # half-open intervals [a, b) and [b, c) never count as overlapping.
    kinds = np.concatenate([np.zeros(n, dtype=np.int8), np.ones(n, dtype=np.int8)])
    deltas = np.concatenate([-w, w])
    order = np.lexsort((kinds, coords))
    depth = np.cumsum(deltas[order])
    best = int(np.argmax(depth))
    return int(coords[order][best]), depth[best]


def _best_point(
    lo: np.ndarray, hi: np.ndarray, w: np.ndarray, dim: int
) -> tuple[tuple[int, ...] | None, object]:
    """Exact max over integer points of the summed weight of boxes containing the point.

    Sweeps dimension `dim` over the distinct lower ends (the depth can only rise there)
    and recurses on the boxes active at each; the last dimension is a vectorised 1-D
    sweep. Cost O(q^(k-1) q log q) for q boxes in k dimensions; exact, no sampling.
    """
    k = lo.shape[1]
    if dim == k - 1:
        x, depth = _best_1d(lo[:, dim], hi[:, dim], w)
        return (None if x is None else (x,)), depth
    best_point: tuple[int, ...] | None = None
    best_depth: object = 0
    for c in np.unique(lo[:, dim]):
        active = (lo[:, dim] <= c) & (hi[:, dim] > c)
        if not active.any():
            continue
        rest, depth = _best_point(lo[active], hi[active], w[active], dim + 1)
        if rest is not None and (best_point is None or depth > best_depth):  # type: ignore[operator]
            best_point, best_depth = (int(c),) + rest, depth
    return best_point, best_depth


def overlap_graph_max_clique(queries: Sequence[RangeQuery], *, weighted: bool = True) -> Clique:
    """Maximum (weighted) clique of the overlap graph of the queries' boxes.

    Nodes are queries; an edge joins two queries whose boxes share an integer point. For
    axis-parallel boxes the graph is an intersection graph with the Helly property
    (pairwise-intersecting boxes have a common point), so a clique is exactly a set of
    boxes stabbed by one point and the maximum clique is found by maximising, over points,
    the number (`weighted=False`) or the epsilon sum (`weighted=True`) of boxes containing
    the point. Seed 004 (slides 59-61) states the same bound via the max clique (NP-hard
    for general graphs, polynomial here).

    Returns:
        A Clique with ascending indices, the exact epsilon sum of its members, and a
        witness point in all of them; an empty Clique (sum 0, witness None) for no queries.

    Raises:
        ValueError / TypeError: queries are not RangeQuery objects of one dimensionality.
    """
    qs = _validate_queries(queries)
    if not qs:
        return Clique((), Fraction(0), None)
    lo = np.array([q.lo for q in qs], dtype=object)
    hi = np.array([q.hi for q in qs], dtype=object)
    # Coordinates are Python ints (unbounded); compress them to ranks so numpy can sort.
    lo_r = np.empty(lo.shape, dtype=np.int64)
    hi_r = np.empty(hi.shape, dtype=np.int64)
    for d in range(qs[0].ndim):
        values = sorted(set(lo[:, d].tolist()) | set(hi[:, d].tolist()))
        rank = {v: r for r, v in enumerate(values)}
        lo_r[:, d] = [rank[v] for v in lo[:, d]]
        hi_r[:, d] = [rank[v] for v in hi[:, d]]
    fracs = [exact_decimal(q.epsilon) for q in qs]
    if weighted:
        w, _ = _integer_weights(fracs)
    else:
        w = np.ones(len(qs), dtype=np.int64)
    point_r, _ = _best_point(lo_r, hi_r, w, 0)
    assert point_r is not None  # at least one non-empty box exists
    k = qs[0].ndim
    members = tuple(
        i for i in range(len(qs)) if all(lo_r[i, d] <= point_r[d] < hi_r[i, d] for d in range(k))
    )
    # Map the witness back from ranks: the largest lower end of the members, per axis.
    witness = tuple(max(qs[i].lo[d] for i in members) for d in range(k))
    return Clique(members, sum((fracs[i] for i in members), Fraction(0)), witness)


def _charged_exact(queries: Sequence[RangeQuery]) -> Fraction:
    return overlap_graph_max_clique(queries, weighted=True).epsilon_exact


def charged_epsilon(queries: Sequence[RangeQuery]) -> float:
    """Total epsilon of answering all `queries` directly, each with Laplace noise at its epsilon.

    Privacy map: each query is a count over its box (sensitivity 1 under add/remove one
    record) answered by an epsilon_q-DP mechanism. A record at point x influences only the
    queries whose boxes contain x, so by sequential composition over those and parallel
    composition across disjoint parts of the domain, the release is
    max_x sum_{q contains x} epsilon_q -DP (seed 004, slides 52-61). With equal epsilons
    this is epsilon times the maximum overlap (max clique); otherwise it is the maximum
    weighted clique. Never more than the plain sum (`sequential_epsilon`). Who learns the
    noise: only the party that answers the queries. Assumes one record per individual; for
    users with several records, bound their contribution first (seed 004, slides 67-78).

    Seed 004 examples: Q1, Q2 overlap and Q3 is apart -> 2 eps; adding Q4 that meets all
    three -> 3 eps (with Q1, Q2, Q4 sharing a point).

    Returns:
        The exact rational charge rounded to the nearest float (0.0 for no queries).
    """
    return float(_charged_exact(queries))


def sequential_epsilon(queries: Sequence[RangeQuery]) -> float:
    """Plain sequential-composition total: the sum of all epsilons (the naive charge)."""
    qs = _validate_queries(queries)
    return float(sum((exact_decimal(q.epsilon) for q in qs), Fraction(0)))


class BudgetExceeded(BudgetExhaustedError):
    """A charge would take the direct-query accountant past its total budget.

    Attributes:
        spent: the charge of the queries already answered.
        requested: how much the new queries would add to that charge.
        total: the accountant's total budget.
    """

    def __init__(self, spent: Fraction, requested: Fraction, total: Fraction) -> None:
        self.spent = float(spent)
        self.requested = float(requested)
        self.total = float(total)
        super().__init__(
            f"privacy budget exceeded: spent {self.spent:g} of total {self.total:g}; the new "
            f"queries would add {self.requested:g} (to {float(spent + requested):g}). Ask "
            "fewer or non-overlapping queries, or lower their epsilons."
        )


@dataclass(frozen=True)
class ChargeEvent:
    """An immutable record of one accepted batch of directly answered queries.

    Attributes:
        sequence: 0-based position of the event in the accountant's history.
        queries: the batch accepted.
        spent_before: exact charge of all earlier queries.
        spent_after: exact charge of all queries up to and including this batch.
    """

    sequence: int
    queries: tuple[RangeQuery, ...]
    spent_before: Fraction
    spent_after: Fraction

    def __post_init__(self) -> None:
        if self.sequence < 0:
            raise ValueError(f"sequence must be >= 0, got {self.sequence}")
        if not self.queries:
            raise ValueError("queries must not be empty, got ()")
        if self.spent_after < self.spent_before:
            raise ValueError(
                f"spent_after must be >= spent_before, got {self.spent_after} < {self.spent_before}"
            )

    @property
    def increment(self) -> Fraction:
        """How much this batch raised the total charge (0 if it fell on unused ground)."""
        return self.spent_after - self.spent_before


class DirectQueryAccountant:
    """Tracks a total budget against the max-overlap charge of all answered range counts.

    `charge` dry-runs the charge of history + new queries and either raises
    BudgetExceeded (changing nothing) or appends an immutable ChargeEvent. Record the
    event before releasing any answer. The charge of a set of queries only grows when
    queries are added, so `spent` never decreases. Not thread-safe: serialise calls.

    Raises (constructor):
        ValueError: total_epsilon is not > 0 and finite.
    """

    def __init__(self, total_epsilon: float) -> None:
        self._total = positive_finite("total_epsilon", total_epsilon)
        self._total_exact = exact_decimal(self._total)
        self._events: list[ChargeEvent] = []

    def __repr__(self) -> str:
        return (
            f"DirectQueryAccountant(total_epsilon={self._total!r}, spent={self.spent!r}, "
            f"events={len(self._events)})"
        )

    @property
    def total_epsilon(self) -> float:
        """The total budget."""
        return self._total

    @property
    def history(self) -> tuple[ChargeEvent, ...]:
        """All accepted events, oldest first."""
        return tuple(self._events)

    @property
    def queries(self) -> tuple[RangeQuery, ...]:
        """All accepted queries, in order."""
        return tuple(q for e in self._events for q in e.queries)

    @property
    def spent_exact(self) -> Fraction:
        """Exact charge of all accepted queries."""
        return self._events[-1].spent_after if self._events else Fraction(0)

    @property
    def spent(self) -> float:
        """Charge of all accepted queries, rounded to the nearest float."""
        return float(self.spent_exact)

    @property
    def remaining(self) -> float:
        """total_epsilon - spent, rounded to the nearest float."""
        return float(self._total_exact - self.spent_exact)

    def dry_run(self, new_queries: Sequence[RangeQuery]) -> float:
        """Return the total charge if `new_queries` were accepted; records nothing."""
        return float(self._charge_with(new_queries)[1])

    def _charge_with(self, new_queries: Sequence[RangeQuery]) -> tuple[tuple[RangeQuery, ...], Fraction]:
        new = _validate_queries(new_queries)
        if not new:
            raise ValueError("new_queries must contain at least one RangeQuery, got none")
        return new, _charged_exact(self.queries + new)

    def charge(self, new_queries: Sequence[RangeQuery]) -> ChargeEvent:
        """Accept `new_queries` if the total charge stays within the budget.

        Privacy: spends budget, no noise drawn here (so nobody knows noise from it). Each
        query is released with discrete Laplace noise at its own `epsilon` (sensitivity:
        one record changes each overlapping range count by 1; neighbouring relation:
        add/remove one record); the history's charge is the heaviest weighted overlap of
        all queries answered (seed 004), recorded only if it stays within total_epsilon.

        Raises:
            BudgetExceeded: the charge of history + new_queries would exceed total_epsilon;
                nothing is recorded.
            ValueError / TypeError: new_queries is empty, not RangeQuery objects, or of a
                different dimensionality than the history.
        """
        new, after = self._charge_with(new_queries)
        before = self.spent_exact
        if after > self._total_exact:
            raise BudgetExceeded(before, after - before, self._total_exact)
        event = ChargeEvent(len(self._events), new, before, after)
        self._events.append(event)
        return event
