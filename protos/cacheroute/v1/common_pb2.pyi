from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_PLANNED: _ClassVar[Mode]
    MODE_FLAT: _ClassVar[Mode]

class RouteReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUTE_REASON_UNSPECIFIED: _ClassVar[RouteReason]
    ROUTE_REASON_PLANNED: _ClassVar[RouteReason]
    ROUTE_REASON_COLD: _ClassVar[RouteReason]
    ROUTE_REASON_FALLBACK: _ClassVar[RouteReason]
MODE_UNSPECIFIED: Mode
MODE_PLANNED: Mode
MODE_FLAT: Mode
ROUTE_REASON_UNSPECIFIED: RouteReason
ROUTE_REASON_PLANNED: RouteReason
ROUTE_REASON_COLD: RouteReason
ROUTE_REASON_FALLBACK: RouteReason

class PrefixHashes(_message.Message):
    __slots__ = ("block_hashes",)
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class RouteDecision(_message.Message):
    __slots__ = ("replica_id", "address", "plan_version", "reason", "key")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    address: str
    plan_version: int
    reason: RouteReason
    key: str
    def __init__(self, replica_id: _Optional[str] = ..., address: _Optional[str] = ..., plan_version: _Optional[int] = ..., reason: _Optional[_Union[RouteReason, str]] = ..., key: _Optional[str] = ...) -> None: ...

class PlanInputs(_message.Message):
    __slots__ = ("rates_snapshot_id", "replica_ids", "q_cap", "warm_slots", "window_seconds")
    RATES_SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    Q_CAP_FIELD_NUMBER: _ClassVar[int]
    WARM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    rates_snapshot_id: str
    replica_ids: _containers.RepeatedScalarFieldContainer[str]
    q_cap: float
    warm_slots: int
    window_seconds: float
    def __init__(self, rates_snapshot_id: _Optional[str] = ..., replica_ids: _Optional[_Iterable[str]] = ..., q_cap: _Optional[float] = ..., warm_slots: _Optional[int] = ..., window_seconds: _Optional[float] = ...) -> None: ...

class PlanEntry(_message.Message):
    __slots__ = ("key", "replicas", "rate")
    KEY_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    key: str
    replicas: _containers.RepeatedScalarFieldContainer[int]
    rate: float
    def __init__(self, key: _Optional[str] = ..., replicas: _Optional[_Iterable[int]] = ..., rate: _Optional[float] = ...) -> None: ...

class SwitchDecision(_message.Message):
    __slots__ = ("switch", "reason", "staleness_penalty", "rewarm_penalty", "churn")
    SWITCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STALENESS_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REWARM_PENALTY_FIELD_NUMBER: _ClassVar[int]
    CHURN_FIELD_NUMBER: _ClassVar[int]
    switch: bool
    reason: str
    staleness_penalty: float
    rewarm_penalty: float
    churn: float
    def __init__(self, switch: _Optional[bool] = ..., reason: _Optional[str] = ..., staleness_penalty: _Optional[float] = ..., rewarm_penalty: _Optional[float] = ..., churn: _Optional[float] = ...) -> None: ...

class ShadowReport(_message.Message):
    __slots__ = ("ran", "passed", "reason", "requests", "qps", "candidate_hit_rate", "flat_hit_rate", "candidate_ttft_p99", "flat_ttft_p99", "candidate_capacity", "flat_capacity", "margin", "active_keys")
    RAN_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    QPS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    FLAT_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_TTFT_P99_FIELD_NUMBER: _ClassVar[int]
    FLAT_TTFT_P99_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    FLAT_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_KEYS_FIELD_NUMBER: _ClassVar[int]
    ran: bool
    passed: bool
    reason: str
    requests: int
    qps: float
    candidate_hit_rate: float
    flat_hit_rate: float
    candidate_ttft_p99: float
    flat_ttft_p99: float
    candidate_capacity: float
    flat_capacity: float
    margin: float
    active_keys: int
    def __init__(self, ran: _Optional[bool] = ..., passed: _Optional[bool] = ..., reason: _Optional[str] = ..., requests: _Optional[int] = ..., qps: _Optional[float] = ..., candidate_hit_rate: _Optional[float] = ..., flat_hit_rate: _Optional[float] = ..., candidate_ttft_p99: _Optional[float] = ..., flat_ttft_p99: _Optional[float] = ..., candidate_capacity: _Optional[float] = ..., flat_capacity: _Optional[float] = ..., margin: _Optional[float] = ..., active_keys: _Optional[int] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("version", "parent_version", "created_at", "inputs", "table", "expected_load", "predicted_imbalance", "total_keys", "admitted_keys", "admitted_rate_share", "churn", "has_parent", "builder", "decision", "shadow", "table_offset", "table_size", "prefixes", "available_hit_rate", "achieved_hit_rate", "columns")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_LOAD_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_IMBALANCE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KEYS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_KEYS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_RATE_SHARE_FIELD_NUMBER: _ClassVar[int]
    CHURN_FIELD_NUMBER: _ClassVar[int]
    HAS_PARENT_FIELD_NUMBER: _ClassVar[int]
    BUILDER_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    TABLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TABLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PREFIXES_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    ACHIEVED_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    version: int
    parent_version: int
    created_at: float
    inputs: PlanInputs
    table: _containers.RepeatedCompositeFieldContainer[PlanEntry]
    expected_load: _containers.RepeatedScalarFieldContainer[float]
    predicted_imbalance: float
    total_keys: int
    admitted_keys: int
    admitted_rate_share: float
    churn: float
    has_parent: bool
    builder: str
    decision: SwitchDecision
    shadow: ShadowReport
    table_offset: int
    table_size: int
    prefixes: _containers.RepeatedCompositeFieldContainer[PrefixEntry]
    available_hit_rate: float
    achieved_hit_rate: float
    columns: PlanColumns
    def __init__(self, version: _Optional[int] = ..., parent_version: _Optional[int] = ..., created_at: _Optional[float] = ..., inputs: _Optional[_Union[PlanInputs, _Mapping]] = ..., table: _Optional[_Iterable[_Union[PlanEntry, _Mapping]]] = ..., expected_load: _Optional[_Iterable[float]] = ..., predicted_imbalance: _Optional[float] = ..., total_keys: _Optional[int] = ..., admitted_keys: _Optional[int] = ..., admitted_rate_share: _Optional[float] = ..., churn: _Optional[float] = ..., has_parent: _Optional[bool] = ..., builder: _Optional[str] = ..., decision: _Optional[_Union[SwitchDecision, _Mapping]] = ..., shadow: _Optional[_Union[ShadowReport, _Mapping]] = ..., table_offset: _Optional[int] = ..., table_size: _Optional[int] = ..., prefixes: _Optional[_Iterable[_Union[PrefixEntry, _Mapping]]] = ..., available_hit_rate: _Optional[float] = ..., achieved_hit_rate: _Optional[float] = ..., columns: _Optional[_Union[PlanColumns, _Mapping]] = ...) -> None: ...

class PlanColumns(_message.Message):
    __slots__ = ("keys", "key_lengths", "replica_counts", "replicas", "rates")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_COUNTS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    RATES_FIELD_NUMBER: _ClassVar[int]
    keys: bytes
    key_lengths: bytes
    replica_counts: bytes
    replicas: bytes
    rates: bytes
    def __init__(self, keys: _Optional[bytes] = ..., key_lengths: _Optional[bytes] = ..., replica_counts: _Optional[bytes] = ..., replicas: _Optional[bytes] = ..., rates: _Optional[bytes] = ...) -> None: ...

class PrefixEntry(_message.Message):
    __slots__ = ("node", "replicas", "rate", "tokens", "keys")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    node: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    rate: float
    tokens: int
    keys: int
    def __init__(self, node: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., rate: _Optional[float] = ..., tokens: _Optional[int] = ..., keys: _Optional[int] = ...) -> None: ...

class PlanSummary(_message.Message):
    __slots__ = ("version", "parent_version", "created_at", "replicas", "total_keys", "admitted_keys", "admitted_rate_share", "predicted_imbalance", "churn", "builder", "decision", "shadow", "active", "pinned")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KEYS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_KEYS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_RATE_SHARE_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_IMBALANCE_FIELD_NUMBER: _ClassVar[int]
    CHURN_FIELD_NUMBER: _ClassVar[int]
    BUILDER_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    version: int
    parent_version: int
    created_at: float
    replicas: int
    total_keys: int
    admitted_keys: int
    admitted_rate_share: float
    predicted_imbalance: float
    churn: float
    builder: str
    decision: SwitchDecision
    shadow: ShadowReport
    active: bool
    pinned: bool
    def __init__(self, version: _Optional[int] = ..., parent_version: _Optional[int] = ..., created_at: _Optional[float] = ..., replicas: _Optional[int] = ..., total_keys: _Optional[int] = ..., admitted_keys: _Optional[int] = ..., admitted_rate_share: _Optional[float] = ..., predicted_imbalance: _Optional[float] = ..., churn: _Optional[float] = ..., builder: _Optional[str] = ..., decision: _Optional[_Union[SwitchDecision, _Mapping]] = ..., shadow: _Optional[_Union[ShadowReport, _Mapping]] = ..., active: _Optional[bool] = ..., pinned: _Optional[bool] = ...) -> None: ...
