"""One planner interval, end to end, at 128,824 and 1,000,000 active keys.

A private redis-server (no persistence) holds a 300 s telemetry window (31 buckets of 10 s)
of `--keys` distinct keys with log-normal counts (sigma 1.65, the paper's). The buckets are
filled oldest first, each followed by a window read (the store's own `window_rates`, as the
planner's reads run every interval), which seals every closed bucket into one blob
(services/store: keys once, counts packed); the newest bucket stays hashes. Two fills:

  every   every key in every bucket: the worst case (128,824 x 31 x 3 = 12M hash fields);
  spread  each key in one bucket (key i in bucket i mod 31), the hottest 1% in every bucket:
          a long tail seen about once per window (1.3 fields per key per hash).

This process runs the planner's own steps (`services.planner.candidate`: the store's window
read, `build_candidate`, `decide`, `put_plan`, `activate`) against that Redis and times each;
a planner process (`--auto 0`, the publisher: pub/sub -> WatchPlans, chunked past the
message limit) and `--dispatchers` dispatcher processes run beside it; "routed" is the time
from the activation's return until every dispatcher's GetStatus reports the new version
(polled every 5 ms). Every key is admitted (W = ceil(N / R)), so the plan's table has N keys.

  1. first interval: a fresh store (cold bucket cache), no active plan: read, build from
     scratch, write, activate, routed;
  2. `--steady` steady intervals: one bucket rewritten (the newest: 2% of keys with new
     counts, as the collector would between two loops), read (cached buckets), churn-aware
     re-plan (`replan_incremental` from the active plan), the switching rule, write,
     activate, routed.

Dispatcher memory per plan: VmRSS of each dispatcher process tree (the supervisor and its
workers, one per core by default, each holding its own copy of the plan) before the first plan,
after it, and after the last steady plan (the previous plan is released when the next is
installed), with each worker's share.

    .venv/bin/python bench/control_loop.py [--keys 128824,1000000] [--fill spread|every]
        [--replicas 32] [--dispatchers 2] [--steady 2] [--cpu [--profile N]]

`--cpu`: the planner's steps only, in this process (no planner or dispatcher processes, so
no "routed"), in the control loop's order (`propose`: read, load = the store's
get_active_plan, build, decide, write, activate), each timed in process CPU seconds
(`time.process_time`: every thread of this process, the window read's worker thread
included; Redis's own CPU is not counted), which the machine's other load affects far less
than wall time. Beside the interval, "publish": the planner's WatchPlans work for the new
version (the store's get_plan, the table in columns, `codec.table_columns`, and its slices,
`planwire.plan_chunks`, at 8 MiB).
`--profile N` adds, per step, the N functions with the most own time (cProfile; the window
read then runs inline rather than in its worker thread, so the profiler sees it).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import grpc

from cacheroute.v1 import dispatcher_pb2, dispatcher_pb2_grpc
from procs import stop
from services.local.redis_server import RedisProcess
from services.planner.candidate import BuildInputs, build_candidate, decide
from services.local.stack import parse_serving_line
from services.store import RedisStore, TelemetryConfig

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 300.0
BUCKET = 10.0

# Fills one bucket's three hashes server-side from ARGV: first index, count, then per key
# (n, prompt, prefix).
_FILL_LUA = """
local first, n = tonumber(ARGV[1]), tonumber(ARGV[2])
for s = 0, n - 1, 500 do
  local a, b, c = {}, {}, {}
  for i = s, math.min(s + 499, n - 1) do
    local f = 'tenant-' .. ARGV[3 + 4 * i]
    local j = 4 + 4 * i
    a[#a + 1] = f; a[#a + 1] = ARGV[j]
    b[#b + 1] = f; b[#b + 1] = ARGV[j + 1]
    c[#c + 1] = f; c[#c + 1] = ARGV[j + 2]
  end
  redis.call('HSET', KEYS[1], unpack(a))
  redis.call('HSET', KEYS[2], unpack(b))
  redis.call('HSET', KEYS[3], unpack(c))
end
redis.call('SET', KEYS[4], ARGV[#ARGV], 'EX', 7200)
for k = 1, 3 do redis.call('EXPIRE', KEYS[k], 7200) end
return n
"""


def counts(n_keys: int, seed: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n_keys):
        n = 1 + int(rng.lognormvariate(0, 1.65))
        out.append((n, n * rng.randrange(500, 4000), n * rng.randrange(0, 500)))
    return out


async def fill_bucket(store: RedisStore, script, idx: int, rows: list[tuple[int, tuple[int, int, int]]],
                      token: str) -> None:
    for s in range(0, len(rows), 50_000):
        part = rows[s:s + 50_000]
        args: list[object] = [0, len(part)]
        for key, (n, pt, xt) in part:
            args += (key, n, pt, xt)
        args.append(token)
        keys = [store._tb(idx, h) for h in ("n", "pt", "xt", "v")]
        await script(keys=keys, args=args)


async def fill(store: RedisStore, n_keys: int, mode: str, first: int, last: int, now: float) -> tuple[int, int, float]:
    """Fields per hash written, arrivals counted over the window, and the seconds spent in the
    window reads after each bucket (they seal the closed buckets, as the planner's reads do)."""
    script = store._redis.register_script(_FILL_LUA)
    base = counts(n_keys, 7)
    buckets = list(range(first, last + 1))
    fields = arrivals = 0
    sealing = 0.0
    hot = sorted(range(n_keys), key=lambda i: -base[i][0])[: max(1, n_keys // 100)]
    for b, idx in enumerate(buckets):
        if mode == "every":
            rows = list(enumerate(base))
        else:
            rows = [(i, base[i]) for i in range(b, n_keys, len(buckets))]
            rows += [(i, base[i]) for i in hot if i % len(buckets) != b]
        await fill_bucket(store, script, idx, rows, f"fill-{idx}")
        fields += len(rows)
        arrivals += sum(c[0] for _, c in rows)
        s = time.perf_counter()
        await store.window_rates(now, WINDOW)      # seals the buckets closed at `now` (all but the last)
        sealing += time.perf_counter() - s
    return fields, arrivals, sealing


async def churn_newest(store: RedisStore, n_keys: int, idx: int, seed: int) -> None:
    """The newest bucket rewritten for 2% of keys with new counts (what happens between loops)."""
    script = store._redis.register_script(_FILL_LUA)
    rng = random.Random(seed)
    picked = rng.sample(range(n_keys), max(1, n_keys // 50))
    fresh = counts(len(picked), seed)
    await fill_bucket(store, script, idx, list(zip(picked, fresh)), f"churn-{seed}")


def spawn(module: str, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", "0", "--metrics-port", "-1",
           "--log-level", "INFO", *args]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def serving_address(proc: subprocess.Popen, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError(f"process exited with {proc.wait()}")
        doc = parse_serving_line(line)
        if doc is not None:
            return doc["address"]
    raise TimeoutError("no serving line")


def drain(proc: subprocess.Popen) -> None:
    """Keep reading a child's stderr so it never blocks on a full pipe."""
    import threading

    def run() -> None:
        for _ in proc.stderr:
            pass
    threading.Thread(target=run, daemon=True).start()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def children(pid: int) -> list[int]:
    """The direct children of `pid` (every thread's /proc children list)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text(encoding="ascii").split()]
        except FileNotFoundError:          # the thread exited meanwhile
            continue
    return out


def tree_rss(pid: int) -> tuple[float, list[float]]:
    """(MiB of `pid` and every descendant, the RSS of each direct child). A dispatcher with
    workers (one per core by default) is a supervisor that holds no plan, its workers do:
    its own VmRSS alone says +0 MiB per plan."""
    kids = children(pid)
    per_child = []
    total = rss_mib(pid)
    for c in kids:
        sub, _ = tree_rss(c)
        per_child.append(sub)
        total += sub
    return total, per_child


STALLS: list[float] = []    # the longest GetStatus answer per dispatcher per interval (event loop busy)


async def until_routed(stubs, version: int, timeout: float = 300.0) -> float:
    """Seconds until every dispatcher reports `version` (polled every 5 ms)."""
    start = time.perf_counter()

    async def one(stub) -> None:
        worst = 0.0
        while True:
            t0 = time.perf_counter()
            try:
                status = await stub.GetStatus(dispatcher_pb2.GetDispatcherStatusRequest(), timeout=60)
            except grpc.aio.AioRpcError:
                status = None
            worst = max(worst, time.perf_counter() - t0)
            if status is not None and status.plan_version >= version:
                STALLS.append(worst)
                return
            if time.perf_counter() - start > timeout:
                raise TimeoutError(f"dispatcher not on v{version} after {timeout:g}s")
            await asyncio.sleep(0.005)

    await asyncio.gather(*(one(s) for s in stubs))
    return time.perf_counter() - start


async def interval(store: RedisStore, stubs, replicas: list[str], q_cap: float, warm: int, now: float,
                   active, last_switch: float) -> tuple[dict[str, float], object]:
    t: dict[str, float] = {}
    s = time.perf_counter()
    snap = await store.window_rates(now, WINDOW)
    t["read"] = time.perf_counter() - s
    s = time.perf_counter()
    version = await store.next_version()
    inputs = BuildInputs.from_snapshot(snap, replicas, q_cap, warm)
    candidate = build_candidate(inputs, active, version=version, created_at=now, incremental=True)
    t["build"] = time.perf_counter() - s
    s = time.perf_counter()
    decision = decide(active, candidate, inputs, now=now, last_switch_at=last_switch, config=None)
    t["decide"] = time.perf_counter() - s
    # the bench activates whatever the rule says, to time a switch every interval
    plan = dataclasses.replace(candidate, decision=dataclasses.replace(decision, switch=True))
    s = time.perf_counter()
    await store.put_plan(plan)
    t["write"] = time.perf_counter() - s
    s = time.perf_counter()
    await store.activate(plan.version, expected=active.version if active else 0, now=now, reason="bench")
    t["activate"] = time.perf_counter() - s
    STALLS.clear()
    t["routed"] = await until_routed(stubs, plan.version)
    t["interval"] = sum(t.values())          # the steps in sequence (the stall overlaps "routed")
    t["stall"] = max(STALLS)
    t["keys"] = len(snap.keys)
    t["table"] = len(plan.table)
    t["churn"] = plan.churn or 0.0
    t["switch_rule"] = float(decision.switch)
    return t, plan


async def run_one(n_keys: int, args: argparse.Namespace) -> dict:
    cfg = TelemetryConfig(bucket_seconds=BUCKET, retention_seconds=3600)
    replicas = [f"r{i}" for i in range(args.replicas)]
    warm = math.ceil(n_keys / args.replicas)
    load0 = os.getloadavg()[0]
    with RedisProcess() as redis:
        writer = RedisStore(redis.url, telemetry=cfg, timeout=300)
        now = time.time()
        first, last = cfg.bucket(now - WINDOW), cfg.bucket(now)
        s = time.perf_counter()
        fields, arrivals, sealing = await fill(writer, n_keys, args.fill, first, last, now)
        q_cap = 1.2 * arrivals / WINDOW / len(replicas)      # the mean replica load, with 20% headroom
        fill_s = time.perf_counter() - s
        procs = []
        try:
            planner = spawn("services.planner", "--redis", redis.url, "--replicas", ",".join(replicas), "--auto", "0",
                            "--bucket-seconds", str(BUCKET), "--q-cap", f"{q_cap:.3f}", "--warm-slots", str(warm))
            procs.append(planner)
            p_addr = serving_address(planner)
            drain(planner)
            fake = ",".join(f"{r}=127.0.0.1:{9 + i}" for i, r in enumerate(replicas))   # nothing listens there
            dispatchers = []
            for i in range(args.dispatchers):
                d = spawn("services.dispatcher", "--replicas", fake, "--planner", p_addr, "--http-port", "-1",
                          "--dispatcher-id", f"bench-{i}", "--poll-interval", "1", "--telemetry-interval", "5")
                procs.append(d)
                dispatchers.append((d, serving_address(d)))
                drain(d)
            channels = [grpc.aio.insecure_channel(a) for _, a in dispatchers]
            stubs = [dispatcher_pb2_grpc.DispatcherStub(c) for c in channels]
            await asyncio.sleep(1.0)
            rss0 = [tree_rss(d.pid) for d, _ in dispatchers]
            store = RedisStore(redis.url, telemetry=cfg, timeout=300)     # a fresh planner: cold cache
            results = []
            t, plan = await interval(store, stubs, replicas, q_cap, warm, now, None, 0.0)
            t["name"] = "first"
            results.append(t)
            rss1 = [tree_rss(d.pid) for d, _ in dispatchers]
            active, last_switch = plan, now
            for k in range(args.steady):
                await churn_newest(writer, n_keys, last, seed=100 + k)
                now += 0.001
                t, plan = await interval(store, stubs, replicas, q_cap, warm, now, active, last_switch)
                t["name"] = f"steady-{k + 1}"
                results.append(t)
                active, last_switch = plan, now
            rss2 = [tree_rss(d.pid) for d, _ in dispatchers]
            redis_mib = (await writer._redis.info("memory"))["used_memory"] / 2**20
            for c in channels:
                await c.close()
            await store.close()
        finally:
            for p in procs:
                stop(p, grace=15.0)   # a dispatcher holding a million-key plan takes longer to exit
            await writer.close()
    return {"keys": n_keys, "fill": args.fill, "fields": fields, "fill_s": fill_s, "seal_s": sealing,
            "load": (load0, os.getloadavg()[0]), "redis_mib": redis_mib, "intervals": results,
            "rss_before": rss0, "rss_first": rss1, "rss_last": rss2}


def report(r: dict) -> None:
    print(f"\n{r['keys']:,} keys, fill {r['fill']} ({r['fields']:,} counts over 31 buckets; filled in "
          f"{r['fill_s']:.1f} s, of which {r['seal_s']:.1f} s the window reads that sealed the closed buckets); "
          f"load average {r['load'][0]:.2f} at the start, {r['load'][1]:.2f} at the end")
    cols = ("read", "build", "decide", "write", "activate", "routed", "interval")
    print(f"{'interval':<10}" + "".join(f"{c:>10}" for c in cols) + f"{'churn':>8}{'table':>10}{'stall':>9}")
    for t in r["intervals"]:
        print(f"{t['name']:<10}" + "".join(f"{t[c]:>9.2f}s" for c in cols) + f"{t['churn']:>8.3f}{t['table']:>10,}"
              f"{t['stall']:>8.2f}s")
    print("stall: the longest a dispatcher took to answer GetStatus while installing the plan (inside 'routed')")
    print(f"redis used_memory after the last interval: {r['redis_mib']:.0f} MiB")
    for i, (a, b, c) in enumerate(zip(r["rss_before"], r["rss_first"], r["rss_last"])):
        print(f"dispatcher {i} (supervisor + {len(b[1])} workers): RSS {a[0]:.0f} MiB before any plan, "
              f"{b[0]:.0f} MiB with the first (+{b[0] - a[0]:.0f} MiB), {c[0]:.0f} MiB after "
              f"{len(r['intervals']) - 1} more; per worker "
              + ", ".join(f"{x:.0f}->{y:.0f}->{z:.0f}" for x, y, z in zip(a[1], b[1], c[1])) + " MiB")


CPU_STEPS = ("read", "load", "build", "decide", "write", "activate", "publish")


class CpuClock:
    """Per-step process CPU seconds (and wall seconds beside them); with `profile` > 0 a
    cProfile of each step, its `profile` costliest functions by own time kept as text."""

    def __init__(self, profile: int = 0) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.profiles: dict[str, str] = {}
        self.profile = profile

    async def step(self, name: str, coro_fn, *args, **kwargs):
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile() if self.profile else None
        w, c = time.perf_counter(), time.process_time()
        if prof is not None:
            prof.enable()
        out = coro_fn(*args, **kwargs)
        if asyncio.iscoroutine(out):
            out = await out
        if prof is not None:
            prof.disable()
        self.cpu[name] = time.process_time() - c
        self.wall[name] = time.perf_counter() - w
        if prof is not None:
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(self.profile)
            self.profiles[name] = buf.getvalue()
        return out


async def cpu_interval(store: RedisStore, replicas: list[str], q_cap: float, warm: int, now: float,
                       last_switch: float, profile: int) -> tuple[CpuClock, object]:
    """The planner's steps of one interval in the control loop's order (services.planner.candidate
    `propose`), each in process CPU seconds (module header)."""
    from services.wire import codec, planwire

    clock = CpuClock(profile)
    snap = await clock.step("read", store.window_rates, now, WINDOW)
    _, active = await clock.step("load", store.get_active_plan)

    async def build():
        version = await store.next_version()
        inputs = BuildInputs.from_snapshot(snap, replicas, q_cap, warm)
        return inputs, build_candidate(inputs, active, version=version, created_at=now, incremental=True)

    inputs, candidate = await clock.step("build", build)
    decision = await clock.step("decide", decide, active, candidate, inputs, now=now, last_switch_at=last_switch,
                                config=None)
    plan = dataclasses.replace(candidate, decision=dataclasses.replace(decision, switch=True))
    await clock.step("write", store.put_plan, plan)
    await clock.step("activate", store.activate, plan.version, expected=active.version if active else 0, now=now,
                     reason="bench")

    async def publish():
        published = await store.get_plan(plan.version)      # what the servicer pages from
        assert len(published.table) == len(plan.table)
        budget = planwire.budget_for(8 * 1024 * 1024)
        return planwire.plan_chunks(published, budget, codec.table_columns(published))

    await clock.step("publish", publish)
    clock.cpu["interval"] = sum(clock.cpu[k] for k in CPU_STEPS[:6])
    clock.wall["interval"] = sum(clock.wall[k] for k in CPU_STEPS[:6])
    clock.cpu["table"] = len(plan.table)
    clock.cpu["churn"] = plan.churn or 0.0
    return clock, plan


async def run_cpu(n_keys: int, args: argparse.Namespace) -> dict:
    """--cpu: the fill of `run_one`, then the planner's steps in process, timed in CPU seconds."""
    cfg = TelemetryConfig(bucket_seconds=BUCKET, retention_seconds=3600)
    replicas = [f"r{i}" for i in range(args.replicas)]
    warm = math.ceil(n_keys / args.replicas)
    load0 = os.getloadavg()[0]
    if args.profile:
        async def inline(fn, /, *a, **k):     # the profiler sees only the thread it runs in
            return fn(*a, **k)
        asyncio.to_thread = inline
    with RedisProcess() as redis:
        writer = RedisStore(redis.url, telemetry=cfg, timeout=300)
        now = time.time()
        first, last = cfg.bucket(now - WINDOW), cfg.bucket(now)
        s = time.perf_counter()
        fields, arrivals, sealing = await fill(writer, n_keys, args.fill, first, last, now)
        fill_s = time.perf_counter() - s
        q_cap = 1.2 * arrivals / WINDOW / len(replicas)
        store = RedisStore(redis.url, telemetry=cfg, timeout=300)     # a fresh planner: cold cache
        results = []
        clock, plan = await cpu_interval(store, replicas, q_cap, warm, now, 0.0, args.profile)
        results.append(("first", clock))
        last_switch = now
        for k in range(args.steady):
            await churn_newest(writer, n_keys, last, seed=100 + k)
            now += 0.001
            clock, plan = await cpu_interval(store, replicas, q_cap, warm, now, last_switch, args.profile)
            results.append((f"steady-{k + 1}", clock))
            last_switch = now
        await store.close()
        await writer.close()
    return {"keys": n_keys, "fill": args.fill, "fields": fields, "fill_s": fill_s, "seal_s": sealing,
            "load": (load0, os.getloadavg()[0]), "intervals": results}


def report_cpu(r: dict) -> None:
    print(f"\n{r['keys']:,} keys, fill {r['fill']} ({r['fields']:,} counts over 31 buckets, filled in "
          f"{r['fill_s']:.1f} s); process CPU seconds per step (wall in brackets: interval only); load average "
          f"{r['load'][0]:.2f} at the start, {r['load'][1]:.2f} at the end")
    cols = CPU_STEPS[:6] + ("interval",) + CPU_STEPS[6:]
    print(f"{'interval':<10}" + "".join(f"{c:>10}" for c in cols) + f"{'wall':>9}{'churn':>8}{'table':>10}")
    for name, clock in r["intervals"]:
        print(f"{name:<10}" + "".join(f"{clock.cpu[c]:>9.3f}s" for c in cols)
              + f"{clock.wall['interval']:>8.2f}s{clock.cpu['churn']:>8.3f}{int(clock.cpu['table']):>10,}")
    print("interval: read + load + build + decide + write + activate (the loop's steps: `load` is the store's "
          "get_active_plan); publish beside it (get_plan, columns, slices: the servicer's WatchPlans work)")
    for name, clock in r["intervals"]:
        for step, text in clock.profiles.items():
            print(f"\n--- {name} / {step} (cProfile, by own time)\n{text}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=lambda t: [int(x) for x in t.split(",")], default=[128_824, 1_000_000])
    ap.add_argument("--fill", choices=("spread", "every"), default="spread")
    ap.add_argument("--replicas", type=int, default=32)
    ap.add_argument("--dispatchers", type=int, default=2)
    ap.add_argument("--steady", type=int, default=2)
    ap.add_argument("--cpu", action="store_true", help="the planner's steps in process, in CPU seconds")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="with --cpu: the N costliest functions of each step (cProfile)")
    args = ap.parse_args(argv)
    if args.profile and not args.cpu:
        ap.error("--profile needs --cpu")
    for n in args.keys:
        if args.cpu:
            report_cpu(asyncio.run(run_cpu(n, args)))
        else:
            report(asyncio.run(run_one(n, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
