"""Tests of the data owner's CSV reading and per-person contribution bounding."""

from __future__ import annotations

import dataclasses
import itertools
import math
from fractions import Fraction
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from he_partition import release
from he_partition.core.errors import InvalidInputError
from he_partition.strategies.gap import GapParams
from he_partition.core.noise import SCALE_GRID, SeededRandom, discrete_laplace_variance, laplace_scale
from parties.data_owner.dataset import (
    BoundedHistogram,
    ContributionBounds,
    SAMPLE_COLUMNS,
    check_bound_matches,
    histogram_from_records,
    read_histogram,
    write_sample_csv,
)
from parties.data_owner.domain import DomainSpec

AGE = DomainSpec.parse("age:0:100:50")


def write_csv(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- domain
def test_parse_equal_width() -> None:
    d = DomainSpec.parse("age:0:100:50")
    assert d.column == "age"
    assert d.n_bins == 50
    assert d.edges == tuple(float(2 * i) for i in range(51))
    assert not d.is_categorical


def test_bin_of_half_open_bins_and_upper_edge_outside() -> None:
    got = AGE.bin_of([0, 1.99, 2, 49.5, 99.9, 100, -0.1, math.nan, math.inf, -math.inf])
    assert got.dtype == np.int64
    assert got.tolist() == [0, 0, 1, 24, 49, -1, -1, -1, -1, -1]


def test_from_edges_uneven_bins() -> None:
    d = DomainSpec.from_edges("income", [0, 10_000, 50_000, 1e6])
    assert d.n_bins == 3
    assert d.bin_of([0, 9_999, 10_000, 999_999, 1e6]).tolist() == [0, 0, 1, 2, -1]


def test_parse_explicit_edges_and_colon_in_column() -> None:
    d = DomainSpec.parse("a:b:edges:0, 18,65,120")
    assert d.column == "a:b"
    assert d.edges == (0.0, 18.0, 65.0, 120.0)
    assert DomainSpec.parse("x:y:0:1:4").column == "x:y"


def test_categorical_domain() -> None:
    d = DomainSpec.categorical("sector", ["retail", "health", "other"])
    assert d.n_bins == 3 and d.is_categorical
    assert d.edges == (0.0, 1.0, 2.0, 3.0)
    assert d.bin_of(["health", "other", "retail", "Retail", ""]).tolist() == [1, 2, 0, -1, -1]
    assert DomainSpec.parse("sector:categories:retail,health,other") == d


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("age:0:100", "cannot parse domain spec"),
        ("age", "cannot parse domain spec"),
        ("age:100:0:5", "upper bound must exceed"),
        ("age:0:100:0", "n_bins must be an integer >= 1"),
        ("age:0:100:2.5", "n_bins must be an integer"),
        ("age:0:x:5", "lo and hi must be numbers"),
        ("age:0:inf:5", "finite"),
        (":0:100:5", "column name must be a non-empty string"),
        ("age:edges:0,5,5", "strictly increasing"),
        ("age:edges:0", "at least 2 bin edges"),
        ("age:edges:0,a", "must be numbers"),
        ("s:categories:a,b,a", "listed twice"),
        ("s:categories:a,,b", "non-empty strings"),
    ],
)
def test_parse_errors_name_the_problem(spec: str, fragment: str) -> None:
    with pytest.raises(InvalidInputError, match=fragment):
        DomainSpec.parse(spec)


def test_domain_validation_and_frozen() -> None:
    with pytest.raises(InvalidInputError, match="strictly increasing.*edge 2"):
        DomainSpec("x", (0.0, 2.0, 1.0))
    with pytest.raises(InvalidInputError, match="finite"):
        DomainSpec.from_edges("x", [0, math.nan])
    with pytest.raises(InvalidInputError, match="categorical domain's edges"):
        DomainSpec("x", (0.0, 2.0), ("a",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        AGE.column = "other"  # type: ignore[misc]


# --------------------------------------------------------------------------- bounds
def test_contribution_bounds() -> None:
    assert ContributionBounds().contribution_bound == 1
    b = ContributionBounds(per_bin=2, max_bins=3)
    assert b.contribution_bound == 6
    assert ContributionBounds(np.int64(4), 2).per_bin == 4
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(InvalidInputError, match="per_bin must be an integer >= 1"):
            ContributionBounds(per_bin=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="max_bins must be an integer >= 1"):
            ContributionBounds(max_bins=bad)  # type: ignore[arg-type]


def _person_a_outcomes() -> set[tuple[int, ...]]:
    """Every histogram the bounded data of the test below may produce (one per kept 3-subset)."""
    a_records = {0: 5, 1: 3, 2: 1, 3: 2}  # person A: 11 records in 4 bins
    others = np.zeros(6, dtype=np.int64)
    others[0] += 1  # B: one record in bin 0
    others[4] += 2  # C: three records in bin 4 -> 2 kept (per_bin 2), one bin
    outcomes = set()
    for kept in itertools.combinations(a_records, 3):
        h = others.copy()
        for b in kept:
            h[b] += min(a_records[b], 2)
        outcomes.add(tuple(int(v) for v in h))
    return outcomes


def test_bounds_enforced_exactly() -> None:
    domain = DomainSpec.equal_width("v", 0, 6, 6)
    values = [0] * 5 + [1] * 3 + [2] + [3] * 2 + [0] + [4] * 3 + [7, -1]
    persons = ["A"] * 11 + ["B"] + ["C"] * 3 + ["A", "B"]  # A and B each also have an out-of-domain record
    outcomes = _person_a_outcomes()
    seen = set()
    for seed in range(40):
        h = histogram_from_records(values, domain, persons=persons, bounds=ContributionBounds(2, 3),
                                   rng=SeededRandom(seed))
        got = tuple(h.counts.tolist())
        assert got in outcomes
        a = np.array(got) - np.array([1, 0, 0, 0, 2, 0])
        assert a.max() <= 2 and np.count_nonzero(a) == 3  # <= 2 per bin, in exactly 3 bins
        assert h.contribution_bound == 6
        assert h.records_read == 17 and h.out_of_domain == 2
        assert h.total + h.records_dropped + h.out_of_domain == h.records_read
        assert h.records_dropped == 15 - h.total
        seen.add(got)
    assert seen == outcomes  # every 3-subset of A's bins occurs


def test_no_drop_when_bounds_are_loose() -> None:
    domain = DomainSpec.equal_width("v", 0, 6, 6)
    values = [0] * 5 + [1] * 3 + [2] + [3] * 2
    h = histogram_from_records(values, domain, persons=["A"] * 11, bounds=ContributionBounds(5, 4), rng=0)
    assert h.counts.tolist() == [5, 3, 1, 2, 0, 0] and h.records_dropped == 0


def test_default_bound_is_one_record_per_person() -> None:
    values = [10, 10, 30, 50, 50, 50, 70]
    persons = [1, 1, 1, 2, 2, 3, 4]
    h = histogram_from_records(values, AGE, persons=persons, rng=SeededRandom(1))
    assert h.total == 4 and h.records_dropped == 3 and h.contribution_bound == 1
    assert h.counts[25] == 2 and h.counts[35] == 1  # persons 2 and 3 in bin 25; person 4 in 35
    assert h.counts[5] + h.counts[15] == 1  # person 1 counts once, in one of its two bins
    assert h.bounds == ContributionBounds(1, 1)


def test_without_person_column_every_record_counts() -> None:
    h = histogram_from_records([10, 10, 30, 150], AGE, bounds=ContributionBounds(2, 3))
    assert h.counts[5] == 2 and h.counts[15] == 1 and h.total == 3
    assert (h.records_read, h.records_dropped, h.out_of_domain) == (4, 0, 1)
    assert h.contribution_bound == 6  # the declared bound is still recorded


def test_categorical_records_with_persons() -> None:
    d = DomainSpec.categorical("sector", ["a", "b", "c"])
    h = histogram_from_records(["a", "a", "b", "z"], d, persons=["p", "p", "q", "q"],
                               bounds=ContributionBounds(2, 1), rng=3)
    assert h.counts.tolist() == [2, 1, 0] and h.out_of_domain == 1


def test_histogram_is_read_only() -> None:
    h = histogram_from_records([1.0], AGE)
    with pytest.raises(ValueError):
        h.counts[0] = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.records_read = 3  # type: ignore[misc]


def test_bounded_histogram_validation() -> None:
    with pytest.raises(InvalidInputError, match="inconsistent accounting"):
        BoundedHistogram(np.array([1, 2]), 1, records_read=5, records_dropped=0, out_of_domain=0,
                         bounds=ContributionBounds())
    with pytest.raises(InvalidInputError, match="does not equal per_bin"):
        BoundedHistogram(np.array([1]), 2, records_read=1, records_dropped=0, out_of_domain=0,
                         bounds=ContributionBounds())


def test_persons_length_mismatch() -> None:
    with pytest.raises(InvalidInputError, match="one id per record: 2 values"):
        histogram_from_records([1, 2], AGE, persons=["a"])


@settings(max_examples=40, deadline=None)
@given(
    records=st.lists(st.tuples(st.integers(0, 5), st.integers(-2, 8)), max_size=60),
    per_bin=st.integers(1, 3),
    max_bins=st.integers(1, 3),
    seed=st.integers(0, 2**32),
)
def test_bounding_invariants(records: list[tuple[int, int]], per_bin: int, max_bins: int, seed: int) -> None:
    domain = DomainSpec.equal_width("v", 0, 6, 6)
    persons = [p for p, _ in records]
    values = [v for _, v in records]
    h = histogram_from_records(values, domain, persons=persons, bounds=ContributionBounds(per_bin, max_bins),
                               rng=SeededRandom(seed))
    raw = np.bincount([v for v in values if 0 <= v < 6], minlength=6)
    assert np.all(h.counts <= raw)
    assert h.total + h.records_dropped + h.out_of_domain == len(records)
    # Each person adds at most c: removing a whole person's records moves no bin above per_bin
    # per person and the total above c per person.
    assert h.total <= len(set(persons)) * per_bin * max_bins
    # Every person keeps exactly min(#bins, max_bins) bins' worth of min(n, per_bin) records, so the
    # total is determined once the bins are chosen; bounds at least as large as the data drop nothing.
    per_person: dict[int, Counter[int]] = {}
    for p, v in records:
        if 0 <= v < 6:
            per_person.setdefault(p, Counter())[v] += 1
    if all(len(c) <= max_bins and max(c.values()) <= per_bin for c in per_person.values()):
        assert np.array_equal(h.counts, raw)


# --------------------------------------------------------------------------- statistical
@pytest.mark.statistical
def test_bin_choice_is_uniform_not_most_frequent() -> None:
    # 6,000 persons, each with 10 records in bin 0 and one record in each of bins 1..3;
    # max_bins = 1: each of the 4 bins must be kept with probability 1/4, whatever it holds.
    domain = DomainSpec.equal_width("v", 0, 4, 4)
    n = 6_000
    values = np.tile(np.array([0] * 10 + [1, 2, 3]), n)
    persons = np.repeat(np.arange(n), 13)
    h = histogram_from_records(values, domain, persons=persons, bounds=ContributionBounds(1, 1),
                               rng=SeededRandom(2024))
    assert h.total == n
    assert stats.chisquare(h.counts).pvalue > 1e-3
    assert abs(h.counts[0] / n - 0.25) < 0.03  # "most frequent" would give 1.0


@pytest.mark.statistical
def test_subset_choice_is_uniform_over_pairs() -> None:
    # One person, 6 bins, max_bins = 2: each of the 15 pairs with probability 1/15.
    domain = DomainSpec.equal_width("v", 0, 6, 6)
    rng = SeededRandom(7)
    trials = 3_000
    seen: Counter[tuple[int, ...]] = Counter()
    for _ in range(trials):
        h = histogram_from_records([0, 1, 2, 3, 4, 5], domain, persons=["p"] * 6,
                                   bounds=ContributionBounds(1, 2), rng=rng)
        seen[tuple(np.flatnonzero(h.counts).tolist())] += 1
    assert len(seen) == 15 and all(len(k) == 2 for k in seen)
    assert stats.chisquare(list(seen.values())).pvalue > 1e-3


# --------------------------------------------------------------------------- CSV
def test_read_histogram_with_persons(tmp_path: Path) -> None:
    p = write_csv(tmp_path / "d.csv",
                  "person_id,age,income\n"
                  "a,10,1\n a ,10.5,1\n"  # same person (ids are stripped), same bin 5
                  "b, 30 ,2\n"
                  "\n"  # blank line skipped
                  "c,100,3\n"  # upper edge: out of domain
                  "c,-inf,3\n")
    h = read_histogram(p, AGE, person_column="person_id", bounds=ContributionBounds(2, 1), rng=1)
    assert h.counts[5] == 2 and h.counts[15] == 1 and h.total == 3
    assert (h.records_read, h.records_dropped, h.out_of_domain) == (5, 0, 2)
    h1 = read_histogram(p, AGE, person_column="person_id", rng=1)
    assert h1.counts[5] == 1 and h1.records_dropped == 1


def test_read_histogram_categorical_and_bom(tmp_path: Path) -> None:
    p = tmp_path / "c.csv"
    p.write_bytes("\ufeffsector,x\nretail,1\nhealth,2\nretail,3\n".encode("utf-8"))
    d = DomainSpec.categorical("sector", ["retail", "health"])
    assert read_histogram(p, d).counts.tolist() == [2, 1]


def test_missing_column_names_column_and_columns_present(tmp_path: Path) -> None:
    p = write_csv(tmp_path / "d.csv", "person_id,Age\n1,3\n")
    with pytest.raises(InvalidInputError, match=r"no value column 'age'.*'person_id', 'Age'"):
        read_histogram(p, AGE)
    with pytest.raises(InvalidInputError, match=r"no person id column 'user'.*'person_id', 'Age'"):
        read_histogram(p, DomainSpec.parse("Age:0:100:50"), person_column="user")


@pytest.mark.parametrize(
    "row, fragment",
    [
        ("x,abc", r"line 3 has value 'abc' in column 'age', which is not a number"),
        ("x,", r"line 3 has an empty value in column 'age'"),
        ("x,NaN", r"line 3 has value 'NaN' \(NaN\)"),
        ("x", r"line 3 has no field for column 'age'"),
        (",4", r"line 3 has no person id in column 'person_id'"),
        ("x,4,5", r"line 3 has 3 fields but the header has 2 \(an unquoted comma"),
    ],
)
def test_bad_value_names_line_and_value(tmp_path: Path, row: str, fragment: str) -> None:
    p = write_csv(tmp_path / "d.csv", f"person_id,age\ny,20\n{row}\nz,30\n")
    with pytest.raises(InvalidInputError, match=fragment + r".*on_bad_value='drop'"):
        read_histogram(p, AGE, person_column="person_id")
    h = read_histogram(p, AGE, person_column="person_id", on_bad_value="drop", rng=0)
    assert h.total == 2 and h.records_read == 3 and h.out_of_domain == 1


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="cannot read .*nope.csv"):
        read_histogram(tmp_path / "nope.csv", AGE)
    with pytest.raises(InvalidInputError, match="is empty: expected a header row"):
        read_histogram(write_csv(tmp_path / "e.csv", ""), AGE)
    with pytest.raises(InvalidInputError, match="appears 2 times"):
        read_histogram(write_csv(tmp_path / "dup.csv", "age,age\n1,2\n"), AGE)
    with pytest.raises(InvalidInputError, match="on_bad_value must be 'error' or 'drop'"):
        read_histogram(tmp_path / "e.csv", AGE, on_bad_value="skip")  # type: ignore[arg-type]
    latin = tmp_path / "l.csv"
    latin.write_bytes(b"age\n\xe9\n")
    with pytest.raises(InvalidInputError, match="not UTF-8"):
        read_histogram(latin, AGE)


def test_header_only_gives_empty_histogram(tmp_path: Path) -> None:
    h = read_histogram(write_csv(tmp_path / "h.csv", "person_id,age\n"), AGE, person_column="person_id")
    assert h.total == 0 and h.n_bins == 50 and h.records_read == 0


# --------------------------------------------------------------------------- sample data
def test_sample_csv_deterministic_and_readable(tmp_path: Path) -> None:
    a, b, c, d = (tmp_path / f"{n}.csv" for n in "abcd")
    write_sample_csv(a, seed=5, n_records=3_000, owner_index=0)
    write_sample_csv(b, seed=5, n_records=3_000, owner_index=0)
    write_sample_csv(c, seed=5, n_records=3_000, owner_index=1)
    write_sample_csv(d, seed=6, n_records=3_000, owner_index=0)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes() and a.read_bytes() != d.read_bytes()
    assert a.read_text().splitlines()[0] == ",".join(SAMPLE_COLUMNS)

    raw0 = read_histogram(a, AGE)
    raw1 = read_histogram(c, AGE)
    assert raw0.records_read == raw0.total == 3_000 and raw0.out_of_domain == 0
    centers = np.arange(50) * 2 + 1
    mean0 = float(raw0.counts @ centers) / raw0.total
    mean1 = float(raw1.counts @ centers) / raw1.total
    assert mean1 - mean0 > 6  # different but ...
    assert np.count_nonzero(np.minimum(raw0.counts, raw1.counts)) >= 10  # ... overlapping distributions

    bounded = read_histogram(a, AGE, person_column="person_id", bounds=ContributionBounds(2, 2), rng=1)
    persons = {line.split(",")[0] for line in a.read_text().splitlines()[1:]}
    assert len(persons) == 1_800  # default n_persons = 60% of the records
    assert bounded.records_dropped > 0  # several persons exceed both bounds
    assert bounded.total <= 4 * len(persons)
    default = read_histogram(a, AGE, person_column="person_id", rng=1)
    assert default.total == len(persons)


def test_sample_csv_argument_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="n_records must be an integer >= 1"):
        write_sample_csv(tmp_path / "x.csv", seed=1, n_records=0, owner_index=0)
    with pytest.raises(InvalidInputError, match=r"n_persons must be an integer in \[1, n_records=5\]"):
        write_sample_csv(tmp_path / "x.csv", seed=1, n_records=5, owner_index=0, n_persons=6)
    with pytest.raises(InvalidInputError, match="owner_index must be"):
        write_sample_csv(tmp_path / "x.csv", seed=1, n_records=5, owner_index=-1)


# --------------------------------------------------------------------------- contract and noise
def test_check_bound_matches() -> None:
    h = histogram_from_records([1, 2], AGE, persons=["a", "b"], bounds=ContributionBounds(2, 3), rng=0)
    check_bound_matches(h, 6)
    with pytest.raises(InvalidInputError, match=r"bounded to 6 .*per_bin=2 x max_bins=3.*contribution_bound=1: "
                                                r"its noise would be too small"):
        check_bound_matches(h, 1)
    with pytest.raises(InvalidInputError, match="more noise than this data needs"):
        check_bound_matches(h, 12)
    with pytest.raises(InvalidInputError, match="must be an integer"):
        check_bound_matches(h, 6.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("per_bin, max_bins", [(1, 1), (2, 1), (2, 3), (5, 4)])
def test_noise_scale_follows_the_bound(tmp_path: Path, per_bin: int, max_bins: int) -> None:
    path = tmp_path / "s.csv"
    write_sample_csv(path, seed=11, n_records=2_000, owner_index=2)
    domain = DomainSpec.parse("age:0:100:25")
    h = read_histogram(path, domain, person_column="person_id", bounds=ContributionBounds(per_bin, max_bins), rng=3)
    c = per_bin * max_bins
    assert h.contribution_bound == c
    eps = 0.5
    check_bound_matches(h, c)
    summary = release([h.counts], eps, strategy="gap", contribution_bound=h.contribution_bound, rng=SeededRandom(9))
    _, eps_sum = GapParams().split(eps)
    expected = summary.noise_parties * discrete_laplace_variance(laplace_scale(c, eps_sum))
    assert summary.noise_parties == 2 and summary.contribution_bound == c
    assert summary.sum_variance == (expected,) * summary.n_partitions  # exact
    exact = Fraction(c) / Fraction(eps_sum)  # the scale is c / eps_sum, rounded up to the 2^-20 grid
    assert exact <= laplace_scale(c, eps_sum) < exact + Fraction(1, SCALE_GRID)
