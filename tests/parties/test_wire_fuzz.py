"""Fuzzing the wire (hypothesis): malformed messages at every RPC of every service, over mutual TLS.

Two kinds of input per RPC: arbitrary bytes sent as the serialized request (a raw channel
with no serializer), and well-typed messages whose fields hold random values (built from
the proto descriptors, with a few real ids and hashes mixed in so that checks deep in the
handlers are reached). The callers hold the certificates the RPC allows, so the fuzz gets
past the role checks. After every example: the server answered with a status (never an
unhandled exception, and bytes that do not parse are INVALID_ARGUMENT, not INTERNAL), it still reports
SERVING, and nothing was stored (studies, ledger rows, uploads, submissions, releases and
ciphertext files unchanged).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import pytest
from google.protobuf import descriptor as pbd
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numpy as np

from parties.wire.v1 import analyst_pb2, computation_pb2, decryption_pb2
from he_partition.he.bfv import BfvBackend, load_context
from he_partition.core.measurements import PrefixDifferences, owner_encoding
from parties.common.config import GRPC_OPTIONS
from parties.common.convert import measurement_to_proto

from .conftest import ANALYST_ID, CS_ID, OPERATOR_ID, Cluster

SERVICES = {"Decryption": decryption_pb2, "Computation": computation_pb2, "Analyst": analyst_pb2}
METHODS: list[tuple[str, str]] = [(svc, m.name) for svc, mod in SERVICES.items()
                                  for m in mod.DESCRIPTOR.services_by_name[svc].methods]

#: The party each RPC is fuzzed as: one it allows, so the input reaches the handler.
CALLER = {
    "Decryption/ReconcileCharges": (OPERATOR_ID, "operator"),
    "Decryption/EvaluatePseudonyms": ("a", "data_owner"),
    "Decryption": (CS_ID, "computation"),
    "Computation/SubmitHistogram": ("a", "data_owner"),
    "Computation/UploadStatus": ("a", "data_owner"),
    "Computation/StudyStatus": ("a", "data_owner"),
    "Computation/JoinExchange": ("a", "data_owner"),
    "Computation/JoinPlacement": ("a", "data_owner"),
    "Computation/ReleaseStatus": (ANALYST_ID, "analyst"),
    "Computation": (OPERATOR_ID, "operator"),
    "Analyst": (ANALYST_ID, "analyst"),
}

#: Codes a handler answers bad input with (the error table); anything else is a bug.
EXPECTED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ALREADY_EXISTS}

FUZZ = settings(max_examples=30, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class _World:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.contract = cluster.open_study(domain_size=64, owners=("a", "b"), strategy="gap")
        self.channels: dict[str, grpc.Channel] = {}
        be = BfvBackend(load_context(cluster.ds.handler.public_key_for("s1")[0]))
        #: A genuine ciphertext of the study's key: uploads get as far as the signature check.
        self.ciphertext = be.serialize_chunk(be.encrypt(owner_encoding(np.ones(64, dtype=int))).chunks[0])
        c = self.contract
        self.submit_header = computation_pb2.SubmitHeader(
            study_id="s1", owner_id="a", idempotency_key="fz", domain_length=64,
            context_fingerprint=c.context_fingerprint, chunk_count=1, contract_hash=c.contract_hash,
            signature=b"\0" * 64)
        self.join_header = decryption_pb2.DecryptJoinCellsHeader(
            study_id="s1", release_id="r-fzj", release_epsilon=0.5, contract_hash=c.contract_hash, cell_count=1)
        self.decrypt_header = decryption_pb2.DecryptMeasurementHeader(
            study_id="s1", release_id="r-fz", release_epsilon=0.5, chunk_count=1, contract_hash=c.contract_hash,
            measurement=measurement_to_proto(PrefixDifferences(64, 0.1, 2)))

    def channel(self, service: str, method: str) -> grpc.Channel:
        party, role = CALLER.get(f"{service}/{method}") or CALLER[service]
        key = f"{service}:{party}"
        if key not in self.channels:
            tls = self.cluster.tls(party, role)
            assert tls is not None
            target = self.cluster.ds.target if service == "Decryption" else self.cluster.cs.target
            self.channels[key] = grpc.secure_channel(target, tls.channel_credentials(), options=list(GRPC_OPTIONS))
        return self.channels[key]

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_World]:
    cluster = Cluster.start(Path(tmp_path_factory.mktemp("fuzz")), secure=True)
    w = _World(cluster)
    try:
        yield w
    finally:
        w.close()
        cluster.stop()


def _method(service: str, name: str) -> pbd.MethodDescriptor:
    return SERVICES[service].DESCRIPTOR.services_by_name[service].methods_by_name[name]


def _invoke(ch: grpc.Channel, service: str, name: str, requests: list[bytes]) -> tuple[grpc.StatusCode, str]:
    """Send serialized requests as they are; return the status the server answered with."""
    m = _method(service, name)
    path = f"/dpagg.v1.{service}/{name}"
    try:
        if m.client_streaming and m.server_streaming:  # IssueShares (key-share holders; refused here, K = 1)
            for _ in ch.stream_stream(path)(iter(requests), timeout=20):
                pass
        elif m.client_streaming:
            ch.stream_unary(path)(iter(requests), timeout=20)
        elif m.server_streaming:
            for _ in ch.unary_stream(path)(requests[0] if requests else b"", timeout=20):
                pass
        else:
            ch.unary_unary(path)(requests[0] if requests else b"", timeout=20)
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def _check(world: _World, before: tuple[object, ...], service: str, code: grpc.StatusCode, details: str,
           *, raw: bool) -> None:
    # Bytes that do not parse are INVALID_ARGUMENT too, never INTERNAL (parties.common.limits parses the request).
    assert code in EXPECTED and code != grpc.StatusCode.INTERNAL, (service, code, details, raw)
    assert "see the server log" not in details, details  # the sign of an unhandled exception
    target = world.cluster.ds.target if service == "Decryption" else world.cluster.cs.target
    health = health_pb2_grpc.HealthStub(world.channel(service, ""))
    assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == \
        health_pb2.HealthCheckResponse.SERVING, target
    assert world.cluster.snapshot() == before


# -- arbitrary bytes --------------------------------------------------------------------------

@pytest.mark.parametrize("service, name", METHODS, ids=[f"{s}.{n}" for s, n in METHODS])
@FUZZ
@given(data=st.lists(st.binary(max_size=300), min_size=0, max_size=3))
def test_random_bytes_at_every_rpc(world: _World, service: str, name: str, data: list[bytes]) -> None:
    before = world.cluster.snapshot()
    ch = world.channel(service, name)
    code, details = _invoke(ch, service, name, data)
    _check(world, before, service, code, details, raw=True)


# -- well-typed messages with random field values -------------------------------------------------

_INT_BOUNDS = {
    pbd.FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), pbd.FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    pbd.FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1), pbd.FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    pbd.FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), pbd.FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}


def _strings(world: _World, deep: bool) -> st.SearchStrategy[str]:
    real = ["s1", "a", "b", "", "rel-none", "k1", "gap", "partition_sums", "prefix_differences",
            "haar_coefficients", "../etc", "x" * 65]
    if deep:  # values that pass the header checks, so chunk handling is fuzzed too
        real += [world.contract.contract_hash, world.contract.context_fingerprint]
    return st.one_of(st.sampled_from(real), st.text(max_size=24))


def _scalar(f: pbd.FieldDescriptor, strings: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    t = f.type
    if t == pbd.FieldDescriptor.TYPE_STRING:
        return strings
    if t == pbd.FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=80), st.just(b"\0" * 64))
    if t == pbd.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == pbd.FieldDescriptor.TYPE_DOUBLE:
        return st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.1, 0.5, 1.0, 1e-300]))
    if t == pbd.FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32, allow_nan=True, allow_infinity=True)
    if t == pbd.FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in f.enum_type.values])
    lo, hi = _INT_BOUNDS[t]
    return st.one_of(st.integers(lo, hi), st.sampled_from([0, 1, 2, 64, 4096, -1]))


def _message(desc: pbd.Descriptor, strings: st.SearchStrategy[str], depth: int = 0) -> st.SearchStrategy[Any]:
    cls = message_factory.GetMessageClass(desc)
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for f in desc.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_f, val_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            parts[f.name] = st.dictionaries(_scalar(key_f, strings), _scalar(val_f, strings), max_size=3)
            continue
        if f.message_type is not None:
            if depth >= 3:
                continue
            inner = _message(f.message_type, strings, depth + 1)
        else:
            inner = _scalar(f, strings)
        parts[f.name] = st.lists(inner, max_size=3) if f.is_repeated else inner

    def build(values: dict[str, Any]) -> Any:
        msg = cls()
        for name, v in values.items():
            f = desc.fields_by_name[name]
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                getattr(msg, name).update(v)
            elif f.is_repeated:
                getattr(msg, name).extend(v)
            elif f.message_type is not None:
                getattr(msg, name).CopyFrom(v)
            else:
                setattr(msg, name, v)
        return msg

    return st.fixed_dictionaries({}, optional=parts).map(build)


def _mutated(base: Any, strings: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """`base` (a valid header) with a random subset of its fields replaced by random values."""
    desc = base.DESCRIPTOR
    changes = _message(desc, strings)

    def merge(changed: Any) -> Any:
        out = type(base)()
        out.CopyFrom(base)
        for f, _ in changed.ListFields():
            out.ClearField(f.name)
        out.MergeFrom(changed)
        return out

    return changes.map(merge)


def _typed_requests(world: _World, service: str, name: str) -> st.SearchStrategy[list[bytes]]:
    m = _method(service, name)
    deep = name in ("SubmitHistogram", "DecryptMeasurement", "IssueShares")
    strings = _strings(world, deep)
    msgs = _message(m.input_type, strings)
    proper = st.lists(msgs, min_size=1, max_size=3)  # any other stream (ForwardUploads): well-typed random parts
    if name == "SubmitHistogram":  # a near-valid header, then chunks (genuine ciphertexts among them)
        chunk = st.builds(lambda i, d: computation_pb2.SubmitHistogramRequest(
            chunk=computation_pb2.CiphertextChunk(index=i, data=d)),
            st.sampled_from([0, 0, 1, -1, 2**40]), st.one_of(st.just(world.ciphertext), st.binary(max_size=80)))
        header = _mutated(world.submit_header, strings).map(lambda h: computation_pb2.SubmitHistogramRequest(header=h))
        proper = st.tuples(header, st.lists(chunk, max_size=2)).map(lambda t: [t[0], *t[1]])
    elif name in ("DecryptMeasurement", "IssueShares"):  # a near-valid header, then random chunk bytes (never a decryption)
        chunk = st.one_of(  # random chunk bytes, or a page of partition starts (announced or not)
            st.binary(max_size=80).map(lambda d: decryption_pb2.DecryptMeasurementRequest(chunk=d)),
            st.lists(st.integers(-2**40, 2**40), max_size=6).map(lambda v: decryption_pb2.DecryptMeasurementRequest(
                starts=decryption_pb2.Int64Page(values=v))))
        header = _mutated(world.decrypt_header, strings).map(
            lambda h: decryption_pb2.DecryptMeasurementRequest(header=h))
        proper = st.tuples(header, st.lists(chunk, max_size=2)).map(lambda t: [t[0], *t[1]])
    elif name == "DecryptJoinCells":  # a near-valid header (the study is no join study), then random cell bytes
        cell = st.binary(max_size=80).map(lambda d: decryption_pb2.DecryptJoinCellsRequest(cell=d))
        header = _mutated(world.join_header, strings).map(lambda h: decryption_pb2.DecryptJoinCellsRequest(header=h))
        proper = st.tuples(header, st.lists(cell, max_size=2)).map(lambda t: [t[0], *t[1]])
    if m.client_streaming:
        anything = st.lists(msgs, max_size=4)
        return st.one_of(proper, proper, anything).map(lambda ms: [x.SerializeToString() for x in ms])
    return msgs.map(lambda x: [x.SerializeToString()])


@pytest.mark.parametrize("service, name", METHODS, ids=[f"{s}.{n}" for s, n in METHODS])
@FUZZ
@given(data=st.data())
def test_well_typed_messages_with_random_fields_at_every_rpc(world: _World, service: str, name: str,
                                                            data: st.DataObject) -> None:
    requests = data.draw(_typed_requests(world, service, name))
    before = world.cluster.snapshot()
    code, details = _invoke(world.channel(service, name), service, name, requests)
    _check(world, before, service, code, details, raw=False)


def test_the_fuzz_covers_every_rpc_the_protos_define() -> None:
    assert len(METHODS) == 35 and len(set(METHODS)) == 35
    described: Callable[[str], set[str]] = lambda svc: {m.name for m in SERVICES[svc].DESCRIPTOR.services_by_name[
        svc].methods}
    assert {f"{s}/{n}" for s, n in METHODS} == {f"{s}/{n}" for s in SERVICES for n in described(s)}
