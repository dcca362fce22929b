"""Mutual TLS wired into the real servers: every RPC checks the caller's certificate role and id first.

A refused call answers UNAUTHENTICATED (no verified dpagg identity) or PERMISSION_DENIED (a
verified party whose role or id may not do this), and nothing happens: no study, no upload,
no ledger charge, no decryption.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Callable

import grpc
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from parties.wire.v1 import (
    analyst_pb2,
    analyst_pb2_grpc,
    computation_pb2,
    computation_pb2_grpc,
    decryption_pb2,
    decryption_pb2_grpc,
)
from he_partition.he.bfv import BfvBackend, load_context
from he_partition.core.measurements import PrefixDifferences, owner_encoding
from parties.common.config import GRPC_OPTIONS
from parties.common.approval import approve_study
from parties.common.convert import approval_to_proto, measurement_to_proto, open_study_kwargs
from parties.common.errors import ServiceError
from parties.common.tls import TlsConfig, write_private_file

from .conftest import ANALYST_ID, CS_ID, DS_ID, OPERATOR_APPROVAL, OPERATOR_ID, Cluster

DENIED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)

#: (party id, role) of every kind of caller the matrix tries.
CALLERS = {
    "owner": ("a", "data_owner"),
    "cs": (CS_ID, "computation"),
    "rogue_cs": ("cs-2", "computation"),  # a computation certificate, but not the configured id
    "ds": (DS_ID, "decryption"),
    "analyst": (ANALYST_ID, "analyst"),
    "operator": (OPERATOR_ID, "operator"),
}


def _channel(cluster: Cluster, target: str, tls: TlsConfig | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(target, options=list(GRPC_OPTIONS))
    return grpc.secure_channel(target, tls.channel_credentials(), options=list(GRPC_OPTIONS))


def _state(cluster: Cluster) -> tuple[object, ...]:
    return cluster.snapshot()


def _calls(cluster: Cluster) -> dict[str, Callable[[grpc.Channel], Any]]:
    """One call per RPC of every service. Requests decode, but those that would change state are invalid
    (an allowed caller gets a validation error instead), so only the access decision is observed."""
    contract = cluster.ds.handler.get_study("s1")
    be = BfvBackend(load_context(cluster.ds.handler.public_key_for("s1")[0]))
    chunk = be.serialize_chunk(be.encrypt(owner_encoding(np.ones(64, dtype=int))).chunks[0])
    header = decryption_pb2.DecryptMeasurementHeader(
        study_id="s1", release_id="r-matrix", release_epsilon=0.5, chunk_count=1, contract_hash="f" * 64,
        measurement=measurement_to_proto(PrefixDifferences(64, 0.1, 2)))
    open_req = decryption_pb2.OpenStudyRequest(study_id="s-new", domain_size=0, epsilon=1.0, expected_owners=["a"],
                                               owner_keys={"a": cluster.signing_key("a")[1].hex()})
    approval = approve_study(OPERATOR_APPROVAL[0], **open_study_kwargs(open_req))  # so the terms are what is refused
    open_req.approval.CopyFrom(approval_to_proto(approval))
    sub_header = computation_pb2.SubmitHeader(study_id="s1", owner_id="a", idempotency_key="k-matrix",
                                              domain_length=64, context_fingerprint=contract.context_fingerprint,
                                              chunk_count=1, contract_hash=contract.contract_hash,
                                              signature=b"\0" * 64)

    def d(ch: grpc.Channel) -> Any:
        return decryption_pb2_grpc.DecryptionStub(ch)

    def c(ch: grpc.Channel) -> Any:
        return computation_pb2_grpc.ComputationStub(ch)

    def a(ch: grpc.Channel) -> Any:
        return analyst_pb2_grpc.AnalystStub(ch)

    t = 10
    return {
        "Decryption/GetPublicContext": lambda ch: list(d(ch).GetPublicContext(
            decryption_pb2.GetPublicContextRequest(), timeout=t)),
        "Decryption/GetStudy": lambda ch: d(ch).GetStudy(decryption_pb2.GetStudyRequest(study_id="s1"), timeout=t),
        "Decryption/OpenStudy": lambda ch: d(ch).OpenStudy(open_req, timeout=t),
        "Decryption/DecryptMeasurement": lambda ch: list(d(ch).DecryptMeasurement(iter([
            decryption_pb2.DecryptMeasurementRequest(header=header),
            decryption_pb2.DecryptMeasurementRequest(chunk=chunk)]), timeout=t)),
        "Decryption/KeySetup": lambda ch: d(ch).KeySetup(decryption_pb2.KeySetupRequest(step="status"), timeout=t),
        "Decryption/JoinCheck": lambda ch: d(ch).JoinCheck(decryption_pb2.JoinCheckRequest(study_id="s"), timeout=t),
        "Decryption/JoinShares": lambda ch: list(d(ch).JoinShares(decryption_pb2.JoinSharesRequest(), timeout=t)),
        "Decryption/SignCharge": lambda ch: d(ch).SignCharge(decryption_pb2.SignChargeRequest(study_id="s"),
                                                             timeout=t),
        "Decryption/IssueShares": lambda ch: list(d(ch).IssueShares(iter([
            decryption_pb2.DecryptMeasurementRequest(header=header),
            decryption_pb2.DecryptMeasurementRequest(chunk=chunk)]), timeout=t)),
        "Decryption/ForwardUploads": lambda ch: d(ch).ForwardUploads(iter([decryption_pb2.ForwardUploadsRequest(
            study_id="s1", owner_id="a", index=0, c1=b"\0" * 8)]), timeout=t),
        "Decryption/CloseUploads": lambda ch: d(ch).CloseUploads(decryption_pb2.CloseUploadsRequest(
            study_id="s1", contract_hash="0" * 64), timeout=t),
        "Computation/SetupKey": lambda ch: c(ch).SetupKey(computation_pb2.SetupKeyRequest(), timeout=t),
        "Decryption/BudgetStatus": lambda ch: d(ch).BudgetStatus(
            decryption_pb2.BudgetStatusRequest(study_id="s1"), timeout=t),
        "Decryption/ReconcileCharges": lambda ch: d(ch).ReconcileCharges(
            decryption_pb2.ReconcileChargesRequest(study_id="s1"), timeout=t),
        "Decryption/ChargeDirectQueries": lambda ch: d(ch).ChargeDirectQueries(
            decryption_pb2.ChargeDirectQueriesRequest(study_id="s1", request_id="dq-matrix", contract_hash="f" * 64,
                                                      epsilon=0.1), timeout=t),
        "Decryption/DecryptJoinCells": lambda ch: d(ch).DecryptJoinCells(iter([
            decryption_pb2.DecryptJoinCellsRequest(header=decryption_pb2.DecryptJoinCellsHeader(
                study_id="s1", release_id="r-join", release_epsilon=0.5, contract_hash="f" * 64, cell_count=1))]),
            timeout=t),
        "Decryption/EvaluatePseudonyms": lambda ch: d(ch).EvaluatePseudonyms(decryption_pb2.EvaluatePseudonymsRequest(
            study_id="s1", owner_id="a", contract_hash="f" * 64, page=0, blinded_elements=b"\0" * 32), timeout=t),
        "Decryption/JoinCheckSeed": lambda ch: d(ch).JoinCheckSeed(decryption_pb2.JoinCheckSeedRequest(
            study_id="s1", contract_hash="f" * 64), timeout=t),
        "Decryption/CheckJoinUpload": lambda ch: d(ch).CheckJoinUpload(decryption_pb2.CheckJoinUploadRequest(
            study_id="s1", contract_hash="f" * 64, owner_id="a", seed=b"s" * 32), timeout=t),
        "Computation/JoinExchange": lambda ch: c(ch).JoinExchange(computation_pb2.JoinExchangeRequest(
            study_id="s1", owner_id="a", public_key=b"k" * 32), timeout=t),
        "Computation/JoinPlacement": lambda ch: c(ch).JoinPlacement(computation_pb2.JoinPlacementRequest(
            study_id="s1", owner_id="a", pseudonyms=b"p" * 32), timeout=t),
        "Computation/GetPublicContext": lambda ch: list(c(ch).GetPublicContext(
            decryption_pb2.GetPublicContextRequest(), timeout=t)),
        "Computation/OpenStudy": lambda ch: c(ch).OpenStudy(open_req, timeout=t),
        "Computation/SubmitHistogram": lambda ch: c(ch).SubmitHistogram(iter([
            computation_pb2.SubmitHistogramRequest(header=sub_header)]), timeout=t),
        "Computation/UploadStatus": lambda ch: c(ch).UploadStatus(computation_pb2.UploadStatusRequest(
            study_id="s1", owner_id="a", idempotency_key="k-matrix"), timeout=t),
        "Computation/StudyStatus": lambda ch: c(ch).StudyStatus(
            computation_pb2.StudyStatusRequest(study_id="s1"), timeout=t),
        "Computation/LedgerReceipts": lambda ch: c(ch).LedgerReceipts(
            computation_pb2.LedgerReceiptsRequest(study_id="s1"), timeout=t),
        "Computation/RunRelease": lambda ch: c(ch).RunRelease(
            computation_pb2.RunReleaseRequest(study_id="s1", wait=True), timeout=t),
        "Computation/ReleaseStatus": lambda ch: c(ch).ReleaseStatus(
            computation_pb2.ReleaseStatusRequest(release_id="rel-none"), timeout=t),
        "Computation/DirectRangeCounts": lambda ch: c(ch).DirectRangeCounts(
            computation_pb2.DirectRangeCountsRequest(study_id="s1", epsilon=0.0), timeout=t),
        "Analyst/ListReleases": lambda ch: a(ch).ListReleases(analyst_pb2.ListReleasesRequest(), timeout=t),
        "Analyst/GetRelease": lambda ch: a(ch).GetRelease(
            analyst_pb2.GetReleaseRequest(release_id="rel-none"), timeout=t),
        "Analyst/GetReleasePages": lambda ch: list(a(ch).GetReleasePages(
            analyst_pb2.GetReleaseRequest(release_id="rel-none"), timeout=t)),
        "Analyst/GetReleaseArrow": lambda ch: list(a(ch).GetReleaseArrow(
            analyst_pb2.GetReleaseRequest(release_id="rel-none"), timeout=t)),
        "Analyst/RangeCounts": lambda ch: a(ch).RangeCounts(
            analyst_pb2.RangeCountsRequest(release_id="rel-none"), timeout=t),
    }


#: Who may call what (the rules in parties/common/access.py); everyone else is refused.
ALLOWED = {
    "Decryption/GetPublicContext": set(CALLERS),
    "Decryption/GetStudy": set(CALLERS),
    "Decryption/OpenStudy": {"cs"},
    "Decryption/DecryptMeasurement": {"cs"},
    "Decryption/KeySetup": {"cs"},
    "Decryption/JoinCheck": {"cs"},
    "Decryption/JoinShares": {"cs"},
    "Decryption/SignCharge": {"cs"},
    "Decryption/IssueShares": {"cs"},
    "Decryption/ForwardUploads": {"cs"},
    "Decryption/CloseUploads": {"cs"},
    "Computation/SetupKey": {"operator"},
    "Decryption/BudgetStatus": {"cs", "rogue_cs", "operator", "analyst"},
    "Decryption/ReconcileCharges": {"operator"},
    "Decryption/ChargeDirectQueries": {"cs"},
    "Decryption/DecryptJoinCells": {"cs"},
    "Decryption/EvaluatePseudonyms": {"owner"},
    "Decryption/JoinCheckSeed": {"cs"},
    "Decryption/CheckJoinUpload": {"cs"},
    "Computation/JoinExchange": {"owner"},
    "Computation/JoinPlacement": {"owner"},
    "Computation/GetPublicContext": set(CALLERS),
    "Computation/OpenStudy": {"operator"},
    "Computation/SubmitHistogram": {"owner"},
    "Computation/UploadStatus": {"owner", "operator"},
    "Computation/StudyStatus": set(CALLERS),
    "Computation/LedgerReceipts": {"operator", "analyst"},
    "Computation/RunRelease": {"operator"},
    "Computation/ReleaseStatus": {"operator", "cs", "rogue_cs", "analyst"},
    "Computation/DirectRangeCounts": {"analyst", "operator"},
    "Analyst/ListReleases": {"analyst", "operator"},
    "Analyst/GetRelease": {"analyst", "operator"},
    "Analyst/GetReleasePages": {"analyst", "operator"},
    "Analyst/GetReleaseArrow": {"analyst", "operator"},
    "Analyst/RangeCounts": {"analyst", "operator"},
}


def test_every_rpc_checks_the_callers_role_before_doing_anything(secure_cluster: Cluster) -> None:
    cluster = secure_cluster
    cluster.open_study(domain_size=64, owners=("a", "b"))
    calls = _calls(cluster)
    assert set(calls) == set(ALLOWED)
    # every RPC the protos define is in the matrix
    services = {"Decryption": decryption_pb2, "Computation": computation_pb2, "Analyst": analyst_pb2}
    defined = {f"{name}/{m.name}" for name, mod in services.items()
               for m in mod.DESCRIPTOR.services_by_name[name].methods}
    assert defined == set(calls)

    before = _state(cluster)
    for who, (party, role) in CALLERS.items():
        tls = cluster.tls(party, role)
        for method, call in calls.items():
            target = cluster.ds.target if method.startswith("Decryption/") else cluster.cs.target
            with _channel(cluster, target, tls) as ch:
                try:
                    call(ch)
                    code = grpc.StatusCode.OK
                    details = ""
                except grpc.RpcError as err:
                    code, details = err.code(), err.details() or ""
            if who in ALLOWED[method]:
                assert code not in DENIED, (who, method, code, details)
            else:
                assert code == grpc.StatusCode.PERMISSION_DENIED, (who, method, code, details)
                assert repr(party) in details and "may not" in details, details
        # refused calls changed nothing; the allowed ones here are reads or fail validation
        assert _state(cluster) == before, who


def test_a_caller_without_a_dpagg_identity_is_unauthenticated_and_without_a_certificate_cannot_connect(
        secure_cluster: Cluster, tmp_path: Path) -> None:
    cluster = secure_cluster
    cluster.open_study(domain_size=64, owners=("a", "b"))
    # A certificate from the deployment's CA that names no dpagg party (no SAN URI).
    ca = cluster.pki.ca  # type: ignore[union-attr]
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nobody")]))
            .issuer_name(ca.certificate().subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(days=1))
            .sign(ca._private_key(), hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    creds = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem(), private_key=key_pem,
                                         certificate_chain=cert.public_bytes(serialization.Encoding.PEM))
    before = _state(cluster)
    for method, call in _calls(cluster).items():
        target = cluster.ds.target if method.startswith("Decryption/") else cluster.cs.target
        with grpc.secure_channel(target, creds) as ch:
            with pytest.raises(grpc.RpcError) as info:
                call(ch)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
        assert "no verified party identity" in (info.value.details() or "")
        with grpc.insecure_channel(target) as ch:  # plaintext to a TLS port: the handshake fails
            with pytest.raises(grpc.RpcError) as info:
                call(ch)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, method
    assert _state(cluster) == before
    # a TlsConfig refuses a certificate without a dpagg identity up front
    write_private_file(tmp_path / "nobody.key", key_pem)
    (tmp_path / "nobody.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(Exception, match="no dpagg party identity"):
        TlsConfig(ca.cert_path, tmp_path / "nobody.crt", tmp_path / "nobody.key")


def test_owners_submit_only_in_their_own_name_and_only_to_studies_that_list_them(secure_cluster: Cluster) -> None:
    cluster = secure_cluster
    contract = cluster.open_study(domain_size=64, owners=("a", "b"))
    owner_b = cluster.owner("b")
    enc = owner_b.encrypt("s1", np.ones(64, dtype=int))
    before = _state(cluster)
    # b's certificate, but the header claims owner a
    b_as_cs_client = cluster.computation("b", "data_owner")
    with pytest.raises(ServiceError) as info:
        b_as_cs_client.submit_chunks(study_id="s1", owner_id="a", idempotency_key="k1", domain_length=64,
                                     context_fingerprint=contract.context_fingerprint, chunk_count=1,
                                     chunks=[(0, enc.chunks[0])], contract_hash=contract.contract_hash,
                                     signature=b"\0" * 64)
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert "party 'b' may not act as 'a'" in info.value.details
    # b may not even ask for a's upload status
    with pytest.raises(ServiceError) as info:
        b_as_cs_client.upload_status("s1", "a", "k1")
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    # an owner the CA certified, but the study does not list
    zed = cluster.computation("zed", "data_owner")
    with pytest.raises(ServiceError) as info:
        zed.submit_chunks(study_id="s1", owner_id="zed", idempotency_key="k1", domain_length=64,
                          context_fingerprint=contract.context_fingerprint, chunk_count=1,
                          chunks=[(0, enc.chunks[0])], contract_hash=contract.contract_hash, signature=b"\0" * 64)
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED and "not expected by study s1" in info.value.details
    assert _state(cluster) == before
    # the client refuses a certificate that is not the owner's own before connecting
    with pytest.raises(Exception, match="not of data owner 'a'"):
        from parties.data_owner.client import DataOwnerClient

        DataOwnerClient("a", computation=cluster.cs.target, decryption=cluster.ds.target,
                        tls=cluster.tls("b", "data_owner"))


def test_a_full_release_under_mutual_tls_with_every_party_in_its_role(secure_cluster: Cluster) -> None:
    cluster = secure_cluster
    contract = cluster.open_study(domain_size=64, owners=("a", "b"))
    assert contract.signed and dict(contract.owner_keys)["a"] == cluster.signing_key("a")[1].hex()
    for o in ("a", "b"):
        assert cluster.owner(o).submit("s1", np.arange(64) % 5).committed
    rel = cluster.computation().run_release("s1")
    assert rel.state == "DONE" and rel.owners == ("a", "b")
    got = cluster.analyst().get_release(rel.release_id)
    assert got.summary == rel.summary
    assert cluster.decryption().budget("s1").spent == 1.0  # the operator reads the budget
    assert cluster.decryption(ANALYST_ID, "analyst").budget("s1").spent == 1.0
    # the computation server talked to the decryption server with its own certificate:
    # the ledger has the charges, and an operator cannot ask for a decryption itself
    with pytest.raises(ServiceError) as info:
        cluster.decryption().decrypt_measurement(study_id="s1", release_id="r-op", release_epsilon=0.1,
                                                 measurement=PrefixDifferences(64, 0.1, 2), chunks=[],
                                                 chunk_count=1, contract_hash=contract.contract_hash)
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert "only computation may" in info.value.details
    assert len(cluster.decryption().budget("s1").charges) == 2


def test_a_server_refuses_to_start_without_tls_unless_insecure_is_explicit(tmp_path: Path) -> None:
    from he_partition.core.errors import InvalidInputError
    from parties.common.config import AnalystConfig, ComputationConfig, DecryptionConfig

    for build in (lambda **kw: DecryptionConfig(tmp_path, **kw),
                  lambda **kw: ComputationConfig(tmp_path, "127.0.0.1:1", **kw),
                  lambda **kw: AnalystConfig(tmp_path, **kw)):
        with pytest.raises(InvalidInputError, match="needs mutual TLS.*insecure=True"):
            build()
        assert build(insecure=True).tls is None
    from parties.common.pki import create_ca, issue_party_certificate

    ca = create_ca(tmp_path / "pki")
    issue_party_certificate(ca, tmp_path / "pki", "x", "analyst")
    with pytest.raises(InvalidInputError, match="analyst certificate.*needs decryption"):
        DecryptionConfig(tmp_path, tls=TlsConfig.in_directory(tmp_path / "pki", "x"))


def test_identity_and_signature_errors_map_to_their_status_codes() -> None:
    from parties.common.errors import status_for
    from parties.common.signing import SignatureError
    from parties.common.tls import AccessDeniedError

    for code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        assert status_for(AccessDeniedError(code, "who are you")) == (code, "who are you")
    assert status_for(SignatureError("bad signature")) == (grpc.StatusCode.UNAUTHENTICATED, "bad signature")
