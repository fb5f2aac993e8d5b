"""Store configuration: the telemetry bucketing and the store flags the planner and the collector
share (they must agree on the bucketing). `open_store`, which picks the implementation, is in
factory.py: the implementations import TelemetryConfig from here, so this module imports none
of them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.flags import flag

@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    bucket_seconds: float = 10.0          # width of one telemetry bucket
    retention_seconds: float = 3600.0     # how long buckets and batch markers live
    gaps_per_bucket: int = 2000           # inter-arrival samples kept per bucket
    log_per_bucket: int = 20000           # arrival-log records kept per bucket
    # distinct keys counted per bucket; arrivals of further keys are counted in the bucket's
    # untracked total only (0: no cap). The planner admits the hottest few hundred keys; the
    # cap bounds Redis, the planner's window cache and GetRates whatever callers send.
    keys_per_bucket: int = 20000

    def __post_init__(self) -> None:
        if not (self.bucket_seconds > 0 and math.isfinite(self.bucket_seconds)):
            raise ValueError("bucket_seconds must be a positive number")
        if not self.retention_seconds >= self.bucket_seconds:
            raise ValueError("retention_seconds must be at least one bucket")
        if self.gaps_per_bucket < 0 or self.log_per_bucket < 0 or self.keys_per_bucket < 0:
            raise ValueError("sample sizes and keys_per_bucket must be >= 0")

    def bucket(self, t: float) -> int:
        return math.floor(t / self.bucket_seconds)

    @property
    def ttl(self) -> int:
        return math.ceil(self.retention_seconds + self.bucket_seconds)


def add_store_flags(parser) -> None:
    """Flags for reaching the store, shared by the planner and the collector (which must agree
    on the telemetry bucketing). Defaults from env vars (services.flags)."""
    g = parser.add_argument_group("store")
    flag(g, "--redis", env="REDIS_URL", default="redis://127.0.0.1:6379/0",
         help="Redis URL, or memory:// for an in-process store")
    flag(g, "--key-prefix", env="KEY_PREFIX", default="cr", help="prefix of every Redis key")
    flag(g, "--bucket-seconds", env="BUCKET_SECONDS", default=10.0, type=float, help="telemetry bucket width")
    flag(g, "--retention-seconds", env="RETENTION_SECONDS", default=3600.0, type=float, help="telemetry retention")
    flag(g, "--bucket-keys", env="BUCKET_KEYS", default=20000, type=int,
         help="distinct keys counted per telemetry bucket, the rest as untracked; 0 = no cap")


def telemetry_from_args(args) -> TelemetryConfig:
    return TelemetryConfig(bucket_seconds=args.bucket_seconds, retention_seconds=args.retention_seconds,
                           keys_per_bucket=args.bucket_keys)
