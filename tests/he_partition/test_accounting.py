"""Tests of he_partition.core.accounting: max-overlap charging of direct range counts (seed 004)."""

from __future__ import annotations

import dataclasses
import itertools
from fractions import Fraction

import numpy as np
import pytest

from he_partition.core.accounting import (
    BudgetExceeded,
    ChargeEvent,
    Clique,
    DirectQueryAccountant,
    RangeQuery,
    charged_epsilon,
    overlap_graph_max_clique,
    sequential_epsilon,
)

Q = RangeQuery.from_inclusive


def seed_queries(eps: float) -> list[RangeQuery]:
    """Seed 004, slides 54-58: (age, height) predicates with inclusive bounds."""
    return [
        Q((10, 100), (20, 120), eps),  # Q1: 10 <= age <= 20 AND 100 <= height <= 120
        Q((5, 80), (25, 105), eps),  # Q2
        Q((30, 150), (40, 180), eps),  # Q3
        Q((17, 90), (32, 160), eps),  # Q4
    ]


# ---- seed 004 worked examples ---------------------------------------------------------


def test_seed_example_1_charges_two_epsilon() -> None:
    q1, q2, q3, _ = seed_queries(1.0)
    assert charged_epsilon([q1, q2, q3]) == 2.0
    assert sequential_epsilon([q1, q2, q3]) == 3.0
    clique = overlap_graph_max_clique([q1, q2, q3])
    assert clique.indices == (0, 1)
    assert clique.epsilon_exact == Fraction(2)


def test_seed_example_2_charges_three_epsilon() -> None:
    qs = seed_queries(1.0)
    assert charged_epsilon(qs) == 3.0
    assert sequential_epsilon(qs) == 4.0
    clique = overlap_graph_max_clique(qs)
    assert clique.indices == (0, 1, 3)  # Q1, Q2, Q4
    assert clique.witness is not None
    assert all(qs[i].contains(clique.witness) for i in clique.indices)
    assert not qs[2].contains(clique.witness)


def test_seed_examples_exact_with_non_dyadic_epsilon() -> None:
    qs = seed_queries(0.1)
    assert charged_epsilon(qs[:3]) == float(Fraction(2, 10))
    assert charged_epsilon(qs) == float(Fraction(3, 10))
    assert overlap_graph_max_clique(qs).epsilon_exact == Fraction(3, 10)
    assert sequential_epsilon(qs) == 0.4


def test_seed_overlap_structure() -> None:
    q1, q2, q3, q4 = seed_queries(1.0)
    assert q1.overlaps(q2) and q2.overlaps(q1)
    assert not q1.overlaps(q3) and not q2.overlaps(q3)
    assert q4.overlaps(q1) and q4.overlaps(q2) and q4.overlaps(q3)


# ---- simple geometry ------------------------------------------------------------------


def test_disjoint_queries_charge_the_max_epsilon() -> None:
    qs = [RangeQuery((10 * i,), (10 * i + 5,), 0.5) for i in range(6)]
    assert charged_epsilon(qs) == 0.5
    assert sequential_epsilon(qs) == 3.0


def test_touching_half_open_intervals_do_not_overlap() -> None:
    a = RangeQuery((0,), (5,), 1.0)
    b = RangeQuery((5,), (9,), 1.0)
    assert not a.overlaps(b)
    assert charged_epsilon([a, b]) == 1.0
    # One more unit of overlap and they do.
    c = RangeQuery((4,), (9,), 1.0)
    assert charged_epsilon([a, c]) == 2.0


def test_touching_boxes_in_2d_do_not_overlap() -> None:
    a = RangeQuery((0, 0), (5, 5), 1.0)
    b = RangeQuery((5, 0), (9, 5), 1.0)  # shares an edge with a
    c = RangeQuery((5, 5), (9, 9), 1.0)  # shares a corner with a
    assert charged_epsilon([a, b, c]) == 1.0


def test_inclusive_constructor() -> None:
    q = Q((10,), (20,), 1.0)
    assert q.lo == (10,) and q.hi == (21,)
    assert q.contains((20,)) and not q.contains((21,))
    assert charged_epsilon([Q((0,), (5,), 1.0), Q((5,), (9,), 1.0)]) == 2.0


def test_nested_queries_charge_the_depth() -> None:
    qs = [RangeQuery((i,), (100 - i,), 0.25) for i in range(0, 40, 5)]  # 8 nested intervals
    assert charged_epsilon(qs) == 2.0
    assert overlap_graph_max_clique(qs, weighted=False).size == 8


def test_weighted_case_picks_heaviest_not_largest_clique() -> None:
    qs = [
        RangeQuery((0,), (10,), 0.5),
        RangeQuery((2,), (10,), 0.5),
        RangeQuery((4,), (10,), 0.5),  # three light queries overlap on [4, 10): 1.5
        RangeQuery((20,), (30,), 1.0),
        RangeQuery((25,), (35,), 1.0),  # two heavy ones overlap on [25, 30): 2.0
    ]
    assert charged_epsilon(qs) == 2.0
    heavy = overlap_graph_max_clique(qs, weighted=True)
    assert heavy.indices == (3, 4)
    assert heavy.epsilon_exact == Fraction(2)
    large = overlap_graph_max_clique(qs, weighted=False)
    assert large.indices == (0, 1, 2)
    assert large.epsilon_exact == Fraction(3, 2)


def test_weighted_mixed_epsilons_exact() -> None:
    qs = [
        RangeQuery((0,), (10,), 0.1),
        RangeQuery((5,), (15,), 0.2),
        RangeQuery((12,), (20,), 0.7),
    ]
    # [5,10): 0.1 + 0.2; [12,15): 0.2 + 0.7 = 0.9
    assert overlap_graph_max_clique(qs).epsilon_exact == Fraction(9, 10)
    assert charged_epsilon(qs) == 0.9


def test_2d_rectangles() -> None:
    qs = [
        RangeQuery((0, 0), (4, 4), 1.0),
        RangeQuery((2, 2), (6, 6), 1.0),
        RangeQuery((3, 0), (8, 3), 1.0),  # meets the first two only in (3, 2)
        RangeQuery((5, 5), (9, 9), 1.0),
    ]
    clique = overlap_graph_max_clique(qs)
    assert clique.size == 3
    assert clique.indices == (0, 1, 2)
    assert clique.witness == (3, 2)
    assert charged_epsilon(qs) == 3.0


def test_chain_of_overlaps_is_not_a_clique() -> None:
    # A chain a-b, b-c with a, c disjoint: max clique 2, not 3.
    qs = [RangeQuery((0, 0), (3, 3), 1.0), RangeQuery((2, 2), (5, 5), 1.0), RangeQuery((4, 4), (7, 7), 1.0)]
    assert charged_epsilon(qs) == 2.0


def test_3d_boxes() -> None:
    qs = [
        RangeQuery((0, 0, 0), (2, 2, 2), 1.0),
        RangeQuery((1, 1, 1), (3, 3, 3), 1.0),
        RangeQuery((1, 0, 1), (2, 3, 2), 1.0),
        RangeQuery((0, 0, 2), (3, 3, 3), 1.0),  # disjoint from the first in z
    ]
    assert charged_epsilon(qs) == 3.0


def test_empty_query_set() -> None:
    assert charged_epsilon([]) == 0.0
    assert sequential_epsilon([]) == 0.0
    assert overlap_graph_max_clique([]) == Clique((), Fraction(0), None)


def test_large_and_negative_coordinates() -> None:
    big = 10**30
    qs = [RangeQuery((-big,), (big,), 1.0), RangeQuery((big - 1,), (big + 5,), 1.0)]
    clique = overlap_graph_max_clique(qs)
    assert clique.witness == (big - 1,)
    assert charged_epsilon(qs) == 2.0


def test_extreme_epsilon_magnitudes_are_summed_exactly() -> None:
    qs = [RangeQuery((0,), (5,), 1e-300), RangeQuery((0,), (5,), 1e300)]
    clique = overlap_graph_max_clique(qs)
    assert clique.epsilon_exact == Fraction("1e-300") + Fraction("1e300")
    assert charged_epsilon(qs) == 1e300


# ---- brute-force cross-checks ---------------------------------------------------------


def _brute_depth(qs: list[RangeQuery]) -> Fraction:
    k = qs[0].ndim
    lows = [min(q.lo[d] for q in qs) for d in range(k)]
    highs = [max(q.hi[d] for q in qs) for d in range(k)]
    best = Fraction(0)
    for point in itertools.product(*(range(a, b) for a, b in zip(lows, highs))):
        depth = sum((Fraction(repr(q.epsilon)) for q in qs if q.contains(point)), Fraction(0))
        best = max(best, depth)
    return best


def _brute_clique(qs: list[RangeQuery]) -> Fraction:
    """Max weighted clique of the overlap graph by enumerating subsets (no geometry)."""
    best = Fraction(0)
    for r in range(1, len(qs) + 1):
        for subset in itertools.combinations(range(len(qs)), r):
            if all(qs[i].overlaps(qs[j]) for i, j in itertools.combinations(subset, 2)):
                best = max(best, sum((Fraction(repr(qs[i].epsilon)) for i in subset), Fraction(0)))
    return best


def _random_queries(rng: np.random.Generator, n: int, k: int, span: int) -> list[RangeQuery]:
    out = []
    eps_choices = [0.1, 0.25, 0.5, 1.0, 0.3]
    for _ in range(n):
        lo = rng.integers(0, span - 1, size=k)
        width = rng.integers(1, span // 2 + 1, size=k)
        hi = np.minimum(lo + width, span)
        out.append(RangeQuery(tuple(int(v) for v in lo), tuple(int(v) for v in hi),
                              float(rng.choice(eps_choices))))
    return out


@pytest.mark.parametrize("k", [1, 2, 3])
def test_sweep_matches_brute_force_point_depth_and_subset_cliques(k: int) -> None:
    rng = np.random.default_rng(20240501 + k)
    for _ in range(40):
        qs = _random_queries(rng, int(rng.integers(1, 8)), k, span=9)
        expected = _brute_depth(qs)
        got = overlap_graph_max_clique(qs)
        assert got.epsilon_exact == expected
        # Helly property: geometric depth equals the max weighted clique of the graph.
        assert _brute_clique(qs) == expected
        assert got.witness is not None
        assert all(qs[i].contains(got.witness) for i in got.indices)
        assert charged_epsilon(qs) <= sequential_epsilon(qs)


def test_unweighted_matches_brute_force_count() -> None:
    rng = np.random.default_rng(7)
    for _ in range(30):
        qs = _random_queries(rng, 6, 2, span=8)
        unit = [RangeQuery(q.lo, q.hi, 1.0) for q in qs]
        assert overlap_graph_max_clique(qs, weighted=False).size == int(_brute_depth(unit))


def test_many_queries_are_fast_enough() -> None:
    rng = np.random.default_rng(3)
    qs = _random_queries(rng, 400, 2, span=1000)
    clique = overlap_graph_max_clique(qs)
    assert clique.witness is not None
    assert all(qs[i].contains(clique.witness) for i in clique.indices)
    # Every query containing the witness is in the clique.
    assert clique.indices == tuple(i for i, q in enumerate(qs) if q.contains(clique.witness))


# ---- validation -----------------------------------------------------------------------


def test_range_query_validation() -> None:
    with pytest.raises(ValueError, match=r"epsilon must be > 0 and finite, got -1"):
        RangeQuery((0,), (1,), -1)
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        RangeQuery((0,), (1,), float("nan"))
    with pytest.raises(ValueError, match=r"lo\[0\]=3 >= hi\[0\]=3"):
        RangeQuery((3,), (3,), 1.0)
    with pytest.raises(ValueError, match="same length"):
        RangeQuery((0, 0), (1,), 1.0)
    with pytest.raises(ValueError, match="at least one dimension"):
        RangeQuery((), (), 1.0)
    with pytest.raises(TypeError, match="must contain ints"):
        RangeQuery((0.5,), (1,), 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must contain ints"):
        RangeQuery((True,), (2,), 1.0)
    with pytest.raises(TypeError, match="epsilon must be a real number"):
        RangeQuery((0,), (1,), "1")  # type: ignore[arg-type]


def test_range_query_normalises_and_is_frozen() -> None:
    q = RangeQuery([np.int64(1), 2], [3, np.int32(4)], 1)  # type: ignore[arg-type]
    assert q.lo == (1, 2) and q.hi == (3, 4) and q.epsilon == 1.0
    assert type(q.lo[0]) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.epsilon = 2.0  # type: ignore[misc]


def test_mixed_dimensionality_rejected() -> None:
    with pytest.raises(ValueError, match="same number of dimensions"):
        charged_epsilon([RangeQuery((0,), (1,), 1.0), RangeQuery((0, 0), (1, 1), 1.0)])
    with pytest.raises(TypeError, match=r"queries\[1\] must be a RangeQuery"):
        charged_epsilon([RangeQuery((0,), (1,), 1.0), ((0,), (1,), 1.0)])  # type: ignore[list-item]


# ---- accountant -----------------------------------------------------------------------


def test_accountant_seed_sequence_fills_budget_exactly() -> None:
    q1, q2, q3, q4 = seed_queries(1.0)
    acct = DirectQueryAccountant(3.0)
    e1 = acct.charge([q1, q2])
    assert (e1.spent_before, e1.spent_after, e1.increment) == (Fraction(0), Fraction(2), Fraction(2))
    e2 = acct.charge([q3])  # disjoint from Q1, Q2: free under parallel composition
    assert e2.increment == 0
    assert acct.spent == 2.0
    assert acct.dry_run([q4]) == 3.0
    assert acct.spent == 2.0  # dry run recorded nothing
    e3 = acct.charge([q4])  # exactly reaches the total: allowed
    assert e3.spent_after == Fraction(3)
    assert acct.remaining == 0.0
    assert [e.sequence for e in acct.history] == [0, 1, 2]
    assert acct.queries == (q1, q2, q3, q4)


def test_accountant_rejects_and_changes_nothing() -> None:
    q1, q2, q3, q4 = seed_queries(1.0)
    acct = DirectQueryAccountant(2.5)
    acct.charge([q1, q2, q3])
    history = acct.history
    with pytest.raises(BudgetExceeded) as info:
        acct.charge([q4])
    err = info.value
    assert (err.spent, err.requested, err.total) == (2.0, 1.0, 2.5)
    assert "spent 2 of total 2.5" in str(err)
    assert "would add 1" in str(err)
    assert acct.history == history
    assert acct.spent == 2.0
    # A query on unused ground still fits.
    acct.charge([RangeQuery((100, 0), (200, 10), 1.0)])
    assert acct.spent == 2.0


def test_accountant_decimal_budget_fits_exactly() -> None:
    acct = DirectQueryAccountant(0.3)
    acct.charge([RangeQuery((0,), (5,), 0.1)] * 3)
    assert acct.spent_exact == Fraction(3, 10)
    with pytest.raises(BudgetExceeded):
        acct.charge([RangeQuery((4,), (6,), 0.1)])
    acct.charge([RangeQuery((5,), (6,), 0.1)])  # touching, not overlapping
    assert acct.spent_exact == Fraction(3, 10)


def test_accountant_batch_is_charged_jointly() -> None:
    acct = DirectQueryAccountant(1.0)
    with pytest.raises(BudgetExceeded):
        acct.charge([RangeQuery((0,), (5,), 0.6), RangeQuery((3,), (8,), 0.6)])
    assert acct.history == ()


def test_accountant_validation() -> None:
    with pytest.raises(ValueError, match=r"total_epsilon must be > 0 and finite, got 0"):
        DirectQueryAccountant(0)
    acct = DirectQueryAccountant(1.0)
    with pytest.raises(ValueError, match="at least one RangeQuery"):
        acct.charge([])
    acct.charge([RangeQuery((0,), (1,), 0.5)])
    with pytest.raises(ValueError, match="same number of dimensions"):
        acct.charge([RangeQuery((0, 0), (1, 1), 0.1)])
    assert len(acct.history) == 1


def test_charge_event_is_immutable_and_validated() -> None:
    q = RangeQuery((0,), (1,), 0.5)
    ev = ChargeEvent(0, (q,), Fraction(0), Fraction(1, 2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.spent_after = Fraction(0)  # type: ignore[misc]
    with pytest.raises(ValueError, match="spent_after must be >= spent_before"):
        ChargeEvent(0, (q,), Fraction(1), Fraction(0))
    with pytest.raises(ValueError, match="queries must not be empty"):
        ChargeEvent(0, (), Fraction(0), Fraction(0))
    with pytest.raises(ValueError, match="sequence must be >= 0"):
        ChargeEvent(-1, (q,), Fraction(0), Fraction(0))


def test_budget_exceeded_is_an_exception() -> None:
    assert issubclass(BudgetExceeded, Exception)
