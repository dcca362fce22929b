"""Conversion between protobuf messages and domain objects (contracts, measurements, summaries)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from parties.wire.v1 import common_pb2, decryption_pb2
from he_partition.core.errors import InvalidInputError
from he_partition.core.measurements import Measurement, PartitionSums, measurement_from_dict
from he_partition.core.summary import RangeCount, RangeCounts, ReleasedValues, Summary

from .config import CONTEXT_CHUNK_BYTES
from .approval import StudyApproval
from .contract import StudyContract, canonical_json, check_id
from .sealing import Commitment
from .signing import OwnerSignature

__all__ = [
    "open_study_kwargs",
    "approval_to_proto",
    "contract_to_proto",
    "contract_from_proto",
    "measurement_json",
    "measurement_to_proto",
    "measurement_from_proto",
    "summary_to_proto",
    "summary_from_proto",
    "range_counts_to_proto",
    "range_counts_from_proto",
    "ranges_to_proto",
    "ranges_from_proto",
    "signatures_to_proto",
    "owner_keys_to_proto",
    "signatures_from_proto",
]


def contract_to_proto(c: StudyContract) -> common_pb2.StudyContract:
    return common_pb2.StudyContract(
        version=c.version,
        study_id=c.study_id,
        domain_size=c.domain_size,
        epsilon=c.epsilon,
        strategy=c.strategy,
        contribution_bound=c.contribution_bound,
        noise_parties=c.noise_parties,
        expected_owners=list(c.expected_owners),
        context_fingerprint=c.context_fingerprint,
        strategy_params_json=c.strategy_params_json,
        contract_hash=c.contract_hash,
        domain_spec=c.domain_spec,
        owner_keys=dict(c.owner_keys),
        correlation_leakage=c.correlation_leakage,
        correlation_source=c.correlation_source,
        max_organizations=c.max_organizations,
        max_records_per_owner=c.max_records_per_owner,
        holder_seal_keys=list(c.holder_seal_keys),
        noise_tolerates=c.noise_tolerates,
        seal_threshold=c.seal_threshold,
    )


def contract_from_proto(p: common_pb2.StudyContract, *, verify_hash: bool = True) -> StudyContract:
    """Rebuild and validate a contract; with `verify_hash`, a hash that does not match the fields is refused."""
    c = StudyContract(
        version=p.version,
        study_id=p.study_id,
        domain_size=int(p.domain_size),
        epsilon=float(p.epsilon),
        strategy=p.strategy,
        contribution_bound=int(p.contribution_bound),
        noise_parties=int(p.noise_parties),
        expected_owners=tuple(p.expected_owners),
        context_fingerprint=p.context_fingerprint,
        strategy_params_json=p.strategy_params_json or "{}",
        domain_spec=p.domain_spec,
        owner_keys=tuple(p.owner_keys.items()),
        correlation_leakage=float(p.correlation_leakage),
        correlation_source=p.correlation_source,
        max_organizations=int(p.max_organizations) or 1,
        holder_seal_keys=tuple(p.holder_seal_keys),
        noise_tolerates=int(p.noise_tolerates),
        seal_threshold=int(p.seal_threshold),
    )
    if verify_hash and p.contract_hash and p.contract_hash != c.contract_hash:
        raise InvalidInputError(
            f"contract hash mismatch for study {c.study_id}: received {p.contract_hash}, fields hash to "
            f"{c.contract_hash}; the contract was altered in transit or built by an incompatible version"
        )
    return c


#: Partition starts formatted per block when a measurement's spec is written (`measurement_json`).
_JSON_BLOCK = 1 << 16


def measurement_json(m: Measurement) -> str:
    """`canonical_json(m.to_dict())`, the text that names a measurement (its hash is in each ledger row and it
    keys the key holder's draw), written without a Python int per partition start.

    The same text, character for character: "starts" is the last of a partition-sums spec's sorted keys, and
    each start is written as json writes an int, a block of starts at a time (at 2^24 starts the list of
    Python ints `to_dict` makes would be about 600 MB more).
    """
    if not isinstance(m, PartitionSums) or len(m.starts) <= _JSON_BLOCK:
        return canonical_json(m.to_dict())
    head = canonical_json(Measurement.to_dict(m))  # every field but the starts, sorted; "starts" sorts last
    starts = np.asarray(m.starts)
    parts = [head[:-1], ',"starts":[']
    for lo in range(0, len(starts), _JSON_BLOCK):
        parts.extend(("," if lo else "", ",".join(map(str, starts[lo:lo + _JSON_BLOCK].tolist()))))
    parts.append("]}")
    return "".join(parts)  # one copy of the text besides its blocks


def measurement_to_proto(m: Measurement, *, with_starts: bool = True) -> common_pb2.MeasurementSpec:
    """The measurement's spec; `with_starts=False` leaves the partition starts out (they travel in pages)."""
    starts = getattr(m, "starts", None)
    return common_pb2.MeasurementSpec(
        kind=m.kind, domain_size=int(m.domain_size), epsilon=float(m.epsilon), sensitivity=int(m.sensitivity),
        starts=np.asarray(starts, dtype=np.int64).tolist() if with_starts and starts is not None else [],
        lo=int(getattr(m, "lo", 0)), hi=int(getattr(m, "hi", 0)),
    )


def measurement_from_proto(p: common_pb2.MeasurementSpec, starts: npt.NDArray[np.int64] | None = None) -> Measurement:
    """The measurement a spec names; `starts`: its partition starts when they came in pages (not in `p`)."""
    d: dict[str, Any] = {"kind": p.kind, "domain_size": int(p.domain_size), "epsilon": float(p.epsilon),
                         "sensitivity": int(p.sensitivity)}
    if p.kind == "partition_sums":
        d["starts"] = starts if starts is not None else np.fromiter(p.starts, dtype=np.int64, count=len(p.starts))
    elif len(p.starts):
        raise InvalidInputError(f"measurement kind {p.kind!r} takes no partition starts")
    if p.kind == "range_count":
        d["lo"], d["hi"] = int(p.lo), int(p.hi)
    elif p.lo or p.hi:
        raise InvalidInputError(f"measurement kind {p.kind!r} takes no range (lo, hi)")
    return measurement_from_dict(d)


def owner_keys_to_proto(keys: Mapping[str, str | bytes] | None) -> dict[str, str]:
    """Owner keys as the wire carries them: owner id -> lowercase hex of the raw Ed25519 public key."""
    if not keys:
        return {}
    return {o: (bytes(k).hex() if isinstance(k, (bytes, bytearray)) else str(k).lower()) for o, k in keys.items()}


def signatures_to_proto(sigs: Iterable[OwnerSignature]) -> list[common_pb2.OwnerSignature]:
    return [common_pb2.OwnerSignature(owner_id=s.owner_id, idempotency_key=s.idempotency_key,
                                      ciphertext_digest=s.ciphertext_digest, signature=s.signature) for s in sigs]


def signatures_from_proto(sigs: Iterable[common_pb2.OwnerSignature]) -> tuple[OwnerSignature, ...]:
    return tuple(OwnerSignature(s.owner_id, s.idempotency_key, bytes(s.ciphertext_digest), bytes(s.signature))
                 for s in sigs)


def summary_to_proto(s: Summary, *, release_id: str, study_id: str, owners: Sequence[str] = (),
                     contract_hash: str = "", created_at: str = "",
                     owner_signatures: Sequence[OwnerSignature] = (), lists: bool = True
                     ) -> common_pb2.ReleaseSummary:
    """The summary as a message; `lists=False` leaves out the lists that grow with the domain (the partitions'
    starts, sums and variances and each released measurement's values and starts: they travel in pages)."""
    return common_pb2.ReleaseSummary(
        release_id=release_id,
        study_id=study_id,
        domain_size=s.domain_size,
        epsilon=s.epsilon,
        strategy=s.strategy,
        noise_parties=s.noise_parties,
        contribution_bound=s.contribution_bound,
        # Summary holds Python ints and floats (its __post_init__ checks the shapes)
        starts=s.starts if lists else (),
        sums=s.sums if lists else (),
        sum_variance=s.sum_variance if lists else (),
        epsilon_spent=[common_pb2.EpsilonCharge(what=k, epsilon=float(v)) for k, v in s.epsilon_spent],
        params_json=json.dumps(s.params, sort_keys=True),
        owners=list(owners),
        contract_hash=contract_hash,
        created_at=created_at,
        estimator="" if s.estimator == "partition" else s.estimator,
        released=[common_pb2.ReleasedValues(kind=r.kind, values=[int(v) for v in r.values] if lists else [],
                                            variance=r.variance, epsilon=r.epsilon,
                                            starts=[int(v) for v in r.starts] if lists else [])
                  for r in s.released],
        owner_signatures=signatures_to_proto(owner_signatures),
    )


def summary_from_proto(p: common_pb2.ReleaseSummary, *,
                       partitions: tuple[Sequence[int], Sequence[int], Sequence[float]] | None = None) -> Summary:
    """The summary of a message; `partitions`: (starts, sums, sum_variance) read elsewhere (in pages), in place of
    the message's own lists."""
    starts, sums, variance = partitions if partitions is not None else (p.starts, p.sums, p.sum_variance)
    try:
        params = json.loads(p.params_json) if p.params_json else {}
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"release {p.release_id}: params_json is not JSON: {exc}") from exc
    return Summary(
        domain_size=int(p.domain_size),
        epsilon=float(p.epsilon),
        strategy=p.strategy,
        noise_parties=int(p.noise_parties),
        contribution_bound=int(p.contribution_bound),
        starts=tuple(starts),  # repeated int64 / double fields read as Python ints / floats
        sums=tuple(sums),
        sum_variance=tuple(variance),
        epsilon_spent=tuple((e.what, float(e.epsilon)) for e in p.epsilon_spent),
        params=params,
        estimator=p.estimator or "partition",
        released=tuple(ReleasedValues(kind=r.kind, values=tuple(int(v) for v in r.values), variance=float(r.variance),
                                      epsilon=float(r.epsilon), starts=tuple(int(v) for v in r.starts))
                       for r in p.released),
    )


def ranges_to_proto(ranges: Iterable[tuple[int, int]]) -> list[common_pb2.Range]:
    return [common_pb2.Range(lo=int(lo), hi=int(hi)) for lo, hi in ranges]


def ranges_from_proto(ranges: Iterable[common_pb2.Range]) -> list[tuple[int, int]]:
    return [(int(r.lo), int(r.hi)) for r in ranges]


def range_counts_to_proto(counts: Iterable[RangeCount]) -> list[common_pb2.RangeCount]:
    return [common_pb2.RangeCount(lo=c.lo, hi=c.hi, value=c.value, standard_error=c.standard_error) for c in counts]


def range_counts_from_proto(counts: Iterable[common_pb2.RangeCount]) -> RangeCounts:
    return RangeCounts(RangeCount(int(c.lo), int(c.hi), float(c.value), float(c.standard_error)) for c in counts)


def open_study_request(*, study_id: str, domain_size: int, epsilon: float, expected_owners: Sequence[str],
                       strategy: str, contribution_bound: int, noise_parties: int, strategy_params_json: str,
                       domain_spec: str, owner_keys: Mapping[str, str | bytes] | None, correlation_leakage: float,
                       correlation_source: str, max_organizations: int = 1,
                       holder_seal_keys: Sequence[str] = (),
                       noise_tolerates: int | None = None,
                       approval: StudyApproval | None = None) -> decryption_pb2.OpenStudyRequest:
    """The `dpagg.v1.OpenStudyRequest` both clients send (the inverse of `open_study_kwargs`).

    `noise_tolerates` None leaves the field unset: the receiver fills its default (K - 1 in
    threshold mode, 0 at the single decryption server).
    """
    request = decryption_pb2.OpenStudyRequest(
        study_id=study_id, domain_size=domain_size, epsilon=epsilon, strategy=strategy,
        contribution_bound=contribution_bound, noise_parties=noise_parties, expected_owners=list(expected_owners),
        strategy_params_json=strategy_params_json, domain_spec=domain_spec,
        owner_keys=owner_keys_to_proto(owner_keys), correlation_leakage=correlation_leakage,
        correlation_source=correlation_source, max_organizations=max_organizations,
        holder_seal_keys=list(holder_seal_keys),
    )
    if noise_tolerates is not None:
        request.noise_tolerates = int(noise_tolerates)
    if approval is not None:
        request.approval.CopyFrom(approval_to_proto(approval))
    return request


def approval_to_proto(approval: StudyApproval) -> decryption_pb2.StudyApproval:
    """An operator's approval as `OpenStudyRequest.approval` carries it."""
    return decryption_pb2.StudyApproval(terms_json=approval.terms_json, operator_key=approval.operator_key,
                                        signature=approval.signature)


def open_study_kwargs(request: Any) -> dict[str, Any]:
    """Handler arguments of a `dpagg.v1.OpenStudyRequest` (the same message reaches both servers)."""
    return dict(
        study_id=request.study_id, domain_size=request.domain_size, epsilon=request.epsilon,
        expected_owners=list(request.expected_owners), strategy=request.strategy,
        contribution_bound=request.contribution_bound, noise_parties=request.noise_parties,
        strategy_params_json=request.strategy_params_json, domain_spec=request.domain_spec,
        owner_keys=dict(request.owner_keys), correlation_leakage=request.correlation_leakage,
        correlation_source=request.correlation_source, max_organizations=request.max_organizations,
        holder_seal_keys=tuple(getattr(request, "holder_seal_keys", ())),
        noise_tolerates=int(request.noise_tolerates) if request.HasField("noise_tolerates") else None,
        approval=(StudyApproval(request.approval.terms_json, bytes(request.approval.operator_key),
                                bytes(request.approval.signature)) if request.HasField("approval") else None),
    )


def commitments_to_proto(commitments: Iterable[Commitment]) -> list[decryption_pb2.UploadCommitment]:
    """Owners' upload commitments as `CloseUploadsRequest.commitments` carries them."""
    return [decryption_pb2.UploadCommitment(owner_id=c.owner_id, idempotency_key=c.idempotency_key,
                                            c1_parts_digest=c.c1_parts_digest, key_shares=list(c.key_shares),
                                            signature=c.signature) for c in commitments]


def commitments_from_proto(items: Iterable[Any]) -> list[Commitment]:
    """The inverse of `commitments_to_proto` (ids checked)."""
    return [Commitment(check_id("owner_id", c.owner_id), check_id("idempotency_key", c.idempotency_key),
                       bytes(c.c1_parts_digest), tuple(bytes(s) for s in c.key_shares), bytes(c.signature))
            for c in items]


def context_to_chunks(data: bytes, fingerprint: str) -> Iterator[decryption_pb2.PublicContextChunk]:
    """A serialized public context as the PublicContextChunk stream both servers send."""
    for offset in range(0, len(data), CONTEXT_CHUNK_BYTES):
        yield decryption_pb2.PublicContextChunk(total_size=len(data), offset=offset,
                                                data=data[offset:offset + CONTEXT_CHUNK_BYTES], fingerprint=fingerprint)


def context_from_chunks(chunks: Iterable[decryption_pb2.PublicContextChunk]) -> bytes:
    """Reassemble a PublicContextChunk stream and check its SHA-256 fingerprint (InvalidInputError if corrupt)."""
    parts: list[bytes] = []
    total = -1
    fingerprint = ""
    for chunk in chunks:
        if chunk.offset != sum(len(p) for p in parts):
            raise InvalidInputError("public context chunks arrived out of order")
        parts.append(chunk.data)
        total, fingerprint = chunk.total_size, chunk.fingerprint
    data = b"".join(parts)
    if len(data) != total or hashlib.sha256(data).hexdigest() != fingerprint:
        raise InvalidInputError(
            f"public context download is corrupt ({len(data)} of {total} bytes, fingerprint mismatch); retry"
        )
    return data
