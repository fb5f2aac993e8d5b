from cacheroute.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt", "blocks", "max_tokens", "key")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: str
    blocks: PromptBlocks
    max_tokens: int
    key: str
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[str] = ..., blocks: _Optional[_Union[PromptBlocks, _Mapping]] = ..., max_tokens: _Optional[int] = ..., key: _Optional[str] = ...) -> None: ...

class PromptBlocks(_message.Message):
    __slots__ = ("block_hashes", "prompt_tokens")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    prompt_tokens: int
    def __init__(self, block_hashes: _Optional[_Iterable[int]] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("index", "token_ids", "text", "first", "ttft_seconds", "cached_tokens", "prompt_tokens", "replica_id", "finished", "finish_reason", "route")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    TTFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    index: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    first: bool
    ttft_seconds: float
    cached_tokens: int
    prompt_tokens: int
    replica_id: str
    finished: bool
    finish_reason: str
    route: _common_pb2.RouteDecision
    def __init__(self, index: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., first: _Optional[bool] = ..., ttft_seconds: _Optional[float] = ..., cached_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., replica_id: _Optional[str] = ..., finished: _Optional[bool] = ..., finish_reason: _Optional[str] = ..., route: _Optional[_Union[_common_pb2.RouteDecision, _Mapping]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineStats(_message.Message):
    __slots__ = ("replica_id", "profile", "waiting", "running", "kv_usage", "requests", "prompt_tokens", "cached_tokens", "preemptions", "kv_blocks", "time_scale", "prefill_tokens")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TIME_SCALE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    profile: str
    waiting: int
    running: int
    kv_usage: float
    requests: int
    prompt_tokens: int
    cached_tokens: int
    preemptions: int
    kv_blocks: int
    time_scale: float
    prefill_tokens: int
    def __init__(self, replica_id: _Optional[str] = ..., profile: _Optional[str] = ..., waiting: _Optional[int] = ..., running: _Optional[int] = ..., kv_usage: _Optional[float] = ..., requests: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., preemptions: _Optional[int] = ..., kv_blocks: _Optional[int] = ..., time_scale: _Optional[float] = ..., prefill_tokens: _Optional[int] = ...) -> None: ...
