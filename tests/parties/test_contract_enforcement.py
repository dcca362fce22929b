"""A study is a privacy contract: its hash travels with every submission and measurement, and the
decryption server refuses a measurement that differs from it, before charging or decrypting anything."""

from __future__ import annotations

from dataclasses import replace

import grpc
import numpy as np
import pytest

from he_partition.he.bfv import BfvBackend, load_context
from he_partition.core.measurements import Measurement, PartitionSums, PrefixDifferences, owner_encoding
from parties.common.contract import StudyContract
from parties.common.errors import ServiceError

from .conftest import CS_ID, Cluster


def _chunks(cluster: Cluster, n: int) -> list[bytes]:
    be = BfvBackend(load_context(cluster.ds.handler.public_key_for("s1")[0]))
    return [be.serialize_chunk(c) for c in be.encrypt(owner_encoding(np.arange(n) % 7)).chunks]


def _decrypt(cluster: Cluster, contract: StudyContract, m: Measurement, *, chunks: list[bytes],
             contract_hash: str | None = None, release_epsilon: float = 0.5, release_id: str = "r1",
             chunk_count: int | None = None) -> object:
    ds = cluster.decryption(CS_ID, "computation")
    return ds.decrypt_measurement(study_id=contract.study_id, release_id=release_id, release_epsilon=release_epsilon,
                                  measurement=m, chunks=chunks,
                                  chunk_count=len(chunks) if chunk_count is None else chunk_count,
                                  contract_hash=contract.contract_hash if contract_hash is None else contract_hash)


def _refused(cluster: Cluster, contract: StudyContract, m: Measurement, **kw: object) -> ServiceError:
    before = cluster.ds.handler.ledger.charges(contract.study_id)
    with pytest.raises(ServiceError) as info:
        _decrypt(cluster, contract, m, **kw)  # type: ignore[arg-type]
    assert cluster.ds.handler.ledger.charges(contract.study_id) == before  # nothing charged, nothing decrypted
    return info.value


def test_measurements_that_differ_from_the_contract_are_refused_naming_the_field(secure_cluster: Cluster) -> None:
    cluster = secure_cluster
    gap = cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0, contribution_bound=2, strategy="gap")
    hier = cluster.open_study(study_id="s-hier", domain_size=64, owners=("a",), epsilon=1.0, strategy="hier")
    chunks = _chunks(cluster, 64)
    cluster.forward_c1(gap, {"a": chunks})  # as the computation server does for a signed study

    err = _refused(cluster, gap, PrefixDifferences(64, 0.1, 4), chunks=chunks, contract_hash="")
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "contract_hash is required" in err.details
    err = _refused(cluster, gap, PrefixDifferences(64, 0.1, 4), chunks=chunks, contract_hash=hier.contract_hash)
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and "contract_hash" in err.details
    # Terms that differ in any field hash differently: a computation server holding another contract cannot
    # get this study's measurement decrypted.
    other = replace(gap, contribution_bound=3)
    err = _refused(cluster, gap, PrefixDifferences(64, 0.1, 4), chunks=chunks, contract_hash=other.contract_hash)
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and "contract_hash" in err.details

    err = _refused(cluster, gap, PrefixDifferences(65, 0.1, 4), chunks=chunks)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "measurement.domain_size 65" in err.details
    err = _refused(cluster, gap, PrefixDifferences(64, 0.1, 3), chunks=chunks)  # needs 2c = 4
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "measurement.sensitivity" in err.details
    assert "below 4 (contribution bound 2 x at most 1 organization(s)" in err.details
    err = _refused(cluster, gap, PartitionSums(64, 0.1, 1, starts=(0, 32)), chunks=chunks)  # needs c = 2
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "measurement.sensitivity" in err.details
    # hier measures only partition sums: adjacent differences are not part of that study's contract
    err = _refused(cluster, hier, PrefixDifferences(64, 0.1, 2), chunks=chunks)
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and "measurement.kind 'prefix_differences'" in err.details
    assert "'hier'" in err.details
    err = _refused(cluster, gap, PrefixDifferences(64, 0.1, 4), chunks=chunks, release_epsilon=1.5)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "release_epsilon 1.5" in err.details
    err = _refused(cluster, gap, PrefixDifferences(64, 0.1, 4), chunks=chunks, chunk_count=2)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "chunk_count" in err.details

    # a measurement that fits is decrypted; then epsilon beyond what is left is refused before decryption
    ok = _decrypt(cluster, gap, PrefixDifferences(64, 0.6, 4), chunks=chunks, release_epsilon=0.6)
    assert ok.charge_id >= 1  # type: ignore[attr-defined]
    err = _refused(cluster, gap, PrefixDifferences(64, 0.5, 4), chunks=chunks, release_id="r2")
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "0.4 left" in err.details
    assert [c.epsilon for c in cluster.ds.handler.ledger.charges(gap.study_id)] == [0.6]


def test_every_decryption_is_recorded_in_the_ledger_with_what_it_paid_for(secure_cluster: Cluster) -> None:
    import hashlib
    import json

    from parties.common.contract import canonical_json
    from parties.common.signing import stream_digest

    cluster = secure_cluster
    contract = cluster.open_study(domain_size=64, owners=("a",), epsilon=1.0, strategy="gap")
    chunks = _chunks(cluster, 64)
    cluster.forward_c1(contract, {"a": chunks})
    m = PrefixDifferences(64, 0.25, 2)
    res = _decrypt(cluster, contract, m, chunks=chunks)
    (charge,) = cluster.ds.handler.ledger.charges("s1")
    assert charge.charge_id == res.charge_id  # type: ignore[attr-defined]
    detail = json.loads(charge.detail)
    assert detail == {"contract_hash": contract.contract_hash,
                      "measurement_sha256": hashlib.sha256(canonical_json(m.to_dict()).encode()).hexdigest(),
                      "ciphertext_digest": stream_digest(chunks).hex(), "values": 64, "sensitivity": 2,
                      "noise_stream": 2}
    # a whole release (another study: s1's uploads closed on the test's own commitment above): one row per
    # decryption, each naming the contract
    s2 = cluster.open_study(study_id="s2", domain_size=64, owners=("a",), epsilon=1.0, strategy="gap")
    cluster.owner("a").submit("s2", np.arange(64) % 4)
    rel = cluster.computation().run_release("s2", epsilon=0.5)
    rows = [c for c in cluster.ds.handler.ledger.charges("s2") if c.release_id == rel.release_id]
    assert [c.kind for c in rows] == ["prefix_differences", "partition_sums"]
    assert all(json.loads(c.detail)["contract_hash"] == s2.contract_hash for c in rows)
    assert cluster.ds.handler.ledger.check_consistency() == []


def test_a_submission_for_other_terms_is_refused_and_nothing_is_stored(secure_cluster: Cluster) -> None:
    cluster = secure_cluster
    contract = cluster.open_study(domain_size=64, owners=("a",))
    enc = cluster.owner("a").encrypt("s1", np.ones(64, dtype=int))
    with pytest.raises(ServiceError) as info:
        cluster.computation("a", "data_owner").submit_chunks(
            study_id="s1", owner_id="a", idempotency_key="k", domain_length=64,
            context_fingerprint=contract.context_fingerprint, chunk_count=1, chunks=[(0, enc.chunks[0])],
            contract_hash=replace(contract, epsilon=2.0).contract_hash, signature=b"\0" * 64)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION and "contract_hash" in info.value.details
    assert cluster.cs.handler.store.get_upload("s1", "a") is None
    assert cluster.cs.handler.store.get_submission("s1", "a") is None
