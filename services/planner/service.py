"""The planner's wiring: `PlannerConfig` and `PlannerService` (store, control loop, watch hub,
shadow gate, live repair and the gRPC server). `services/planner/__main__.py` parses flags into
a config and runs it; tests and local stacks start the service directly."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from cacheroute.v1 import planner_pb2_grpc
from prometheus_client import Counter, Gauge, Histogram

from services.planner.advisor import AdviceConfig, RecommendedReplicas
from services.planner.control import ControlLoop, LoopConfig, LoopCounters
from services.planner.engines import Discovery, DiscoveryTask, EngineControl, EngineRegistry
from services.planner.gate import Gate, GateConfig
from services.planner.repair import Repairer, ReplicaHealth
from services.planner.servicer import PlannerServicer
from services.planner.watch import WatchHub
from services.rpc import RpcMetrics, RunningServer, ServerConfig, kv, start_server
from services.store import Store, TelemetryConfig, open_store

log = logging.getLogger("cacheroute.planner")
SERVICE = "cacheroute.v1.Planner"
PROTECTED = frozenset({"BuildPlan", "BuildPlanStream", "ActivatePlan", "Rollback", "SetMode", "PinPlan", "UnpinPlan", "ShadowPlan",
                       "AddEngine", "DrainEngine", "RemoveEngine"})


@dataclass(frozen=True)
class PlannerConfig:
    server: ServerConfig
    loop: LoopConfig
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "cr"
    telemetry: TelemetryConfig = TelemetryConfig()
    auto: bool = True
    watch_poll_seconds: float = 0.5
    gate: GateConfig = field(default_factory=GateConfig)
    replica_addresses: Mapping[str, str] = field(default_factory=dict)   # id -> host:port (health checks)
    repair: bool = True                   # repair when replica addresses are known
    health_interval: float = 0.5
    health_timeout: float = 0.3
    repair_grace: float = 2.0
    engine_kind: str = "cacheroute"       # kind of replica addresses without KIND+ (services.backends)
    advice: "AdviceConfig | None" = None  # cacheroute_recommended_replicas (services/planner/advisor.py); None: off
    advice_interval: float = 60.0         # seconds between advices (not the control loop's interval)
    discovery: "Discovery | None" = None  # engines from a DNS name (services/planner/engines.py); None: off
    clock: Callable[[], float] = field(default=time.time, compare=False, repr=False)


def _counters(registry, hub: WatchHub) -> LoopCounters:
    active = Gauge("cacheroute_planner_active_version", "active plan version (0: none)", registry=registry)
    flat = Gauge("cacheroute_planner_flat_mode", "1 in flat-fallback mode", registry=registry)
    leader = Gauge("cacheroute_planner_leader", "1 while this planner holds the lease", registry=registry)
    build = Histogram("cacheroute_planner_build_seconds", "candidate build + decision time", registry=registry,
                      buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
    share = Gauge("cacheroute_planner_admitted_rate_share", "admitted rate share of the last candidate", registry=registry)
    imbalance = Gauge("cacheroute_planner_predicted_imbalance", "max/mean expected load of the last candidate",
                      registry=registry)
    available = Gauge("cacheroute_planner_available_hit_rate",
                      "infinite-cache hit rate of the last window's arrivals (prefix-node telemetry)", registry=registry)
    achieved = Gauge("cacheroute_planner_achieved_hit_rate",
                     "cached / prompt tokens the engines reported over the last window", registry=registry)
    churn = Gauge("cacheroute_planner_plan_churn", "rate share the last candidate moves off its parent's replicas",
                  registry=registry)
    decisions = Counter("cacheroute_planner_switch_decisions_total", "loop outcomes", ["outcome"], registry=registry)
    errors = Counter("cacheroute_planner_loop_errors_total", "failed loop iterations", registry=registry)

    def on_state(state) -> None:
        active.set(state.active_version)
        flat.set(1 if state.mode.value == "flat" else 0)

    def built(plan, seconds: float) -> None:
        build.observe(seconds)
        share.set(plan.admitted_rate_share)
        imbalance.set(plan.predicted_imbalance)
        if plan.churn is not None:
            churn.set(plan.churn)
        if "available_hit_rate" in plan.extra:
            available.set(plan.extra["available_hit_rate"])
        if "achieved_hit_rate" in plan.extra:
            achieved.set(plan.extra["achieved_hit_rate"])

    hub.on_state = on_state
    return LoopCounters(built=built, decision=lambda outcome: decisions.labels(outcome).inc(), error=errors.inc,
                        leader=lambda is_leader: leader.set(1 if is_leader else 0))


class PlannerService:
    """The planner in this event loop: `await start()`, then `await stop()`."""

    def __init__(self, config: PlannerConfig, store: Store | None = None) -> None:
        self.config = config
        self.store = store or open_store(config.redis_url, telemetry=config.telemetry, prefix=config.key_prefix)
        self._owns_store = store is None
        self.metrics = RpcMetrics(config.server.name)
        self.hub = WatchHub(self.store, poll_seconds=config.watch_poll_seconds)
        self.gate = Gate(config.gate)          # ShadowPlan and BuildPlan(shadow) even when the loop is ungated
        self.health = self.repairer = None
        self._warm: asyncio.Task | None = None
        # the engine set (services/planner/engines.py): the configured replicas, then whatever was
        # added, drained or removed at run time; the loop plans over its active engines
        self.engines = EngineRegistry(self.store, configured=[(rid, config.replica_addresses.get(rid, ""))
                                                              for rid in config.loop.replica_ids],
                                      clock=config.clock, poll=config.watch_poll_seconds,
                                      on_change=self._engines_changed)
        ids = self.engines.placeable_ids
        replicas = ids
        if config.repair:
            self.health = ReplicaHealth(config.replica_addresses, interval=config.health_interval,
                                        timeout=config.health_timeout, tls=config.server.tls,
                                        default_kind=config.engine_kind)
            health, grace = self.health, config.repair_grace
            replicas = lambda: health.usable(ids(), grace)   # noqa: E731
        self.loop = ControlLoop(self.store, config.loop, clock=config.clock, enabled=config.auto,
                                counters=_counters(self.metrics.registry, self.hub),
                                gate=self.gate if config.gate.enabled else None, replicas=replicas)
        self.engine_control = EngineControl(self.engines, self.store, wake=self.loop.wake, clock=config.clock,
                                            default_kind=config.engine_kind)
        self.discovery = (DiscoveryTask(self.engine_control, config.discovery, self._lease_token)
                          if config.discovery is not None and config.auto else None)
        if self.health is not None and config.auto:
            repairs = Counter("cacheroute_planner_repairs_total", "repaired plan versions written",
                              registry=self.metrics.registry)
            self.repairer = Repairer(self.store, self.health, grace=config.repair_grace, leader=self._lease_token,
                                     clock=config.clock, on_repair=lambda outcome: repairs.inc())
        self.running: RunningServer | None = None
        self.servicer: PlannerServicer | None = None
        self._resets = Counter("cacheroute_planner_store_resets", "times the store was found to have lost its plan "
                               "state (Redis restarted without persistence)", registry=self.metrics.registry)
        self.store.on_reset = self._store_reset
        self.advisor = (RecommendedReplicas(self.store, self.metrics.registry, config.advice,
                                            window_seconds=config.loop.window_seconds, interval=config.advice_interval,
                                            clock=config.clock) if config.advice is not None else None)

    def _store_reset(self, seen: int, counter: int) -> None:
        """The store forgot versions it had: say so loudly; version numbers stay above `seen`."""
        self._resets.inc()
        log.error("store lost its plan state", extra=kv(highest_version_seen=seen, version_counter=counter))
        if self.servicer is not None:
            self.servicer.forget_plans()

    async def _engines_changed(self, engines) -> None:
        """The engine set changed (here or through another planner): health checks follow it
        and the loop re-plans now."""
        if self.health is not None:
            await self.health.set_addresses(engines.addresses())
        self.loop.wake()

    def _lease_token(self) -> int | None:
        return self.loop.status().token if self.loop.leader else None

    @property
    def address(self) -> str:
        assert self.running is not None
        return self.running.address

    async def start(self) -> "PlannerService":
        servicer = self.servicer = PlannerServicer(self.store, self.loop, self.hub, planner_id=self.config.loop.planner_id,
                                                   clock=self.config.clock, gate=self.gate,
                                                   max_message_bytes=self.config.server.max_message_bytes,
                                                   engines=self.engine_control, health=self.health,
                                                   advisor=self.advisor)
        self.running = await start_server(self.config.server, [(planner_pb2_grpc.add_PlannerServicer_to_server, servicer)],
                                          [SERVICE], protected_methods=PROTECTED, audited_methods=PROTECTED,
                                          metrics=self.metrics)
        self.hub.start()
        if self.health is not None:
            await self.health.start()
        await self.engines.start()
        if self.discovery is not None:
            self.discovery.start()
        if self.config.gate.enabled:
            self._warm = asyncio.create_task(self._warm_up(), name="planner-gate-warm-up")
        self.loop.start()
        if self.repairer is not None:
            self.repairer.start()
        if self.advisor is not None:
            self.advisor.start()
        cfg = self.config.loop
        log.info("planner ready", extra=kv(planner=cfg.planner_id, replicas=len(cfg.replica_ids), q_cap=cfg.q_cap,
                                           warm_slots=cfg.warm_slots, interval=cfg.interval, auto=self.config.auto,
                                           gate=self.config.gate.enabled, repair=self.repairer is not None))
        return self

    async def _warm_up(self) -> None:
        try:
            await self.gate.warm_up()
        except Exception as exc:  # noqa: BLE001 - the first gate will say what is wrong
            log.warning("shadow replay worker did not start", extra=kv(error=str(exc)))

    async def stop(self, grace: float | None = None) -> None:
        if self.running is not None:
            await self.running.set_serving(False)
        if self.repairer is not None:
            await self.repairer.stop()
        if self.advisor is not None:
            await self.advisor.stop()
        if self.discovery is not None:
            await self.discovery.stop()
        await self.engines.stop()
        await self.loop.stop()
        await self.hub.stop()
        if self.health is not None:
            await self.health.stop()
        if self._warm is not None:
            self._warm.cancel()
        await self.gate.close()
        if self.running is not None:
            await self.running.stop(grace)
        if self._owns_store:
            await self.store.close()


async def serve(config: PlannerConfig, store: Store | None = None) -> PlannerService:
    return await PlannerService(config, store).start()
