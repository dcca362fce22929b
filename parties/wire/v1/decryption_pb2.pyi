from parties.wire.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UploadCommitment(_message.Message):
    __slots__ = ("owner_id", "idempotency_key", "c1_parts_digest", "key_shares", "signature")
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    C1_PARTS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    KEY_SHARES_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    owner_id: str
    idempotency_key: str
    c1_parts_digest: bytes
    key_shares: _containers.RepeatedScalarFieldContainer[bytes]
    signature: bytes
    def __init__(self, owner_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., c1_parts_digest: _Optional[bytes] = ..., key_shares: _Optional[_Iterable[bytes]] = ..., signature: _Optional[bytes] = ...) -> None: ...

class CloseUploadsRequest(_message.Message):
    __slots__ = ("study_id", "contract_hash", "commitments")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_HASH_FIELD_NUMBER: _ClassVar[int]
    COMMITMENTS_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    contract_hash: str
    commitments: _containers.RepeatedCompositeFieldContainer[UploadCommitment]
    def __init__(self, study_id: _Optional[str] = ..., contract_hash: _Optional[str] = ..., commitments: _Optional[_Iterable[_Union[UploadCommitment, _Mapping]]] = ...) -> None: ...

class CloseUploadsResponse(_message.Message):
    __slots__ = ("key_shares", "holder")
    KEY_SHARES_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    key_shares: _containers.RepeatedScalarFieldContainer[bytes]
    holder: int
    def __init__(self, key_shares: _Optional[_Iterable[bytes]] = ..., holder: _Optional[int] = ...) -> None: ...

class ForwardUploadsRequest(_message.Message):
    __slots__ = ("study_id", "contract_hash", "owner_id", "idempotency_key", "signature", "index", "c1", "plane")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_HASH_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    C1_FIELD_NUMBER: _ClassVar[int]
    PLANE_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    contract_hash: str
    owner_id: str
    idempotency_key: str
    signature: bytes
    index: int
    c1: bytes
    plane: bytes
    def __init__(self, study_id: _Optional[str] = ..., contract_hash: _Optional[str] = ..., owner_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., signature: _Optional[bytes] = ..., index: _Optional[int] = ..., c1: _Optional[bytes] = ..., plane: _Optional[bytes] = ...) -> None: ...

class ForwardUploadsResponse(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: int
    def __init__(self, chunks: _Optional[int] = ...) -> None: ...

class GetPublicContextRequest(_message.Message):
    __slots__ = ("study_id",)
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    def __init__(self, study_id: _Optional[str] = ...) -> None: ...

class PublicContextChunk(_message.Message):
    __slots__ = ("total_size", "offset", "data", "fingerprint")
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    total_size: int
    offset: int
    data: bytes
    fingerprint: str
    def __init__(self, total_size: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., fingerprint: _Optional[str] = ...) -> None: ...

class OpenStudyRequest(_message.Message):
    __slots__ = ("study_id", "domain_size", "epsilon", "strategy", "contribution_bound", "noise_parties", "expected_owners", "strategy_params_json", "domain_spec", "owner_keys", "correlation_leakage", "correlation_source", "max_organizations", "holder_seal_keys", "noise_tolerates", "approval")
    class OwnerKeysEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTION_BOUND_FIELD_NUMBER: _ClassVar[int]
    NOISE_PARTIES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_OWNERS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_SPEC_FIELD_NUMBER: _ClassVar[int]
    OWNER_KEYS_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_LEAKAGE_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_SOURCE_FIELD_NUMBER: _ClassVar[int]
    MAX_ORGANIZATIONS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_SEAL_KEYS_FIELD_NUMBER: _ClassVar[int]
    NOISE_TOLERATES_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    domain_size: int
    epsilon: float
    strategy: str
    contribution_bound: int
    noise_parties: int
    expected_owners: _containers.RepeatedScalarFieldContainer[str]
    strategy_params_json: str
    domain_spec: str
    owner_keys: _containers.ScalarMap[str, str]
    correlation_leakage: float
    correlation_source: str
    max_organizations: int
    holder_seal_keys: _containers.RepeatedScalarFieldContainer[str]
    noise_tolerates: int
    approval: StudyApproval
    def __init__(self, study_id: _Optional[str] = ..., domain_size: _Optional[int] = ..., epsilon: _Optional[float] = ..., strategy: _Optional[str] = ..., contribution_bound: _Optional[int] = ..., noise_parties: _Optional[int] = ..., expected_owners: _Optional[_Iterable[str]] = ..., strategy_params_json: _Optional[str] = ..., domain_spec: _Optional[str] = ..., owner_keys: _Optional[_Mapping[str, str]] = ..., correlation_leakage: _Optional[float] = ..., correlation_source: _Optional[str] = ..., max_organizations: _Optional[int] = ..., holder_seal_keys: _Optional[_Iterable[str]] = ..., noise_tolerates: _Optional[int] = ..., approval: _Optional[_Union[StudyApproval, _Mapping]] = ...) -> None: ...

class StudyApproval(_message.Message):
    __slots__ = ("terms_json", "operator_key", "signature")
    TERMS_JSON_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    terms_json: str
    operator_key: bytes
    signature: bytes
    def __init__(self, terms_json: _Optional[str] = ..., operator_key: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class OpenStudyResponse(_message.Message):
    __slots__ = ("contract", "already_existed")
    CONTRACT_FIELD_NUMBER: _ClassVar[int]
    ALREADY_EXISTED_FIELD_NUMBER: _ClassVar[int]
    contract: _common_pb2.StudyContract
    already_existed: bool
    def __init__(self, contract: _Optional[_Union[_common_pb2.StudyContract, _Mapping]] = ..., already_existed: _Optional[bool] = ...) -> None: ...

class GetStudyRequest(_message.Message):
    __slots__ = ("study_id",)
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    def __init__(self, study_id: _Optional[str] = ...) -> None: ...

class GetStudyResponse(_message.Message):
    __slots__ = ("contract",)
    CONTRACT_FIELD_NUMBER: _ClassVar[int]
    contract: _common_pb2.StudyContract
    def __init__(self, contract: _Optional[_Union[_common_pb2.StudyContract, _Mapping]] = ...) -> None: ...

class DecryptMeasurementHeader(_message.Message):
    __slots__ = ("study_id", "release_id", "release_epsilon", "measurement", "chunk_count", "contract_hash", "newest_receipt", "starts_count", "charge_log", "participants")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_EPSILON_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_HASH_FIELD_NUMBER: _ClassVar[int]
    NEWEST_RECEIPT_FIELD_NUMBER: _ClassVar[int]
    STARTS_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHARGE_LOG_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    release_id: str
    release_epsilon: float
    measurement: _common_pb2.MeasurementSpec
    chunk_count: int
    contract_hash: str
    newest_receipt: LedgerReceipt
    starts_count: int
    charge_log: str
    participants: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, study_id: _Optional[str] = ..., release_id: _Optional[str] = ..., release_epsilon: _Optional[float] = ..., measurement: _Optional[_Union[_common_pb2.MeasurementSpec, _Mapping]] = ..., chunk_count: _Optional[int] = ..., contract_hash: _Optional[str] = ..., newest_receipt: _Optional[_Union[LedgerReceipt, _Mapping]] = ..., starts_count: _Optional[int] = ..., charge_log: _Optional[str] = ..., participants: _Optional[_Iterable[int]] = ...) -> None: ...

class Int64Page(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class DecryptMeasurementRequest(_message.Message):
    __slots__ = ("header", "chunk", "starts")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    header: DecryptMeasurementHeader
    chunk: bytes
    starts: Int64Page
    def __init__(self, header: _Optional[_Union[DecryptMeasurementHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ..., starts: _Optional[_Union[Int64Page, _Mapping]] = ...) -> None: ...

class DecryptMeasurementResponse(_message.Message):
    __slots__ = ("values", "charge_id", "epsilon_remaining", "receipt", "value_count")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    CHARGE_ID_FIELD_NUMBER: _ClassVar[int]
    EPSILON_REMAINING_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    VALUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    charge_id: int
    epsilon_remaining: float
    receipt: LedgerReceipt
    value_count: int
    def __init__(self, values: _Optional[_Iterable[int]] = ..., charge_id: _Optional[int] = ..., epsilon_remaining: _Optional[float] = ..., receipt: _Optional[_Union[LedgerReceipt, _Mapping]] = ..., value_count: _Optional[int] = ...) -> None: ...

class LedgerReceipt(_message.Message):
    __slots__ = ("body", "signature", "public_key")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    signature: bytes
    public_key: bytes
    def __init__(self, body: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., public_key: _Optional[bytes] = ...) -> None: ...

class DecryptJoinCellsHeader(_message.Message):
    __slots__ = ("study_id", "release_id", "release_epsilon", "contract_hash", "cell_count", "measurement")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_EPSILON_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_HASH_FIELD_NUMBER: _ClassVar[int]
    CELL_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENT_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    release_id: str
    release_epsilon: float
    contract_hash: str
    cell_count: int
    measurement: _common_pb2.MeasurementSpec
    def __init__(self, study_id: _Optional[str] = ..., release_id: _Optional[str] = ..., release_epsilon: _Optional[float] = ..., contract_hash: _Optional[str] = ..., cell_count: _Optional[int] = ..., measurement: _Optional[_Union[_common_pb2.MeasurementSpec, _Mapping]] = ...) -> None: ...

class DecryptJoinCellsRequest(_message.Message):
    __slots__ = ("header", "cell")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CELL_FIELD_NUMBER: _ClassVar[int]
    header: DecryptJoinCellsHeader
    cell: bytes
    def __init__(self, header: _Optional[_Union[DecryptJoinCellsHeader, _Mapping]] = ..., cell: _Optional[bytes] = ...) -> None: ...

class JoinCheckSeedRequest(_message.Message):
    __slots__ = ("study_id", "contract_hash")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_HASH_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    contract_hash: str
    def __init__(self, study_id: _Optional[str] = ..., contract_hash: _Optional[str] = ...) -> None: ...

class JoinCheckSeedResponse(_message.Message):
    __slots__ = ("seed", "rounds")
    SEED_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    seed: bytes
    rounds: int
    def __init__(self, seed: _Optional[bytes] = ..., rounds: _Optional[int] = ...) -> None: ...

class CheckJoinUploadRequest(_message.Message):
    __slots__ = ("study_id", "contract_hash", "owner_id", "seed", "residues")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_HASH_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    RESIDUES_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    contract_hash: str
    owner_id: str
    seed: bytes
    residues: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, study_id: _Optional[str] = ..., contract_hash: _Optional[str] = ..., owner_id: _Optional[str] = ..., seed: _Optional[bytes] = ..., residues: _Optional[_Iterable[bytes]] = ...) -> None: ...

class CheckJoinUploadResponse(_message.Message):
    __slots__ = ("well_formed",)
    WELL_FORMED_FIELD_NUMBER: _ClassVar[int]
    well_formed: bool
    def __init__(self, well_formed: _Optional[bool] = ...) -> None: ...

class DecryptJoinCellsResponse(_message.Message):
    __slots__ = ("values", "variance", "epsilon_charged", "epsilon_remaining")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    VARIANCE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_CHARGED_FIELD_NUMBER: _ClassVar[int]
    EPSILON_REMAINING_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    variance: float
    epsilon_charged: float
    epsilon_remaining: float
    def __init__(self, values: _Optional[_Iterable[int]] = ..., variance: _Optional[float] = ..., epsilon_charged: _Optional[float] = ..., epsilon_remaining: _Optional[float] = ...) -> None: ...

class BudgetStatusRequest(_message.Message):
    __slots__ = ("study_id",)
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    def __init__(self, study_id: _Optional[str] = ...) -> None: ...

class LedgerCharge(_message.Message):
    __slots__ = ("charge_id", "release_id", "kind", "epsilon", "created_at")
    CHARGE_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    charge_id: int
    release_id: str
    kind: str
    epsilon: float
    created_at: str
    def __init__(self, charge_id: _Optional[int] = ..., release_id: _Optional[str] = ..., kind: _Optional[str] = ..., epsilon: _Optional[float] = ..., created_at: _Optional[str] = ...) -> None: ...

class BudgetStatusResponse(_message.Message):
    __slots__ = ("study_id", "epsilon_total", "epsilon_spent", "epsilon_remaining", "charges", "epsilon_reserved", "chain_problem", "epsilon_available", "receipt_public_key", "key_threshold", "charge_log_entries", "charge_log_spent", "charges_signed")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    EPSILON_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_REMAINING_FIELD_NUMBER: _ClassVar[int]
    CHARGES_FIELD_NUMBER: _ClassVar[int]
    EPSILON_RESERVED_FIELD_NUMBER: _ClassVar[int]
    CHAIN_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    KEY_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    CHARGE_LOG_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CHARGE_LOG_SPENT_FIELD_NUMBER: _ClassVar[int]
    CHARGES_SIGNED_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    epsilon_total: float
    epsilon_spent: float
    epsilon_remaining: float
    charges: _containers.RepeatedCompositeFieldContainer[LedgerCharge]
    epsilon_reserved: float
    chain_problem: str
    epsilon_available: float
    receipt_public_key: bytes
    key_threshold: int
    charge_log_entries: int
    charge_log_spent: float
    charges_signed: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, study_id: _Optional[str] = ..., epsilon_total: _Optional[float] = ..., epsilon_spent: _Optional[float] = ..., epsilon_remaining: _Optional[float] = ..., charges: _Optional[_Iterable[_Union[LedgerCharge, _Mapping]]] = ..., epsilon_reserved: _Optional[float] = ..., chain_problem: _Optional[str] = ..., epsilon_available: _Optional[float] = ..., receipt_public_key: _Optional[bytes] = ..., key_threshold: _Optional[int] = ..., charge_log_entries: _Optional[int] = ..., charge_log_spent: _Optional[float] = ..., charges_signed: _Optional[_Iterable[int]] = ...) -> None: ...

class ChargeDirectQueriesRequest(_message.Message):
    __slots__ = ("study_id", "request_id", "contract_hash", "ranges", "epsilon", "newest_receipt")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_HASH_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    NEWEST_RECEIPT_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    request_id: str
    contract_hash: str
    ranges: _containers.RepeatedCompositeFieldContainer[_common_pb2.Range]
    epsilon: float
    newest_receipt: LedgerReceipt
    def __init__(self, study_id: _Optional[str] = ..., request_id: _Optional[str] = ..., contract_hash: _Optional[str] = ..., ranges: _Optional[_Iterable[_Union[_common_pb2.Range, _Mapping]]] = ..., epsilon: _Optional[float] = ..., newest_receipt: _Optional[_Union[LedgerReceipt, _Mapping]] = ...) -> None: ...

class ChargeDirectQueriesResponse(_message.Message):
    __slots__ = ("epsilon_charged", "epsilon_direct_total", "epsilon_remaining", "charge_id", "already_charged", "receipt")
    EPSILON_CHARGED_FIELD_NUMBER: _ClassVar[int]
    EPSILON_DIRECT_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EPSILON_REMAINING_FIELD_NUMBER: _ClassVar[int]
    CHARGE_ID_FIELD_NUMBER: _ClassVar[int]
    ALREADY_CHARGED_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    epsilon_charged: float
    epsilon_direct_total: float
    epsilon_remaining: float
    charge_id: int
    already_charged: bool
    receipt: LedgerReceipt
    def __init__(self, epsilon_charged: _Optional[float] = ..., epsilon_direct_total: _Optional[float] = ..., epsilon_remaining: _Optional[float] = ..., charge_id: _Optional[int] = ..., already_charged: _Optional[bool] = ..., receipt: _Optional[_Union[LedgerReceipt, _Mapping]] = ...) -> None: ...

class SignChargeRequest(_message.Message):
    __slots__ = ("study_id", "entry", "charge_log")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    CHARGE_LOG_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    entry: str
    charge_log: str
    def __init__(self, study_id: _Optional[str] = ..., entry: _Optional[str] = ..., charge_log: _Optional[str] = ...) -> None: ...

class SignChargeResponse(_message.Message):
    __slots__ = ("holder", "signature")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    holder: int
    signature: bytes
    def __init__(self, holder: _Optional[int] = ..., signature: _Optional[bytes] = ...) -> None: ...

class KeySetupRequest(_message.Message):
    __slots__ = ("step", "session", "holders", "messages", "ciphertext", "values", "threshold", "participants", "join_version")
    class MessagesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: bytes
        def __init__(self, key: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    JOIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    step: str
    session: bytes
    holders: _containers.RepeatedScalarFieldContainer[str]
    messages: _containers.ScalarMap[int, bytes]
    ciphertext: bytes
    values: _containers.RepeatedScalarFieldContainer[int]
    threshold: int
    participants: _containers.RepeatedScalarFieldContainer[int]
    join_version: int
    def __init__(self, step: _Optional[str] = ..., session: _Optional[bytes] = ..., holders: _Optional[_Iterable[str]] = ..., messages: _Optional[_Mapping[int, bytes]] = ..., ciphertext: _Optional[bytes] = ..., values: _Optional[_Iterable[int]] = ..., threshold: _Optional[int] = ..., participants: _Optional[_Iterable[int]] = ..., join_version: _Optional[int] = ...) -> None: ...

class JoinCheckRequest(_message.Message):
    __slots__ = ("study_id", "contract_hash", "step", "messages", "participants")
    class MessagesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: bytes
        def __init__(self, key: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_HASH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    contract_hash: str
    step: str
    messages: _containers.ScalarMap[int, bytes]
    participants: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, study_id: _Optional[str] = ..., contract_hash: _Optional[str] = ..., step: _Optional[str] = ..., messages: _Optional[_Mapping[int, bytes]] = ..., participants: _Optional[_Iterable[int]] = ...) -> None: ...

class JoinCheckResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: bytes
    def __init__(self, message: _Optional[bytes] = ...) -> None: ...

class JoinSharesRequest(_message.Message):
    __slots__ = ("header", "participants", "charge_log")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    CHARGE_LOG_FIELD_NUMBER: _ClassVar[int]
    header: DecryptJoinCellsHeader
    participants: _containers.RepeatedScalarFieldContainer[int]
    charge_log: str
    def __init__(self, header: _Optional[_Union[DecryptJoinCellsHeader, _Mapping]] = ..., participants: _Optional[_Iterable[int]] = ..., charge_log: _Optional[str] = ...) -> None: ...

class KeySetupResponse(_message.Message):
    __slots__ = ("message", "fingerprint", "state", "holder", "seal_public_key", "signing_public_key", "threshold")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    SEAL_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNING_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    message: bytes
    fingerprint: str
    state: str
    holder: int
    seal_public_key: str
    signing_public_key: str
    threshold: int
    def __init__(self, message: _Optional[bytes] = ..., fingerprint: _Optional[str] = ..., state: _Optional[str] = ..., holder: _Optional[int] = ..., seal_public_key: _Optional[str] = ..., signing_public_key: _Optional[str] = ..., threshold: _Optional[int] = ...) -> None: ...

class IssueSharesResponse(_message.Message):
    __slots__ = ("share", "done")
    SHARE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    share: bytes
    done: IssueSharesDone
    def __init__(self, share: _Optional[bytes] = ..., done: _Optional[_Union[IssueSharesDone, _Mapping]] = ...) -> None: ...

class IssueSharesDone(_message.Message):
    __slots__ = ("charge_id", "epsilon_remaining", "receipt", "repeated")
    CHARGE_ID_FIELD_NUMBER: _ClassVar[int]
    EPSILON_REMAINING_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    REPEATED_FIELD_NUMBER: _ClassVar[int]
    charge_id: int
    epsilon_remaining: float
    receipt: LedgerReceipt
    repeated: bool
    def __init__(self, charge_id: _Optional[int] = ..., epsilon_remaining: _Optional[float] = ..., receipt: _Optional[_Union[LedgerReceipt, _Mapping]] = ..., repeated: _Optional[bool] = ...) -> None: ...

class ReconcileChargesRequest(_message.Message):
    __slots__ = ("study_id", "receipts")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    receipts: _containers.RepeatedCompositeFieldContainer[LedgerReceipt]
    def __init__(self, study_id: _Optional[str] = ..., receipts: _Optional[_Iterable[_Union[LedgerReceipt, _Mapping]]] = ...) -> None: ...

class ReconcileChargesResponse(_message.Message):
    __slots__ = ("booked", "epsilon_spent")
    BOOKED_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    booked: _containers.RepeatedCompositeFieldContainer[LedgerCharge]
    epsilon_spent: float
    def __init__(self, booked: _Optional[_Iterable[_Union[LedgerCharge, _Mapping]]] = ..., epsilon_spent: _Optional[float] = ...) -> None: ...

class EvaluatePseudonymsRequest(_message.Message):
    __slots__ = ("study_id", "owner_id", "contract_hash", "page", "blinded_elements", "route")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_HASH_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    BLINDED_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    owner_id: str
    contract_hash: str
    page: int
    blinded_elements: bytes
    route: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, study_id: _Optional[str] = ..., owner_id: _Optional[str] = ..., contract_hash: _Optional[str] = ..., page: _Optional[int] = ..., blinded_elements: _Optional[bytes] = ..., route: _Optional[_Iterable[int]] = ...) -> None: ...

class EvaluatePseudonymsResponse(_message.Message):
    __slots__ = ("evaluated_elements", "evaluations_used", "evaluation_quota")
    EVALUATED_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    EVALUATIONS_USED_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_QUOTA_FIELD_NUMBER: _ClassVar[int]
    evaluated_elements: bytes
    evaluations_used: int
    evaluation_quota: int
    def __init__(self, evaluated_elements: _Optional[bytes] = ..., evaluations_used: _Optional[int] = ..., evaluation_quota: _Optional[int] = ...) -> None: ...
