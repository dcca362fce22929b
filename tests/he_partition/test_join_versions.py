"""Join scheme versions: a contract names its version (absent: 1, 20-bit t), new studies get 2 (23-bit t);
the capacity cap follows the version's t; keys and ciphertexts of another version are refused by name."""

from __future__ import annotations

from typing import Any

import pytest

from he_partition.core.errors import InvalidInputError
from he_partition.he.join_scheme import CURRENT_JOIN_VERSION, JoinParams, JoinScheme, join_plain_modulus
from he_partition.join.protocol import JoinTerms, capacity_for, join_capacity_limit, max_join_capacity

SLOTS = 8192


@pytest.fixture(scope="module")
def v1() -> JoinScheme:
    return JoinScheme.generate(JoinParams.for_version(1))


@pytest.fixture(scope="module")
def v2() -> JoinScheme:
    return JoinScheme.generate(JoinParams.for_version(2))


def _terms(capacity: int, **extra: Any) -> JoinTerms:
    return JoinTerms.from_params({"shape": [2, 2], "capacity": capacity, "padding_epsilon": 1.0,
                                  "padding_offset": 44, **extra}, domain_size=4)


def test_versions_have_their_plain_moduli_and_capacity_caps() -> None:
    assert CURRENT_JOIN_VERSION == 2
    assert join_plain_modulus(1) == 1_032_193 and join_plain_modulus(1).bit_length() == 20
    assert join_plain_modulus(2) == 8_273_921 and join_plain_modulus(2).bit_length() == 23
    assert join_capacity_limit(1) == 507_904 and join_capacity_limit(2) == 4_128_768
    with pytest.raises(InvalidInputError, match="join scheme version 3 is unknown"):
        JoinParams.for_version(3)


def test_a_contract_without_a_version_is_version_1_and_keeps_its_cap() -> None:
    assert _terms(SLOTS).version == 1 and _terms(SLOTS).scheme_params == JoinParams()
    assert _terms(507_904).capacity == 507_904
    with pytest.raises(InvalidInputError, match="up to 507904 .*version 1.*mod t = 1032193.*got 516096"):
        _terms(507_904 + SLOTS)


def test_the_v2_capacity_edge_is_accepted_and_one_group_past_it_refused() -> None:
    top = join_capacity_limit(2)
    assert _terms(top, join_version=2).capacity == top
    with pytest.raises(InvalidInputError, match=f"up to {top} .*version 2.*mod t = 8273921.*got {top + SLOTS}"):
        _terms(top + SLOTS, join_version=2)
    # The acceptance benchmark's 1.5M customers fit version 2 and not version 1.
    assert capacity_for([1_000_000, 1_000_000 - 500_000 + 1], 0.5, 86) == 1_507_328
    with pytest.raises(InvalidInputError, match="above the 507904 .*version 1"):
        capacity_for([1_000_000, 500_001], 0.5, 86, version=1)
    with pytest.raises(InvalidInputError, match="above the 4128768 .*version 2"):
        capacity_for([2_100_000, 2_100_000], 0.5, 86)


@pytest.mark.parametrize("value", [3, 0, "2", 2.0, True])
def test_an_unknown_or_malformed_version_is_refused(value: Any) -> None:
    with pytest.raises(InvalidInputError, match="join_version"):
        _terms(SLOTS, join_version=value)


def test_the_largest_value_of_the_v2_capacity_decodes_centred_and_half_t_wraps(v2: JoinScheme) -> None:
    t = v2.plain_modulus
    assert t == join_plain_modulus(2)
    top = max_join_capacity(t)
    margin = top + SLOTS - 1  # the capacity plus the room for the CS's noise draw
    assert v2.decrypt(v2.encrypt([top, -top, margin, -margin]))[:4].tolist() == [top, -top, margin, -margin]
    assert v2.decrypt(v2.encrypt([(t + 1) // 2]))[0] != (t + 1) // 2


def test_public_keys_record_their_version_and_the_wrong_one_is_refused_by_name(v1: JoinScheme,
                                                                                v2: JoinScheme) -> None:
    assert JoinScheme.from_public(v2.public_bytes()).params == JoinParams.for_version(2)
    assert JoinScheme.from_public(v1.public_bytes()).params == JoinParams.for_version(1)
    with pytest.raises(InvalidInputError, match=r"is for join scheme version 2 \(23-bit plain modulus\), but join "
                                                r"scheme version 1 \(20-bit plain modulus\) is expected"):
        JoinScheme.from_public(v2.public_bytes(), JoinParams.for_version(1))
    with pytest.raises(InvalidInputError, match=r"is for join scheme version 1 .*but join scheme version 2 "):
        JoinScheme.from_public(v1.public_bytes(), JoinParams.for_version(2))
    with pytest.raises(InvalidInputError, match="secret key for join scheme version 1"):
        JoinScheme.from_secret(v1.public_bytes(), v2.secret_bytes())


def test_a_ciphertext_of_the_other_version_is_refused_by_name(v1: JoinScheme, v2: JoinScheme) -> None:
    with pytest.raises(InvalidInputError, match=r"a ciphertext of join scheme version 2 \(23-bit plain modulus\), "
                                                r"but this study uses join scheme version 1"):
        v1.deserialize(v2.serialize(v2.encrypt([1])))
    with pytest.raises(InvalidInputError, match="a ciphertext of join scheme version 1 .*uses join scheme version 2"):
        v2.deserialize(v1.serialize(v1.encrypt([1])))
    with pytest.raises(InvalidInputError, match="not a valid ciphertext for join scheme version 2"):
        v2.deserialize(b"\x5e\xa1" + b"\0" * 64)
    assert v2.decrypt(v2.deserialize(v2.serialize(v2.encrypt([5, -6]))))[:2].tolist() == [5, -6]
