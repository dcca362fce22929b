"""The join's OPRF key shared among K holders (he_partition.join.toprf): any t holders' answers give the single key's
pseudonyms under the combined key, t - 1 holders miss a part of it, and the forms not built are refused by name."""

from __future__ import annotations

import hashlib
from itertools import combinations

import pytest

from he_partition.core.errors import InvalidInputError
from he_partition.join import oprf, toprf


def _keys(holders: int, threshold: int) -> list[toprf.HolderKey]:
    """Each holder's part, from seeds that stand in for its master secret and its pairwise secrets."""
    def seed(*names: int) -> bytes:
        return hashlib.sha256(b"test|" + bytes(sorted(names))).digest()

    if threshold == holders:
        return [toprf.holder_key(i, holders, threshold, "s", "h", own_seed=seed(i)) for i in range(holders)]
    return [toprf.holder_key(i, holders, threshold, "s", "h",
                             pair_seeds={j: seed(i, j) for j in range(holders) if j != i}) for i in range(holders)]


@pytest.mark.parametrize("holders, threshold", [(3, 3), (3, 2)])
def test_any_t_holders_give_the_single_key_pseudonyms_under_the_combined_key(holders: int, threshold: int) -> None:
    keys = _keys(holders, threshold)
    k = toprf.combined_key(keys)  # in a deployment no party holds every part: here, the reference
    inputs = [b"alice@example.org", b"bob@example.org", b"\x00"]
    blinds = oprf.blind_scalars(b"s" * 32, len(inputs))
    blinded = toprf.blind(inputs, blinds)
    single = oprf.finalize(inputs, blinds, oprf.blind_evaluate(k, oprf.blind(inputs, blinds)))
    assert single == [oprf.evaluate(k, x) for x in inputs]
    for route in combinations(range(holders), threshold):
        answers = [toprf.evaluate_share(keys[j], route, "a", 0, blinded) for j in route]
        assert toprf.finalize(inputs, blinds, toprf.combine(answers)) == single, route
        # One answer missing, or one from another page or route, gives nothing that matches.
        assert not set(toprf.finalize(inputs, blinds, toprf.combine(answers[1:]))) & set(single)
        other = toprf.evaluate_share(keys[route[0]], route, "a", 1, blinded)
        if threshold < holders:
            assert not set(toprf.finalize(inputs, blinds, toprf.combine([other] + answers[1:]))) & set(single)
    # t - 1 holders miss a part of k: the sets they hold do not cover every set.
    for coalition in combinations(range(holders), threshold - 1):
        held = {a for j in coalition for a in keys[j].parts}
        assert held != set(toprf.key_sets(holders, threshold))


def test_forms_not_built_routes_and_elements_are_refused_by_name() -> None:
    with pytest.raises(InvalidInputError, match="only K-of-K and"):
        toprf.key_sets(5, 3)
    with pytest.raises(InvalidInputError, match="2 <= t <= K"):
        toprf.key_sets(3, 1)
    key = _keys(3, 2)[0]
    element = toprf.blind([b"x"], oprf.blind_scalars(b"s" * 32, 1))
    with pytest.raises(InvalidInputError, match="does not include holder 0"):
        toprf.evaluate_share(key, (1, 2), "a", 0, element)
    with pytest.raises(InvalidInputError, match="2 distinct holders"):
        toprf.evaluate_share(key, (0, 0), "a", 0, element)
    for bad in (toprf.IDENTITY, b"\xff" * 32, b"\x01" * 31):
        with pytest.raises(InvalidInputError, match="ristretto255"):
            toprf.evaluate_share(key, (0, 1), "a", 0, [bad])
