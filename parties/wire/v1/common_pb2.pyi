from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StudyContract(_message.Message):
    __slots__ = ("version", "study_id", "domain_size", "epsilon", "strategy", "contribution_bound", "noise_parties", "expected_owners", "context_fingerprint", "strategy_params_json", "contract_hash", "domain_spec", "owner_keys", "correlation_leakage", "correlation_source", "max_organizations", "max_records_per_owner", "holder_seal_keys", "noise_tolerates", "seal_threshold")
    class OwnerKeysEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTION_BOUND_FIELD_NUMBER: _ClassVar[int]
    NOISE_PARTIES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_OWNERS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_HASH_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_SPEC_FIELD_NUMBER: _ClassVar[int]
    OWNER_KEYS_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_LEAKAGE_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_SOURCE_FIELD_NUMBER: _ClassVar[int]
    MAX_ORGANIZATIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_PER_OWNER_FIELD_NUMBER: _ClassVar[int]
    HOLDER_SEAL_KEYS_FIELD_NUMBER: _ClassVar[int]
    NOISE_TOLERATES_FIELD_NUMBER: _ClassVar[int]
    SEAL_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    version: str
    study_id: str
    domain_size: int
    epsilon: float
    strategy: str
    contribution_bound: int
    noise_parties: int
    expected_owners: _containers.RepeatedScalarFieldContainer[str]
    context_fingerprint: str
    strategy_params_json: str
    contract_hash: str
    domain_spec: str
    owner_keys: _containers.ScalarMap[str, str]
    correlation_leakage: float
    correlation_source: str
    max_organizations: int
    max_records_per_owner: int
    holder_seal_keys: _containers.RepeatedScalarFieldContainer[str]
    noise_tolerates: int
    seal_threshold: int
    def __init__(self, version: _Optional[str] = ..., study_id: _Optional[str] = ..., domain_size: _Optional[int] = ..., epsilon: _Optional[float] = ..., strategy: _Optional[str] = ..., contribution_bound: _Optional[int] = ..., noise_parties: _Optional[int] = ..., expected_owners: _Optional[_Iterable[str]] = ..., context_fingerprint: _Optional[str] = ..., strategy_params_json: _Optional[str] = ..., contract_hash: _Optional[str] = ..., domain_spec: _Optional[str] = ..., owner_keys: _Optional[_Mapping[str, str]] = ..., correlation_leakage: _Optional[float] = ..., correlation_source: _Optional[str] = ..., max_organizations: _Optional[int] = ..., max_records_per_owner: _Optional[int] = ..., holder_seal_keys: _Optional[_Iterable[str]] = ..., noise_tolerates: _Optional[int] = ..., seal_threshold: _Optional[int] = ...) -> None: ...

class OwnerSignature(_message.Message):
    __slots__ = ("owner_id", "idempotency_key", "ciphertext_digest", "signature")
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    owner_id: str
    idempotency_key: str
    ciphertext_digest: bytes
    signature: bytes
    def __init__(self, owner_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., ciphertext_digest: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class MeasurementSpec(_message.Message):
    __slots__ = ("kind", "domain_size", "epsilon", "sensitivity", "starts", "lo", "hi")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    SENSITIVITY_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    LO_FIELD_NUMBER: _ClassVar[int]
    HI_FIELD_NUMBER: _ClassVar[int]
    kind: str
    domain_size: int
    epsilon: float
    sensitivity: int
    starts: _containers.RepeatedScalarFieldContainer[int]
    lo: int
    hi: int
    def __init__(self, kind: _Optional[str] = ..., domain_size: _Optional[int] = ..., epsilon: _Optional[float] = ..., sensitivity: _Optional[int] = ..., starts: _Optional[_Iterable[int]] = ..., lo: _Optional[int] = ..., hi: _Optional[int] = ...) -> None: ...

class ReleaseSummary(_message.Message):
    __slots__ = ("release_id", "study_id", "domain_size", "epsilon", "strategy", "noise_parties", "contribution_bound", "starts", "sums", "sum_variance", "epsilon_spent", "params_json", "owners", "contract_hash", "created_at", "estimator", "released", "owner_signatures")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    NOISE_PARTIES_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTION_BOUND_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    SUMS_FIELD_NUMBER: _ClassVar[int]
    SUM_VARIANCE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_HASH_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ESTIMATOR_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    OWNER_SIGNATURES_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    study_id: str
    domain_size: int
    epsilon: float
    strategy: str
    noise_parties: int
    contribution_bound: int
    starts: _containers.RepeatedScalarFieldContainer[int]
    sums: _containers.RepeatedScalarFieldContainer[int]
    sum_variance: _containers.RepeatedScalarFieldContainer[float]
    epsilon_spent: _containers.RepeatedCompositeFieldContainer[EpsilonCharge]
    params_json: str
    owners: _containers.RepeatedScalarFieldContainer[str]
    contract_hash: str
    created_at: str
    estimator: str
    released: _containers.RepeatedCompositeFieldContainer[ReleasedValues]
    owner_signatures: _containers.RepeatedCompositeFieldContainer[OwnerSignature]
    def __init__(self, release_id: _Optional[str] = ..., study_id: _Optional[str] = ..., domain_size: _Optional[int] = ..., epsilon: _Optional[float] = ..., strategy: _Optional[str] = ..., noise_parties: _Optional[int] = ..., contribution_bound: _Optional[int] = ..., starts: _Optional[_Iterable[int]] = ..., sums: _Optional[_Iterable[int]] = ..., sum_variance: _Optional[_Iterable[float]] = ..., epsilon_spent: _Optional[_Iterable[_Union[EpsilonCharge, _Mapping]]] = ..., params_json: _Optional[str] = ..., owners: _Optional[_Iterable[str]] = ..., contract_hash: _Optional[str] = ..., created_at: _Optional[str] = ..., estimator: _Optional[str] = ..., released: _Optional[_Iterable[_Union[ReleasedValues, _Mapping]]] = ..., owner_signatures: _Optional[_Iterable[_Union[OwnerSignature, _Mapping]]] = ...) -> None: ...

class ReleasedValues(_message.Message):
    __slots__ = ("kind", "values", "variance", "epsilon", "starts")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    VARIANCE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    values: _containers.RepeatedScalarFieldContainer[int]
    variance: float
    epsilon: float
    starts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, kind: _Optional[str] = ..., values: _Optional[_Iterable[int]] = ..., variance: _Optional[float] = ..., epsilon: _Optional[float] = ..., starts: _Optional[_Iterable[int]] = ...) -> None: ...

class EpsilonCharge(_message.Message):
    __slots__ = ("what", "epsilon")
    WHAT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    what: str
    epsilon: float
    def __init__(self, what: _Optional[str] = ..., epsilon: _Optional[float] = ...) -> None: ...

class Range(_message.Message):
    __slots__ = ("lo", "hi")
    LO_FIELD_NUMBER: _ClassVar[int]
    HI_FIELD_NUMBER: _ClassVar[int]
    lo: int
    hi: int
    def __init__(self, lo: _Optional[int] = ..., hi: _Optional[int] = ...) -> None: ...

class RangeCount(_message.Message):
    __slots__ = ("lo", "hi", "value", "standard_error")
    LO_FIELD_NUMBER: _ClassVar[int]
    HI_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    STANDARD_ERROR_FIELD_NUMBER: _ClassVar[int]
    lo: int
    hi: int
    value: float
    standard_error: float
    def __init__(self, lo: _Optional[int] = ..., hi: _Optional[int] = ..., value: _Optional[float] = ..., standard_error: _Optional[float] = ...) -> None: ...
