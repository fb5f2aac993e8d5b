"""The collector's wiring: `CollectorConfig` and `CollectorService` (store, ingestor and the
gRPC server). `services/collector/__main__.py` parses flags into a config and runs it; tests
and local stacks start the service directly."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from cacheroute.v1 import collector_pb2_grpc
from prometheus_client import Counter, Gauge

from services.collector.ingest import IngestCounters, Ingestor
from services.collector.servicer import CollectorServicer
from services.errors import Unavailable
from services.rpc import RpcMetrics, RunningServer, ServerConfig, kv, start_server
from services.store import Store, TelemetryConfig, open_store

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
    max_rates: int = 10_000               # keys per GetRates answer at most
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
        try:   # windows younger than the collection divide by its span (Store.window_rates)
            since = await self.store.mark_telemetry_start(self.config.clock())
        except Unavailable as exc:
            since = None
            log.warning("telemetry start not recorded; windows span their full length", extra=kv(error=str(exc)))
        self.ingestor.start()
        servicer = CollectorServicer(self.ingestor, self.store, window_seconds=self.config.window_seconds,
                                     clock=self.config.clock, max_rates=self.config.max_rates,
                                     max_message_bytes=self.config.server.max_message_bytes)
        self.running = await start_server(self.config.server,
                                          [(collector_pb2_grpc.add_CollectorServicer_to_server, servicer)],
                                          [SERVICE], protected_methods=PROTECTED, metrics=self.metrics)
        log.info("collector ready", extra=kv(bucket_seconds=self.config.telemetry.bucket_seconds,
                                             retention_seconds=self.config.telemetry.retention_seconds,
                                             telemetry_since=since))
        return self

    async def stop(self, grace: float | None = None) -> None:
        if self.running is not None:
            await self.running.stop(grace)
        await self.ingestor.stop()
        if self._owns_store:
            await self.store.close()


async def serve(config: CollectorConfig, store: Store | None = None) -> CollectorService:
    return await CollectorService(config, store).start()
