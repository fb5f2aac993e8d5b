"""`cacheroute serve planner` / `python -m services.planner`: the control plane.

Environment variables (flags override them):
  CACHEROUTE_REDIS_URL (redis://127.0.0.1:6379/0)  the store (memory:// for in-process)
  CACHEROUTE_KEY_PREFIX (cr)                       Redis key prefix
  CACHEROUTE_BUCKET_SECONDS (10)                   telemetry bucket width (collector must agree)
  CACHEROUTE_RETENTION_SECONDS (3600)              telemetry retention
  CACHEROUTE_REPLICAS (required)                   replica ids, or id=host:port pairs (ids are used)
  CACHEROUTE_Q_CAP (20)                            req/s one replica carries at the latency knee
  CACHEROUTE_WARM_SLOTS (8)                        W: prefixes one replica keeps warm
  CACHEROUTE_INTERVAL (30)                         seconds between control-loop iterations
  CACHEROUTE_WINDOW_SECONDS (300)                  telemetry window the rates are measured over
  CACHEROUTE_INCREMENTAL (1)                       churn-aware re-planning when available (0: from scratch)
  CACHEROUTE_SWITCH_KNOBS ("")                     switching-rule knobs NAME=VALUE,... (services.core.switching)
  CACHEROUTE_PLANNER_ID (hostname-pid)             lease holder name
  CACHEROUTE_LEASE_TTL (15)                        planner lease TTL, seconds (renewed every TTL/3)
  CACHEROUTE_KEEP_VERSIONS (500)                   stored versions kept (active, pinned, history always kept)
  CACHEROUTE_AUTO (1)                              run the control loop (0: RPCs only, never leads)
  CACHEROUTE_MAX_MOVES (8)                         incremental rebalancing moves per loop, 0 = unbounded
                                                   (a returning replica gets at most this many key shares a loop)

Shadow gate and automatic fallback (services/planner/gate.py):
  CACHEROUTE_GATE (off)                            on: replay every candidate against Flat-LB before activation,
                                                   fall back to flat (and return) by the gate's mode rule
  CACHEROUTE_GATE_MARGIN (0.10)                    required p99 or capacity improvement over Flat-LB
  CACHEROUTE_GATE_WINDOW (120)                     seconds of the arrival log replayed
  CACHEROUTE_GATE_PROFILE ($CACHEROUTE_PROFILE or llama3-8b-h100)   engine profile of the replay
  CACHEROUTE_GATE_KV_BLOCKS ($CACHEROUTE_KV_BLOCKS or the profile's) KV blocks per replica in the replay
  CACHEROUTE_GATE_TIME_SCALE ($CACHEROUTE_TIME_SCALE or 1)          the engines' time scale
  CACHEROUTE_GATE_SLO (3.5)                        p99 TTFT SLO (seconds) for the capacity estimate
  CACHEROUTE_GATE_TIMEOUT (30)                     seconds one replay may take (then it fails the gate)
  CACHEROUTE_GATE_MAX_REQUESTS (2000)              latest records replayed
  CACHEROUTE_COLD_TAIL (the cacheroute policy's default)  dispatchers' cold tail, replayed with the candidate
  CACHEROUTE_FALLBACK_KNOBS ("")                   key_tolerance=,p99_tolerance=,p99_slack= (FallbackConfig)

Live failure repair (services/planner/repair.py; needs id=host:port replicas):
  CACHEROUTE_REPAIR (1)                            health-check replicas and repair the active plan
  CACHEROUTE_ENGINE_KIND (cacheroute)              kind of addresses without KIND+ (services/backends)
  CACHEROUTE_HEALTH_INTERVAL (0.5)                 seconds between health checks of each replica
  CACHEROUTE_HEALTH_TIMEOUT (0.3)                  deadline of one health check, seconds
  CACHEROUTE_REPAIR_GRACE (2)                      seconds a replica must stay down before a repair
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from cacheroute.v1 import planner_pb2_grpc
from prometheus_client import Counter, Gauge, Histogram

from services.core.shadow import FallbackConfig
from services.planner.control import (
    ControlLoop,
    LoopConfig,
    LoopCounters,
    switching_config,
)
from services.planner.gate import Gate, GateConfig, default_cold_tail
from services.planner.repair import Repairer, ReplicaHealth
from services.planner.servicer import PlannerServicer
from services.planner.watch import WatchHub
from services.rpc import (
    RpcMetrics,
    RunningServer,
    ServerConfig,
    add_server_flags,
    env,
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

log = logging.getLogger("cacheroute.planner")
SERVICE = "cacheroute.v1.Planner"
PROTECTED = frozenset({"BuildPlan", "ActivatePlan", "Rollback", "SetMode", "PinPlan", "UnpinPlan", "ShadowPlan"})


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
    decisions = Counter("cacheroute_planner_switch_decisions_total", "loop outcomes", ["outcome"], registry=registry)
    errors = Counter("cacheroute_planner_loop_errors_total", "failed loop iterations", registry=registry)

    def on_state(state) -> None:
        active.set(state.active_version)
        flat.set(1 if state.mode.value == "flat" else 0)

    def built(plan, seconds: float) -> None:
        build.observe(seconds)
        share.set(plan.admitted_rate_share)
        imbalance.set(plan.predicted_imbalance)

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
        replicas = None
        if config.repair and config.replica_addresses:
            self.health = ReplicaHealth(config.replica_addresses, interval=config.health_interval,
                                        timeout=config.health_timeout, tls=config.server.tls,
                                        default_kind=config.engine_kind)
            health, ids, grace = self.health, config.loop.replica_ids, config.repair_grace
            replicas = lambda: health.usable(ids, grace)   # noqa: E731
        self.loop = ControlLoop(self.store, config.loop, clock=config.clock, enabled=config.auto,
                                counters=_counters(self.metrics.registry, self.hub),
                                gate=self.gate if config.gate.enabled else None, replicas=replicas)
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

    def _store_reset(self, seen: int, counter: int) -> None:
        """The store forgot versions it had: say so loudly; version numbers stay above `seen`."""
        self._resets.inc()
        log.error("store lost its plan state", extra=kv(highest_version_seen=seen, version_counter=counter))
        if self.servicer is not None:
            self.servicer.forget_plans()

    def _lease_token(self) -> int | None:
        return self.loop.status().token if self.loop.leader else None

    @property
    def address(self) -> str:
        assert self.running is not None
        return self.running.address

    async def start(self) -> "PlannerService":
        servicer = self.servicer = PlannerServicer(self.store, self.loop, self.hub, planner_id=self.config.loop.planner_id,
                                                   clock=self.config.clock, gate=self.gate,
                                                   max_message_bytes=self.config.server.max_message_bytes)
        self.running = await start_server(self.config.server, [(planner_pb2_grpc.add_PlannerServicer_to_server, servicer)],
                                          [SERVICE], protected_methods=PROTECTED, audited_methods=PROTECTED,
                                          metrics=self.metrics)
        self.hub.start()
        if self.health is not None:
            await self.health.start()
        if self.config.gate.enabled:
            self._warm = asyncio.create_task(self._warm_up(), name="planner-gate-warm-up")
        self.loop.start()
        if self.repairer is not None:
            self.repairer.start()
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


def parse_replicas(text: str) -> tuple[str, ...]:
    """"a,b" or "a=host:port,b=host:port" -> ("a", "b")."""
    ids = tuple(part.split("=", 1)[0].strip() for part in text.split(",") if part.strip())
    if not ids:
        raise ValueError("no replicas given (--replicas or CACHEROUTE_REPLICAS)")
    if len(set(ids)) != len(ids) or not all(ids):
        raise ValueError(f"replica ids must be distinct and non-empty: {text!r}")
    return ids


def parse_replica_addresses(text: str) -> dict[str, str]:
    """"a=host:port,b=host:port" -> {"a": "host:port", ...}; bare ids have no address (no health checks)."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        rid, sep, address = part.partition("=")
        if sep and address.strip():
            out[rid.strip()] = address.strip()
    return out


def parse_knobs(text: str, what: str = "switching") -> dict[str, float]:
    knobs = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"{what} knob {part!r} is not NAME=VALUE")
        knobs[name.strip()] = float(value)
    return knobs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cacheroute serve planner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_flags(p, default_port=50051, default_metrics_port=9151)
    add_store_flags(p)
    g = p.add_argument_group("planning")
    g.add_argument("--replicas", default=env("REPLICAS"), help="ids or id=addr pairs, comma-separated (env CACHEROUTE_REPLICAS)")
    g.add_argument("--q-cap", type=float, default=env_number("Q_CAP", "20", float), help="req/s per replica at the knee (default 20)")
    g.add_argument("--warm-slots", type=int, default=env_number("WARM_SLOTS", "8", int), help="W, prefixes per replica (default 8)")
    g.add_argument("--interval", type=float, default=env_number("INTERVAL", "30", float), help="loop period, seconds (default 30)")
    g.add_argument("--window", type=float, default=env_number("WINDOW_SECONDS", "300", float), help="rate window, seconds (default 300)")
    g.add_argument("--incremental", type=int, choices=(0, 1), default=env_number("INCREMENTAL", "1", int),
                   help="1: churn-aware re-planning when available (default 1)")
    g.add_argument("--switch-knobs", default=env("SWITCH_KNOBS", ""),
                   help="switching-rule knobs NAME=VALUE,... (env CACHEROUTE_SWITCH_KNOBS)")
    g.add_argument("--planner-id", default=env("PLANNER_ID", f"{socket.gethostname()}-{os.getpid()}"),
                   help="lease holder name (env CACHEROUTE_PLANNER_ID, default hostname-pid)")
    g.add_argument("--lease-ttl", type=float, default=env_number("LEASE_TTL", "15", float), help="lease TTL, seconds (default 15)")
    g.add_argument("--keep-versions", type=int, default=env_number("KEEP_VERSIONS", "500", int),
                   help="stored versions kept, 0 = all (default 500)")
    g.add_argument("--auto", type=int, choices=(0, 1), default=env_number("AUTO", "1", int),
                   help="1: run the control loop (default 1)")
    g.add_argument("--max-moves", type=int, default=env_number("MAX_MOVES", "8", int),
                   help="incremental rebalancing moves per loop, 0 = unbounded (env CACHEROUTE_MAX_MOVES, default 8)")
    g = p.add_argument_group("shadow gate and automatic fallback")
    g.add_argument("--gate", choices=("on", "off"), default=env("GATE", "off"),
                   help="replay candidates against Flat-LB before activating them (env CACHEROUTE_GATE, default off)")
    g.add_argument("--gate-margin", type=float, default=env_number("GATE_MARGIN", "0.10", float),
                   help="required p99 or capacity improvement (default 0.10)")
    g.add_argument("--gate-window", type=float, default=env_number("GATE_WINDOW", "120", float),
                   help="seconds of arrivals replayed (default 120)")
    g.add_argument("--gate-profile", default=env("GATE_PROFILE", env("PROFILE", "llama3-8b-h100")),
                   help="engine profile of the replay (env CACHEROUTE_GATE_PROFILE, else CACHEROUTE_PROFILE)")
    kv_blocks = env("GATE_KV_BLOCKS", env("KV_BLOCKS"))
    g.add_argument("--gate-kv-blocks", type=int, default=int(kv_blocks) if kv_blocks else None,
                   help="KV blocks per replica in the replay (default: the profile's)")
    g.add_argument("--gate-time-scale", type=float, default=float(env("GATE_TIME_SCALE", env("TIME_SCALE", "1"))),
                   help="the engines' time scale, wall seconds per model second (default 1)")
    g.add_argument("--gate-slo", type=float, default=env_number("GATE_SLO", "3.5", float),
                   help="p99 TTFT SLO in seconds for the capacity estimate (default 3.5)")
    g.add_argument("--gate-timeout", type=float, default=env_number("GATE_TIMEOUT", "30", float),
                   help="seconds one replay may take; an overrun fails the gate (default 30)")
    g.add_argument("--gate-max-requests", type=int, default=env_number("GATE_MAX_REQUESTS", "2000", int),
                   help="latest records replayed (default 2000)")
    g.add_argument("--cold-tail", choices=("p2c", "chwbl"), default=env("COLD_TAIL", default_cold_tail()),
                   help=f"the dispatchers' cold tail, replayed with the candidate (default {default_cold_tail()})")
    g.add_argument("--fallback-knobs", default=env("FALLBACK_KNOBS", ""),
                   help="key_tolerance=,p99_tolerance=,p99_slack= (services.core.shadow.FallbackConfig)")
    g = p.add_argument_group("live failure repair")
    g.add_argument("--repair", type=int, choices=(0, 1), default=env_number("REPAIR", "1", int),
                   help="1: health-check id=host:port replicas and repair the active plan (default 1)")
    g.add_argument("--engine-kind", default=env("ENGINE_KIND", "cacheroute"),
                   choices=("cacheroute", "vllm", "sglang", "llamacpp", "openai"),
                   help="kind of replica addresses given without KIND+, as the dispatchers' (env CACHEROUTE_ENGINE_KIND)")
    g.add_argument("--health-interval", type=float, default=env_number("HEALTH_INTERVAL", "0.5", float),
                   help="seconds between health checks (default 0.5)")
    g.add_argument("--health-timeout", type=float, default=env_number("HEALTH_TIMEOUT", "0.3", float),
                   help="deadline of one health check, seconds (default 0.3)")
    g.add_argument("--repair-grace", type=float, default=env_number("REPAIR_GRACE", "2", float),
                   help="seconds a replica stays down before its keys move (default 2)")
    return p


def gate_from_args(args: argparse.Namespace) -> GateConfig:
    if args.gate_window > args.retention_seconds:
        raise ValueError("--gate-window must not exceed --retention-seconds")
    if args.gate_max_requests < 10:
        raise ValueError("--gate-max-requests must be >= 10")
    fallback = FallbackConfig(**_known(parse_knobs(args.fallback_knobs, "fallback"), FallbackConfig))
    return GateConfig(enabled=args.gate == "on", margin=args.gate_margin, window_seconds=args.gate_window,
                      profile=args.gate_profile, kv_blocks=args.gate_kv_blocks, time_scale=args.gate_time_scale,
                      slo_p99=args.gate_slo, timeout=args.gate_timeout, max_requests=args.gate_max_requests,
                      cold=args.cold_tail, fallback=fallback)


def _known(knobs: dict[str, float], cls) -> dict[str, float]:
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(knobs) - names)
    if unknown:
        raise ValueError(f"unknown fallback knob(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    return knobs


def config_from_args(args: argparse.Namespace) -> PlannerConfig:
    for name in ("q_cap", "interval", "window", "lease_ttl"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0")
    if args.window > args.retention_seconds:
        raise ValueError("--window must not exceed --retention-seconds")
    if args.warm_slots < 1:
        raise ValueError("--warm-slots must be >= 1")
    if args.max_moves < 0:
        raise ValueError("--max-moves must be >= 0")
    for name in ("health_interval", "health_timeout", "repair_grace"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0")
    loop = LoopConfig(replica_ids=parse_replicas(args.replicas or ""), q_cap=args.q_cap, warm_slots=args.warm_slots,
                      interval=args.interval, window_seconds=args.window, incremental=bool(args.incremental),
                      switching=switching_config(parse_knobs(args.switch_knobs)), planner_id=args.planner_id,
                      lease_ttl=args.lease_ttl, keep_versions=args.keep_versions, max_moves=args.max_moves or None)
    return PlannerConfig(server=server_config("planner", args), loop=loop, redis_url=args.redis,
                         key_prefix=args.key_prefix, telemetry=telemetry_from_args(args), auto=bool(args.auto),
                         gate=gate_from_args(args), replica_addresses=parse_replica_addresses(args.replicas or ""),
                         repair=bool(args.repair), health_interval=args.health_interval,
                         health_timeout=args.health_timeout, repair_grace=args.repair_grace,
                         engine_kind=args.engine_kind)


def main(argv: list[str] | None = None) -> int:
    return run_service("planner", lambda: config_from_args(build_parser().parse_args(argv)), serve)


if __name__ == "__main__":
    sys.exit(main())
