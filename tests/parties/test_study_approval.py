"""Studies the computation server cannot author: every key holder opens only studies the operator's approval key
signed, with exactly the signed terms (real servers, mutual TLS, SQLite ledgers).

The attacker is the computation server (CS) alone, with nothing but its own certificate: it opens a study naming an
owner whose signing key it made itself (so that it could later sign that owner's uploads and commitments and close
the study on them), or it relays the operator's approved request with one term changed. Before approvals, the key
holders took the owners' keys from whatever contract the CS sent and the single key holder stored the study.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from parties.common.approval import approve_study
from parties.common.errors import NotFoundError, ServiceError
from parties.common.signing import generate_signing_key
from parties.computation.client import ComputationClient
from parties.decryption.client import DecryptionClient

from .conftest import CS_ID, DS_ID, FAST_RETRY, OPERATOR_APPROVAL, Cluster, approved, status_of
from .test_threshold_services import DOMAIN, HOLDERS, OWNERS, Threshold


def _cs_at_ds(cluster: Cluster) -> DecryptionClient:
    """The decryption server as the computation server reaches it: the CS's own certificate, nothing else."""
    return cluster._keep(DecryptionClient(cluster.ds.target, retry=FAST_RETRY,  # type: ignore[return-value]
                                          tls=cluster.tls(CS_ID, "computation")))


def _invented(study_id: str) -> dict[str, Any]:
    """Terms a CS would write: one owner, whose signing key the CS made itself."""
    _, cs_made_public = generate_signing_key()
    return dict(study_id=study_id, domain_size=64, epsilon=0.25, expected_owners=["ghost"], strategy="gap",
                owner_keys={"ghost": cs_made_public})


def _stored(cluster: Cluster, study_id: str) -> bool:
    try:
        cluster.ds.handler.ledger.get_study(study_id)
    except NotFoundError:
        return False
    return True


def test_the_computation_server_alone_opens_no_study_at_the_decryption_server(secure_cluster: Cluster) -> None:
    cs = _cs_at_ds(secure_cluster)
    with pytest.raises(ServiceError) as unsigned:
        cs.open_study(**_invented("s-ghost"))
    assert status_of(unsigned).name == "PERMISSION_DENIED" and "no operator approval" in unsigned.value.details
    # signed with a key the CS made: the decryption server pins only the operator's
    cs_key, _ = generate_signing_key()
    terms = _invented("s-ghost")
    with pytest.raises(ServiceError) as forged:
        cs.open_study(**terms, approval=approve_study(cs_key, **terms))
    assert status_of(forged).name == "PERMISSION_DENIED" and "does not pin" in forged.value.details
    # through its own front door, with no approval key, the same: refused at the key holder, nothing kept
    with pytest.raises(ServiceError) as relayed:
        with ComputationClient(secure_cluster.cs.target, retry=FAST_RETRY,
                               tls=secure_cluster.tls("op", "operator")) as no_approval_key:
            no_approval_key.open_study(**_invented("s-ghost2"))
    assert status_of(relayed).name == "PERMISSION_DENIED"
    assert not _stored(secure_cluster, "s-ghost") and not _stored(secure_cluster, "s-ghost2")
    assert secure_cluster.cs.handler.store.get_study("s-ghost2") is None


def test_a_relay_that_changes_an_approved_term_opens_nothing(secure_cluster: Cluster) -> None:
    """The operator approved owners a and b with their keys; the CS swaps b's key for one it made, or widens epsilon."""
    keys = {o: generate_signing_key()[1] for o in ("a", "b")}
    terms = dict(study_id="s-swap", domain_size=64, epsilon=1.0, expected_owners=["a", "b"], owner_keys=keys)
    approval = approved(**terms)
    cs = _cs_at_ds(secure_cluster)
    for field, value in (("owner_keys", {**keys, "b": generate_signing_key()[1]}), ("epsilon", 50.0),
                         ("expected_owners", ["a"]), ("contribution_bound", 1000)):
        with pytest.raises(ServiceError) as err:
            cs.open_study(**{**terms, field: value}, approval=approval)
        assert status_of(err).name == "PERMISSION_DENIED" and f"request's {field}" in err.value.details, field
    assert not _stored(secure_cluster, "s-swap")
    # the seal keys are the relay's to fill in: naming its own, owners would seal their upload keys to the CS
    from parties.common.sealing import SealKeyPair

    cs_seal = SealKeyPair.load_or_create(secure_cluster.root / "cs-own-seal").public_hex
    with pytest.raises(ServiceError) as err:
        cs.open_study(**terms, approval=approval, holder_seal_keys=[cs_seal])
    assert status_of(err).name == "FAILED_PRECONDITION" and "not this holder's" in err.value.details
    assert not _stored(secure_cluster, "s-swap")
    # the operator's own request, relayed unchanged, opens it; every later call on it is served
    contract, existed = secure_cluster.computation().open_study(**terms)  # type: ignore[arg-type]
    assert not existed and contract.owner_public_key("b") == keys["b"]
    assert secure_cluster.decryption().get_study("s-swap") == contract


def test_a_study_without_an_approval_is_served_nothing_until_the_operator_approves_it(
        secure_cluster: Cluster) -> None:
    """A study already in the ledger without an approval (opened before the holder pinned a key): refused for
    everything, with what to do; the operator's open-study with the same terms approves it."""
    from parties.common.contract import StudyContract

    handler = secure_cluster.ds.handler
    keys = {"a": generate_signing_key()[1]}
    legacy = StudyContract.create(study_id="s-old", domain_size=64, epsilon=1.0, expected_owners=["a"],
                                  context_fingerprint=handler.fingerprint, owner_keys=keys,
                                  holder_seal_keys=[handler.seal_key.public_hex])
    handler.ledger.create_study(legacy)
    with pytest.raises(ServiceError) as err:
        secure_cluster.decryption().get_study("s-old")
    assert status_of(err).name == "FAILED_PRECONDITION" and "without the operator's approval" in err.value.details
    with pytest.raises(ServiceError):
        _cs_at_ds(secure_cluster).charge_direct_queries(study_id="s-old", request_id="q1", ranges=[(0, 8)],
                                                       epsilon=0.1, contract_hash=legacy.contract_hash)
    contract, existed = secure_cluster.computation().open_study(study_id="s-old", domain_size=64, epsilon=1.0,
                                                                expected_owners=["a"], owner_keys=keys)
    assert existed and contract == legacy
    assert secure_cluster.decryption().get_study("s-old") == legacy


def test_a_key_holder_with_tls_refuses_to_start_without_a_pinned_approval_key(tmp_path: Path) -> None:
    from he_partition.core.errors import InvalidInputError
    from parties.common.config import DecryptionConfig

    from .conftest import Pki

    tls = Pki(tmp_path / "pki").tls(DS_ID, "decryption")
    with pytest.raises(InvalidInputError, match="--operator-key"):
        DecryptionConfig(tmp_path / "ds", tls=tls)
    assert DecryptionConfig(tmp_path / "ds", tls=tls, operator_keys=(OPERATOR_APPROVAL[1],)).operator_keys


def test_the_computation_server_alone_opens_no_study_at_any_key_share_holder(tmp_path: Path) -> None:
    """Three key-share holders (N-of-N): the CS's invented study is refused by every holder, none stores it."""
    from .test_threshold_refusals import _as_computation_server

    t = Threshold.start(tmp_path)
    try:
        t.computation().setup_key()
        seals = [h.handler.seal.public_hex for h in t.holders]
        for i in range(len(HOLDERS)):
            with pytest.raises(ServiceError) as err:
                _as_computation_server(t, i).open_study(**_invented("s-ghost"), holder_seal_keys=seals,
                                                        noise_tolerates=2)
            assert status_of(err).name == "PERMISSION_DENIED", HOLDERS[i]
        for i in range(len(HOLDERS)):
            with pytest.raises(NotFoundError):
                t.ledger(i).get_study("s-ghost")
        # the operator's approved study opens at every holder under one contract
        keys = {o: generate_signing_key()[1] for o in OWNERS}
        contract, _ = t.computation().open_study(study_id="s-ok", domain_size=DOMAIN, epsilon=1.0,
                                                 expected_owners=list(OWNERS), owner_keys=keys)
        assert all(t.ledger(i).get_study("s-ok") == contract for i in range(len(HOLDERS)))
    finally:
        t.stop()
