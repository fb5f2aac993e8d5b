"""`open_store`: a store URL -> the Store implementation (memory:// or Redis).

Above the implementations and the config they share, so nothing below imports it back.
"""

from __future__ import annotations

from services.store.config import TelemetryConfig
from services.store.contract import Store
from services.store.memory import MemoryStore
from services.store.redis import RedisStore


def open_store(url: str, *, telemetry: TelemetryConfig | None = None, prefix: str = "cr") -> Store:
    """`memory://` for the in-process twin, otherwise a Redis URL."""
    if url.startswith("memory://"):
        return MemoryStore(telemetry)
    return RedisStore(url, prefix=prefix, telemetry=telemetry)
