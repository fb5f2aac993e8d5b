"""Soak run: steady load through the local stack with a plan switch every interval.

    .venv/bin/python bench/soak.py --minutes 10            # the default run
    .venv/bin/python bench/soak.py --minutes 4 --json out.json

Starts `services.local.stack.Stack` (its own redis-server, collector, planner with the automatic
loop off, engines, dispatchers; all on loopback), then for `--minutes`:
  - Generate at `--rate` req/s (open loop, Poisson gaps) and Route at `--route-rate` req/s
    through both dispatchers with the client library; the key popularity (Zipf over
    `--keys` keys, each key a shared prompt prefix plus a unique suffix) rotates at every
    switch so that successive plans really differ;
  - every `--switch-every` seconds: BuildPlan from the telemetry window, activated with a
    compare-and-set on the active version (a plan switch on every dispatcher);
  - every `--sample-every` seconds: each service's RSS (/proc/<pid>/status VmRSS) and
    Redis `INFO memory` used_memory.
Reports failed requests by kind and code, RSS drift of every service from the post-warm-up
level to the end (goal: within 10%), and Redis memory after the telemetry retention
(`--retention`, passed to the collector and planner) has started expiring buckets: it
should stay flat, bounded by the TTLs. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
import redis

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from clients import AsyncCacheRouteClient, RetryPolicy  # noqa: E402
from services.local.stack import Stack, StackConfig  # noqa: E402


@dataclass
class Tally:
    ok: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)        # (kind, code) -> n
    latency: dict[str, list[float]] = field(default_factory=lambda: {"generate": [], "route": []})


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Workload:
    """Zipf key popularity over `keys` shared prefixes, rotated by `shift()`."""

    def __init__(self, keys: int, prefix_words: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.prefixes = [" ".join(f"k{k}w{i}" for i in range(prefix_words)) for k in range(keys)]
        self.weights = [1.0 / (rank + 1) ** 1.1 for rank in range(keys)]
        self.offset = 0
        self.n = 0

    def shift(self) -> None:
        self.offset = (self.offset + max(1, len(self.prefixes) // 8)) % len(self.prefixes)

    def key(self) -> int:
        rank = self.rng.choices(range(len(self.prefixes)), self.weights)[0]
        return (rank + self.offset) % len(self.prefixes)

    def prompt(self) -> str:
        self.n += 1
        return f"{self.prefixes[self.key()]} unique{self.n} q{self.rng.random():.6f}"


async def generate_one(client: AsyncCacheRouteClient, prompt: str, tally: Tally, max_tokens: int) -> None:
    start = time.monotonic()
    try:
        async for _ in client.generate(prompt, max_tokens=max_tokens, timeout=30):
            pass
        tally.ok["generate"] += 1
        tally.latency["generate"].append(time.monotonic() - start)
    except grpc.aio.AioRpcError as err:
        tally.failed["generate", err.code().name] += 1


async def route_one(client: AsyncCacheRouteClient, key: str, tally: Tally) -> None:
    start = time.monotonic()
    try:
        await client.route(key)
        tally.ok["route"] += 1
        tally.latency["route"].append(time.monotonic() - start)
    except grpc.aio.AioRpcError as err:
        tally.failed["route", err.code().name] += 1


async def open_loop(rate: float, end: float, make, rng: random.Random, limit: int) -> None:
    """Start `make()` at Poisson times (mean `rate`/s) until `end`, at most `limit` in flight."""
    tasks: set[asyncio.Task] = set()
    gate = asyncio.Semaphore(limit)
    next_at = time.monotonic()
    while next_at < end:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await gate.acquire()
        task = asyncio.create_task(make())
        task.add_done_callback(lambda t: gate.release())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        next_at += rng.expovariate(rate)
    await asyncio.gather(*tasks)


async def switcher(client: AsyncCacheRouteClient, workload: Workload, every: float, end: float,
                   tally: Tally, switches: list[dict]) -> None:
    while time.monotonic() + every < end:
        await asyncio.sleep(every)
        workload.shift()
        try:
            active = (await client.planner_status()).active_version
            built = await client.build_plan(activate=True, expected_active_version=active, timeout=30)
            switches.append({"at": time.monotonic(), "version": built.plan.version, "keys": built.plan.admitted_keys,
                             "churn": round(built.plan.churn, 3)})
            tally.ok["switch"] += 1
        except grpc.aio.AioRpcError as err:
            tally.failed["switch", err.code().name] += 1


async def sampler(stack: Stack, every: float, end: float, samples: list[dict]) -> None:
    r = redis.Redis.from_url(stack.redis_url)
    try:
        while time.monotonic() < end:
            row = {"at": time.monotonic()}
            for child in stack.children:
                if child.proc is not None and child.proc.poll() is None:
                    row[child.name] = rss_kib(child.proc.pid)
            mem = r.info("memory")
            row["redis_used_memory"] = int(mem["used_memory"])
            row["redis_keys"] = int(r.dbsize())
            samples.append(row)
            await asyncio.sleep(every)
    finally:
        r.close()


async def drive(stack: Stack, args: argparse.Namespace) -> tuple[Tally, list[dict], list[dict], float]:
    tally, samples, switches = Tally(), [], []
    workload = Workload(args.keys, args.prefix_words, args.seed)
    rng = random.Random(args.seed)
    start = time.monotonic()
    end = start + args.minutes * 60
    retry = RetryPolicy(rounds=2)
    async with AsyncCacheRouteClient(stack.dispatchers, planner=stack.planner, retry=retry, seed=args.seed) as client:
        await asyncio.gather(
            open_loop(args.rate, end, lambda: generate_one(client, workload.prompt(), tally, args.max_tokens), rng, 500),
            open_loop(args.route_rate, end, lambda: route_one(client, f"key-{workload.key()}", tally), rng, 500),
            switcher(client, workload, args.switch_every, end, tally, switches),
            sampler(stack, args.sample_every, end, samples))
    return tally, samples, switches, start


def mean_between(samples: list[dict], name: str, lo: float, hi: float) -> float | None:
    values = [s[name] for s in samples if lo <= s["at"] <= hi and name in s]
    return statistics.fmean(values) if values else None


def report(stack: Stack, args, tally: Tally, samples: list[dict], switches: list[dict], start: float) -> dict:
    end = samples[-1]["at"] if samples else start
    warm = start + args.warmup
    window = 3 * args.sample_every           # average a few samples at each end
    rss = {}
    for child in stack.children:
        base = mean_between(samples, child.name, warm, warm + window)
        last = mean_between(samples, child.name, end - window, end)
        if base and last:
            rss[child.name] = {"post_warmup_mib": round(base / 1024, 1), "end_mib": round(last / 1024, 1),
                               "drift_pct": round(100 * (last - base) / base, 1)}
    # Redis after the retention has started expiring telemetry: flat if bounded by the TTLs
    steady = start + max(args.warmup, args.retention + 15)
    redis_base = mean_between(samples, "redis_used_memory", steady, steady + window)
    redis_end = mean_between(samples, "redis_used_memory", end - window, end)
    redis_max = max((s["redis_used_memory"] for s in samples), default=0)
    lat = {k: (round(1000 * statistics.median(v), 1), round(1000 * sorted(v)[int(0.99 * (len(v) - 1))], 1))
           for k, v in tally.latency.items() if v}
    return {
        "minutes": args.minutes, "rate": args.rate, "route_rate": args.route_rate, "switch_every": args.switch_every,
        "requests_ok": dict(tally.ok), "failed": {f"{k}:{c}": n for (k, c), n in tally.failed.items()},
        "latency_ms_p50_p99": lat, "switches": len(switches), "last_version": switches[-1]["version"] if switches else 0,
        "rss": rss, "max_rss_drift_pct": max((abs(v["drift_pct"]) for v in rss.values()), default=None),
        "redis": {"after_retention_mib": round(redis_base / 2**20, 2) if redis_base else None,
                  "end_mib": round(redis_end / 2**20, 2) if redis_end else None,
                  "max_mib": round(redis_max / 2**20, 2),
                  "drift_pct": round(100 * (redis_end - redis_base) / redis_base, 1) if redis_base and redis_end else None,
                  "keys_end": samples[-1]["redis_keys"] if samples else 0},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="run length (default 10)")
    p.add_argument("--rate", type=float, default=20.0, help="Generate requests/s (default 20)")
    p.add_argument("--route-rate", type=float, default=100.0, help="Route requests/s (default 100)")
    p.add_argument("--switch-every", type=float, default=30.0, help="seconds between plan switches (default 30)")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between RSS/Redis samples (default 5)")
    p.add_argument("--warmup", type=float, default=None, help="seconds before the RSS baseline (default min(60, 25%%))")
    p.add_argument("--retention", type=float, default=90.0, help="telemetry retention, seconds (default 90)")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--dispatchers", type=int, default=2)
    p.add_argument("--keys", type=int, default=64)
    p.add_argument("--prefix-words", type=int, default=300, help="shared prefix length per key, words (~tokens)")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args(argv)
    if args.warmup is None:
        args.warmup = min(60.0, 0.25 * args.minutes * 60)
    os.environ["CACHEROUTE_RETENTION_SECONDS"] = f"{args.retention:g}"   # inherited by collector and planner
    os.environ["CACHEROUTE_GATE_WINDOW"] = f"{min(120.0, args.retention):g}"   # must fit in the retention
    config = StackConfig(engines=args.engines, dispatchers=args.dispatchers, planner_auto=False, window_seconds=30,
                         bucket_seconds=1, seed=args.seed)
    with Stack(config) as stack:
        print(f"stack up: dispatchers {stack.dispatchers}, logs in {stack.log_dir}", file=sys.stderr)
        tally, samples, switches, start = asyncio.run(drive(stack, args))
        died = [c.name for c in stack.poll()]
        result = report(stack, args, tally, samples, switches, start)
        result["exited"] = died
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"report": result, "samples": samples, "switches": switches}, fh, indent=1)
    return 0 if not tally.failed and not died else 1


if __name__ == "__main__":
    sys.exit(main())
