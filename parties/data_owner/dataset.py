"""Data-owner input: records from a CSV to a histogram with each person's contribution bounded.

The domain grammar (`DomainSpec`, which value goes to which bin) is in `domain.py`.

Privacy meaning (Wilson et al., "Differentially Private SQL with Bounded User
Contribution", PETS 2020; seed 004). Differential privacy protects one *record*; when one
person can own several records, the study must protect the *person*. The data owner
therefore bounds every person's contribution **before encryption**, in two ways:

- per-partition (``per_bin``): at most ``per_bin`` of a person's records count in any one bin;
- cross-partition (``max_bins``): a person counts in at most ``max_bins`` distinct bins,
  chosen uniformly at random among that person's bins (never by a data-dependent rule such
  as "the most frequent bins", which would make the selection itself leak).

After bounding, adding or removing all records of one person changes the histogram by at
most ``per_bin`` in each of at most ``max_bins`` bins: an L1 change of at most
``contribution_bound = per_bin * max_bins``. Every sensitivity of the study is multiplied
by this bound (the gap strategy uses L1 sensitivity 2c for adjacent differences and c for
partition sums), so the noise scale grows linearly with it. The bounds must be fixed in
advance from public knowledge, never tuned on the data.

Requirements on whoever builds the study:

- The study contract records the contribution bound, and the sensitivity used for every
  measurement must equal the ``contribution_bound`` recorded in each owner's
  ``BoundedHistogram``. A mismatch must be refused (``check_bound_matches``): a histogram
  bounded more loosely than the contract would be under-noised.
- The bound holds *per data owner*. If the same person can appear at k data owners, one
  person can change the aggregate by up to k * c; the contract must then use k * c (or the
  owners must hold disjoint populations).
- Without a person column every record is treated as its own person: the guarantee is then
  per record (a person with r records gets r * epsilon by group privacy), although the
  declared ``per_bin * max_bins`` is still recorded and used for the noise.

This module is pure (numpy and the csv standard library); it neither encrypts nor talks to
any server, and adds no DP noise. Its only randomness is the choice of bins to keep for
persons above ``max_bins``; it comes from a ``he_partition.core.noise.RandomSource``
(``CipherRandom``, AES-CTR under a fresh OS key, by default, so nobody can predict which records were kept).
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Sequence

import numpy as np
import numpy.typing as npt

from he_partition.core.errors import InvalidInputError
from he_partition.core.noise import RandomSource, as_random_source

from .domain import DomainSpec

__all__ = [
    "ContributionBounds",
    "BoundedHistogram",
    "read_histogram",
    "histogram_from_records",
    "histogram_from_frame",
    "check_bound_matches",
    "write_sample_csv",
    "SAMPLE_COLUMNS",
]

IntArray = npt.NDArray[np.int64]

#: Columns written by `write_sample_csv`, in order.
SAMPLE_COLUMNS = ("person_id", "age", "income")

# --------------------------------------------------------------------------- bounds
@dataclass(frozen=True)
class ContributionBounds:
    """Per-person contribution bounds, fixed in advance from public knowledge.

    ``per_bin``: at most this many records of one person count in any one bin
    (per-partition bound). ``max_bins``: one person counts in at most this many distinct
    bins (cross-partition bound). Default (1, 1): one record per person.
    """

    per_bin: int = 1
    max_bins: int = 1

    def __post_init__(self) -> None:
        for name in ("per_bin", "max_bins"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InvalidInputError(f"{name} must be an integer >= 1, got {v!r}")
            object.__setattr__(self, name, int(v))

    @property
    def contribution_bound(self) -> int:
        """L1 bound c on one person's contribution to the histogram: per_bin * max_bins.

        Every sensitivity of the study is multiplied by c (so is the noise scale).
        """
        return self.per_bin * self.max_bins


@dataclass(frozen=True, eq=False)
class BoundedHistogram:
    """A data owner's histogram after contribution bounding, ready to be encrypted.

    ``counts[i]``: records kept in bin i (int64, read-only). ``contribution_bound``: the L1
    bound c = bounds.per_bin * bounds.max_bins on one person's contribution; the study's
    contract must use exactly this value (see `check_bound_matches`).

    Accounting, always ``counts.sum() + records_dropped + out_of_domain == records_read``:
    ``records_read`` every data record seen; ``out_of_domain`` records with no bin (value
    outside the domain, or unparsable and skipped with ``on_bad_value="drop"``);
    ``records_dropped`` in-domain records removed by contribution bounding. These counts are
    for the data owner's own information: they are not DP and must not be released.
    """

    counts: IntArray
    contribution_bound: int
    records_read: int
    records_dropped: int
    out_of_domain: int
    bounds: ContributionBounds = field(default_factory=ContributionBounds)

    def __post_init__(self) -> None:
        raw = np.asarray(self.counts)
        if raw.dtype.kind not in "iu" and not (raw.dtype.kind == "f" and np.all(raw == np.rint(raw))):
            raise InvalidInputError(f"counts must be integers, got dtype {raw.dtype}")
        counts = np.array(raw, dtype=np.int64, copy=True)
        if counts.ndim != 1 or counts.size == 0:
            raise InvalidInputError(f"counts must be a non-empty 1-D array, got shape {counts.shape}")
        if np.any(counts < 0):
            raise InvalidInputError("counts must be non-negative")
        counts.flags.writeable = False
        object.__setattr__(self, "counts", counts)
        if self.contribution_bound != self.bounds.contribution_bound:
            raise InvalidInputError(
                f"contribution_bound {self.contribution_bound} does not equal per_bin * max_bins = "
                f"{self.bounds.contribution_bound} of {self.bounds}"
            )
        for name in ("records_read", "records_dropped", "out_of_domain"):
            if int(getattr(self, name)) < 0:
                raise InvalidInputError(f"{name} must be >= 0, got {getattr(self, name)}")
        if int(counts.sum()) + self.records_dropped + self.out_of_domain != self.records_read:
            raise InvalidInputError(
                f"inconsistent accounting: {int(counts.sum())} counted + {self.records_dropped} dropped + "
                f"{self.out_of_domain} out of domain != {self.records_read} read"
            )

    @property
    def n_bins(self) -> int:
        return int(self.counts.size)

    @property
    def total(self) -> int:
        """Number of records counted in the histogram."""
        return int(self.counts.sum())


def check_bound_matches(histogram: BoundedHistogram, contract_bound: int) -> None:
    """Refuse a histogram whose contribution bound differs from the study contract's.

    The study's noise is calibrated to ``contract_bound``; a histogram bounded more loosely
    would be under-noised (the privacy promise breaks), one bounded more tightly would be
    needlessly noisy and signals a configuration error. Either way: InvalidInputError.
    """
    if isinstance(contract_bound, bool) or not isinstance(contract_bound, (int, np.integer)):
        raise InvalidInputError(f"the contract's contribution bound must be an integer, got {contract_bound!r}")
    if histogram.contribution_bound != int(contract_bound):
        b = histogram.bounds
        why = (
            "its noise would be too small for this data (the privacy promise would not hold)"
            if histogram.contribution_bound > contract_bound
            else "the study would add more noise than this data needs"
        )
        raise InvalidInputError(
            f"the histogram was bounded to {histogram.contribution_bound} records per person "
            f"(per_bin={b.per_bin} x max_bins={b.max_bins}) but the study contract uses contribution_bound="
            f"{int(contract_bound)}: {why}. Re-read the data with bounds whose per_bin * max_bins equals "
            f"{int(contract_bound)}, or use a study opened with contribution_bound={histogram.contribution_bound}"
        )


# --------------------------------------------------------------------------- bounding
def _factorize(persons: npt.NDArray[Any]) -> IntArray:
    """Dense integer code per person id (equal ids -> equal codes)."""
    if persons.dtype.kind in "iubUS":
        _, codes = np.unique(persons, return_inverse=True)
        return np.asarray(codes, dtype=np.int64).ravel()
    table: dict[Any, int] = {}
    try:
        out = [table.setdefault(p, len(table)) for p in persons.tolist()]
    except TypeError as exc:
        raise InvalidInputError(f"person ids must be hashable (strings or integers): {exc}") from exc
    return np.asarray(out, dtype=np.int64)


def _choose_bins(pair_person: IntArray, max_bins: int, rng: RandomSource) -> npt.NDArray[np.bool_]:
    """Mask over (person, bin) pairs, sorted by person: at most `max_bins` kept per person.

    For each person with more than `max_bins` distinct bins, a uniformly random subset of
    size `max_bins` is kept (partial Fisher-Yates shuffle with exact uniform integers from
    `rng`, vectorised across persons). The choice ignores how many records each bin holds.
    """
    n_pairs = pair_person.size
    keep = np.ones(n_pairs, dtype=bool)
    if n_pairs == 0:
        return keep
    starts = np.flatnonzero(np.r_[True, pair_person[1:] != pair_person[:-1]])
    sizes = np.diff(np.r_[starts, n_pairs])
    over = sizes > max_bins
    if not over.any():
        return keep
    s = starts[over]
    k = sizes[over]
    perm = np.arange(n_pairs)
    for j in range(max_bins):
        a = s + j
        b = a + rng.integers(k - j, s.size)
        tmp = perm[a].copy()
        perm[a] = perm[b]
        perm[b] = tmp
    keep[np.repeat(over, sizes)] = False
    chosen = perm[(s[:, None] + np.arange(max_bins)[None, :]).ravel()]
    keep[chosen] = True
    return keep


def histogram_from_records(
    values: npt.ArrayLike | Sequence[Any],
    domain: DomainSpec,
    *,
    persons: npt.ArrayLike | Sequence[Any] | None = None,
    bounds: ContributionBounds = ContributionBounds(),
    rng: RandomSource | int | None = None,
) -> BoundedHistogram:
    """Histogram of in-memory records over `domain`, with each person's contribution bounded.

    ``values[r]`` is record r's value in the domain's column; ``persons[r]`` (optional) its
    person id. Records outside the domain are counted in ``out_of_domain`` and do not use up
    a person's bins. With ``persons``: for each person, at most ``bounds.max_bins`` of its
    distinct bins are kept, chosen uniformly at random (from `rng`), and in each kept bin at
    most ``bounds.per_bin`` of its records count (a person's records in one bin are
    interchangeable for the histogram, so keeping min(n, per_bin) equals a random sample).
    Without ``persons`` each record is its own person and nothing is dropped; the declared
    bound is still recorded (see the module docstring).

    Privacy: no noise is added here. The result's L1 sensitivity to adding or removing one
    person (all their records at this owner) is at most ``bounds.contribution_bound``, and
    the study must calibrate its noise to exactly that value. ``rng``: None uses
    ``CipherRandom`` (production); an int seed or a ``SeededRandom`` is for tests only.
    """
    if not isinstance(domain, DomainSpec):
        raise InvalidInputError(f"domain must be a DomainSpec, got {type(domain).__name__}")
    if not isinstance(bounds, ContributionBounds):
        raise InvalidInputError(f"bounds must be a ContributionBounds, got {type(bounds).__name__}")
    source = as_random_source(rng)
    bins = np.asarray(domain.bin_of(values), dtype=np.int64)
    if bins.ndim != 1:
        raise InvalidInputError(f"values must be 1-D (one value per record), got shape {bins.shape}")
    n = bins.size
    n_bins = domain.n_bins
    inside = bins >= 0
    out_of_domain = int(n - np.count_nonzero(inside))
    counts = np.zeros(n_bins, dtype=np.int64)
    if persons is None:
        np.add.at(counts, bins[inside], 1)
    else:
        pers = np.asarray(persons)
        if pers.ndim != 1 or pers.size != n:
            raise InvalidInputError(
                f"persons must hold one id per record: {n} values but persons has shape {pers.shape}"
            )
        codes = _factorize(pers)[inside]
        b = bins[inside]
        pair = codes * np.int64(n_bins) + b
        upair, n_in_pair = np.unique(pair, return_counts=True)
        pair_person = upair // n_bins
        pair_bin = upair % n_bins
        kept_per_pair = np.minimum(n_in_pair, bounds.per_bin).astype(np.int64)
        keep = _choose_bins(pair_person, bounds.max_bins, source)
        np.add.at(counts, pair_bin[keep], kept_per_pair[keep])
    dropped = int(n - out_of_domain - int(counts.sum()))
    return BoundedHistogram(
        counts=counts,
        contribution_bound=bounds.contribution_bound,
        records_read=int(n),
        records_dropped=dropped,
        out_of_domain=out_of_domain,
        bounds=bounds,
    )


# --------------------------------------------------------------------------- CSV
def _column_index(header: list[str], name: str, path: str, role: str) -> int:
    hits = [i for i, h in enumerate(header) if h == name]
    if not hits:
        present = ", ".join(repr(h) for h in header) or "(none)"
        raise InvalidInputError(
            f"{path}: no {role} column {name!r}; the columns present are {present}. "
            "Pass one of these names (matching is exact and case-sensitive)"
        )
    if len(hits) > 1:
        raise InvalidInputError(f"{path}: column {name!r} appears {len(hits)} times in the header; rename the duplicates")
    return hits[0]


def read_histogram(
    path: str | os.PathLike[str] | Any,
    domain: DomainSpec,
    *,
    person_column: str | None = None,
    bounds: ContributionBounds = ContributionBounds(),
    rng: RandomSource | int | None = None,
    on_bad_value: Literal["error", "drop"] = "error",
    drop_hint: str = "on_bad_value='drop'",
) -> BoundedHistogram:
    """Read a CSV file (header row first), or a pandas DataFrame, and build its contribution-bounded histogram.

    The value of column ``domain.column`` is mapped to a bin (`DomainSpec.bin_of`); with
    ``person_column`` the records are grouped by that column's value and each person's
    contribution is bounded as in `histogram_from_records` (applied here, before any
    encryption; see the module docstring for the privacy meaning). Without it every record
    is its own person.

    Fields are stripped of surrounding whitespace; completely empty lines are skipped; the
    file is read as UTF-8 (a byte-order mark is ignored). A value is *bad* when it is empty,
    not a number (numeric domain) or NaN, when the person id is empty, or when the row has
    another number of fields than the header (an unquoted comma shifts every column). With
    ``on_bad_value="error"`` (default) the first bad value raises InvalidInputError naming
    the line and the value (and `drop_hint`, how the caller asks for dropping: the CLI
    names its flag); with ``"drop"`` such records are skipped and counted in
    ``out_of_domain``. Values that parse but fall outside the domain (including +-inf)
    always count in ``out_of_domain``.

    A pandas DataFrame in place of ``path`` is read the same way, its rows for the CSV's lines
    (`histogram_from_frame`): the same columns, the same bad values, the same bounding.
    """
    if on_bad_value not in ("error", "drop"):
        raise InvalidInputError(f"on_bad_value must be 'error' or 'drop', got {on_bad_value!r}")
    if not isinstance(domain, DomainSpec):
        raise InvalidInputError(f"domain must be a DomainSpec, got {type(domain).__name__}")
    if not isinstance(path, (str, os.PathLike)) and hasattr(path, "columns"):
        return histogram_from_frame(path, domain, person_column=person_column, bounds=bounds, rng=rng,
                                    on_bad_value=on_bad_value, drop_hint=drop_hint)
    shown = os.fspath(path)
    numeric = not domain.is_categorical
    values: list[Any] = []
    persons: list[str] = []
    n_bad = 0
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise InvalidInputError(f"{shown} is empty: expected a header row naming the columns")
            header = [h.strip() for h in header]
            vi = _column_index(header, domain.column, shown, "value")
            pi = None if person_column is None else _column_index(header, person_column, shown, "person id")
            for row in reader:
                if not row or all(not f.strip() for f in row):
                    continue
                problem = None
                raw = row[vi].strip() if vi < len(row) else None
                person = None
                if raw is None:
                    problem = f"has no field for column {domain.column!r} (only {len(row)} fields)"
                elif len(row) != len(header):
                    problem = (f"has {len(row)} fields but the header has {len(header)} (an unquoted comma in a "
                               "value?)")
                elif raw == "":
                    problem = f"has an empty value in column {domain.column!r}"
                if problem is None and pi is not None:
                    person = row[pi].strip() if pi < len(row) else ""
                    if person == "":
                        problem = f"has no person id in column {person_column!r}"
                value: Any = raw
                if problem is None and numeric:
                    try:
                        value = float(raw)  # type: ignore[arg-type]
                    except ValueError:
                        problem = f"has value {raw!r} in column {domain.column!r}, which is not a number"
                    else:
                        if math.isnan(value):
                            problem = f"has value {raw!r} (NaN) in column {domain.column!r}"
                if problem is not None:
                    if on_bad_value == "drop":
                        n_bad += 1
                        continue
                    raise InvalidInputError(
                        f"{shown}: line {reader.line_num} {problem}; fix the file or pass {drop_hint} to skip "
                        "such records"
                    )
                values.append(value)
                if person is not None:
                    persons.append(person)
    except OSError as exc:
        raise InvalidInputError(f"cannot read {shown}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{shown} is not UTF-8 text: {exc}") from exc
    except csv.Error as exc:
        raise InvalidInputError(f"{shown} is not valid CSV: {exc}") from exc

    vals: npt.NDArray[Any] = (
        np.asarray(values, dtype=np.float64) if numeric else np.asarray(values, dtype=object)
    )
    hist = histogram_from_records(
        vals,
        domain,
        persons=None if person_column is None else np.asarray(persons, dtype=object),
        bounds=bounds,
        rng=rng,
    )
    if n_bad:
        hist = replace(hist, records_read=hist.records_read + n_bad, out_of_domain=hist.out_of_domain + n_bad)
    return hist


def histogram_from_frame(
    frame: Any,
    domain: DomainSpec,
    *,
    person_column: str | None = None,
    bounds: ContributionBounds = ContributionBounds(),
    rng: RandomSource | int | None = None,
    on_bad_value: Literal["error", "drop"] = "error",
    drop_hint: str = "on_bad_value='drop'",
) -> BoundedHistogram:
    """`read_histogram` of a pandas DataFrame: one record per row, the value in column ``domain.column``, the
    person id in ``person_column``. A value is bad when it is missing (None, NaN), an empty string, or (numeric
    domain) not a number; a person id when it is missing or empty. Bad rows raise InvalidInputError naming
    the row's index label, or with ``on_bad_value="drop"`` are skipped and counted in ``out_of_domain``.
    Privacy: as `histogram_from_records` (no noise; L1 sensitivity ``bounds.contribution_bound``)."""
    columns = [str(c) for c in frame.columns]
    shown = "the DataFrame"
    _column_index(columns, domain.column, shown, "value")
    if person_column is not None:
        _column_index(columns, person_column, shown, "person id")
    raw = np.asarray(frame[domain.column].to_numpy(dtype=object), dtype=object)
    bad = np.array([v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v.strip())
                    for v in raw.tolist()], dtype=bool)
    values: npt.NDArray[Any] = raw
    if not domain.is_categorical:
        numbers = np.full(raw.size, np.nan)
        for i, v in enumerate(raw.tolist()):
            if bad[i]:
                continue
            try:
                numbers[i] = float(v.strip() if isinstance(v, str) else v)
            except (TypeError, ValueError):
                bad[i] = True
        bad |= np.isnan(numbers)
        values = numbers
    persons: npt.NDArray[Any] | None = None
    if person_column is not None:
        persons = np.asarray(frame[person_column].to_numpy(dtype=object), dtype=object)
        bad |= np.array([p is None or (isinstance(p, float) and math.isnan(p)) or (isinstance(p, str) and not p.strip())
                         for p in persons.tolist()], dtype=bool)
    if bad.any() and on_bad_value == "error":
        i = int(np.argmax(bad))
        shown_person = "" if persons is None else f", person id {persons[i]!r}"
        raise InvalidInputError(
            f"the DataFrame's row {frame.index[i]!r} has a missing or bad value {raw[i]!r} in column "
            f"{domain.column!r}{shown_person}; fix the frame or pass {drop_hint} to skip such records")
    keep = ~bad
    hist = histogram_from_records(values[keep], domain, persons=None if persons is None else persons[keep],
                                  bounds=bounds, rng=rng)
    n_bad = int(bad.sum())
    if n_bad:
        hist = replace(hist, records_read=hist.records_read + n_bad, out_of_domain=hist.out_of_domain + n_bad)
    return hist


# --------------------------------------------------------------------------- sample data
def write_sample_csv(
    path: str | os.PathLike[str],
    *,
    seed: int,
    n_records: int,
    owner_index: int,
    n_persons: int | None = None,
) -> None:
    """Write seeded demo records (columns person_id, age, income) for data owner `owner_index`.

    Deterministic for (seed, owner_index, n_records, n_persons). Owners' age distributions
    differ but overlap (a main mode at 30 + 12 * (owner_index % 4) years plus an older
    minority mode). Every person has at least one record; the remaining records go to
    persons drawn with Zipf-like weights, so a few persons have many records. A person's
    records carry the age at the time of each record (base age + 0..3 years), so a heavy
    person has several records in one bin and records in a few neighbouring bins: both
    bounds visibly drop records. Person ids are prefixed with the owner, so owners' persons
    are disjoint. This is synthetic data, not private; its generator is numpy PCG64, never
    used for noise. Default n_persons: 60% of n_records (at least 1).
    """
    for name, v, lo in (("seed", seed, 0), ("n_records", n_records, 1), ("owner_index", owner_index, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise InvalidInputError(f"{name} must be an integer >= {lo}, got {v!r}")
    if n_persons is None:
        n_persons = max(1, (int(n_records) * 3) // 5)
    if isinstance(n_persons, bool) or not isinstance(n_persons, (int, np.integer)) or not 1 <= n_persons <= n_records:
        raise InvalidInputError(f"n_persons must be an integer in [1, n_records={n_records}], got {n_persons!r}")
    n_records, n_persons = int(n_records), int(n_persons)
    gen = np.random.Generator(np.random.PCG64([int(seed), int(owner_index)]))

    center = 30.0 + 12.0 * (int(owner_index) % 4)
    older = gen.random(n_persons) < 0.25
    base_age = np.where(older, gen.normal(center + 28.0, 6.0, n_persons), gen.normal(center, 10.0, n_persons))
    base_age = np.clip(np.rint(base_age), 18, 95).astype(np.int64)
    log_income = np.log(28_000.0) + 0.012 * (base_age - 18) + gen.normal(0.0, 0.45, n_persons)
    income = (np.rint(np.exp(log_income) / 100.0) * 100).astype(np.int64)

    extra = n_records - n_persons
    rank = gen.permutation(n_persons)  # which persons are heavy is random
    weights = 1.0 / (rank + 1.0) ** 1.1
    weights /= weights.sum()
    owner_of = np.concatenate([np.arange(n_persons), gen.choice(n_persons, size=extra, p=weights)])
    age = np.minimum(base_age[owner_of] + gen.integers(0, 4, n_records), 99)
    order = gen.permutation(n_records)

    try:
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(SAMPLE_COLUMNS)
            for r in order:
                p = int(owner_of[r])
                w.writerow((f"owner{owner_index}-p{p:06d}", int(age[r]), int(income[p])))
    except OSError as exc:
        raise InvalidInputError(f"cannot write {os.fspath(path)}: {exc.strerror or exc}") from exc
