"""A computation server (CS) colluding with one data owner, through the real services over mutual TLS.

The attacks (docs/threat-model.md, "A computation server colluding with an owner"): the owner
signs, with its own contract key, a c1 part chosen against the other owners' parts
(c1_x = target - sum of the others: the key holders' shares then give away their key shares),
or uploads (c - 1) x others + c x own so that the aggregate is scaled and the key holders'
noise shrinks by c. Both need the other owners' ciphertexts before the colluding owner fixes
its own. The test double plays the CS with the CS's certificate and the owner with its signing
key, and tries every step the attack needs, K = 3 key-share holders and the single decryption
server alike:

1. read the honest owners' c1 from the CS's store (on the former code: plain ciphertexts);
2. close the uploads early on the honest owners to read them, then add the colluding owner's
   crafted commitment (refused by every key holder: the set is closed for good);
3. forward the crafted c1 parts without a commitment (refused: not what the closed set holds).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from he_partition.core.errors import InvalidInputError
from he_partition.he.bfv import load_context
from he_partition.he.threshold.c1 import c1_bytes, c1_from_bytes, c1_of_vector, c1_stream_digest
from parties.common.contract import StudyContract
from parties.common.errors import ServiceError
from parties.common.sealing import (Commitment, commitment_statement, is_sealed, open_chunk, seal_upload_key,
                                    sealed_key_shares, upload_key_from_shares)
from parties.common.signing import sign_submission
from parties.decryption.keyshare.uploads import sign_c1_parts

from .conftest import CS_ID, FAST_RETRY, Cluster
from .test_threshold_refusals import _as_computation_server
from .test_threshold_services import OWNERS, Threshold, _histograms, threshold

__all__ = ["threshold"]

HONEST = OWNERS[:-1]
COLLUDER = OWNERS[-1]


def _open(t: Threshold, study: str) -> StudyContract:
    return t.open(study)  # type: ignore[no-any-return]


def _crafted_commitment(contract: StudyContract, private: bytes, parts: list[bytes], holders: int) -> Commitment:
    """The colluding owner's commitment to chosen c1 parts, signed with its own contract key."""
    place = dict(study_id=contract.study_id, owner_id=COLLUDER, idempotency_key="crafted",
                 contract_hash=contract.contract_hash)
    key = seal_upload_key(private, b"\0" * 32, **place)
    shares = sealed_key_shares(key, contract.holder_seal_keys, **place)
    assert len(shares) == holders
    digest = c1_stream_digest(parts)
    statement = commitment_statement(contract.study_id, COLLUDER, "crafted", contract.contract_hash, digest, shares)
    return Commitment(COLLUDER, "crafted", digest, shares, sign_submission(private, statement))


def _attack(cs: Any, holder_clients: list[Any], contract: StudyContract, signing: dict[str, Any]) -> None:
    """Every step of the chosen-c1 / scaling attack; each must be refused."""
    store = cs.handler.store
    ctx = load_context(holder_clients[0].public_context(study_id=contract.study_id))  # the study's own key
    subs = [s for s in store.submissions(contract.study_id) if s.owner_id in HONEST]
    assert sorted(s.owner_id for s in subs) == sorted(HONEST)
    # 1. The honest uploads in the CS's store are sealed: no c1 to choose against, no ciphertext to scale.
    for s in subs:
        for i in range(s.meta.chunk_count):
            data = store.read_chunk(s, i)
            assert is_sealed(data)
            with pytest.raises(InvalidInputError):
                c1_of_vector(ctx, data)
    # 2. Close early on the honest owners alone to read them ...
    commitments = [cs.handler.sealed.get(contract.study_id, s.owner_id, s.idempotency_key) for s in subs]
    per_holder = [c.close_upload_shares(contract, commitments) for c in holder_clients]
    keys = [upload_key_from_shares(h[j] for h in per_holder) for j in range(len(subs))]
    moduli = [int(m.value()) for m in ctx.seal_context().data.first_context_data().parms().coeff_modulus()]
    honest_c1 = []
    for s, key in zip(subs, keys):
        chunk = open_chunk(key, 0, store.read_chunk(s, 0), study_id=contract.study_id, owner_id=s.owner_id,
                           idempotency_key=s.idempotency_key, contract_hash=contract.contract_hash)
        honest_c1.append(c1_of_vector(ctx, chunk))  # now readable: the uploads are closed without the colluder
    # ... then commit to c1_x = target - sum(others): the key holders' shares would reveal their key shares.
    q = np.array(moduli, dtype=np.uint64)[:, None]
    target = np.zeros_like(honest_c1[0])
    target[:, 0] = 1 << 40
    crafted = (target + (len(honest_c1) * q - np.sum(honest_c1, axis=0, dtype=np.uint64) % q)) % q
    parts = [c1_bytes(crafted)]
    assert c1_from_bytes(parts[0], moduli, crafted.shape[1]).shape == crafted.shape
    evil = _crafted_commitment(contract, signing[COLLUDER][0], parts, len(holder_clients))
    for c in holder_clients:
        with pytest.raises(ServiceError) as err:
            c.close_upload_shares(contract, [*commitments, evil])
        assert err.value.code.name == "FAILED_PRECONDITION" and "closed on" in err.value.details
    # 3. Forwarding the crafted parts without a commitment in the closed set: refused by every key holder.
    signed = sign_c1_parts(signing[COLLUDER][0], study_id=contract.study_id, owner_id=COLLUDER,
                           idempotency_key="crafted", contract_hash=contract.contract_hash, parts=parts)
    for c in holder_clients:
        with pytest.raises(ServiceError) as err:
            c.send_uploads(contract.study_id, contract.contract_hash, [signed])
        assert err.value.code.name == "FAILED_PRECONDITION" and "closed" in err.value.details


def test_an_owner_colluding_with_the_cs_cannot_choose_or_scale_the_aggregate_three_holders(
        threshold: Threshold) -> None:
    t = threshold
    contract = _open(t, "s-collude")
    assert contract.sealed and len(contract.holder_seal_keys) == 3
    for o, h in zip(OWNERS, _histograms()):
        if o in HONEST:
            t.owner(o).submit("s-collude", h)
    _attack(t.cs, [_as_computation_server(t, i) for i in range(3)], contract, t.signing)


@pytest.fixture
def single(secure_cluster: Cluster) -> Iterator[Cluster]:
    yield secure_cluster


def test_an_owner_colluding_with_the_cs_cannot_choose_or_scale_the_aggregate_single_key(single: Cluster) -> None:
    cluster = single
    contract = cluster.open_study(domain_size=64, owners=tuple(OWNERS))
    assert contract.sealed and len(contract.holder_seal_keys) == 1
    for o in HONEST:
        cluster.owner(o).submit(contract.study_id, np.arange(64) % 3)
    from parties.decryption.client import DecryptionClient
    ds = DecryptionClient(cluster.ds.target, retry=FAST_RETRY, tls=cluster.tls(CS_ID, "computation"))
    try:
        _attack(cluster.cs, [ds], contract, {o: cluster.signing_key(o) for o in OWNERS})
    finally:
        ds.close()


def test_the_honest_path_closes_once_every_owner_is_in_and_releases(threshold: Threshold, tmp_path: Path) -> None:
    t = threshold
    contract = t.open_and_submit("s-honest")
    t.cs.handler.join(timeout=60)
    assert t.cs.handler.sealed.closed_on("s-honest") == tuple(sorted(OWNERS))
    for h in t.holders:
        assert sorted(h.handler.commitments.closed("s-honest")) == sorted(OWNERS)
    assert t.computation().run_release("s-honest", epsilon=0.5).state == "DONE"
    assert contract.sealed
