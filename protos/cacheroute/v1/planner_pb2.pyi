from cacheroute.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetPlanRequest(_message.Message):
    __slots__ = ("version", "summary_only", "table_offset", "max_bytes", "columnar")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_ONLY_FIELD_NUMBER: _ClassVar[int]
    TABLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    COLUMNAR_FIELD_NUMBER: _ClassVar[int]
    version: int
    summary_only: bool
    table_offset: int
    max_bytes: int
    columnar: bool
    def __init__(self, version: _Optional[int] = ..., summary_only: _Optional[bool] = ..., table_offset: _Optional[int] = ..., max_bytes: _Optional[int] = ..., columnar: _Optional[bool] = ...) -> None: ...

class ListPlansRequest(_message.Message):
    __slots__ = ("limit", "before_version")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BEFORE_VERSION_FIELD_NUMBER: _ClassVar[int]
    limit: int
    before_version: int
    def __init__(self, limit: _Optional[int] = ..., before_version: _Optional[int] = ...) -> None: ...

class ListPlansResponse(_message.Message):
    __slots__ = ("plans", "active_version", "mode", "pinned_version")
    PLANS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PINNED_VERSION_FIELD_NUMBER: _ClassVar[int]
    plans: _containers.RepeatedCompositeFieldContainer[_common_pb2.PlanSummary]
    active_version: int
    mode: _common_pb2.Mode
    pinned_version: int
    def __init__(self, plans: _Optional[_Iterable[_Union[_common_pb2.PlanSummary, _Mapping]]] = ..., active_version: _Optional[int] = ..., mode: _Optional[_Union[_common_pb2.Mode, str]] = ..., pinned_version: _Optional[int] = ...) -> None: ...

class WatchPlansRequest(_message.Message):
    __slots__ = ("known_version", "include_table", "max_chunk_bytes", "columnar")
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_TABLE_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    COLUMNAR_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    include_table: bool
    max_chunk_bytes: int
    columnar: bool
    def __init__(self, known_version: _Optional[int] = ..., include_table: _Optional[bool] = ..., max_chunk_bytes: _Optional[int] = ..., columnar: _Optional[bool] = ...) -> None: ...

class PlanUpdate(_message.Message):
    __slots__ = ("active_version", "mode", "plan", "event")
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    active_version: int
    mode: _common_pb2.Mode
    plan: _common_pb2.Plan
    event: str
    def __init__(self, active_version: _Optional[int] = ..., mode: _Optional[_Union[_common_pb2.Mode, str]] = ..., plan: _Optional[_Union[_common_pb2.Plan, _Mapping]] = ..., event: _Optional[str] = ...) -> None: ...

class KeyRate(_message.Message):
    __slots__ = ("key", "rate", "prefix_tokens")
    KEY_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    key: str
    rate: float
    prefix_tokens: int
    def __init__(self, key: _Optional[str] = ..., rate: _Optional[float] = ..., prefix_tokens: _Optional[int] = ...) -> None: ...

class BuildPlanRequest(_message.Message):
    __slots__ = ("rates", "replica_ids", "q_cap", "warm_slots", "incremental", "activate", "expected_active_version", "shadow")
    RATES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    Q_CAP_FIELD_NUMBER: _ClassVar[int]
    WARM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    INCREMENTAL_FIELD_NUMBER: _ClassVar[int]
    ACTIVATE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    rates: _containers.RepeatedCompositeFieldContainer[KeyRate]
    replica_ids: _containers.RepeatedScalarFieldContainer[str]
    q_cap: float
    warm_slots: int
    incremental: bool
    activate: bool
    expected_active_version: int
    shadow: bool
    def __init__(self, rates: _Optional[_Iterable[_Union[KeyRate, _Mapping]]] = ..., replica_ids: _Optional[_Iterable[str]] = ..., q_cap: _Optional[float] = ..., warm_slots: _Optional[int] = ..., incremental: _Optional[bool] = ..., activate: _Optional[bool] = ..., expected_active_version: _Optional[int] = ..., shadow: _Optional[bool] = ...) -> None: ...

class BuildPlanResponse(_message.Message):
    __slots__ = ("plan", "activated")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ACTIVATED_FIELD_NUMBER: _ClassVar[int]
    plan: _common_pb2.Plan
    activated: bool
    def __init__(self, plan: _Optional[_Union[_common_pb2.Plan, _Mapping]] = ..., activated: _Optional[bool] = ...) -> None: ...

class DiffPlansRequest(_message.Message):
    __slots__ = ("from_version", "to_version", "max_moves")
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_MOVES_FIELD_NUMBER: _ClassVar[int]
    from_version: int
    to_version: int
    max_moves: int
    def __init__(self, from_version: _Optional[int] = ..., to_version: _Optional[int] = ..., max_moves: _Optional[int] = ...) -> None: ...

class KeyMove(_message.Message):
    __slots__ = ("key", "from_replicas", "to_replicas", "rate")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FROM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TO_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    key: str
    from_replicas: _containers.RepeatedScalarFieldContainer[str]
    to_replicas: _containers.RepeatedScalarFieldContainer[str]
    rate: float
    def __init__(self, key: _Optional[str] = ..., from_replicas: _Optional[_Iterable[str]] = ..., to_replicas: _Optional[_Iterable[str]] = ..., rate: _Optional[float] = ...) -> None: ...

class DiffPlansResponse(_message.Message):
    __slots__ = ("churn", "keys_moved", "keys_added", "keys_removed", "moves", "prefixes_kept", "prefixes_moved", "prefixes_added", "prefixes_removed", "prefix_moves")
    CHURN_FIELD_NUMBER: _ClassVar[int]
    KEYS_MOVED_FIELD_NUMBER: _ClassVar[int]
    KEYS_ADDED_FIELD_NUMBER: _ClassVar[int]
    KEYS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    PREFIXES_KEPT_FIELD_NUMBER: _ClassVar[int]
    PREFIXES_MOVED_FIELD_NUMBER: _ClassVar[int]
    PREFIXES_ADDED_FIELD_NUMBER: _ClassVar[int]
    PREFIXES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    PREFIX_MOVES_FIELD_NUMBER: _ClassVar[int]
    churn: float
    keys_moved: int
    keys_added: int
    keys_removed: int
    moves: _containers.RepeatedCompositeFieldContainer[KeyMove]
    prefixes_kept: int
    prefixes_moved: int
    prefixes_added: int
    prefixes_removed: int
    prefix_moves: _containers.RepeatedCompositeFieldContainer[KeyMove]
    def __init__(self, churn: _Optional[float] = ..., keys_moved: _Optional[int] = ..., keys_added: _Optional[int] = ..., keys_removed: _Optional[int] = ..., moves: _Optional[_Iterable[_Union[KeyMove, _Mapping]]] = ..., prefixes_kept: _Optional[int] = ..., prefixes_moved: _Optional[int] = ..., prefixes_added: _Optional[int] = ..., prefixes_removed: _Optional[int] = ..., prefix_moves: _Optional[_Iterable[_Union[KeyMove, _Mapping]]] = ...) -> None: ...

class ActivatePlanRequest(_message.Message):
    __slots__ = ("version", "expected_active_version", "reason")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    version: int
    expected_active_version: int
    reason: str
    def __init__(self, version: _Optional[int] = ..., expected_active_version: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("expected_active_version", "to_version", "reason")
    EXPECTED_ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    expected_active_version: int
    to_version: int
    reason: str
    def __init__(self, expected_active_version: _Optional[int] = ..., to_version: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class SetModeRequest(_message.Message):
    __slots__ = ("mode", "reason")
    MODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    mode: _common_pb2.Mode
    reason: str
    def __init__(self, mode: _Optional[_Union[_common_pb2.Mode, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class PinPlanRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class UnpinPlanRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ControlResponse(_message.Message):
    __slots__ = ("active_version", "previous_version", "mode", "pinned_version")
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PINNED_VERSION_FIELD_NUMBER: _ClassVar[int]
    active_version: int
    previous_version: int
    mode: _common_pb2.Mode
    pinned_version: int
    def __init__(self, active_version: _Optional[int] = ..., previous_version: _Optional[int] = ..., mode: _Optional[_Union[_common_pb2.Mode, str]] = ..., pinned_version: _Optional[int] = ...) -> None: ...

class ShadowPlanRequest(_message.Message):
    __slots__ = ("version", "window_seconds")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    version: int
    window_seconds: float
    def __init__(self, version: _Optional[int] = ..., window_seconds: _Optional[float] = ...) -> None: ...

class GetPlannerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetAdviceRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AdvicePoint(_message.Message):
    __slots__ = ("replicas", "hit_rate", "ttft_p99", "meets_slo")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    TTFT_P99_FIELD_NUMBER: _ClassVar[int]
    MEETS_SLO_FIELD_NUMBER: _ClassVar[int]
    replicas: int
    hit_rate: float
    ttft_p99: float
    meets_slo: bool
    def __init__(self, replicas: _Optional[int] = ..., hit_rate: _Optional[float] = ..., ttft_p99: _Optional[float] = ..., meets_slo: _Optional[bool] = ...) -> None: ...

class CapacityAdvice(_message.Message):
    __slots__ = ("recommended", "gauge", "slo_p99", "replicas", "points", "qps", "requests", "output_tokens", "output_measured", "arrival_cv", "computed_at")
    RECOMMENDED_FIELD_NUMBER: _ClassVar[int]
    GAUGE_FIELD_NUMBER: _ClassVar[int]
    SLO_P99_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    QPS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_MEASURED_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_CV_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_AT_FIELD_NUMBER: _ClassVar[int]
    recommended: int
    gauge: int
    slo_p99: float
    replicas: int
    points: _containers.RepeatedCompositeFieldContainer[AdvicePoint]
    qps: float
    requests: int
    output_tokens: int
    output_measured: bool
    arrival_cv: float
    computed_at: float
    def __init__(self, recommended: _Optional[int] = ..., gauge: _Optional[int] = ..., slo_p99: _Optional[float] = ..., replicas: _Optional[int] = ..., points: _Optional[_Iterable[_Union[AdvicePoint, _Mapping]]] = ..., qps: _Optional[float] = ..., requests: _Optional[int] = ..., output_tokens: _Optional[int] = ..., output_measured: _Optional[bool] = ..., arrival_cv: _Optional[float] = ..., computed_at: _Optional[float] = ...) -> None: ...

class PlannerStatus(_message.Message):
    __slots__ = ("planner_id", "leader", "lease_fencing_token", "active_version", "mode", "pinned_version", "mode_reason", "last_loop_at", "last_loop_outcome", "latest_version", "available_hit_rate", "achieved_hit_rate")
    PLANNER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEASE_FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PINNED_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODE_REASON_FIELD_NUMBER: _ClassVar[int]
    LAST_LOOP_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_LOOP_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    ACHIEVED_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    planner_id: str
    leader: bool
    lease_fencing_token: int
    active_version: int
    mode: _common_pb2.Mode
    pinned_version: int
    mode_reason: str
    last_loop_at: float
    last_loop_outcome: str
    latest_version: int
    available_hit_rate: float
    achieved_hit_rate: float
    def __init__(self, planner_id: _Optional[str] = ..., leader: _Optional[bool] = ..., lease_fencing_token: _Optional[int] = ..., active_version: _Optional[int] = ..., mode: _Optional[_Union[_common_pb2.Mode, str]] = ..., pinned_version: _Optional[int] = ..., mode_reason: _Optional[str] = ..., last_loop_at: _Optional[float] = ..., last_loop_outcome: _Optional[str] = ..., latest_version: _Optional[int] = ..., available_hit_rate: _Optional[float] = ..., achieved_hit_rate: _Optional[float] = ...) -> None: ...

class ListEnginesRequest(_message.Message):
    __slots__ = ("known_version", "planned_keys", "wait_seconds")
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    PLANNED_KEYS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    planned_keys: bool
    wait_seconds: float
    def __init__(self, known_version: _Optional[int] = ..., planned_keys: _Optional[bool] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class EngineInfo(_message.Message):
    __slots__ = ("slot", "id", "address", "state", "source", "changed_at", "planned_keys", "healthy")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    PLANNED_KEYS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    slot: int
    id: str
    address: str
    state: str
    source: str
    changed_at: float
    planned_keys: int
    healthy: bool
    def __init__(self, slot: _Optional[int] = ..., id: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[str] = ..., source: _Optional[str] = ..., changed_at: _Optional[float] = ..., planned_keys: _Optional[int] = ..., healthy: _Optional[bool] = ...) -> None: ...

class EngineSet(_message.Message):
    __slots__ = ("version", "engines", "unchanged")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    version: int
    engines: _containers.RepeatedCompositeFieldContainer[EngineInfo]
    unchanged: bool
    def __init__(self, version: _Optional[int] = ..., engines: _Optional[_Iterable[_Union[EngineInfo, _Mapping]]] = ..., unchanged: _Optional[bool] = ...) -> None: ...

class AddEngineRequest(_message.Message):
    __slots__ = ("address", "id")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    address: str
    id: str
    def __init__(self, address: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class DrainEngineRequest(_message.Message):
    __slots__ = ("engine",)
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    engine: str
    def __init__(self, engine: _Optional[str] = ...) -> None: ...

class RemoveEngineRequest(_message.Message):
    __slots__ = ("engine", "force")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    engine: str
    force: bool
    def __init__(self, engine: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class EngineChange(_message.Message):
    __slots__ = ("engines", "engine", "active_version", "outcome")
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    engines: EngineSet
    engine: EngineInfo
    active_version: int
    outcome: str
    def __init__(self, engines: _Optional[_Union[EngineSet, _Mapping]] = ..., engine: _Optional[_Union[EngineInfo, _Mapping]] = ..., active_version: _Optional[int] = ..., outcome: _Optional[str] = ...) -> None: ...
