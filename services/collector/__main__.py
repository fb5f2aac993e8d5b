"""`cacheroute serve collector` / `python -m services.collector`: the telemetry collector.

Environment variables (flags override them):
  CACHEROUTE_REDIS_URL (redis://127.0.0.1:6379/0)  the store (memory:// for in-process)
  CACHEROUTE_KEY_PREFIX (cr)                       Redis key prefix
  CACHEROUTE_BUCKET_SECONDS (10)                   telemetry bucket width (planner must agree)
  CACHEROUTE_RETENTION_SECONDS (3600)              telemetry retention; older records are rejected
  CACHEROUTE_WINDOW_SECONDS (300)                  GetRates window when the request says 0
  CACHEROUTE_COLLECTOR_QUEUE (64)                  batches queued between streams and Redis writers
  CACHEROUTE_COLLECTOR_WRITERS (2)                 concurrent Redis writers
  CACHEROUTE_COLLECTOR_COALESCE (16)               queued batches merged into one round trip
  CACHEROUTE_MAX_RATES (10000)                     keys one GetRates answer carries at most (hottest first)
With a bearer token configured (CACHEROUTE_AUTH_TOKEN / --auth-token-file) every collector RPC
requires it: the telemetry writes, ReportArrivals and ReportCacheStats, and the GetRates read.
Dispatchers and engines configured with the same token send it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from cacheroute.v1 import collector_pb2_grpc
from prometheus_client import Counter, Gauge

from services.collector.ingest import IngestCounters, Ingestor
from services.collector.servicer import CollectorServicer
from services.rpc import (
    RpcMetrics,
    RunningServer,
    ServerConfig,
    add_server_flags,
    env_number,
    kv,
    run_service,
    server_config,
    start_server,
)
from services.store import (
    Store,
    TelemetryConfig,
    add_store_flags,
    open_store,
    telemetry_from_args,
)

log = logging.getLogger("cacheroute.collector")
SERVICE = "cacheroute.v1.Collector"
# with a token: forged telemetry skews plans; GetRates is a costly read of every tenant's keys
PROTECTED = frozenset({"ReportArrivals", "ReportCacheStats", "GetRates"})


@dataclass(frozen=True)
class CollectorConfig:
    server: ServerConfig
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "cr"
    telemetry: TelemetryConfig = TelemetryConfig()
    window_seconds: float = 300.0
    queue_size: int = 64
    writers: int = 2
    coalesce: int = 16
    max_rates: int = 10_000
    clock: Callable[[], float] = field(default=time.time, compare=False, repr=False)


def _metrics(registry, ingestor_queue_depth: Callable[[], int]) -> IngestCounters:
    events = Counter("cacheroute_collector_events_total", "arrival records counted", registry=registry)
    rejected = Counter("cacheroute_collector_rejected_total", "invalid records", ["kind"], registry=registry)
    dups = Counter("cacheroute_collector_duplicate_batches_total", "batches seen before", ["kind"], registry=registry)
    depth = Gauge("cacheroute_collector_queue_depth", "batches waiting for a writer", registry=registry)
    depth.set_function(ingestor_queue_depth)
    return IngestCounters(events=events.inc, rejected=lambda kind, n: n and rejected.labels(kind).inc(n),
                          duplicates=lambda kind: dups.labels(kind).inc())


class CollectorService:
    """The collector in this event loop: `await start()`, then `await stop()`."""

    def __init__(self, config: CollectorConfig, store: Store | None = None) -> None:
        self.config = config
        self.store = store or open_store(config.redis_url, telemetry=config.telemetry, prefix=config.key_prefix)
        self._owns_store = store is None
        self.metrics = RpcMetrics(config.server.name)
        self.ingestor = Ingestor(self.store, queue_size=config.queue_size, writers=config.writers,
                                 max_coalesce=config.coalesce, clock=config.clock)
        self.ingestor.counters = _metrics(self.metrics.registry, self.ingestor.queue.qsize)
        self.running: RunningServer | None = None

    @property
    def address(self) -> str:
        assert self.running is not None
        return self.running.address

    async def start(self) -> "CollectorService":
        self.ingestor.start()
        servicer = CollectorServicer(self.ingestor, self.store, window_seconds=self.config.window_seconds,
                                     clock=self.config.clock, max_rates=self.config.max_rates,
                                     max_message_bytes=self.config.server.max_message_bytes)
        self.running = await start_server(self.config.server,
                                          [(collector_pb2_grpc.add_CollectorServicer_to_server, servicer)],
                                          [SERVICE], protected_methods=PROTECTED, metrics=self.metrics)
        log.info("collector ready", extra=kv(bucket_seconds=self.config.telemetry.bucket_seconds,
                                             retention_seconds=self.config.telemetry.retention_seconds))
        return self

    async def stop(self, grace: float | None = None) -> None:
        if self.running is not None:
            await self.running.stop(grace)
        await self.ingestor.stop()
        if self._owns_store:
            await self.store.close()


async def serve(config: CollectorConfig, store: Store | None = None) -> CollectorService:
    return await CollectorService(config, store).start()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cacheroute serve collector", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_flags(p, default_port=50052, default_metrics_port=9152)
    add_store_flags(p)
    p.add_argument("--window", type=float, default=env_number("WINDOW_SECONDS", "300", float),
                   help="GetRates default window, seconds (env CACHEROUTE_WINDOW_SECONDS, default 300)")
    p.add_argument("--queue-size", type=int, default=env_number("COLLECTOR_QUEUE", "64", int),
                   help="bounded write queue, batches (env CACHEROUTE_COLLECTOR_QUEUE, default 64)")
    p.add_argument("--writers", type=int, default=env_number("COLLECTOR_WRITERS", "2", int),
                   help="Redis writer tasks (env CACHEROUTE_COLLECTOR_WRITERS, default 2)")
    p.add_argument("--coalesce", type=int, default=env_number("COLLECTOR_COALESCE", "16", int),
                   help="batches per round trip (env CACHEROUTE_COLLECTOR_COALESCE, default 16)")
    p.add_argument("--max-rates", type=int, default=env_number("MAX_RATES", "10000", int),
                   help="keys per GetRates answer at most (env CACHEROUTE_MAX_RATES, default 10000)")
    return p


def config_from_args(args: argparse.Namespace) -> CollectorConfig:
    return CollectorConfig(server=server_config("collector", args), redis_url=args.redis, key_prefix=args.key_prefix,
                           telemetry=telemetry_from_args(args), window_seconds=args.window,
                           queue_size=args.queue_size, writers=args.writers, coalesce=args.coalesce,
                           max_rates=args.max_rates)


def main(argv: list[str] | None = None) -> int:
    return run_service("collector", lambda: config_from_args(build_parser().parse_args(argv)), serve)


if __name__ == "__main__":
    sys.exit(main())
