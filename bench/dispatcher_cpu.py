"""Dispatcher CPU per request on long-prompt chat completions (issue 22 item 4).

Processes on loopback: `--engines` fast fake OpenAI engines (tests/faults/fake_engine.py: no
model time at all, so everything the dispatcher does is overhead) inside this process, one
dispatcher (`python -m services.dispatcher`, kind vllm, one worker: the HTTP pass-through path
real engines take) as a child, and this process as a bounded closed-loop client
(`--concurrency` requests in flight, one aiohttp session, keep-alive).

Workload: chat completions like bench/peers.py's tenants workload: `--tenants` tenants, each
with a system prompt of 1,000-4,000 words (log-uniform, seeded), then a short user turn.
Two phases of `--requests` each: streamed (the engine sends `--events` SSE chunks plus the
usage chunk; the client did not ask for usage, so the dispatcher adds and strips it) and
not streamed (one JSON answer with usage).

Figure: the dispatcher process's user+system CPU seconds (/proc/<pid>/stat) over a phase,
minus its idle rate (health polls, telemetry) measured for `--idle` seconds first, divided by
the phase's requests. CPU seconds, not wall time, so the figure holds on a shared machine
(the load average is printed beside it). `--profile` runs the dispatcher under cProfile and
prints its top 25 functions by own time; `--no-uvloop` runs its event loop on asyncio's
default loop (CACHEROUTE_UVLOOP=0).

    PYTHONPATH=$PWD:$PWD/protos nice -n 19 .venv/bin/python bench/dispatcher_cpu.py \
        [--requests 1000] [--concurrency 8] [--system-words 1000,4000] [--profile] [--no-uvloop] [--json]
        [--key-tokens 1024] [--engines 8 --poll-interval 0.5 --metrics-page bench/results/sim_engine_metrics.txt]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import pstats
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import ROOT, cpu_seconds, pct, stop, wait_healthy  # noqa: E402

sys.path.insert(0, str(ROOT))          # tests.faults.fake_engine (the editable install has services/ only)

from services.local.redis_server import free_port  # noqa: E402
from tests.faults.fake_engine import FakeEngine  # noqa: E402

def system_prompts(tenants: int, low: int, high: int, seed: int) -> list[str]:
    """One system prompt per tenant, log-uniform on [low, high] words (bench/peers.py's tenants)."""
    rng = random.Random(seed)
    vocab = [f"w{rng.randrange(50_000)}" for _ in range(4096)]
    out = []
    for t in range(tenants):
        n = int(math.exp(rng.uniform(math.log(low), math.log(high))))
        out.append(f"tenant {t}: " + " ".join(rng.choice(vocab) for _ in range(n)))
    return out


def body(prompts: list[str], i: int, stream: bool) -> bytes:
    return json.dumps({"model": "m", "max_tokens": 8, "stream": stream, "messages": [
        {"role": "system", "content": prompts[i % len(prompts)]},
        {"role": "user", "content": f"question {i}: what is in the document?"}]}).encode()


async def one(session: aiohttp.ClientSession, url: str, data: bytes) -> tuple[float, bool]:
    """(seconds to the first body byte, ok)."""
    start = time.perf_counter()
    first = None
    async with session.post(url + "/v1/chat/completions", data=data,
                            headers={"content-type": "application/json"}) as resp:
        async for _ in resp.content.iter_any():
            if first is None:
                first = time.perf_counter() - start
        return (first or time.perf_counter() - start), resp.status == 200


async def closed_loop(session, url: str, bodies: list[bytes], concurrency: int) -> tuple[list[float], int]:
    """Send `bodies`, `concurrency` at a time; (ttfb seconds, errors)."""
    it = iter(bodies)
    ttfb: list[float] = []
    errors = 0

    async def worker() -> None:
        nonlocal errors
        for data in it:
            t, ok = await one(session, url, data)
            ttfb.append(t)
            errors += not ok

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ttfb, errors


def spawn_dispatcher(replicas: str, http_port: int, profile: str | None, uvloop: bool,
                     tree: Path = ROOT, env_extra: dict | None = None) -> subprocess.Popen:
    """The dispatcher of the source tree `tree` (this one by default; --base: another checkout)."""
    cmd = [sys.executable]
    if profile:
        cmd += ["-m", "cProfile", "-o", profile]
    cmd += ["-m", "services.dispatcher", "--metrics-port", "-1", "--log-level", "WARNING", "--port",
            str(free_port()), "--http-port", str(http_port), "--replicas", replicas, "--engine-kind", "vllm",
            "--seed", "1", "--workers", "1"]
    env = {**os.environ, "CACHEROUTE_UVLOOP": "1" if uvloop else "0", **(env_extra or {})}
    if tree != ROOT:
        env["PYTHONPATH"] = f"{tree}{os.pathsep}{tree / 'protos'}"
    return subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def dispatcher_env(args) -> dict:
    """The dispatcher's knobs the peers runs set (bench/peers_routers.py): key tokens, poll interval."""
    return {"CACHEROUTE_KEY_TOKENS": str(args.key_tokens), "CACHEROUTE_POLL_INTERVAL": str(args.poll_interval)}


def set_metrics(engines: list, args) -> None:
    """`--metrics-page FILE`: every fake engine serves that /metrics page (e.g. the simulated
    engine's, which the dispatcher parses on every poll); default: none (404)."""
    if args.metrics_page:
        page = Path(args.metrics_page).read_text()
        for e in engines:
            e.metrics_page = page


async def compare(args) -> dict:
    """--base TREE: the dispatcher of TREE ("before") and of this tree ("after") side by side on
    the same engines, in one run: `--blocks` rounds, each one block of `--requests` streamed
    and one whole per dispatcher, the order alternating (AB, BA, ...) so drifts in the machine's
    load fall on both alike. Per block: the dispatcher's CPU seconds over the block minus its
    idle rate, per request."""
    engines = [await FakeEngine("slow" if args.event_gap > 0 else "stream", events=args.events, chunk_bytes=24).start()
               for _ in range(args.engines)]
    for e in engines:
        e.slow_seconds = args.event_gap
    set_metrics(engines, args)
    replicas = ",".join(f"e{i}=vllm+{e.url}" for i, e in enumerate(engines))
    trees = {"before": Path(args.base).resolve(), "after": ROOT}
    ports = {name: free_port() for name in trees}
    procs = {name: spawn_dispatcher(replicas, ports[name], None, args.uvloop, tree, dispatcher_env(args))
             for name, tree in trees.items()}
    prompts = system_prompts(args.tenants, *args.system_words, args.seed)
    blocks: dict[tuple[str, bool], list[float]] = {}
    idle: dict[str, float] = {}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            for name in trees:
                url = f"http://127.0.0.1:{ports[name]}"
                await wait_healthy(session, url)
                await closed_loop(session, url, [body(prompts, i, True) for i in range(50)], args.concurrency)
            c0 = {n: cpu_seconds(p.pid) for n, p in procs.items()}
            t0 = time.monotonic()
            await asyncio.sleep(args.idle)
            idle = {n: (cpu_seconds(p.pid) - c0[n]) / (time.monotonic() - t0) for n, p in procs.items()}
            for b in range(args.blocks):
                order = list(trees) if b % 2 == 0 else list(trees)[::-1]
                for name in order:
                    url, pid = f"http://127.0.0.1:{ports[name]}", procs[name].pid
                    for stream in (True, False):
                        for e in engines:
                            e.mode = ("slow" if args.event_gap > 0 else "stream") if stream else "ok"
                        bodies = [body(prompts, b * args.requests + i, stream) for i in range(args.requests)]
                        cpu0, w0 = cpu_seconds(pid), time.monotonic()
                        _, errors = await closed_loop(session, url, bodies, args.concurrency)
                        cpu, wall = cpu_seconds(pid) - cpu0, time.monotonic() - w0
                        if errors:
                            raise RuntimeError(f"{name}: {errors} errors in a block")
                        blocks.setdefault((name, stream), []).append(
                            max(0.0, cpu - idle[name] * wall) / len(bodies) * 1e3)
    finally:
        for p in procs.values():
            stop(p, grace=30.0)
        for e in engines:
            await e.stop()
    return {"base": str(trees["before"]), "loadavg": os.getloadavg(), "idle": idle, "blocks": blocks,
            "requests": args.requests, "event_gap": args.event_gap, "system_words": args.system_words,
            "events": args.events, "concurrency": args.concurrency}


def compare_table(doc: dict) -> str:
    import statistics
    load = " ".join(f"{x:.2f}" for x in doc["loadavg"])
    gap = f" {doc['event_gap']:g} s apart" if doc["event_gap"] else ""
    lines = [f"dispatcher CPU ms per request (CPU seconds, blocks of {doc['requests']} requests alternating "
             f"before/after; load average {load} at the end), system prompts {doc['system_words'][0]}-"
             f"{doc['system_words'][1]} words, {doc['events']} events{gap}, "
             f"concurrency {doc['concurrency']}; before = {doc['base']}",
             f"idle: before {doc['idle']['before']:.1%}, after {doc['idle']['after']:.1%} of a core",
             f"{'phase':>8} {'before med (min-max)':>24} {'after med (min-max)':>24} {'after/before':>12}"]
    for stream in (True, False):
        b, a = doc["blocks"][("before", stream)], doc["blocks"][("after", stream)]
        mb, ma = statistics.median(b), statistics.median(a)
        lines.append(f"{'stream' if stream else 'whole':>8} {mb:>8.3f} ({min(b):.3f}-{max(b):.3f})   "
                     f"{ma:>8.3f} ({min(a):.3f}-{max(a):.3f})   {ma / mb if mb else float('nan'):>10.2f}")
    return "\n".join(lines)


async def main(args) -> dict:
    engines = [await FakeEngine("stream", events=args.events, chunk_bytes=24).start() for _ in range(args.engines)]
    set_metrics(engines, args)
    replicas = ",".join(f"e{i}=vllm+{e.url}" for i, e in enumerate(engines))
    port = free_port()
    profile = (args.profile_out or tempfile.mktemp(suffix=".prof")) if args.profile else None
    dispatcher = spawn_dispatcher(replicas, port, profile, args.uvloop, env_extra=dispatcher_env(args))
    url = f"http://127.0.0.1:{port}"
    prompts = system_prompts(args.tenants, *args.system_words, args.seed)
    rows = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await wait_healthy(session, url)
            await closed_loop(session, url, [body(prompts, i, True) for i in range(50)], args.concurrency)  # warm
            idle0, t0 = cpu_seconds(dispatcher.pid), time.monotonic()
            await asyncio.sleep(args.idle)
            idle_rate = (cpu_seconds(dispatcher.pid) - idle0) / (time.monotonic() - t0)
            for stream in (True, False):
                for e in engines:
                    e.mode = "stream" if stream else "ok"
                bodies = [body(prompts, i, stream) for i in range(args.requests)]
                cpu0, t0 = cpu_seconds(dispatcher.pid), time.monotonic()
                ttfb, errors = await closed_loop(session, url, bodies, args.concurrency)
                cpu, wall = cpu_seconds(dispatcher.pid) - cpu0, time.monotonic() - t0
                rows.append({"stream": stream, "requests": len(ttfb), "errors": errors, "wall_s": wall,
                             "cpu_ms_per_request": max(0.0, cpu - idle_rate * wall) / len(ttfb) * 1e3,
                             "cpu_share": cpu / wall, "ttfb_p50_ms": pct(ttfb, 0.5) * 1e3,
                             "ttfb_p99_ms": pct(ttfb, 0.99) * 1e3})
    finally:
        stop(dispatcher, grace=30.0)
        for e in engines:
            await e.stop()
    doc = {"engines": args.engines, "concurrency": args.concurrency, "uvloop": args.uvloop,
           "system_words": args.system_words,
           "loadavg": os.getloadavg(), "idle_cpu_share": idle_rate, "rows": rows}
    if profile and os.path.exists(profile):
        doc["profile"] = profile
    return doc


def table(doc: dict) -> str:
    load = " ".join(f"{x:.2f}" for x in doc["loadavg"])
    lines = [f"dispatcher CPU per request (CPU seconds, shared machine; load average {load}), kind vllm, "
             f"{doc['engines']} fake engines, system prompts {doc['system_words'][0]}-{doc['system_words'][1]} words, "
             f"concurrency {doc['concurrency']}, uvloop {doc['uvloop']}, "
             f"idle {doc['idle_cpu_share']:.1%} of a core",
             f"{'phase':>8} {'requests':>8} {'errors':>6} {'CPU ms/req':>10} {'core':>5} {'ttfb p50':>9} "
             f"{'ttfb p99':>9}"]
    for r in doc["rows"]:
        lines.append(f"{'stream' if r['stream'] else 'whole':>8} {r['requests']:>8} {r['errors']:>6} "
                     f"{r['cpu_ms_per_request']:>10.3f} {r['cpu_share']:>5.0%} {r['ttfb_p50_ms']:>9.2f} "
                     f"{r['ttfb_p99_ms']:>9.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000, help="per phase (streamed, whole)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--events", type=int, default=8, help="SSE chunks per streamed answer")
    parser.add_argument("--tenants", type=int, default=16)
    parser.add_argument("--system-words", type=lambda t: tuple(int(x) for x in t.split(",")), default=(1000, 4000),
                        help="LOW,HIGH: system prompt words, log-uniform (default 1000,4000; 8,16: a bare proxy's "
                             "short requests)")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds of idle CPU measured first")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="cProfile the dispatcher; print its top 25")
    parser.add_argument("--profile-out", help="keep the dispatcher's cProfile stats in this file")
    parser.add_argument("--no-uvloop", dest="uvloop", action="store_false")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--base", help="another source tree (e.g. `git archive main` unpacked): its dispatcher "
                                       "against this one's, alternating blocks in one run")
    parser.add_argument("--blocks", type=int, default=6, help="with --base: rounds of blocks")
    parser.add_argument("--event-gap", type=float, default=0.0,
                        help="seconds between a stream's events (0: back to back), as a real engine's tokens")
    parser.add_argument("--key-tokens", type=int, default=64,
                        help="the dispatcher's --key-tokens (64 default; 1024 in docs/peers.md's tenants and Mooncake)")
    parser.add_argument("--poll-interval", type=float, default=0.25,
                        help="the dispatcher's stats poll interval (0.25 default; 0.5 in docs/peers.md's runs)")
    parser.add_argument("--metrics-page", help="a Prometheus page every fake engine serves at /metrics "
                                               "(e.g. bench/results/sim_engine_metrics.txt)")
    args = parser.parse_args()
    if args.base:
        print(compare_table(asyncio.run(compare(args))))
        sys.exit(0)
    result = asyncio.run(main(args))
    print(json.dumps(result, indent=2) if args.json else table(result))
    if result.get("profile"):
        pstats.Stats(result["profile"]).sort_stats("tottime").print_stats(25)
        if not args.profile_out:
            os.unlink(result["profile"])
