from parties.wire.v1 import common_pb2 as _common_pb2
from parties.wire.v1 import decryption_pb2 as _decryption_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitHeader(_message.Message):
    __slots__ = ("study_id", "owner_id", "idempotency_key", "domain_length", "context_fingerprint", "chunk_count", "contract_hash", "signature", "c1_signature", "c1_parts_digest", "key_shares", "commitment_signature")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_HASH_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    C1_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    C1_PARTS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    KEY_SHARES_FIELD_NUMBER: _ClassVar[int]
    COMMITMENT_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    owner_id: str
    idempotency_key: str
    domain_length: int
    context_fingerprint: str
    chunk_count: int
    contract_hash: str
    signature: bytes
    c1_signature: bytes
    c1_parts_digest: bytes
    key_shares: _containers.RepeatedScalarFieldContainer[bytes]
    commitment_signature: bytes
    def __init__(self, study_id: _Optional[str] = ..., owner_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., domain_length: _Optional[int] = ..., context_fingerprint: _Optional[str] = ..., chunk_count: _Optional[int] = ..., contract_hash: _Optional[str] = ..., signature: _Optional[bytes] = ..., c1_signature: _Optional[bytes] = ..., c1_parts_digest: _Optional[bytes] = ..., key_shares: _Optional[_Iterable[bytes]] = ..., commitment_signature: _Optional[bytes] = ...) -> None: ...

class CiphertextChunk(_message.Message):
    __slots__ = ("index", "data")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    data: bytes
    def __init__(self, index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class SubmitHistogramRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: SubmitHeader
    chunk: CiphertextChunk
    def __init__(self, header: _Optional[_Union[SubmitHeader, _Mapping]] = ..., chunk: _Optional[_Union[CiphertextChunk, _Mapping]] = ...) -> None: ...

class SubmitHistogramResponse(_message.Message):
    __slots__ = ("committed", "duplicate", "received_chunks", "chunk_count", "bytes_received")
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    committed: bool
    duplicate: bool
    received_chunks: _containers.RepeatedScalarFieldContainer[int]
    chunk_count: int
    bytes_received: int
    def __init__(self, committed: _Optional[bool] = ..., duplicate: _Optional[bool] = ..., received_chunks: _Optional[_Iterable[int]] = ..., chunk_count: _Optional[int] = ..., bytes_received: _Optional[int] = ...) -> None: ...

class UploadStatusRequest(_message.Message):
    __slots__ = ("study_id", "owner_id", "idempotency_key")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    owner_id: str
    idempotency_key: str
    def __init__(self, study_id: _Optional[str] = ..., owner_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class UploadStatusResponse(_message.Message):
    __slots__ = ("state", "received_chunks", "chunk_count", "c1_signature_wanted")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[UploadStatusResponse.State]
        NONE: _ClassVar[UploadStatusResponse.State]
        PARTIAL: _ClassVar[UploadStatusResponse.State]
        COMMITTED: _ClassVar[UploadStatusResponse.State]
        CONFLICT: _ClassVar[UploadStatusResponse.State]
    STATE_UNSPECIFIED: UploadStatusResponse.State
    NONE: UploadStatusResponse.State
    PARTIAL: UploadStatusResponse.State
    COMMITTED: UploadStatusResponse.State
    CONFLICT: UploadStatusResponse.State
    STATE_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    C1_SIGNATURE_WANTED_FIELD_NUMBER: _ClassVar[int]
    state: UploadStatusResponse.State
    received_chunks: _containers.RepeatedScalarFieldContainer[int]
    chunk_count: int
    c1_signature_wanted: bool
    def __init__(self, state: _Optional[_Union[UploadStatusResponse.State, str]] = ..., received_chunks: _Optional[_Iterable[int]] = ..., chunk_count: _Optional[int] = ..., c1_signature_wanted: _Optional[bool] = ...) -> None: ...

class StudyStatusRequest(_message.Message):
    __slots__ = ("study_id",)
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    def __init__(self, study_id: _Optional[str] = ...) -> None: ...

class StudyStatusResponse(_message.Message):
    __slots__ = ("contract", "submitted_owners", "missing_owners", "release_ids", "key_holders", "holders_per_measurement")
    CONTRACT_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_OWNERS_FIELD_NUMBER: _ClassVar[int]
    MISSING_OWNERS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    KEY_HOLDERS_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_PER_MEASUREMENT_FIELD_NUMBER: _ClassVar[int]
    contract: _common_pb2.StudyContract
    submitted_owners: _containers.RepeatedScalarFieldContainer[str]
    missing_owners: _containers.RepeatedScalarFieldContainer[str]
    release_ids: _containers.RepeatedScalarFieldContainer[str]
    key_holders: int
    holders_per_measurement: int
    def __init__(self, contract: _Optional[_Union[_common_pb2.StudyContract, _Mapping]] = ..., submitted_owners: _Optional[_Iterable[str]] = ..., missing_owners: _Optional[_Iterable[str]] = ..., release_ids: _Optional[_Iterable[str]] = ..., key_holders: _Optional[int] = ..., holders_per_measurement: _Optional[int] = ...) -> None: ...

class RunReleaseRequest(_message.Message):
    __slots__ = ("study_id", "epsilon", "force", "wait", "request_key", "spend_rest")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_KEY_FIELD_NUMBER: _ClassVar[int]
    SPEND_REST_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    epsilon: float
    force: bool
    wait: bool
    request_key: str
    spend_rest: bool
    def __init__(self, study_id: _Optional[str] = ..., epsilon: _Optional[float] = ..., force: _Optional[bool] = ..., wait: _Optional[bool] = ..., request_key: _Optional[str] = ..., spend_rest: _Optional[bool] = ...) -> None: ...

class ReleaseStatusRequest(_message.Message):
    __slots__ = ("release_id",)
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    def __init__(self, release_id: _Optional[str] = ...) -> None: ...

class ReleaseStatusResponse(_message.Message):
    __slots__ = ("release_id", "study_id", "state", "epsilon", "owners", "error_code", "error_message", "summary", "seconds", "bytes_to_decryption", "summary_paged", "progress")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[ReleaseStatusResponse.State]
        RUNNING: _ClassVar[ReleaseStatusResponse.State]
        DONE: _ClassVar[ReleaseStatusResponse.State]
        FAILED: _ClassVar[ReleaseStatusResponse.State]
    STATE_UNSPECIFIED: ReleaseStatusResponse.State
    RUNNING: ReleaseStatusResponse.State
    DONE: ReleaseStatusResponse.State
    FAILED: ReleaseStatusResponse.State
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_TO_DECRYPTION_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_PAGED_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    study_id: str
    state: ReleaseStatusResponse.State
    epsilon: float
    owners: _containers.RepeatedScalarFieldContainer[str]
    error_code: str
    error_message: str
    summary: _common_pb2.ReleaseSummary
    seconds: float
    bytes_to_decryption: int
    summary_paged: bool
    progress: ReleaseProgress
    def __init__(self, release_id: _Optional[str] = ..., study_id: _Optional[str] = ..., state: _Optional[_Union[ReleaseStatusResponse.State, str]] = ..., epsilon: _Optional[float] = ..., owners: _Optional[_Iterable[str]] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., summary: _Optional[_Union[_common_pb2.ReleaseSummary, _Mapping]] = ..., seconds: _Optional[float] = ..., bytes_to_decryption: _Optional[int] = ..., summary_paged: _Optional[bool] = ..., progress: _Optional[_Union[ReleaseProgress, _Mapping]] = ...) -> None: ...

class ReleaseProgress(_message.Message):
    __slots__ = ("phase", "measurements_done", "measurement_kind", "chunks_sent", "chunks_total", "measurement_seconds")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENTS_DONE_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENT_KIND_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_SENT_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    phase: str
    measurements_done: int
    measurement_kind: str
    chunks_sent: int
    chunks_total: int
    measurement_seconds: float
    def __init__(self, phase: _Optional[str] = ..., measurements_done: _Optional[int] = ..., measurement_kind: _Optional[str] = ..., chunks_sent: _Optional[int] = ..., chunks_total: _Optional[int] = ..., measurement_seconds: _Optional[float] = ...) -> None: ...

class DirectRangeCountsRequest(_message.Message):
    __slots__ = ("study_id", "ranges", "epsilon", "force", "request_key")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_KEY_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    ranges: _containers.RepeatedCompositeFieldContainer[_common_pb2.Range]
    epsilon: float
    force: bool
    request_key: str
    def __init__(self, study_id: _Optional[str] = ..., ranges: _Optional[_Iterable[_Union[_common_pb2.Range, _Mapping]]] = ..., epsilon: _Optional[float] = ..., force: _Optional[bool] = ..., request_key: _Optional[str] = ...) -> None: ...

class DirectRangeCountsResponse(_message.Message):
    __slots__ = ("request_id", "counts", "epsilon_charged", "epsilon_sequential", "epsilon_remaining", "owners")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_CHARGED_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SEQUENTIAL_FIELD_NUMBER: _ClassVar[int]
    EPSILON_REMAINING_FIELD_NUMBER: _ClassVar[int]
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    counts: _containers.RepeatedCompositeFieldContainer[_common_pb2.RangeCount]
    epsilon_charged: float
    epsilon_sequential: float
    epsilon_remaining: float
    owners: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., counts: _Optional[_Iterable[_Union[_common_pb2.RangeCount, _Mapping]]] = ..., epsilon_charged: _Optional[float] = ..., epsilon_sequential: _Optional[float] = ..., epsilon_remaining: _Optional[float] = ..., owners: _Optional[_Iterable[str]] = ...) -> None: ...

class JoinExchangeRequest(_message.Message):
    __slots__ = ("study_id", "owner_id", "public_key", "signature")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    owner_id: str
    public_key: bytes
    signature: bytes
    def __init__(self, study_id: _Optional[str] = ..., owner_id: _Optional[str] = ..., public_key: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class JoinExchangeResponse(_message.Message):
    __slots__ = ("peer_public_key", "peer_signature")
    PEER_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    PEER_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    peer_public_key: bytes
    peer_signature: bytes
    def __init__(self, peer_public_key: _Optional[bytes] = ..., peer_signature: _Optional[bytes] = ...) -> None: ...

class JoinPlacementRequest(_message.Message):
    __slots__ = ("study_id", "owner_id", "pseudonyms", "part", "parts")
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_ID_FIELD_NUMBER: _ClassVar[int]
    PSEUDONYMS_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    owner_id: str
    pseudonyms: bytes
    part: int
    parts: int
    def __init__(self, study_id: _Optional[str] = ..., owner_id: _Optional[str] = ..., pseudonyms: _Optional[bytes] = ..., part: _Optional[int] = ..., parts: _Optional[int] = ...) -> None: ...

class JoinPlacementResponse(_message.Message):
    __slots__ = ("ready", "positions", "capacity")
    READY_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    positions: _containers.RepeatedScalarFieldContainer[int]
    capacity: int
    def __init__(self, ready: _Optional[bool] = ..., positions: _Optional[_Iterable[int]] = ..., capacity: _Optional[int] = ...) -> None: ...

class SetupKeyRequest(_message.Message):
    __slots__ = ("threshold",)
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    threshold: int
    def __init__(self, threshold: _Optional[int] = ...) -> None: ...

class SetupKeyResponse(_message.Message):
    __slots__ = ("fingerprint", "holders", "already_active", "threshold")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    ALREADY_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    fingerprint: str
    holders: _containers.RepeatedScalarFieldContainer[str]
    already_active: bool
    threshold: int
    def __init__(self, fingerprint: _Optional[str] = ..., holders: _Optional[_Iterable[str]] = ..., already_active: _Optional[bool] = ..., threshold: _Optional[int] = ...) -> None: ...

class LedgerReceiptsRequest(_message.Message):
    __slots__ = ("study_id",)
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    def __init__(self, study_id: _Optional[str] = ...) -> None: ...

class HolderReceipts(_message.Message):
    __slots__ = ("holder", "receipts", "address")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    holder: str
    receipts: _containers.RepeatedCompositeFieldContainer[_decryption_pb2.LedgerReceipt]
    address: str
    def __init__(self, holder: _Optional[str] = ..., receipts: _Optional[_Iterable[_Union[_decryption_pb2.LedgerReceipt, _Mapping]]] = ..., address: _Optional[str] = ...) -> None: ...

class LedgerReceiptsResponse(_message.Message):
    __slots__ = ("holders", "charge_log_entries", "charge_log_spent")
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    CHARGE_LOG_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CHARGE_LOG_SPENT_FIELD_NUMBER: _ClassVar[int]
    holders: _containers.RepeatedCompositeFieldContainer[HolderReceipts]
    charge_log_entries: int
    charge_log_spent: str
    def __init__(self, holders: _Optional[_Iterable[_Union[HolderReceipts, _Mapping]]] = ..., charge_log_entries: _Optional[int] = ..., charge_log_spent: _Optional[str] = ...) -> None: ...
