"""The contract term noise_tolerates (T): its canonical form, round trips, old hashes, and T >= K refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from parties.wire.v1 import decryption_pb2
from he_partition.core.errors import InvalidInputError
from parties.common.contract import CONTRACT_VERSION_V1, StudyContract
from parties.common.convert import contract_from_proto, contract_to_proto, open_study_kwargs, open_study_request

FP = "0123456789abcdef" * 4
TERMS: dict[str, Any] = dict(study_id="s-t", domain_size=64, epsilon=1.0, expected_owners=("a", "b", "c"),
                             context_fingerprint=FP, strategy="hier")
#: The hashes of TERMS as the code before noise_tolerates computed them (v2 and v1 canonical forms).
HASH_V2 = "c8ab30e069184c368d091665a0a6a9b8e4b82a29aa7679c4abf2cdb2a20e68c8"
HASH_V1 = "926cf55bcfc47e2b380c9a05b4c5f17c0c0f733e86688464af894c914d6ba5e0"


def test_t_0_keeps_the_canonical_form_and_hash_of_contracts_written_before_the_term() -> None:
    plain = StudyContract(**TERMS)
    assert plain.noise_tolerates == 0 and "noise_tolerates" not in plain.to_dict()
    assert plain.contract_hash == HASH_V2 == StudyContract(**TERMS, noise_tolerates=0).contract_hash
    assert StudyContract(**TERMS, version=CONTRACT_VERSION_V1).contract_hash == HASH_V1
    assert StudyContract.from_dict(plain.to_dict()).noise_tolerates == 0


def test_t_is_part_of_the_hash_and_round_trips_through_json_and_proto() -> None:
    c = StudyContract(**TERMS, noise_tolerates=2)
    assert '"noise_tolerates":2' in c.canonical_json()
    assert c.contract_hash != HASH_V2
    assert StudyContract.from_json(c.canonical_json()) == c
    assert StudyContract.from_dict(json.loads(json.dumps({**c.to_dict(), "noise_tolerates": 2.0}))) == c
    p = contract_to_proto(c)
    assert p.noise_tolerates == 2
    assert contract_from_proto(p) == c  # the hash the proto carries is checked
    p.noise_tolerates = 1
    with pytest.raises(InvalidInputError, match="contract hash mismatch"):
        contract_from_proto(p)


def test_an_open_study_request_leaves_t_unset_unless_given() -> None:
    base: dict[str, Any] = dict(study_id="s", domain_size=4, epsilon=1.0, expected_owners=["a"], strategy="",
                                contribution_bound=1, noise_parties=2, strategy_params_json="", domain_spec="",
                                owner_keys=None, correlation_leakage=0.0, correlation_source="")
    unset = decryption_pb2.OpenStudyRequest.FromString(open_study_request(**base).SerializeToString())
    assert open_study_kwargs(unset)["noise_tolerates"] is None
    for t in (0, 2):
        given = decryption_pb2.OpenStudyRequest.FromString(
            open_study_request(**base, noise_tolerates=t).SerializeToString())
        assert open_study_kwargs(given)["noise_tolerates"] == t


def test_t_at_or_above_k_is_refused_naming_noise_tolerates_and_k() -> None:
    c = StudyContract(**TERMS, noise_tolerates=2)
    c.check_key_holders(3)
    assert c.holder_noise_variance(3) == 3.0 and StudyContract(**TERMS).holder_noise_variance(3) == 1.0
    assert StudyContract(**TERMS, noise_tolerates=1).holder_noise_variance(4) == pytest.approx(4 / 3)
    with pytest.raises(InvalidInputError, match=r"noise_tolerates is 2 but there are K = 2 key holder\(s\)"):
        c.check_key_holders(2)
    with pytest.raises(InvalidInputError, match="K = 1 .*single decryption server"):
        StudyContract(**TERMS, noise_tolerates=1).check_key_holders(1)
    StudyContract(**TERMS).check_key_holders(1)


@pytest.mark.parametrize("bad", [-1, 64, True, 1.5, "2"])
def test_a_t_that_is_no_holder_count_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="noise_tolerates"):
        StudyContract.create(**TERMS, noise_tolerates=bad)
