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
from typing import Callable

from prometheus_client import Counter, Gauge, Histogram

from cacheroute.v1 import planner_pb2_grpc
from services.planner.control import ControlLoop, LoopConfig, LoopCounters, switching_config
from services.planner.servicer import PlannerServicer
from services.planner.watch import WatchHub
from services.rpc import (RpcMetrics, RunningServer, ServerConfig, add_server_flags, env, kv, server_config,
                          setup_logging, start_server)
from services.store import Store, TelemetryConfig, add_store_flags, open_store, telemetry_from_args

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
        self.loop = ControlLoop(self.store, config.loop, clock=config.clock, enabled=config.auto,
                                counters=_counters(self.metrics.registry, self.hub))
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

    @property
    def address(self) -> str:
        assert self.running is not None
        return self.running.address

    async def start(self) -> "PlannerService":
        servicer = self.servicer = PlannerServicer(self.store, self.loop, self.hub,
                                                   planner_id=self.config.loop.planner_id, clock=self.config.clock)
        self.running = await start_server(self.config.server, [(planner_pb2_grpc.add_PlannerServicer_to_server, servicer)],
                                          [SERVICE], protected_methods=PROTECTED, metrics=self.metrics)
        self.hub.start()
        self.loop.start()
        cfg = self.config.loop
        log.info("planner ready", extra=kv(planner=cfg.planner_id, replicas=len(cfg.replica_ids), q_cap=cfg.q_cap,
                                           warm_slots=cfg.warm_slots, interval=cfg.interval, auto=self.config.auto))
        return self

    async def stop(self, grace: float | None = None) -> None:
        if self.running is not None:
            await self.running.set_serving(False)
        await self.loop.stop()
        await self.hub.stop()
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


def parse_knobs(text: str) -> dict[str, float]:
    knobs = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"switching knob {part!r} is not NAME=VALUE")
        knobs[name.strip()] = float(value)
    return knobs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cacheroute serve planner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_flags(p, default_port=50051, default_metrics_port=9151)
    add_store_flags(p)
    g = p.add_argument_group("planning")
    g.add_argument("--replicas", default=env("REPLICAS"), help="ids or id=addr pairs, comma-separated (env CACHEROUTE_REPLICAS)")
    g.add_argument("--q-cap", type=float, default=float(env("Q_CAP", "20")), help="req/s per replica at the knee (default 20)")
    g.add_argument("--warm-slots", type=int, default=int(env("WARM_SLOTS", "8")), help="W, prefixes per replica (default 8)")
    g.add_argument("--interval", type=float, default=float(env("INTERVAL", "30")), help="loop period, seconds (default 30)")
    g.add_argument("--window", type=float, default=float(env("WINDOW_SECONDS", "300")), help="rate window, seconds (default 300)")
    g.add_argument("--incremental", type=int, choices=(0, 1), default=int(env("INCREMENTAL", "1")),
                   help="1: churn-aware re-planning when available (default 1)")
    g.add_argument("--switch-knobs", default=env("SWITCH_KNOBS", ""),
                   help="switching-rule knobs NAME=VALUE,... (env CACHEROUTE_SWITCH_KNOBS)")
    g.add_argument("--planner-id", default=env("PLANNER_ID", f"{socket.gethostname()}-{os.getpid()}"),
                   help="lease holder name (env CACHEROUTE_PLANNER_ID, default hostname-pid)")
    g.add_argument("--lease-ttl", type=float, default=float(env("LEASE_TTL", "15")), help="lease TTL, seconds (default 15)")
    g.add_argument("--keep-versions", type=int, default=int(env("KEEP_VERSIONS", "500")),
                   help="stored versions kept, 0 = all (default 500)")
    g.add_argument("--auto", type=int, choices=(0, 1), default=int(env("AUTO", "1")),
                   help="1: run the control loop (default 1)")
    return p


def config_from_args(args: argparse.Namespace) -> PlannerConfig:
    for name in ("q_cap", "interval", "window", "lease_ttl"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0")
    if args.window > args.retention_seconds:
        raise ValueError("--window must not exceed --retention-seconds")
    if args.warm_slots < 1:
        raise ValueError("--warm-slots must be >= 1")
    loop = LoopConfig(replica_ids=parse_replicas(args.replicas or ""), q_cap=args.q_cap, warm_slots=args.warm_slots,
                      interval=args.interval, window_seconds=args.window, incremental=bool(args.incremental),
                      switching=switching_config(parse_knobs(args.switch_knobs)), planner_id=args.planner_id,
                      lease_ttl=args.lease_ttl, keep_versions=args.keep_versions)
    return PlannerConfig(server=server_config("planner", args), loop=loop, redis_url=args.redis,
                         key_prefix=args.key_prefix, telemetry=telemetry_from_args(args), auto=bool(args.auto))


async def _run(config: PlannerConfig) -> None:
    service = await serve(config)
    try:
        await service.running.wait_for_stop_signal()
    finally:
        await service.stop()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"planner: error: {exc}", file=sys.stderr)
        return 2
    setup_logging("planner", config.server.log_level)
    asyncio.run(_run(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
