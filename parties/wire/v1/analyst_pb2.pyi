from parties.wire.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListReleasesRequest(_message.Message):
    __slots__ = ("study_id",)
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    study_id: str
    def __init__(self, study_id: _Optional[str] = ...) -> None: ...

class ReleaseInfo(_message.Message):
    __slots__ = ("release_id", "study_id", "epsilon", "domain_size", "partitions", "created_at")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    STUDY_ID_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    study_id: str
    epsilon: float
    domain_size: int
    partitions: int
    created_at: str
    def __init__(self, release_id: _Optional[str] = ..., study_id: _Optional[str] = ..., epsilon: _Optional[float] = ..., domain_size: _Optional[int] = ..., partitions: _Optional[int] = ..., created_at: _Optional[str] = ...) -> None: ...

class ListReleasesResponse(_message.Message):
    __slots__ = ("releases",)
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    releases: _containers.RepeatedCompositeFieldContainer[ReleaseInfo]
    def __init__(self, releases: _Optional[_Iterable[_Union[ReleaseInfo, _Mapping]]] = ...) -> None: ...

class GetReleaseRequest(_message.Message):
    __slots__ = ("release_id",)
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    def __init__(self, release_id: _Optional[str] = ...) -> None: ...

class GetReleaseResponse(_message.Message):
    __slots__ = ("summary",)
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    summary: _common_pb2.ReleaseSummary
    def __init__(self, summary: _Optional[_Union[_common_pb2.ReleaseSummary, _Mapping]] = ...) -> None: ...

class ReleaseSummaryPage(_message.Message):
    __slots__ = ("head", "partitions", "released")
    HEAD_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    head: ReleaseSummaryHead
    partitions: PartitionsPage
    released: ReleasedPage
    def __init__(self, head: _Optional[_Union[ReleaseSummaryHead, _Mapping]] = ..., partitions: _Optional[_Union[PartitionsPage, _Mapping]] = ..., released: _Optional[_Union[ReleasedPage, _Mapping]] = ...) -> None: ...

class ReleaseSummaryHead(_message.Message):
    __slots__ = ("summary", "partitions", "released_values", "released_starts")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_VALUES_FIELD_NUMBER: _ClassVar[int]
    RELEASED_STARTS_FIELD_NUMBER: _ClassVar[int]
    summary: _common_pb2.ReleaseSummary
    partitions: int
    released_values: _containers.RepeatedScalarFieldContainer[int]
    released_starts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, summary: _Optional[_Union[_common_pb2.ReleaseSummary, _Mapping]] = ..., partitions: _Optional[int] = ..., released_values: _Optional[_Iterable[int]] = ..., released_starts: _Optional[_Iterable[int]] = ...) -> None: ...

class PartitionsPage(_message.Message):
    __slots__ = ("starts", "sums", "sum_variance")
    STARTS_FIELD_NUMBER: _ClassVar[int]
    SUMS_FIELD_NUMBER: _ClassVar[int]
    SUM_VARIANCE_FIELD_NUMBER: _ClassVar[int]
    starts: _containers.RepeatedScalarFieldContainer[int]
    sums: _containers.RepeatedScalarFieldContainer[int]
    sum_variance: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, starts: _Optional[_Iterable[int]] = ..., sums: _Optional[_Iterable[int]] = ..., sum_variance: _Optional[_Iterable[float]] = ...) -> None: ...

class ReleasedPage(_message.Message):
    __slots__ = ("index", "values", "starts")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    values: _containers.RepeatedScalarFieldContainer[int]
    starts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, index: _Optional[int] = ..., values: _Optional[_Iterable[int]] = ..., starts: _Optional[_Iterable[int]] = ...) -> None: ...

class RangeCountsRequest(_message.Message):
    __slots__ = ("release_id", "ranges")
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    ranges: _containers.RepeatedCompositeFieldContainer[_common_pb2.Range]
    def __init__(self, release_id: _Optional[str] = ..., ranges: _Optional[_Iterable[_Union[_common_pb2.Range, _Mapping]]] = ...) -> None: ...

class RangeCountsResponse(_message.Message):
    __slots__ = ("counts",)
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    counts: _containers.RepeatedCompositeFieldContainer[_common_pb2.RangeCount]
    def __init__(self, counts: _Optional[_Iterable[_Union[_common_pb2.RangeCount, _Mapping]]] = ...) -> None: ...

class ReleaseArrowPage(_message.Message):
    __slots__ = ("head", "data")
    HEAD_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    head: ReleaseArrowHead
    data: bytes
    def __init__(self, head: _Optional[_Union[ReleaseArrowHead, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ReleaseArrowHead(_message.Message):
    __slots__ = ("release", "files")
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    release: _common_pb2.ReleaseSummary
    files: _containers.RepeatedCompositeFieldContainer[ArrowFile]
    def __init__(self, release: _Optional[_Union[_common_pb2.ReleaseSummary, _Mapping]] = ..., files: _Optional[_Iterable[_Union[ArrowFile, _Mapping]]] = ...) -> None: ...

class ArrowFile(_message.Message):
    __slots__ = ("name", "size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...
