"""The control-plane store: telemetry aggregates, plan versions, activation, mode and the
planner lease. The only code that knows Redis.

  contract.py      `Store` and `Subscription` (the contract, as docstrings) and the refusals
  keys.py          the key schema and the codecs of field names and stored values
  buckets.py       pure bucketing helpers (batch -> buckets, window -> rates)
  lua/*.lua        the Redis scripts, one per conditional multi-key step, loaded once
  redis.py         `RedisStore` (one node or a Redis Cluster)
  connect.py       Redis URLs (redis://, redis+cluster://, ...) -> redis-py clients, sync and asyncio
  window_cache.py  the Redis store's cache of per-bucket window sums
  records.py       the record bus's pub/sub transport between dispatchers (RedisStore.records())
  memory.py        `MemoryStore`, the in-process twin
  config.py        `TelemetryConfig`, the store flags
  factory.py       `open_store` (memory:// or Redis)

`from services.store import X` works for every public name below. The records and control
state (`Mode`, `ArrivalRecord`, `ControlState`, ...) are defined in services.model.
"""

from services.model import (
    Activation,
    ArrivalRecord,
    CacheCounters,
    CacheStatRecord,
    ControlState,
    HistoryEntry,
    LeaseInfo,
    Mode,
    PlanEvent,
    RatesSnapshot,
)
from services.store.buckets import key_totals, split_by_bucket
from services.store.config import TelemetryConfig, add_store_flags, telemetry_from_args
from services.store.contract import HISTORY_MAX, Fenced, FlatMode, Pinned, StaleVersion, Store, Subscription
from services.store.factory import open_store
from services.store.keys import log_blob, log_lines, summary_of
from services.store.memory import MemoryStore
from services.store.redis import RedisStore

__all__ = [
    "Activation", "ArrivalRecord", "CacheCounters", "CacheStatRecord", "ControlState", "Fenced", "FlatMode",
    "HISTORY_MAX", "HistoryEntry", "LeaseInfo", "MemoryStore", "Mode", "Pinned", "PlanEvent", "RatesSnapshot",
    "RedisStore", "StaleVersion", "Store", "Subscription", "TelemetryConfig", "add_store_flags", "key_totals",
    "log_blob", "log_lines", "open_store", "split_by_bucket", "summary_of", "telemetry_from_args",
]
