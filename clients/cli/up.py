"""`cacheroute up`: the local stack.

  up    start Redis (embedded unless --redis), collector, planner, engines and dispatchers
        as processes on free loopback ports (services.local.stack), wait until all are SERVING,
        print their addresses, and keep them running until Ctrl-C / SIGTERM.

The stack flags and config (`add_stack_flags`, `stack_config`, `start_stack`) are shared with
`cacheroute demo` (clients/cli/demo.py).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

import orjson

from clients.cli import CliError
from services.rpc import env
from services.local.stack import Stack, StackConfig, StackError

DEFAULTS = StackConfig()


# ---------------------------------------------------------------- shared flags

def add_stack_flags(p: argparse.ArgumentParser, *, interval: float) -> None:
    g = p.add_argument_group("local stack")
    g.add_argument("--num-engines", type=int, default=DEFAULTS.engines, help=f"engine replicas (default {DEFAULTS.engines})")
    g.add_argument("--num-dispatchers", type=int, default=DEFAULTS.dispatchers,
                   help=f"dispatchers (default {DEFAULTS.dispatchers})")
    g.add_argument("--dispatcher-workers", type=int, default=DEFAULTS.dispatcher_workers,
                   help="worker processes per dispatcher sharing its ports, 0 = one per core "
                        f"(default {DEFAULTS.dispatcher_workers})")
    g.add_argument("--profile", default=DEFAULTS.profile, help=f"engine profile (default {DEFAULTS.profile})")
    g.add_argument("--time-scale", type=float, default=DEFAULTS.time_scale,
                   help="engines' wall seconds per model second (default 1; < 1 runs faster, costs more CPU)")
    g.add_argument("--kv-blocks", type=int, default=None, help="engines' KV pool in 16-token blocks (default: profile's)")
    g.add_argument("--interval", type=float, default=interval, help=f"planner loop period, seconds (default {interval:g})")
    g.add_argument("--window", type=float, default=DEFAULTS.window_seconds,
                   help=f"telemetry window the planner reads, seconds (default {DEFAULTS.window_seconds:g})")
    g.add_argument("--q-cap", type=float, default=DEFAULTS.q_cap, help=f"planner q_cap, req/s (default {DEFAULTS.q_cap:g})")
    g.add_argument("--warm-slots", type=int, default=DEFAULTS.warm_slots,
                   help=f"planner W, prefixes per replica (default {DEFAULTS.warm_slots})")
    g.add_argument("--switch-knobs", default=None,
                   help="planner switching knobs NAME=VALUE,... (services.core.switching); default: the "
                        "planner's for up, min_dwell_seconds=INTERVAL for demo")
    g.add_argument("--redis", default=None, help="use this Redis URL instead of starting redis-server")
    g.add_argument("--redis-maxmemory", default=DEFAULTS.redis_maxmemory,
                   help=f"the embedded redis-server's maxmemory, evicting only telemetry (volatile-lru); "
                        f"'' = none (default {DEFAULTS.redis_maxmemory})")
    g.add_argument("--log-dir", default=None, help="children's log files (default: a new temporary directory)")
    g.add_argument("--seed", type=int, default=None, help="dispatchers' P2C seed")
    e = p.add_argument_group("engines (default: simulated replicas)")
    e.add_argument("--engines", default=None,
                   help="front engines that already run: URL[,URL...] (e.g. http://10.0.0.5:8000, or "
                        "vllm+http://... per engine); no engines are started")
    e.add_argument("--engine-kind", default=DEFAULTS.engine_kind,
                   choices=("cacheroute", "vllm", "sglang", "llamacpp", "openai"),
                   help="kind of --engines (and of started replicas: llamacpp starts real llama.cpp "
                        "replicas with --model; vllm routes to simulated ones over their HTTP API); "
                        "default cacheroute (simulated engines over gRPC)")
    e.add_argument("--model", default=None, help="GGUF file for --engine-kind llamacpp replicas")
    e.add_argument("--llamacpp-threads", type=int, default=DEFAULTS.llamacpp_threads,
                   help=f"CPU threads per llama.cpp replica (default {DEFAULTS.llamacpp_threads})")
    e.add_argument("--llamacpp-ctx", type=int, default=DEFAULTS.llamacpp_ctx,
                   help=f"context tokens per llama.cpp replica (default {DEFAULTS.llamacpp_ctx})")
    e.add_argument("--llamacpp-parallel", type=int, default=DEFAULTS.llamacpp_parallel,
                   help=f"slots per llama.cpp replica, each with its own prompt cache (default {DEFAULTS.llamacpp_parallel})")


def stack_config(args: argparse.Namespace, default_knobs: str = "") -> StackConfig:
    urls = tuple(u.strip() for u in (args.engines or "").split(",") if u.strip())
    if args.model and args.engine_kind != "llamacpp":
        raise CliError("--model needs --engine-kind llamacpp")
    if args.engine_kind == "llamacpp" and not (args.model or urls):
        raise CliError("--engine-kind llamacpp: give --model PATH (a GGUF file) to start replicas, or --engines URL,...")
    if args.model:
        import os

        if not os.path.isfile(args.model):
            raise CliError(f"--model: no file at {args.model}")
        try:
            import xllamacpp  # noqa: F401
        except ImportError:
            raise CliError("--engine-kind llamacpp needs xllamacpp: pip install 'cacheroute[llamacpp]'") from None
    try:
        return StackConfig(engines=len(urls) or args.num_engines, dispatchers=args.num_dispatchers,
                           dispatcher_workers=args.dispatcher_workers, profile=args.profile,
                           time_scale=args.time_scale, kv_blocks=args.kv_blocks, planner_interval=args.interval,
                           window_seconds=args.window, q_cap=args.q_cap, warm_slots=args.warm_slots,
                           redis_url=args.redis, redis_maxmemory=args.redis_maxmemory, log_dir=args.log_dir,
                           seed=args.seed,
                           switch_knobs=args.switch_knobs if args.switch_knobs is not None else default_knobs,
                           engine_kind=args.engine_kind, engine_urls=urls, llamacpp_model=args.model,
                           llamacpp_threads=args.llamacpp_threads, llamacpp_ctx=args.llamacpp_ctx,
                           llamacpp_parallel=args.llamacpp_parallel)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def start_stack(config: StackConfig) -> Stack:
    stack = Stack(config)
    print(f"cacheroute: starting the local stack; logs in {stack.log_dir}", file=sys.stderr)
    try:
        return stack.start()
    except StackError as exc:
        raise CliError(str(exc)) from None


# ---------------------------------------------------------------- up

def add_up(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="run a local stack (Redis, planner, collector, engines, dispatchers)",
                       description="Start the whole stack as local processes on free loopback ports, print the "
                                   "addresses, and stop everything on Ctrl-C or SIGTERM.")
    add_stack_flags(p, interval=30.0)
    p.add_argument("--json", action="store_true", help="print the addresses as one JSON document")
    p.set_defaults(func=run_up)


def run_up(args: argparse.Namespace) -> int:
    config = stack_config(args)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    died: list[str] = []
    stack: Stack | None = None
    try:
        stack = start_stack(config)
        doc = stack.describe()
        print(orjson.dumps(doc).decode() if args.json else address_table(doc), flush=True)
        print("cacheroute: stack is up; Ctrl-C stops it", file=sys.stderr)
        while not stop.wait(0.5):
            for child in stack.poll():
                died.append(child.name)
                print(f"cacheroute: {child.name} exited unexpectedly (code {child.returncode}); "
                      f"log {child.log_path}:\n{child.log_tail()}", file=sys.stderr, flush=True)
    finally:
        if stack is not None:
            print("cacheroute: stopping the stack", file=sys.stderr)
            stack.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 1 if died else 0


def address_table(doc: dict[str, Any]) -> str:
    rows = [("service", "address", "http", "metrics", "log")]
    rows.append(("redis", doc["redis"], "", "", "(embedded)" if doc["redis_embedded"] else "(external)"))
    for s in doc["services"]:
        metrics = f"{s['address'].rsplit(':', 1)[0]}:{s['metrics_port']}" if s["metrics_port"] else ""
        http = s.get("http") or ""
        rows.append((s["name"], "" if s["address"] == http else s["address"], http, metrics, s["log"]))
    if doc.get("engine_kind", "cacheroute") != "cacheroute" and not any(s["kind"] in ("engine", "llamacpp")
                                                                        for s in doc["services"]):
        for url in doc.get("engines_http", []):
            rows.append(("engine (external)", "", url, "", doc["engine_kind"]))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    env_line = (f"\nexport CACHEROUTE_PLANNER={doc['planner']} CACHEROUTE_DISPATCHERS={','.join(doc['dispatchers'])} "
                f"CACHEROUTE_DISPATCHER={doc['dispatchers'][0]} CACHEROUTE_COLLECTOR={doc['collector']}")
    if doc.get("http"):
        env_line += f"\nexport OPENAI_BASE_URL={doc['http'][0]}/v1   # the OpenAI HTTP API (any dispatcher)"
    return "\n".join(lines) + "\n" + env_line


COMMANDS = (add_up,)


def register(sub: argparse._SubParsersAction) -> None:
    for add in COMMANDS:
        add(sub)
