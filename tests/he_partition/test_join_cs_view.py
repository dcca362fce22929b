"""What a curious computation server can read from the posted pseudonym lists, and the join terms that bound it:
no common tail, no set-size shortcut to |A n B|, no file order; delta stated and bounded; counts that cannot wrap."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from scipy import stats

from he_partition.core.errors import InvalidInputError
from he_partition.he.join_scheme import JoinScheme
from he_partition.join.protocol import (
    JOIN_PLAIN_MODULUS,
    MAX_PADDING_DELTA,
    JoinKeyPair,
    JoinTerms,
    capacity_for,
    max_join_capacity,
    min_padding_offset,
    padding_delta,
    posted_pseudonyms,
)
from he_partition.join.release import summary_params

SLOTS = 8192


def _pair(rng: np.random.Generator) -> JoinKeyPair:
    return JoinKeyPair(X25519PrivateKey.from_private_bytes(rng.bytes(32)))


def _terms(eps: float, offset: int, capacity: int = SLOTS) -> JoinTerms:
    return JoinTerms.from_params({"shape": [2, 2], "capacity": capacity, "padding_epsilon": eps,
                                  "padding_offset": offset}, domain_size=4)


def _posted(rng: np.random.Generator, a_ids: list[str], b_ids: list[str],
            terms: JoinTerms) -> tuple[list[bytes], list[bytes]]:
    pa, pb = _pair(rng), _pair(rng)
    key = pa.join_key(pb.public_bytes, study_id="s", contract_hash="h")
    la, _ = posted_pseudonyms(pa, key, a_ids, terms, study_id="s")
    lb, _ = posted_pseudonyms(pb, pb.join_key(pa.public_bytes, study_id="s", contract_hash="h"), b_ids, terms,
                              study_id="s")
    return la, lb


def _common_tail(a: list[bytes], b: list[bytes]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


@pytest.mark.statistical
def test_the_cs_estimate_of_the_intersection_is_no_better_than_the_padding_allows() -> None:
    """Two attacks from the issue, on the lists a CS stores: (1) matched minus the common tail was |A n B| exactly
    (the shared dummies were appended last); (2) with |A| public, matched - (|A list| - |A|) cancelled the shared
    dummies. Now (1) misses by the whole padding and (2) is off by the owner's private padding, whose spread is
    the discrete Laplace sd at padding_epsilon / 3 (seeded keys, 300 studies)."""
    rng = np.random.default_rng(25)
    eps = 1.5
    terms = _terms(eps, min_padding_offset(eps))
    tail_errors, size_errors = [], []
    for trial in range(300):
        shared = int(rng.integers(0, 40))
        a_ids = [f"a{trial}-{i}" for i in range(60 - shared)] + [f"s{trial}-{i}" for i in range(shared)]
        b_ids = [f"s{trial}-{i}" for i in range(shared)] + [f"b{trial}-{i}" for i in range(50 - shared)]
        la, lb = _posted(rng, a_ids, b_ids, terms)
        matched = len(set(la) & set(lb))
        tail_errors.append(matched - _common_tail(la, lb) - shared)
        size_errors.append(matched - (len(la) - len(a_ids)) + terms.padding_offset - shared)
    assert np.mean(np.asarray(tail_errors) == 0) < 0.02, tail_errors[:20]  # was exact in every trial
    q = math.exp(-eps / 3)
    sd = math.sqrt(2 * q) / (1 - q)  # discrete Laplace at eps/3
    assert 0.8 * sd < np.std(size_errors) < 1.25 * sd, (np.std(size_errors), sd)  # was 0
    assert abs(np.mean(size_errors)) < 4 * sd / math.sqrt(300)


@pytest.mark.statistical
def test_posted_order_is_independent_of_the_file_order() -> None:
    """A's file sorted by its attribute: the rank of each record's pseudonym in the posted list is uncorrelated
    with its place in the file (was the identity, rho = 1), dummies included anywhere in the list."""
    rng = np.random.default_rng(7)
    ids = [f"person-{i}" for i in range(3000)]  # in file order, e.g. sorted by age
    pa, pb = _pair(rng), _pair(rng)
    key = pa.join_key(pb.public_bytes, study_id="s", contract_hash="h")
    posted, real = posted_pseudonyms(pa, key, ids, _terms(1.0, min_padding_offset(1.0)), study_id="s")
    rank = {p: i for i, p in enumerate(posted)}
    rho = stats.spearmanr(np.arange(len(ids)), [rank[p] for p in real]).statistic
    assert abs(rho) < 4 / math.sqrt(len(ids)), rho
    real_set = set(real)
    where_dummies = [i for i, p in enumerate(posted) if p not in real_set]
    assert stats.kstest(np.asarray(where_dummies) / len(posted), "uniform").pvalue > 1e-6
    assert posted == sorted(posted)


def test_padding_delta_is_stated_and_terms_above_the_bound_are_refused() -> None:
    for eps in (0.1, 0.5, 1.0, 2.0):
        k = min_padding_offset(eps)
        assert padding_delta(eps, k) <= MAX_PADDING_DELTA < padding_delta(eps, k - 1)
    assert min_padding_offset(0.1) == 428 and min_padding_offset(1.0) == 44
    a = 0.5 / 3  # the exact value: three clamps, P(X <= -k) = exp(-a k) / (1 + exp(-a)) each
    assert padding_delta(0.5, 86) == pytest.approx(3 * math.exp(-a * 86) / (1 + math.exp(-a)), rel=1e-12)
    with pytest.raises(InvalidInputError, match="padding_offset >= 1, got 0.1 and 0"):
        _terms(0.1, 0)
    with pytest.raises(InvalidInputError, match=r"delta 0\.0544, above the bound 1e-06: use padding_offset >= 428"):
        _terms(0.1, 100)  # the old CLI default
    terms = _terms(0.1, 428)
    stated = {"shape": [2, 2], "capacity": SLOTS, "padding_epsilon": 0.1, "padding_offset": 428}
    assert JoinTerms.from_params({**stated, "padding_delta": terms.delta}, domain_size=4) == terms
    with pytest.raises(InvalidInputError, match="states padding_delta 1e-09, but"):
        JoinTerms.from_params({**stated, "padding_delta": 1e-9}, domain_size=4)  # a contract that understates it
    join = summary_params(terms)["join"]
    assert join["padding_delta"] == terms.delta <= MAX_PADDING_DELTA and join["padding_offset"] == 428


def test_a_capacity_whose_counts_could_wrap_is_refused_at_the_edge() -> None:
    top = max_join_capacity(JOIN_PLAIN_MODULUS)  # version 1, the version of contracts that name none
    assert top == 507_904 and top + SLOTS > (JOIN_PLAIN_MODULUS - 1) // 2 - SLOTS
    assert _terms(1.0, 44, top).capacity == top
    for capacity in (top + SLOTS, 1 << 22):  # 4.19M was accepted and wrapped past 516,096 shared customers
        with pytest.raises(InvalidInputError, match=f"up to {top} .*mod t = 1032193.*got {capacity}"):
            _terms(1.0, 44, capacity)


def test_the_largest_value_of_the_largest_capacity_decodes_and_one_past_half_t_wraps() -> None:
    ds = JoinScheme.generate()
    assert ds.plain_modulus == JOIN_PLAIN_MODULUS
    top = max_join_capacity(ds.plain_modulus)
    margin = top + SLOTS - 1  # the capacity plus the room left for the CS's noise draw
    assert ds.decrypt(ds.encrypt([top, -top, margin, -margin]))[:4].tolist() == [top, -top, margin, -margin]
    wrap = (JOIN_PLAIN_MODULUS + 1) // 2  # the first count that does not come back
    assert ds.decrypt(ds.encrypt([wrap]))[0] != wrap


def test_the_capacity_is_sized_from_the_record_counts_and_refused_before_anything_opens() -> None:
    """Both owners' records plus three paddings of at most 2 x offset each, in whole groups of 8,192."""
    assert capacity_for([400, 400], 0.2, 214) == SLOTS
    assert capacity_for([4000, 2907], 0.5, 86) == SLOTS  # 6,907 + 516 = 7,423
    assert capacity_for([4000, 3677], 0.5, 86) == 2 * SLOTS  # 8,193
    assert capacity_for([250_000, 250_000], 0.1, 428, version=1) == max_join_capacity() == 62 * SLOTS
    with pytest.raises(InvalidInputError, match="need a join capacity of 516096, above the 507904"):
        capacity_for([256_000, 250_000], 0.1, 428, version=1)
    assert capacity_for([256_000, 250_000], 0.1, 428) == 516_096  # version 2, what new studies get
    with pytest.raises(InvalidInputError, match="two numbers >= 1"):
        capacity_for([10], 0.1, 428)
