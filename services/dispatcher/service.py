"""The dispatcher's wiring: `DispatcherConfig` and `DispatcherService` (router, replica monitor,
plan feed, telemetry reporter and the gRPC server). `services/dispatcher/__main__.py` parses
flags into a config and runs it; tests and local stacks start the service directly."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from cacheroute.v1 import dispatcher_pb2_grpc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services.auth import EngineKeys, KeyRing
from services.backends import make_backend
from services.dispatcher.budget import BudgetConfig, DeferredArrivals, SharedBudget
from services.dispatcher.cachestats import CacheStatsSender, CacheUsage
from services.dispatcher.dispatch import Dispatcher
from services.dispatcher.http import HttpApi, HttpConfig
from services.dispatcher.monitor import Ejection, ReplicaMonitor
from services.dispatcher.plans import EngineFeed, PlanFeed
from services.dispatcher.recordbus import DEFAULT_BATCH_MAX, DEFAULT_INTERVAL, RecordBus, RecordBusMetrics, sender_id
from services.dispatcher.router import Router
from services.dispatcher.servicer import DispatcherServicer, KeyRules
from services.dispatcher.telemetry import ArrivalReporter
from services.dispatcher.workers import report_ready
from services.model import DEFAULT_COLD_TAIL, Replica
from services.rpc import RpcMetrics, RunningServer, ServerConfig, every, kv, start_server, stop_tasks
from services.store import RedisStore

log = logging.getLogger("cacheroute.dispatcher")
SERVICE = "cacheroute.v1.Dispatcher"
DATA_PLANE = frozenset({"Route", "RouteBatch", "Generate"})   # need an accepted key when any is configured


@dataclass(frozen=True)
class DispatcherConfig:
    server: ServerConfig
    replicas: tuple[Replica, ...]
    dispatcher_id: str = "dispatcher-0"
    planner: str = ""
    redis_url: str = ""
    collector: str = ""
    rules: KeyRules = KeyRules()
    cold: str = DEFAULT_COLD_TAIL
    hold_limit: float = 0.0               # seconds a request may be held while KV is full (0: never hold)
    prefix_nodes: bool = False             # route by prefix nodes, token balance (policy cacheroute-prefix)
    poll_interval: float = 0.25
    poll_timeout: float = 0.2
    health_every: float = 1.0              # seconds between an HTTP engine's /health while its /metrics answers
    telemetry_interval: float = 0.5
    telemetry_capacity: int = 100_000
    plan_backoff_max: float = 5.0
    seed: int | None = None
    budget: BudgetConfig = BudgetConfig()
    engine_kind: str = "cacheroute"       # kind of replicas given without KIND+ (services.backends)
    http: HttpConfig = HttpConfig()       # the OpenAI HTTP API (port -1: off)
    keyring: KeyRing = KeyRing()          # data-plane API keys (services/auth.py); the token is added
    engine_keys: EngineKeys = EngineKeys()   # API keys presented to HTTP engines (services/auth.py)
    workers: int = 1                   # > 1: the process supervises that many workers (services/dispatcher/workers.py)
    worker_index: int | None = None    # set in a worker the supervisor started
    ext_proc_port: int = -1            # Envoy ext_proc endpoint picker (services/dispatcher/extproc.py): -1 off, 0 ephemeral
    uvloop: bool = True                # the process's event loop is uvloop's (services.rpc.loops.use_uvloop)
    # the record bus between dispatchers (services/dispatcher/recordbus.py); only with a Redis store.
    # On by default: docs/experiments.md, "The record bus live, a second seed"
    record_bus: bool = True
    record_interval: float = DEFAULT_INTERVAL
    record_batch_max: int = DEFAULT_BATCH_MAX
    record_handover: bool = True         # hand-over to a starting dispatcher (recordbus.py)
    malloc_arenas: int = 2               # glibc arenas of a serving process (plans.limit_arenas); 0 = glibc's default


class RouterMetrics:
    """Prometheus view of the router, read at scrape time (nothing on the request path)."""

    def __init__(self, router: Router) -> None:
        self.router = router

    def collect(self):
        r = self.router
        routed = CounterMetricFamily("cacheroute_dispatcher_routed", "requests routed, by reason", labels=["reason"])
        for name, value in (("planned", r.counts[1]), ("cold", r.counts[2]), ("fallback", r.counts[3])):
            routed.add_metric([name], value)
        yield routed
        yield GaugeMetricFamily("cacheroute_dispatcher_plan_version", "active plan version (0: none)", r.plan_version)
        yield GaugeMetricFamily("cacheroute_dispatcher_flat_mode", "1 in flat-fallback mode", int(r.flat))
        yield CounterMetricFamily("cacheroute_dispatcher_telemetry_dropped", "arrivals not delivered to the collector",
                                  r.telemetry_dropped)
        yield CounterMetricFamily("cacheroute_dispatcher_telemetry_capped",
                                  "Route/RouteBatch arrivals left out of telemetry: caller over its budget",
                                  r.telemetry_capped)
        healthy = GaugeMetricFamily("cacheroute_dispatcher_replica_healthy", "1 if the replica is healthy", labels=["replica"])
        load = GaugeMetricFamily("cacheroute_dispatcher_replica_load", "load signal (engine queue + recent routes)",
                                 labels=["replica"])
        for i, rid in enumerate(r.ids):
            healthy.add_metric([rid], int(r.state.healthy[i]))
            load.add_metric([rid], r.state.in_flight[i])
        yield healthy
        yield load


def data_plane_keys(config: DispatcherConfig) -> KeyRing:
    """The configured keys plus the deployment token (empty tenant): a deployment with a token
    never has an open data plane, however its config was built."""
    keys = dict(config.keyring.keys)
    if config.server.auth_token:
        keys[config.server.auth_token] = ""
    return KeyRing(keys)


class DispatcherService:
    """One dispatcher in this event loop: `await start()`, then `await stop()`."""

    def __init__(self, config: DispatcherConfig) -> None:
        self.config = config
        self.router = Router(config.replicas, seed=config.seed, cold=config.cold,
                             telemetry_capacity=config.telemetry_capacity, prefix_nodes=config.prefix_nodes,
                             hold=config.hold_limit > 0)
        tls = config.server.tls
        def backend(replica_id: str, address: str):
            return make_backend(replica_id, address, config.engine_kind, tls=tls, keys=config.engine_keys,
                                deadlines=config.http.deadlines, health_every=config.health_every)

        backends = [backend(r.id, r.address) for r in config.replicas]
        self.monitor = ReplicaMonitor(self.router, interval=config.poll_interval, timeout=config.poll_timeout, tls=tls,
                                      backends=backends)
        self.monitor.backend_factory = backend
        h = config.http
        self.monitor.ejection = Ejection(h.eject_after, h.max_ejected_fraction, h.eject_seconds)
        self.usage = CacheUsage(self.router.ids)      # per-response usage of HTTP engines (cache telemetry)
        self.monitor.on_stats = lambda i, s: self.usage.counters(i, s.requests, s.prompt_tokens, s.cached_tokens)
        self.monitor.on_added = lambda i, replica: self.usage.add(replica.id)
        self.cache_sender = (CacheStatsSender(self.usage, config.collector, config.dispatcher_id, tls=tls,
                                              token=config.server.auth_token)
                             if config.collector and any(b.http for b in backends) else None)
        self.dispatcher: Dispatcher | None = None
        self.store = None
        if config.redis_url:
            self.store = RedisStore(config.redis_url)
        self.feed = PlanFeed(self.router, planner=config.planner, store=self.store, tls=tls,
                             backoff_max=config.plan_backoff_max, seed=config.seed)
        self.engine_feed = EngineFeed(self.router, self.monitor, planner=config.planner, store=self.store, tls=tls)
        # one per-caller telemetry budget for gRPC and HTTP arrivals, in the store when there is one
        self.budget = SharedBudget(config.budget, self.store)
        if config.budget.scope == "shared" and self.store is None and config.budget.rate > 0:
            log.info("caller budget: no store (--redis), one budget per dispatcher")
        # served arrivals charged to the store's bucket once per flush, per caller (budget.py)
        self.arrivals = (DeferredArrivals(self.budget, self.router, capacity=config.telemetry_capacity,
                                          seed=config.seed)
                         if self.budget.shared and self.budget.bounded else None)
        settle = self.arrivals.settle if self.arrivals is not None else None
        self.reporter = (ArrivalReporter(self.router, config.collector, config.dispatcher_id,
                                         interval=config.telemetry_interval, tls=tls,
                                         token=config.server.auth_token, settle=settle)
                         if config.collector else None)
        self._settling = None              # no collector: the deferred arrivals are settled on a task of their own
        self.bus = (RecordBus(self.router, self.store, sender_id(config.dispatcher_id),
                              interval=config.record_interval, batch_max=config.record_batch_max,
                              handover=config.record_handover)
                    if config.record_bus and self.store is not None else None)
        self.running: RunningServer | None = None
        self.http: HttpApi | None = None
        self.ext_proc = None               # grpc.aio.Server of the endpoint picker, when on
        self.ext_proc_port: int | None = None

    @property
    def address(self) -> str:
        assert self.running is not None
        return self.running.address

    @property
    def http_url(self) -> str | None:
        return self.http.url if self.http is not None else None

    async def start(self) -> "DispatcherService":
        await self.monitor.start()
        await self.feed.start()
        await self.engine_feed.start()
        metrics = RpcMetrics("dispatcher")
        metrics.registry.register(RouterMetrics(self.router))
        if self.bus is not None:
            metrics.registry.register(RecordBusMetrics(self.bus))
            await self.bus.start()
        ring = data_plane_keys(self.config)
        self.dispatcher = Dispatcher(self.router, self.monitor, self.usage, metrics.registry,
                                     hold_limit=self.config.hold_limit, budget=self.budget, deferred=self.arrivals)
        servicer = DispatcherServicer(self.router, self.monitor, self.config.rules, self.config.dispatcher_id,
                                      budget=self.budget, keyring=ring,
                                      dispatcher=self.dispatcher, forward_client_auth=self.config.http.forward_client_auth)
        self.running = await start_server(self.config.server,
                                          [(dispatcher_pb2_grpc.add_DispatcherServicer_to_server, servicer)],
                                          [SERVICE], keyring=ring, keyring_methods=DATA_PLANE, metrics=metrics)
        if self.config.http.port >= 0:
            self.http = await HttpApi(self.router, self.dispatcher, self.config.http, ring,
                                      registry=metrics.registry).start()
        if self.config.ext_proc_port >= 0:
            from services.dispatcher.extproc import start_ext_proc
            self.ext_proc, self.ext_proc_port = await start_ext_proc(
                self.router, self.config.server.host, self.config.ext_proc_port,
                key_tokens=self.config.http.key_tokens, max_output_tokens=self.config.http.max_output_tokens)
        if self.reporter is not None:
            self.reporter.start()
        elif self.arrivals is not None:
            self._settling = asyncio.get_running_loop().create_task(
                every(self.config.telemetry_interval, self.arrivals.settle), name="arrival-settle")
        if self.cache_sender is not None:
            self.cache_sender.start()
        if self.config.worker_index is not None:
            report_ready(index=self.config.worker_index, address=self.running.address,
                         metrics_port=self.running.metrics_port, http=self.http_url)
        log.info("dispatcher ready", extra=kv(id=self.config.dispatcher_id, replicas=len(self.router.ids),
                                              healthy=sum(self.router.state.healthy), http=self.http_url,
                                              plan_version=self.router.plan_version, source=self.router.plan_source))
        return self

    async def stop(self, grace: float | None = None) -> None:
        if self.http is not None:
            self.http.front.serving = False
        if self.running is not None:
            await self.running.stop(grace)
        if self.http is not None:
            await self.http.stop()
        if self.ext_proc is not None:
            await self.ext_proc.stop(grace)
        if self.bus is not None:
            await self.bus.stop()
        await self.engine_feed.stop()
        await self.feed.stop()
        if self.reporter is not None:
            await self.reporter.stop()
        await stop_tasks([self._settling])
        if self.cache_sender is not None:
            await self.cache_sender.stop()
        await self.monitor.stop()
        if self.store is not None:
            await self.store.close()


async def serve(config: DispatcherConfig) -> DispatcherService:
    return await DispatcherService(config).start()
