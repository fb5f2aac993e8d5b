from cacheroute.v1 import common_pb2 as _common_pb2
from cacheroute.v1 import engine_pb2 as _engine_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RouteRequest(_message.Message):
    __slots__ = ("key", "prefix", "prompt", "prompt_tokens", "request_id")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    key: str
    prefix: _common_pb2.PrefixHashes
    prompt: str
    prompt_tokens: int
    request_id: str
    def __init__(self, key: _Optional[str] = ..., prefix: _Optional[_Union[_common_pb2.PrefixHashes, _Mapping]] = ..., prompt: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class RouteBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[RouteRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[RouteRequest, _Mapping]]] = ...) -> None: ...

class RouteBatchResponse(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[_common_pb2.RouteDecision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[_common_pb2.RouteDecision, _Mapping]]] = ...) -> None: ...

class GetDispatcherStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("replica_id", "address", "healthy", "in_flight", "waiting", "running", "kv_usage", "hit_rate", "routed")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    ROUTED_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    address: str
    healthy: bool
    in_flight: int
    waiting: int
    running: int
    kv_usage: float
    hit_rate: float
    routed: int
    def __init__(self, replica_id: _Optional[str] = ..., address: _Optional[str] = ..., healthy: _Optional[bool] = ..., in_flight: _Optional[int] = ..., waiting: _Optional[int] = ..., running: _Optional[int] = ..., kv_usage: _Optional[float] = ..., hit_rate: _Optional[float] = ..., routed: _Optional[int] = ...) -> None: ...

class DispatcherStatus(_message.Message):
    __slots__ = ("dispatcher_id", "plan_version", "mode", "plan_source", "replicas", "routed", "planned", "cold", "fallback", "telemetry_dropped", "telemetry_capped")
    DISPATCHER_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PLAN_SOURCE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ROUTED_FIELD_NUMBER: _ClassVar[int]
    PLANNED_FIELD_NUMBER: _ClassVar[int]
    COLD_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_DROPPED_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_CAPPED_FIELD_NUMBER: _ClassVar[int]
    dispatcher_id: str
    plan_version: int
    mode: _common_pb2.Mode
    plan_source: str
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    routed: int
    planned: int
    cold: int
    fallback: int
    telemetry_dropped: int
    telemetry_capped: int
    def __init__(self, dispatcher_id: _Optional[str] = ..., plan_version: _Optional[int] = ..., mode: _Optional[_Union[_common_pb2.Mode, str]] = ..., plan_source: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., routed: _Optional[int] = ..., planned: _Optional[int] = ..., cold: _Optional[int] = ..., fallback: _Optional[int] = ..., telemetry_dropped: _Optional[int] = ..., telemetry_capped: _Optional[int] = ...) -> None: ...
