"""Does a dispatcher keep answering while it installs a large plan?

A local stack (services/local/stack.py: embedded Redis, collector, `--engines` simulated engines,
a planner with its control loop off, one dispatcher) gets plans of `--keys` keys built from
explicit rates (BuildPlanStream: a million keys travel in slices) with every key admitted
(W = N). Each plan is built and stored first; then probes start, on the dispatcher's gRPC
Route (a key of the plan) and HTTP GET /health, each every 5 ms (one in flight per kind,
the next 5 ms after the previous one started or at once if it took longer), the plan is
activated (ActivatePlan, a constant-time call), and probing goes on until the dispatcher
has routed by the new version for `--after` seconds.

Printed per plan: the probes' max wait in the `before` seconds ahead of the activation (what
the loaded machine alone costs), then from the activation on: probes sent, failed (an error or no answer within 5 s), max and p99 wait
of each probe kind, the time from activation until a Route answer carries the new version
("routed"), and the dispatcher's VmRSS before and after with the growth per admitted key
(the first plan against the stack's idle dispatcher; later plans replace the previous one).
The machine's load average is printed beside the figures (take them on a quiet machine).

    .venv/bin/python bench/install_stall.py [--keys 128824,1000000] [--plans 2] [--engines 4]

Goals (issue 22): every probe <= 50 ms at 128,824 keys and <= 100 ms at 1,000,000, none
failed; routed <= 1 s / 5 s; dispatcher memory <= 150 bytes per admitted key.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cacheroute.v1 import dispatcher_pb2, dispatcher_pb2_grpc  # noqa: E402
from clients.client import CacheRouteClient  # noqa: E402
from services.local.stack import Stack, StackConfig  # noqa: E402

PERIOD = 0.005
PROBE_TIMEOUT = 5.0


def key(i: int, salt: int = 0) -> str:
    """Routing keys shaped like the dispatcher's own (tenant + 16 hex digits)."""
    return f"t{i % 97}:{(i * 0x9E3779B97F4A7C15 + salt) & ((1 << 64) - 1):016x}"


def rates_for(n: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    return {key(i, seed): round(rng.lognormvariate(0.0, 1.65), 6) for i in range(n)}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@dataclass
class Probes:
    """What the probes saw while one plan was activated."""

    route: list[float] = field(default_factory=list)     # seconds per Route (from the activation on)
    health: list[float] = field(default_factory=list)    # seconds per GET /health (from the activation on)
    idle: list[float] = field(default_factory=list)      # both kinds, before the activation: the machine's noise
    activated: float = float("inf")                      # monotonic time the activation was sent
    failures: list[str] = field(default_factory=list)
    routed_at: float | None = None                       # monotonic time of the first answer by the new version

    @staticmethod
    def pct(values: list[float], q: float) -> float:
        if not values:
            return float("nan")
        s = sorted(values)
        return s[min(len(s) - 1, int(q * len(s)))]


async def probe(dispatcher: str, http_url: str, probe_key: str, version: int, stop: asyncio.Event,
                out: Probes) -> None:
    """Probe Route and /health every PERIOD until `stop` is set."""
    async def every(name: str, call) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            waits = out.idle if t0 < out.activated else out.route if name == "route" else out.health
            try:
                await asyncio.wait_for(call(), PROBE_TIMEOUT)
            except Exception as exc:            # noqa: BLE001: any failure counts, named
                out.failures.append(f"{name}: {type(exc).__name__}: {exc}"[:200])
            waits.append(time.monotonic() - t0)
            await asyncio.sleep(max(0.0, PERIOD - (time.monotonic() - t0)))

    async with grpc.aio.insecure_channel(dispatcher) as channel, aiohttp.ClientSession() as http:
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)

        async def route() -> None:
            reply = await stub.Route(dispatcher_pb2.RouteRequest(key=probe_key))
            if reply.plan_version == version and out.routed_at is None:
                out.routed_at = time.monotonic()

        async def health() -> None:
            async with http.get(f"{http_url}/health") as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}")

        await asyncio.gather(every("route", route), every("health", health))


def activate_with_probes(stack: Stack, client: CacheRouteClient, version: int, expected: int, probe_key: str,
                         *, before: float = 1.0, after: float = 2.0, limit: float = 120.0) -> tuple[Probes, float]:
    """Start the probes, activate `version` after `before` seconds, probe until the dispatcher
    has routed by it for `after` seconds (at most `limit`). Returns the probes and the
    monotonic time the activation returned."""
    out = Probes()
    activated: list[float] = []

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(probe(stack.dispatchers[0], stack.http[0], probe_key, version, stop, out))
        await asyncio.sleep(before)
        out.activated = time.monotonic()
        # activation from a thread, so the probing loop is not held by the call
        await asyncio.to_thread(client.activate_plan, version, expected, "install_stall", timeout=30)
        activated.append(time.monotonic())
        deadline = activated[0] + limit
        while time.monotonic() < deadline and (out.routed_at is None or time.monotonic() < out.routed_at + after):
            await asyncio.sleep(0.05)
        stop.set()
        await task

    asyncio.run(run())
    return out, activated[0]


def start_stack(engines: int) -> Stack:
    return Stack(StackConfig(engines=engines, dispatchers=1, planner_auto=False, metrics=False, time_scale=0.01,
                             log_level="INFO", redis_maxmemory="")).start()


def build(client: CacheRouteClient, n: int, seed: int, engines: int) -> tuple[int, str, float]:
    rates = rates_for(n, seed)
    t0 = time.perf_counter()
    reply = client.build_plan(rates, q_cap=1e9, warm_slots=n, whole=False, timeout=600)
    return reply.plan.version, next(iter(rates)), time.perf_counter() - t0


def run(keys: int, plans: int, engines: int, after: float) -> list[dict]:
    stack = start_stack(engines)
    rows = []
    try:
        pid = stack.of_kind("dispatcher")[0].proc.pid
        with CacheRouteClient(planner=stack.planner, max_message_bytes=64 * 1024 * 1024, timeout=600) as client:
            active = 0
            for p in range(plans):
                version, probe_key, build_s = build(client, keys, p + 1, engines)
                time.sleep(0.5)
                rss0 = rss_kib(pid)
                probes, t_act = activate_with_probes(stack, client, version, active, probe_key, after=after)
                time.sleep(0.5)
                rss1 = rss_kib(pid)
                active = version
                rows.append(dict(keys=keys, plan=p + 1, version=version, build_s=build_s, probes=probes,
                                 routed=None if probes.routed_at is None else probes.routed_at - t_act,
                                 rss0=rss0, rss1=rss1, load=os.getloadavg()))
    finally:
        stack.stop()
    return rows


def report(rows: list[dict]) -> None:
    print("| keys | plan | idle max ms | probes | failed | Route max / p99 ms | /health max / p99 ms | routed s | "
          "RSS before -> after MiB | bytes/key | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p: Probes = r["probes"]
        growth = (r["rss1"] - r["rss0"]) * 1024 / r["keys"]
        routed = "never" if r["routed"] is None else f"{r['routed']:.2f}"
        print(f"| {r['keys']:,} | {r['plan']} | {max(p.idle, default=float('nan')) * 1e3:.1f} | "
              f"{len(p.route) + len(p.health)} | {len(p.failures)} | "
              f"{max(p.route) * 1e3:.1f} / {p.pct(p.route, 0.99) * 1e3:.1f} | "
              f"{max(p.health) * 1e3:.1f} / {p.pct(p.health, 0.99) * 1e3:.1f} | {routed} | "
              f"{r['rss0'] / 1024:.0f} -> {r['rss1'] / 1024:.0f} | {growth:.0f} | "
              f"{' '.join(f'{x:.2f}' for x in r['load'])} |")
        for f in p.failures[:3]:
            print(f"    failure: {f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", default="128824,1000000", help="comma-separated plan sizes (default 128824,1000000)")
    ap.add_argument("--plans", type=int, default=2, help="plans activated one after another per size (default 2)")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--after", type=float, default=2.0, help="seconds of probing after the switch (default 2)")
    args = ap.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rows = []
    for n in (int(k) for k in args.keys.split(",")):
        rows += run(n, args.plans, args.engines, args.after)
        report(rows[-args.plans:])
        sys.stdout.flush()
    if len(rows) > args.plans:
        print()
        report(rows)


if __name__ == "__main__":
    threading.current_thread().name = "main"
    main()
