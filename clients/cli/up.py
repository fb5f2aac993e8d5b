"""`cacheroute up` and `cacheroute demo`: the local stack, and traffic through it.

  up    start Redis (embedded unless --redis), collector, planner, engines and dispatchers
        as processes on free loopback ports (services.local.stack), wait until all are SERVING,
        print their addresses, and keep them running until Ctrl-C / SIGTERM.
  demo  start such a stack (or use --dispatchers/--planner of a running one) and drive the
        same traffic through it twice: planned routing, then flat fallback (P2C), each with
        a warm-up; print hit rate, TTFT and routing reasons side by side.

Demo design. Phase 1: warm-up in planned mode; halfway through it the demo asks the planner
for a plan from the telemetry window (BuildPlan, activate) and waits until every dispatcher
routes by it; the planner's own control loop keeps running. Phase 2: measured traffic,
planned. Phase 3: SetMode FLAT, then the same warm-up + measured traffic, flat. Engine
caches cannot be flushed on a live stack, so the flat run replays a relabeled copy of the
traffic (`clients.loadgen.relabel`: same arrivals, lengths and popularity, disjoint keys and
block hashes); each mode warms its own keys for the same time before it is measured.

Default sizing (4 replicas, llama3-8b-h100, 440k cached tokens each): the paper workload's
top 256 keys (mean prefix ~3,480 tokens, so ~890k tokens of prefixes: 2x one replica's
cache). Flat routing sends every key to every replica and keeps only part of the set warm;
a plan gives each replica ~64 keys (~220k tokens), which fit. 40 req/s, 20 s warm-up and
25 s measured per mode: about 1.5 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import secrets
import signal
import sys
import threading
from typing import Any, Sequence

import grpc
import orjson

from cacheroute.v1 import common_pb2
from clients.cli import CliError, lab_module
from clients.client import AsyncCacheRouteClient
from clients.loadgen import Outcome, drive, relabel, spread_clients, summarize, window
from services.core.request import Request
from services.rpc import env, read_secret
from services.local.stack import Stack, StackConfig, StackError

DEFAULTS = StackConfig()
MODES = {"planned": common_pb2.MODE_PLANNED, "flat": common_pb2.MODE_FLAT}


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


# ---------------------------------------------------------------- demo

def add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="local stack + traffic: planned routing vs flat fallback",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_argument_group("traffic")
    src.add_argument("--workload", default="paper", help="synthetic workload: paper, whale, low-reuse, drift (default paper)")
    src.add_argument("--active-set", type=int, default=256, help="synthetic: keys sending traffic (default 256)")
    src.add_argument("--trace", default=None, help="replay a Mooncake .jsonl (or Azure .csv) trace instead, rescaled to --qps")
    src.add_argument("--qps", type=float, default=None, help="offered req/s (default 40; a trace: its recorded rate)")
    src.add_argument("--warmup", type=float, default=20.0, help="unmeasured seconds before each mode (default 20)")
    src.add_argument("--duration", type=float, default=25.0, help="measured seconds per mode (default 25)")
    src.add_argument("--max-tokens", type=int, default=16, help="output tokens per request, at most (default 16)")
    src.add_argument("--concurrency", type=int, default=256, help="streams in flight, at most (default 256)")
    src.add_argument("--traffic-seed", type=int, default=0, help="workload seed (default 0)")
    ext = p.add_argument_group("an existing stack")
    ext.add_argument("--dispatchers", default=None, help="comma-separated dispatcher addresses (skips starting a stack)")
    ext.add_argument("--planner", default=env("PLANNER", "127.0.0.1:50051"),
                     help="planner address with --dispatchers (env CACHEROUTE_PLANNER, default 127.0.0.1:50051)")
    ext.add_argument("--http-urls", default=None,
                     help="with --dispatchers and --http: the dispatchers' HTTP API base URLs, comma-separated")
    add_stack_flags(p, interval=10.0)
    p.add_argument("--http", action="store_true",
                   help="drive the traffic through the dispatchers' OpenAI HTTP API with the openai SDK "
                        "(streamed /v1/completions) instead of gRPC Generate")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run_demo)


def demo_requests(args: argparse.Namespace) -> list[Request]:
    from services.sim.runs import RunSpec, load_requests

    qps = args.qps if args.qps is not None else (None if args.trace else 40.0)   # a trace: as recorded
    if (qps is not None and qps <= 0) or args.warmup < 0 or args.duration <= 0 or args.max_tokens < 1:
        raise CliError("--qps and --duration must be > 0, --warmup >= 0, --max-tokens >= 1")
    knobs = {} if args.trace else {"active_set": args.active_set}
    spec = RunSpec(policy="flat", qps=qps, duration=args.warmup + args.duration, seed=args.traffic_seed,
                   workload=None if args.trace else args.workload, trace=args.trace, workload_knobs=knobs)
    try:
        requests = load_requests(spec)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not requests:
        raise CliError("the workload has no requests in the demo's time span")
    return requests


def run_demo(args: argparse.Namespace) -> int:
    requests = demo_requests(args)
    token = read_secret(env("AUTH_TOKEN") or None, env("AUTH_TOKEN_FILE") or None)
    tag = secrets.token_hex(3)          # fresh keys on every run: nothing warm from an earlier demo
    runs = {"planned": relabel(requests, f"planned-{tag}"), "flat": relabel(requests, f"flat-{tag}")}
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)   # SIGTERM unwinds like Ctrl-C
    stack: Stack | None = None
    try:
        if args.http:
            try:
                import openai  # noqa: F401
            except ImportError:
                raise CliError("--http needs the openai SDK: pip install openai") from None
        if args.dispatchers:
            dispatchers = [a.strip() for a in args.dispatchers.split(",") if a.strip()]
            planner = args.planner
            http_urls = [u.strip() for u in (args.http_urls or "").split(",") if u.strip()]
            if args.http and not http_urls:
                raise CliError("--http with --dispatchers needs --http-urls")
        else:
            # a demo lasts a minute or two: let the planner switch as often as its loop runs
            stack = start_stack(stack_config(args, default_knobs=f"min_dwell_seconds={args.interval:g}"))
            dispatchers, planner, http_urls = stack.dispatchers, stack.planner, stack.http
        demo = Demo(dispatchers, planner, token, warmup=args.warmup, max_tokens=args.max_tokens,
                    concurrency=args.concurrency, progress=not args.no_progress,
                    http_urls=http_urls if args.http else None)
        result = asyncio.run(demo.run(runs))
    finally:
        if stack is not None:
            print("cacheroute: stopping the stack", file=sys.stderr)
            stack.stop()
        signal.signal(signal.SIGTERM, previous)
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())
    else:
        print(summary_table(result))
    return 0 if all(result["modes"][m]["requests"] > result["modes"][m]["errors"] for m in result["modes"]) else 1


class Demo:
    """The demo's phases against running dispatchers and a planner."""

    def __init__(self, dispatchers: Sequence[str], planner: str, token: str | None, *, warmup: float,
                 max_tokens: int, concurrency: int, progress: bool, http_urls: Sequence[str] | None = None) -> None:
        self.dispatchers = list(dispatchers)
        self.http_urls = list(http_urls) if http_urls else None
        self.planner = planner
        self.token = token
        self.warmup = warmup
        self.max_tokens = max_tokens
        self.concurrency = concurrency
        self.progress = progress
        self.notes: list[str] = []

    async def run(self, runs: dict[str, list[Request]]) -> dict[str, Any]:
        if self.http_urls:
            from clients.httpload import http_clients

            clients = http_clients(self.http_urls, token=self.token)
        else:
            clients = spread_clients(self.dispatchers, token=self.token)
        control = AsyncCacheRouteClient(self.dispatchers, planner=self.planner, token=self.token, timeout=5.0)
        try:
            status = await control.planner_status()
            original_mode = status.mode
            modes: dict[str, dict[str, Any]] = {}
            for mode, requests in runs.items():
                await control.set_mode(mode, reason=f"cacheroute demo: {mode} phase")
                await self._wait_dispatchers(control, lambda s: s.mode == MODES[mode])
                modes[mode] = await self._phase(mode, requests, clients, control)
            if original_mode and original_mode != (await control.planner_status()).mode:
                await control.set_mode(original_mode, reason="cacheroute demo: restore mode")
        finally:
            for client in (*clients, control):
                await client.close()
        return {"dispatchers": self.dispatchers, "planner": self.planner, "warmup_seconds": self.warmup,
                "max_tokens": self.max_tokens, "modes": modes, "notes": self.notes,
                "via": "http" if self.http_urls else "grpc", "http": self.http_urls or []}

    async def _phase(self, mode: str, requests: list[Request], clients, control) -> dict[str, Any]:
        warm = window(requests, 0.0, self.warmup)
        measured = window(requests, self.warmup, math.inf)
        planner_task = None
        if mode == "planned":
            planner_task = asyncio.create_task(self._activate_plan(control, delay=self.warmup / 2))
        await self._drive(clients, warm, f"{mode} warm-up")
        if planner_task is not None:
            await planner_task
        outcomes = await self._drive(clients, measured, f"{mode} measured")
        summary = summarize(outcomes, self._replica_ids(await control.dispatcher_status()))
        return summary.as_dict()

    async def _activate_plan(self, control: AsyncCacheRouteClient, delay: float) -> None:
        """Build a plan from the telemetry so far, activate it, and wait until every
        dispatcher routes by it."""
        await asyncio.sleep(delay)
        status = await control.planner_status()
        try:
            built = await control.build_plan(activate=True, expected_active_version=status.active_version)
        except grpc.RpcError as exc:   # e.g. the loop switched meanwhile (CAS): go on with its plan
            self.notes.append(f"BuildPlan failed ({exc.code().name}: {exc.details()}); "  # type: ignore[attr-defined]
                              "using the planner loop's plan")
            return
        plan = built.plan
        self.notes.append(f"plan v{plan.version}: {plan.admitted_keys} of {plan.total_keys} keys admitted "
                          f"({plan.admitted_rate_share:.0%} of the rate), predicted imbalance "
                          f"{plan.predicted_imbalance:.2f}")
        await self._wait_dispatchers(control, lambda s: s.plan_version >= plan.version)

    async def _wait_dispatchers(self, control: AsyncCacheRouteClient, ready, timeout: float = 5.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        pending = list(self.dispatchers)
        while pending and asyncio.get_running_loop().time() < deadline:
            for address in list(pending):
                async with AsyncCacheRouteClient(address, token=self.token, timeout=1.0) as one:
                    if ready(await one.dispatcher_status()):
                        pending.remove(address)
            if pending:
                await asyncio.sleep(0.05)
        if pending:
            self.notes.append(f"dispatchers {', '.join(pending)} did not follow within {timeout:g}s")

    @staticmethod
    def _replica_ids(status) -> list[str]:
        return [r.replica_id for r in status.replicas]

    async def _drive(self, clients, requests: list[Request], label: str) -> list[Outcome]:
        bar = None
        tqdm = lab_module("tqdm", optional=True) if self.progress else None
        if tqdm is not None:
            bar = tqdm.tqdm(total=len(requests), desc=label, unit="req", file=sys.stderr, leave=True, dynamic_ncols=True,
                            mininterval=0.5, disable=None)   # None: only on a terminal
        stats = {"cached": 0, "prompt": 0, "errors": 0}

        def on_result(o: Outcome) -> None:
            stats["cached"] += o.cached_tokens
            stats["prompt"] += o.prompt_tokens
            stats["errors"] += bool(o.error)
            if bar is not None:
                bar.update(1)
                hit = stats["cached"] / stats["prompt"] if stats["prompt"] else 0.0
                bar.set_postfix_str(f"hit {hit:.1%} errors {stats['errors']}", refresh=False)

        try:
            send = None
            if self.http_urls:
                from clients.httpload import http_send_one as send
            return await drive(clients, requests, max_tokens=self.max_tokens, concurrency=self.concurrency,
                               on_result=on_result, send=send)
        finally:
            if bar is not None:
                bar.close()


def summary_table(result: dict[str, Any]) -> str:
    modes = result["modes"]
    names = list(modes)

    def pct(x: float) -> str:
        return f"{x:.1%}"

    def secs(x: float) -> str:
        return "n/a" if x is None or math.isnan(x) else f"{x * 1000:.0f} ms"

    rows: list[tuple[str, ...]] = [("", *names)]
    rows.append(("requests", *(str(modes[m]["requests"]) for m in names)))
    rows.append(("errors", *(str(modes[m]["errors"]) for m in names)))
    rows.append(("hit rate (token-weighted)", *(pct(modes[m]["hit_rate"]) for m in names)))
    rows.append(("TTFT p50", *(secs(modes[m]["ttft_p50"]) for m in names)))
    rows.append(("TTFT p99", *(secs(modes[m]["ttft_p99"]) for m in names)))
    rows.append(("imbalance (max/mean)", *(f"{modes[m]['imbalance']:.2f}" for m in names)))
    rows.append(("plan versions seen", *(",".join(map(str, modes[m]["plan_versions"])) or "-" for m in names)))
    for reason in ("planned", "cold", "fallback"):
        rows.append((f"routed {reason}", *(str(modes[m]["by_reason"].get(reason, 0)) for m in names)))
    width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, width))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    ttft = ("TTFT is the client's wall time through the OpenAI HTTP API" if result.get("via") == "http"
            else "TTFT is the engines' (model seconds)")
    header = (f"CacheRoute demo: measured after a {result['warmup_seconds']:g}s warm-up per mode, "
              f"{result['max_tokens']} output tokens max; {ttft}")
    return "\n".join([header, *result["notes"], "", *lines])


COMMANDS = (add_up, add_demo)


def register(sub: argparse._SubParsersAction) -> None:
    for add in COMMANDS:
        add(sub)
