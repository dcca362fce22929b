"""A key-share holder takes a join study's planes only as the owners signed them (`keyshare.join_planes`)."""
from __future__ import annotations

import json
import secrets

import pytest

from he_partition.core.errors import InvalidInputError
from parties.common.contract import StudyContract
from parties.common.errors import FailedPreconditionError
from parties.common.signing import SignatureError, generate_signing_key, sign_upload
from parties.decryption.keyshare.join_planes import OwnerPlanes, accept_planes

SHAPE = (4, 3)
TERMS = {"shape": list(SHAPE), "capacity": 16384, "padding_epsilon": 0.5, "padding_offset": 86}  # 2 groups


def _setup(signed: bool = True) -> tuple[StudyContract, dict[str, OwnerPlanes]]:
    keys = {o: generate_signing_key() for o in ("a", "b")}
    contract = StudyContract(study_id="jp", domain_size=SHAPE[0] * SHAPE[1], epsilon=1.0, expected_owners=("a", "b"),
                             context_fingerprint="f" * 64, strategy="join", strategy_params_json=json.dumps(TERMS),
                             owner_keys={o: keys[o][1].hex() for o in keys} if signed else None)
    uploads = {}
    for side, o in enumerate(("a", "b")):
        chunks = [secrets.token_bytes(24) for _ in range(2 * SHAPE[side])]
        sig = sign_upload(keys[o][0], study_id="jp", owner_id=o, idempotency_key=f"k-{o}",
                          contract_hash=contract.contract_hash, chunks=chunks)
        uploads[o] = OwnerPlanes(o, f"k-{o}", sig, chunks)
    return contract, uploads


def test_the_owners_signed_planes_are_taken_group_by_group() -> None:
    contract, up = _setup()
    a, b = accept_planes(contract, [up["b"], up["a"]])
    assert [len(g) for g in a] == [4, 4] and [len(g) for g in b] == [3, 3]
    assert a[1][0] == up["a"].chunks[4] and b[0][2] == up["b"].chunks[2]


def test_planes_the_cs_changed_dropped_or_relabelled_are_refused_by_name() -> None:
    contract, up = _setup()
    swapped = OwnerPlanes("a", "k-a", up["a"].signature, [up["a"].chunks[1], up["a"].chunks[0], *up["a"].chunks[2:]])
    with pytest.raises(SignatureError, match="owner 'a'"):
        accept_planes(contract, [swapped, up["b"]])  # the same planes in another order: other values decrypted
    made_up = OwnerPlanes("b", "k-b", up["b"].signature, [secrets.token_bytes(24)] + list(up["b"].chunks[1:]))
    with pytest.raises(SignatureError, match="owner 'b'"):
        accept_planes(contract, [up["a"], made_up])
    with pytest.raises(FailedPreconditionError, match="each of"):
        accept_planes(contract, [up["a"]])
    with pytest.raises(FailedPreconditionError, match="each of"):
        accept_planes(contract, [up["a"], up["a"]])
    with pytest.raises(InvalidInputError, match="has 7 planes"):
        accept_planes(contract, [up["a"], OwnerPlanes("b", "k-b", up["b"].signature, list(up["b"].chunks) + [b"x"])])
    unsigned, up2 = _setup(signed=False)
    with pytest.raises(FailedPreconditionError, match="signed studies only"):
        accept_planes(unsigned, list(up2.values()))
