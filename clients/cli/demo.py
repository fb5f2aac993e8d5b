"""`cacheroute demo`: a local stack and traffic through it, planned vs flat.

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
from typing import Any, Sequence

import grpc
import orjson

from cacheroute.v1 import common_pb2
from clients.cli import CliError, lab_module
from clients.cli.up import add_stack_flags, stack_config, start_stack
from clients.client import AsyncCacheRouteClient
from clients.loadgen import Outcome, drive, relabel, spread_clients, summarize, window
from services.core.request import Request
from services.flags import flag
from services.rpc import env, read_secret
from services.local.stack import Stack

MODES = {"planned": common_pb2.MODE_PLANNED, "flat": common_pb2.MODE_FLAT}


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
    flag(ext, "--planner", env="PLANNER", default="127.0.0.1:50051", help="planner address with --dispatchers")
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


COMMANDS = (add_demo,)


def register(sub: argparse._SubParsersAction) -> None:
    for add in COMMANDS:
        add(sub)
