"""The study contract's canonical form and hash, the key store's file modes, the public context served."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from he_partition.he.bfv import context_fingerprint, load_context
from he_partition.core.errors import BudgetExhaustedError, InvalidInputError, PrecisionError
from parties.common.contract import CONTRACT_VERSION_V1, StudyContract, canonical_json
from parties.common.convert import contract_from_proto, contract_to_proto
from parties.common.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
    ServiceError,
    status_for,
)
from parties.decryption.keys import KeyStore

from .conftest import Cluster

FP = "0123456789abcdef" * 4


def test_v2_contracts_hash_their_rfc8785_canonical_json() -> None:
    """New contracts (v2) hash RFC 8785 JSON: "1" not "1.0", keys in UTF-16 order; v1 texts stay as pinned below."""
    c = StudyContract(study_id="s1", domain_size=100, epsilon=1.0, expected_owners=("b", "a"),
                      context_fingerprint=FP, domain_spec="age:0:100:100", strategy="gap",
                      strategy_params_json='{"threshold_k":2.0,"gap_fraction":0.25}')
    text = c.canonical_json()
    assert text == (
        '{"context_fingerprint":"' + FP + '","contribution_bound":1,"domain_size":100,"domain_spec":"age:0:100:100",'
        '"epsilon":1,"expected_owners":["a","b"],"noise_parties":2,"strategy":"gap",'
        '"strategy_params":{"gap_fraction":0.25,"threshold_k":2},"study_id":"s1","version":"dpagg.contract.v2"}'
    )
    assert c.contract_hash == hashlib.sha256(text.encode()).hexdigest()
    assert c.contract_hash == "db2d6ce1c25e1c82c65f1a2486b6edfbcb26a063e3499eb3b68c028daa67a6f2"  # Node agrees
    assert StudyContract.from_json(text).contract_hash == c.contract_hash  # the text round-trips to the same terms


def test_contract_canonical_json_and_hash_are_pinned() -> None:
    c = StudyContract(study_id="s1", domain_size=100, epsilon=0.5, expected_owners=("b", "a"),
                      context_fingerprint=FP, domain_spec="age:0:100:100", strategy="gap",
                      version=CONTRACT_VERSION_V1)
    text = c.canonical_json()
    assert text == (
        '{"context_fingerprint":"' + FP + '","contribution_bound":1,"domain_size":100,"domain_spec":"age:0:100:100",'
        '"epsilon":0.5,"expected_owners":["a","b"],"noise_parties":2,"strategy":"gap","strategy_params":{},'
        '"study_id":"s1","version":"dpagg.contract.v1"}'
    )
    assert c.contract_hash == hashlib.sha256(text.encode()).hexdigest()
    assert StudyContract.from_json(text) == c
    # Order of owners and of parameter keys does not change the hash; any field does.
    same = StudyContract.create(study_id="s1", domain_size=100, epsilon=0.5, expected_owners=["a", "b"],
                                context_fingerprint=FP, domain_spec="age:0:100:100", strategy_params={},
                                strategy="gap")
    assert replace(same, version=CONTRACT_VERSION_V1).contract_hash == c.contract_hash
    other = StudyContract.create(study_id="s1", domain_size=100, epsilon=0.5000001, expected_owners=["a", "b"],
                                 context_fingerprint=FP, domain_spec="age:0:100:100")
    assert other.contract_hash != c.contract_hash
    p1 = StudyContract.create(study_id="s", domain_size=4, epsilon=1, expected_owners=["a"], context_fingerprint=FP,
                              strategy="gap", strategy_params={"threshold_k": 2.0, "gap_fraction": 0.25})
    p2 = StudyContract.create(study_id="s", domain_size=4, epsilon=1, expected_owners=["a"], context_fingerprint=FP,
                              strategy="gap", strategy_params='{"gap_fraction":0.25,"threshold_k":2.0}')
    assert p1.contract_hash == p2.contract_hash and p1.strategy_params == {"gap_fraction": 0.25, "threshold_k": 2.0}


def test_contract_round_trips_through_proto_and_refuses_a_tampered_hash() -> None:
    c = StudyContract(study_id="s1", domain_size=100, epsilon=0.5, expected_owners=("a",), context_fingerprint=FP)
    p = contract_to_proto(c)
    assert p.contract_hash == c.contract_hash and contract_from_proto(p) == c
    p.epsilon = 5.0
    with pytest.raises(InvalidInputError, match="contract hash mismatch"):
        contract_from_proto(p)


@pytest.mark.parametrize("kw, text", [
    ({"study_id": "../etc"}, "study_id must be"),
    ({"domain_size": 0}, "domain_size must be in"),
    ({"epsilon": float("inf")}, "epsilon must be > 0 and at most 1000"),
    ({"expected_owners": ()}, "at least one"),
    ({"context_fingerprint": "xyz"}, "64 lowercase hex"),
    ({"contribution_bound": 0}, "contribution_bound must be"),
    ({"strategy_params_json": "[1]"}, "JSON object"),
])
def test_contract_validation_names_parameter_and_value(kw: dict[str, object], text: str) -> None:
    args: dict[str, object] = {"study_id": "s1", "domain_size": 8, "epsilon": 1.0, "expected_owners": ("a",),
                               "context_fingerprint": FP, **kw}
    with pytest.raises(InvalidInputError, match=text):
        StudyContract(**args)  # type: ignore[arg-type]


def test_canonical_json_refuses_nan() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_status_table() -> None:
    cases = [(BudgetExhaustedError("b"), grpc.StatusCode.RESOURCE_EXHAUSTED),
             (InvalidInputError("i"), grpc.StatusCode.INVALID_ARGUMENT),
             (PrecisionError("p"), grpc.StatusCode.INVALID_ARGUMENT),
             (NotFoundError("n"), grpc.StatusCode.NOT_FOUND),
             (PermissionDeniedError("d"), grpc.StatusCode.PERMISSION_DENIED),
             (AlreadyExistsError("a"), grpc.StatusCode.ALREADY_EXISTS),
             (FailedPreconditionError("f"), grpc.StatusCode.FAILED_PRECONDITION),
             (ServiceError(grpc.StatusCode.UNAVAILABLE, "down", method="X/Y"), grpc.StatusCode.UNAVAILABLE),
             (RuntimeError("boom"), grpc.StatusCode.INTERNAL)]
    for exc, code in cases:
        assert status_for(exc)[0] == code, exc
    assert status_for(RuntimeError("secret detail"))[1].count("secret") == 0  # internals are not leaked


def test_key_store_writes_the_secret_0600_and_reloads_the_same_key(tmp_path: Path) -> None:
    ks = KeyStore(tmp_path / "keys")
    first = ks.load_or_create()
    assert stat.S_IMODE(os.stat(ks.secret_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(ks.directory).st_mode) & 0o077 == 0
    assert not load_context(first.public_bytes).is_private()
    again = KeyStore(tmp_path / "keys").load_or_create()
    assert again.public_bytes == first.public_bytes and again.fingerprint == first.fingerprint
    os.chmod(ks.secret_path, 0o644)
    with pytest.raises(InvalidInputError, match="chmod 600"):
        KeyStore(tmp_path / "keys").load_or_create()


def test_served_public_context_has_no_secret_key(cluster: Cluster) -> None:
    data = cluster.decryption().public_context()
    assert context_fingerprint(data) == cluster.ds.handler.fingerprint
    assert not load_context(data).is_private()
    secret_file = cluster.root / "ds" / "keys" / "secret_context.bin"
    assert data != secret_file.read_bytes() and len(data) < len(secret_file.read_bytes())
