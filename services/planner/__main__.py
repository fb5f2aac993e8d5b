"""`cacheroute serve planner` / `python -m services.planner`: the control plane.

Environment variables (flags override them):
  CACHEROUTE_REDIS_URL (redis://127.0.0.1:6379/0)  the store (memory:// for in-process)
  CACHEROUTE_KEY_PREFIX (cr)                       Redis key prefix
  CACHEROUTE_BUCKET_SECONDS (10)                   telemetry bucket width (collector must agree)
  CACHEROUTE_RETENTION_SECONDS (3600)              telemetry retention
  CACHEROUTE_BUCKET_KEYS (20000)                   distinct keys counted per bucket, the rest untracked; 0 = no cap
  CACHEROUTE_REPLICAS (required unless --discover) replica ids, or id=host:port pairs; the engine set's first slots
                                                   (`cacheroute engines add|drain|remove` changes it at run time)
  CACHEROUTE_Q_CAP (20)                            req/s one replica carries at the latency knee
  CACHEROUTE_WARM_SLOTS (8)                        W: prefixes one replica keeps warm
  CACHEROUTE_INTERVAL (30)                         seconds between control-loop iterations
  CACHEROUTE_WINDOW_SECONDS (300)                  telemetry window the rates are measured over
  CACHEROUTE_RATE_HORIZON (0 = off)                plan from an EWMA of per-key rates over this horizon, seconds
                                                   (nested windows of the buckets; 0: the last window only)
  CACHEROUTE_RATE_HISTORY (min(max(3 x horizon, window), retention))  longest span that EWMA reads, seconds
  CACHEROUTE_INCREMENTAL (1)                       churn-aware re-planning when available (0: from scratch)
  CACHEROUTE_COLD_HOMES (1)                        a churn-aware plan admits a new key on its cold-tail ring home
                                                   (where the dispatchers' CHWBL tail has been sending it) when
                                                   balance allows (services.core.replan.ring_homes)
  CACHEROUTE_SWITCH_KNOBS ("")                     switching-rule knobs NAME=VALUE,... (services.core.switching)
  CACHEROUTE_PLANNER_ID (hostname-pid)             lease holder name
  CACHEROUTE_LEASE_TTL (15)                        planner lease TTL, seconds (renewed every TTL/3)
  CACHEROUTE_KEEP_VERSIONS (500)                   stored versions kept (active, pinned, history always kept)
  CACHEROUTE_AUTO (1)                              run the control loop (0: RPCs only, never leads)
  CACHEROUTE_PREFIX_NODES (0)                      1: prefix-aware plans (prefix nodes from the dispatchers' chains,
                                                   sticky placement; services.core.prefixes), with the window's
                                                   available and achieved hit rates on each plan
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
  CACHEROUTE_ADVISE_SLO_P99 (0)                    > 0: export cacheroute_recommended_replicas for this p99 SLO
  CACHEROUTE_ADVISE_PROFILE (llama3-8b-h100)       engine profile the capacity advisor simulates
  CACHEROUTE_ADVISE_INTERVAL (60)                  seconds between advices (its own loop, in a worker process)
  CACHEROUTE_ADVISE_OUTPUT_TOKENS (200)            output tokens per request when the window measured none
  CACHEROUTE_DISCOVER ("")                         [KIND+][http://]NAME:PORT: engines are the addresses NAME resolves
                                                   to (a Kubernetes headless Service), re-resolved by the lease holder
  CACHEROUTE_DISCOVER_INTERVAL (10)                seconds between resolutions
  CACHEROUTE_HEALTH_INTERVAL (0.5)                 seconds between health checks of each replica
  CACHEROUTE_HEALTH_TIMEOUT (0.3)                  deadline of one health check, seconds
  CACHEROUTE_REPAIR_GRACE (2)                      seconds a replica must stay down before a repair
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys

from services.core.shadow import FallbackConfig
from services.model import COLD_TAILS, DEFAULT_COLD_TAIL, parse_replicas
from services.planner.advisor import DEFAULT_OUTPUT_TOKENS, AdviceConfig
from services.planner.control import LoopConfig, switching_config
from services.planner.engines import parse_discovery
from services.planner.gate import GateConfig
from services.planner.service import PlannerConfig, serve
from services.flags import flag
from services.rpc import add_server_flags, run_service, server_config
from services.store import add_store_flags, telemetry_from_args


def parse_knobs(text: str, what: str = "switching") -> dict[str, float]:
    knobs = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"{what} knob {part!r} is not NAME=VALUE")
        knobs[name.strip()] = float(value)
    return knobs


def add_planning_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("planning")
    flag(g, "--replicas", env="REPLICAS", default="", shown='"", required unless --discover',
         help="ids or id=addr pairs, comma-separated")
    flag(g, "--q-cap", env="Q_CAP", default=20.0, type=float, help="req/s per replica at the knee")
    flag(g, "--warm-slots", env="WARM_SLOTS", default=8, type=int, help="W, prefixes per replica")
    flag(g, "--interval", env="INTERVAL", default=30.0, type=float, help="loop period, seconds")
    flag(g, "--window", env="WINDOW_SECONDS", default=300.0, type=float, help="rate window, seconds")
    flag(g, "--rate-horizon", env="RATE_HORIZON", default=0.0, type=float,
         help="EWMA horizon of per-key rates, seconds; 0 = the last --window only")
    flag(g, "--rate-history", env="RATE_HISTORY", default=0.0, type=float,
         shown="0 = min(max(3 x horizon, window), retention)", help="longest span the EWMA reads, seconds")
    flag(g, "--incremental", env="INCREMENTAL", default=1, type=int, choices=(0, 1),
         help="1: churn-aware re-planning when available")
    flag(g, "--prefix-nodes", env="PREFIX_NODES", default=0, type=int, choices=(0, 1), help="1: prefix-aware plans")
    flag(g, "--cold-homes", env="COLD_HOMES", default=1, type=int, choices=(0, 1),
         help="1: admit new keys on the replica the dispatchers' CHWBL cold tail sends them to, when balance allows")
    flag(g, "--switch-knobs", env="SWITCH_KNOBS", default="", help="switching-rule knobs NAME=VALUE,...")
    flag(g, "--planner-id", env="PLANNER_ID", default=f"{socket.gethostname()}-{os.getpid()}", shown="hostname-pid",
         help="lease holder name")
    flag(g, "--lease-ttl", env="LEASE_TTL", default=15.0, type=float, help="lease TTL, seconds")
    flag(g, "--keep-versions", env="KEEP_VERSIONS", default=500, type=int, help="stored versions kept, 0 = all")
    flag(g, "--auto", env="AUTO", default=1, type=int, choices=(0, 1), help="1: run the control loop")
    flag(g, "--max-moves", env="MAX_MOVES", default=8, type=int, help="incremental rebalancing moves per loop, 0 = unbounded")


def add_gate_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("shadow gate and automatic fallback")
    flag(g, "--gate", env="GATE", default="off", choices=("on", "off"),
         help="replay candidates against Flat-LB before activating them")
    flag(g, "--gate-margin", env="GATE_MARGIN", default=0.10, type=float, help="required p99 or capacity improvement")
    flag(g, "--gate-window", env="GATE_WINDOW", default=120.0, type=float, help="seconds of arrivals replayed")
    # the replay's engine figures default to the engines' own variables (services/engine/__main__.py)
    flag(g, "--gate-profile", env=("GATE_PROFILE", "PROFILE"), default="llama3-8b-h100", empty_is_default=True,
         help="engine profile of the replay")
    flag(g, "--gate-kv-blocks", env=("GATE_KV_BLOCKS", "KV_BLOCKS"), default=None, type=int,
         help="KV blocks per replica in the replay, none = the profile's")
    flag(g, "--gate-time-scale", env=("GATE_TIME_SCALE", "TIME_SCALE"), default=1.0, type=float,
         help="the engines' time scale, wall seconds per model second")
    flag(g, "--gate-slo", env="GATE_SLO", default=3.5, type=float, help="p99 TTFT SLO in seconds for the capacity estimate")
    flag(g, "--gate-timeout", env="GATE_TIMEOUT", default=30.0, type=float,
         help="seconds one replay may take; an overrun fails the gate")
    flag(g, "--gate-max-requests", env="GATE_MAX_REQUESTS", default=2000, type=int, help="latest records replayed")
    flag(g, "--cold-tail", env="COLD_TAIL", default=DEFAULT_COLD_TAIL, choices=COLD_TAILS, empty_is_default=True,
         help="the dispatchers' cold tail, replayed with the candidate")
    flag(g, "--fallback-knobs", env="FALLBACK_KNOBS", default="",
         help="key_tolerance=,p99_tolerance=,p99_slack= (services.core.shadow.FallbackConfig)")


def add_repair_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("live failure repair")
    flag(g, "--repair", env="REPAIR", default=1, type=int, choices=(0, 1),
         help="1: health-check id=host:port replicas and repair the active plan")
    flag(g, "--engine-kind", env="ENGINE_KIND", default="cacheroute",
         choices=("cacheroute", "vllm", "sglang", "llamacpp", "openai"),
         help="kind of replica addresses given without KIND+, as the dispatchers'")
    flag(g, "--discover", env="DISCOVER", default="", help="[KIND+][http://]NAME:PORT: engines from every address NAME "
         "resolves to, re-resolved periodically (services/planner/engines.py)")
    flag(g, "--discover-interval", env="DISCOVER_INTERVAL", default=10.0, type=float,
         help="seconds between resolutions of --discover")
    flag(g, "--health-interval", env="HEALTH_INTERVAL", default=0.5, type=float, help="seconds between health checks")
    flag(g, "--health-timeout", env="HEALTH_TIMEOUT", default=0.3, type=float, help="deadline of one health check, seconds")
    flag(g, "--repair-grace", env="REPAIR_GRACE", default=2.0, type=float,
         help="seconds a replica stays down before its keys move")
    a = p.add_argument_group("capacity advisor (services/planner/advisor.py)")
    flag(a, "--advise-slo-p99", env="ADVISE_SLO_P99", default=0.0, type=float, shown="0 = off",
         help="export cacheroute_recommended_replicas for this p99 TTFT SLO, seconds")
    flag(a, "--advise-profile", env="ADVISE_PROFILE", default="llama3-8b-h100", help="engine profile the advisor simulates")
    flag(a, "--advise-interval", env="ADVISE_INTERVAL", default=60.0, type=float,
         help="seconds between advices, its own loop (one costs up to ~12 CPU s for 8 replicas, in a worker process)")
    flag(a, "--advise-output-tokens", env="ADVISE_OUTPUT_TOKENS", default=DEFAULT_OUTPUT_TOKENS, type=int,
         help="output tokens per request when the telemetry window measured none")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cacheroute serve planner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_flags(p, default_port=50051, default_metrics_port=9151)
    add_store_flags(p)
    add_planning_flags(p)
    add_gate_flags(p)
    add_repair_flags(p)
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
    for name in ("rate_horizon", "rate_history"):
        value = getattr(args, name)
        if not (value >= 0 and value != float("inf")):
            raise ValueError(f"--{name.replace('_', '-')} must be a number of seconds >= 0")
    if args.rate_history > args.retention_seconds:
        raise ValueError("--rate-history must not exceed --retention-seconds")
    horizon = args.rate_horizon or None
    history = args.rate_history or (min(max(3 * horizon, args.window), args.retention_seconds) if horizon else 0.0)
    if horizon and history < args.window:
        raise ValueError("--rate-history must be at least --window")
    if args.max_moves < 0:
        raise ValueError("--max-moves must be >= 0")
    for name in ("health_interval", "health_timeout", "repair_grace"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0")
    if not args.advise_interval > 0:
        raise ValueError("--advise-interval must be > 0")
    discovery = parse_discovery(args.discover, args.discover_interval) if args.discover else None
    replicas = parse_replicas(args.replicas) if args.replicas or discovery is None else ()
    loop = LoopConfig(replica_ids=tuple(r.id for r in replicas), q_cap=args.q_cap, warm_slots=args.warm_slots,
                      interval=args.interval, window_seconds=args.window, incremental=bool(args.incremental),
                      switching=switching_config(parse_knobs(args.switch_knobs)), planner_id=args.planner_id,
                      lease_ttl=args.lease_ttl, keep_versions=args.keep_versions, max_moves=args.max_moves or None,
                      rate_horizon=horizon, rate_history=history, prefix=bool(args.prefix_nodes),
                      cold_homes=bool(args.cold_homes))
    return PlannerConfig(server=server_config("planner", args), loop=loop, redis_url=args.redis,
                         key_prefix=args.key_prefix, telemetry=telemetry_from_args(args), auto=bool(args.auto),
                         gate=gate_from_args(args), replica_addresses={r.id: r.address for r in replicas if r.address},
                         repair=bool(args.repair), health_interval=args.health_interval,
                         health_timeout=args.health_timeout, repair_grace=args.repair_grace,
                         engine_kind=args.engine_kind, discovery=discovery,
                         advice=AdviceConfig(profile=args.advise_profile, replicas=max(1, len(loop.replica_ids)),
                                             slo_p99=args.advise_slo_p99, q_cap=loop.q_cap,
                                             output_tokens=args.advise_output_tokens)
                         if args.advise_slo_p99 > 0 else None, advice_interval=args.advise_interval)


def main(argv: list[str] | None = None) -> int:
    return run_service("planner", lambda: config_from_args(build_parser().parse_args(argv)), serve)


if __name__ == "__main__":
    sys.exit(main())
