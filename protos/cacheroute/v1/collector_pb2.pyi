from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Arrival(_message.Message):
    __slots__ = ("key", "time", "prompt_tokens", "prefix_tokens", "prefix_nodes", "replica")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_NODES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    key: str
    time: float
    prompt_tokens: int
    prefix_tokens: int
    prefix_nodes: _containers.RepeatedScalarFieldContainer[int]
    replica: str
    def __init__(self, key: _Optional[str] = ..., time: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., prefix_tokens: _Optional[int] = ..., prefix_nodes: _Optional[_Iterable[int]] = ..., replica: _Optional[str] = ...) -> None: ...

class ArrivalBatch(_message.Message):
    __slots__ = ("batch_id", "source", "arrivals")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ARRIVALS_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    source: str
    arrivals: _containers.RepeatedCompositeFieldContainer[Arrival]
    def __init__(self, batch_id: _Optional[str] = ..., source: _Optional[str] = ..., arrivals: _Optional[_Iterable[_Union[Arrival, _Mapping]]] = ...) -> None: ...

class CacheStat(_message.Message):
    __slots__ = ("replica_id", "prompt_tokens", "cached_tokens", "requests", "completed", "completion_tokens")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    prompt_tokens: int
    cached_tokens: int
    requests: int
    completed: int
    completion_tokens: int
    def __init__(self, replica_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., requests: _Optional[int] = ..., completed: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class CacheStatsBatch(_message.Message):
    __slots__ = ("batch_id", "source", "stats")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    source: str
    stats: _containers.RepeatedCompositeFieldContainer[CacheStat]
    def __init__(self, batch_id: _Optional[str] = ..., source: _Optional[str] = ..., stats: _Optional[_Iterable[_Union[CacheStat, _Mapping]]] = ...) -> None: ...

class IngestSummary(_message.Message):
    __slots__ = ("batches", "accepted", "rejected", "duplicate_batches", "first_rejection")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_BATCHES_FIELD_NUMBER: _ClassVar[int]
    FIRST_REJECTION_FIELD_NUMBER: _ClassVar[int]
    batches: int
    accepted: int
    rejected: int
    duplicate_batches: int
    first_rejection: str
    def __init__(self, batches: _Optional[int] = ..., accepted: _Optional[int] = ..., rejected: _Optional[int] = ..., duplicate_batches: _Optional[int] = ..., first_rejection: _Optional[str] = ...) -> None: ...

class GetRatesRequest(_message.Message):
    __slots__ = ("window_seconds", "limit")
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    window_seconds: float
    limit: int
    def __init__(self, window_seconds: _Optional[float] = ..., limit: _Optional[int] = ...) -> None: ...

class KeyRateSample(_message.Message):
    __slots__ = ("key", "rate", "mean_prompt_tokens", "mean_prefix_tokens")
    KEY_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    MEAN_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEAN_PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    key: str
    rate: float
    mean_prompt_tokens: float
    mean_prefix_tokens: float
    def __init__(self, key: _Optional[str] = ..., rate: _Optional[float] = ..., mean_prompt_tokens: _Optional[float] = ..., mean_prefix_tokens: _Optional[float] = ...) -> None: ...

class GetRatesResponse(_message.Message):
    __slots__ = ("snapshot_id", "window_seconds", "rates", "total_arrivals", "total_keys", "truncated", "untracked_arrivals", "mean_output_tokens", "completed_requests", "arrival_cv")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RATES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ARRIVALS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KEYS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    UNTRACKED_ARRIVALS_FIELD_NUMBER: _ClassVar[int]
    MEAN_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_CV_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    window_seconds: float
    rates: _containers.RepeatedCompositeFieldContainer[KeyRateSample]
    total_arrivals: int
    total_keys: int
    truncated: bool
    untracked_arrivals: int
    mean_output_tokens: float
    completed_requests: int
    arrival_cv: float
    def __init__(self, snapshot_id: _Optional[str] = ..., window_seconds: _Optional[float] = ..., rates: _Optional[_Iterable[_Union[KeyRateSample, _Mapping]]] = ..., total_arrivals: _Optional[int] = ..., total_keys: _Optional[int] = ..., truncated: _Optional[bool] = ..., untracked_arrivals: _Optional[int] = ..., mean_output_tokens: _Optional[float] = ..., completed_requests: _Optional[int] = ..., arrival_cv: _Optional[float] = ...) -> None: ...
