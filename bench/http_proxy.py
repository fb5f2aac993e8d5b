"""Router-added latency of the dispatcher's OpenAI HTTP API: client → dispatcher → engine vs
client → engine directly, in the same run, at fixed request rates.

Processes on loopback: `--engines` simulated engines (`python -m services.engine --http-port`,
time scale `--time-scale`, default 0.01, so a short completion takes ~1 ms of model time), one
dispatcher (`python -m services.dispatcher`, kind vllm: the HTTP pass-through path real
engines take; `--kind cacheroute` measures the gRPC translation path instead), and this
process as the open-loop load generator (one aiohttp session, keep-alive).

At each rate of `--rates` (default 100,500,1000 req/s) the generator sends short streamed
chat completions (`max_tokens` 4, stream=true) on schedule for `--seconds` (default 5) per
path, in alternating one-second blocks (direct, proxied, direct, ...), so both paths see the
same engines, machine load and client, and the dispatcher proxies the full rate. Per request: time to the first SSE event and to the end of
the stream, on the client. Added latency = proxied percentile − direct percentile (p50, p99).
CPU: the dispatcher process's user+system seconds (/proc) over the proxied requests of a rate,
per 1,000 requests, minus its idle rate measured for `--seconds` before the first rate.
The client's scheduling lag (how late requests went out) is reported: when it grows, the
generator, not the router, is the bottleneck.

Goal (issue 11): on one dispatcher process, added p50 ≤ 1 ms and p99 ≤ 5 ms at 500 req/s.

    .venv/bin/python bench/http_proxy.py [--rates 100,500,1000] [--seconds 5] [--kind vllm] [--json]

`--workers 1,2` instead: the dispatcher as N worker processes on one HTTP port (`--workers N`,
SO_REUSEPORT); for each N a load generator in its own process (`--load`, one aiohttp
session whose pooled connections the kernel spreads over the workers) sends the proxied
requests only, at rising rates (x1.25 from `--sweep-from`, `--seconds` each); the highest
rate whose end-of-stream p99 is <= `--p99-ms` (20) with no errors and >= 95% of the rate
achieved, per N, and the ratio N=2 : N=1 (goal >= 1.5x on 2 cores).

    .venv/bin/python bench/http_proxy.py --workers 1,2 [--seconds 3]

`--routers cacheroute,vllm-router,smg` instead: the bare proxy beside the peers (issue 22's goal:
CPU per request <= vllm-router's), in one run. The same `--engines` simulated engines (default 1
here) and the same client load (this process, as above) for every router; the routers run one
at a time: `--blocks` rounds (default 6), in each every router in turn (A B C A B C ...), started
for its block and stopped after it. A block: the router is started and ready, both paths are
warmed (100 req/s for 1 s each), the router's idle CPU rate is measured for `--idle` seconds
(default 3), then at each rate of `--rates` `--seconds` per path in alternating
`--block-seconds` slices (direct, proxied, ...). Per block: added TTFB p50/p99 (proxied -
direct, that block's own direct path), errors, and CPU per request = user+system seconds of
the router's whole process tree (/proc/<pid>/stat of it and its descendants) over the proxied
slices, minus the idle rate x their wall time, over the proxied requests. The table prints per
router and rate the median and range over blocks, the load average at start and end, and the
CPU ratio cacheroute / vllm-router (and / vllm-router-rr) from the same run.

  cacheroute      the dispatcher alone, as in the default run: `python -m services.dispatcher
                  --workers 1 --engine-kind vllm`, no planner (no plan: its default cold-tail rule,
                  chwbl, bounded-load consistent hashing on the prompt's key)
  vllm-router     bench/peers_routers.py's `vllm-ca` launcher: `vllm-router --policy cache_aware`
  vllm-router-rr  its `vllm-rr` launcher: the same with `--policy round_robin`
  smg             bench/peers_routers.py's `smg-ca` launcher: `python -m smg launch --policy cache_aware`

The peers are started by bench/peers_routers.py's own launcher (start_router, peer_command):
their defaults, `--host 127.0.0.1`, their ports and `--request-timeout-secs`, with their default
policy (cache_aware for both, as docs/peers.md runs them as `vllm-ca` and `smg-ca`; nothing
else is changed), and vllm-router once more with round_robin. A bare proxy routes to one engine,
so no policy has a choice to make, but a policy's work per request is in the CPU figure, as it
would be in production, and for vllm-router that work is I/O: with one engine, its cache_aware
still posts `/v1/chat/completions/render` (404 on the simulated engine) and then `/tokenize` to
the engine before every completion (probed with a stub engine: 20 requests, 20 of each;
round_robin: the 20 completions only; smg, either policy: the completions only). So
`vllm-router` is the peer as docs/peers.md runs it and `vllm-router-rr` the peer as a bare
proxy; the table gives our ratio to both.
Requests name the engines' model (smg routes by `model`). A response counts as an error unless
it is a 200 whose stream ends with `data: [DONE]`.

    .venv/bin/python bench/http_proxy.py --routers cacheroute,vllm-router,vllm-router-rr,smg --rates 500 \
        [--blocks 6] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import aiohttp

import peers_routers
from peers_procs import Engines
from peers_procs import cpu_seconds as tree_cpu_seconds
from peers_routers import peer_command, peer_version
from procs import cpu_seconds, highest_passing_rate, pct, spawn, stop, wait_healthy
from services.local.redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent
def body(i: int, model: str = "m") -> bytes:
    return json.dumps({"model": model, "max_tokens": 4, "stream": True, "messages": [
        {"role": "system", "content": f"You are assistant number {i % 64} of the benchmark."},
        {"role": "user", "content": f"request {i}"}]}).encode()


DONE = b"data: [DONE]"


async def one(session: aiohttp.ClientSession, url: str, data: bytes) -> tuple[float, float] | None:
    """(seconds to the first body byte, to the end of the stream); None for an error: a status
    other than 200, a transport error, or a stream that does not end with `data: [DONE]`."""
    start = time.perf_counter()
    first = None
    tail = b""
    try:
        async with session.post(url + "/v1/chat/completions", data=data,
                                headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                await resp.read()
                return None
            async for chunk in resp.content.iter_any():
                if first is None:
                    first = time.perf_counter() - start
                tail = (tail + chunk)[-32:]
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None
    if first is None or not tail.rstrip().endswith(DONE):
        return None
    return first, time.perf_counter() - start


async def run_block(session, urls: list[str], rate: float, seconds: float, first_id: int, model: str = "m"):
    """Open loop at `rate` req/s for `seconds` against `urls` (round robin); (latencies, errors, lags)."""
    n = int(rate * seconds)
    latencies: list[tuple[float, float]] = []
    errors = 0
    lags: list[float] = []

    async def fire(url: str, data: bytes) -> None:
        nonlocal errors
        out = await one(session, url, data)
        if out is None:
            errors += 1
        else:
            latencies.append(out)

    tasks = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(n):
        at = start + i / rate
        delay = at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        lags.append(max(0.0, loop.time() - at))
        tasks.append(asyncio.create_task(fire(urls[i % len(urls)], body(first_id + i, model))))
    await asyncio.gather(*tasks)
    return latencies, errors, lags


async def run_rate(session, direct_urls: list[str], proxy_url: str, rate: float, seconds: float,
                   cpu: Callable[[], float], block: float = 1.0, model: str = "m"):
    """`seconds` per path at `rate`, in alternating blocks of `block` seconds (direct, proxied, ...),
    so both paths see the same engines, machine load and client; `cpu()` is the router's CPU
    seconds so far, read around each proxied block."""
    results: dict[str, list[tuple[float, float]]] = {"direct": [], "proxied": []}
    errors = {"direct": 0, "proxied": 0}
    lags: list[float] = []
    cpu_used = wall = 0.0
    ident = 0
    for _ in range(max(1, round(seconds / block))):
        for path in ("direct", "proxied"):
            urls = direct_urls if path == "direct" else [proxy_url]
            cpu0, t0 = cpu(), time.monotonic()
            got, bad, lag = await run_block(session, urls, rate, block, ident, model)
            ident += len(got) + bad
            if path == "proxied":
                cpu_used += cpu() - cpu0
                wall += time.monotonic() - t0
            results[path] += got
            errors[path] += bad
            lags += lag
    return results, errors, lags, cpu_used, wall


def rate_row(rate: float, results: dict, errors: dict, lags: list[float], cpu: float, wall: float,
             idle_rate: float) -> dict:
    """One rate's figures from run_rate: TTFB and end-of-stream percentiles per path, added =
    proxied - direct, and the router's CPU over the proxied blocks minus its idle rate, per 1,000
    requests (= ms per request)."""
    row = {"rate": rate, "errors": errors, "lag_p99_ms": pct(lags, 0.99) * 1e3}
    for what, index in (("ttfb", 0), ("total", 1)):
        d = [r[index] for r in results["direct"]]
        p = [r[index] for r in results["proxied"]]
        row[what] = {"direct_p50_ms": pct(d, 0.5) * 1e3, "direct_p99_ms": pct(d, 0.99) * 1e3,
                     "proxied_p50_ms": pct(p, 0.5) * 1e3, "proxied_p99_ms": pct(p, 0.99) * 1e3,
                     "added_p50_ms": (pct(p, 0.5) - pct(d, 0.5)) * 1e3,
                     "added_p99_ms": (pct(p, 0.99) - pct(d, 0.99)) * 1e3}
    proxied = len(results["proxied"]) + errors["proxied"]
    row["requests"] = proxied
    row["cpu_s"] = cpu
    row["cpu_s_per_1k"] = max(0.0, cpu - idle_rate * wall) / proxied * 1000 if proxied else float("nan")
    row["cpu_share"] = cpu / wall
    return row


def start_engines(args) -> tuple[list[subprocess.Popen], list[int], list[str]]:
    """args.engines simulated engines: the processes, their gRPC ports and HTTP base URLs."""
    http_ports = [free_port() for _ in range(args.engines)]
    grpc_ports = [free_port() for _ in range(args.engines)]
    engines = [spawn("services.engine", "--port", str(g), "--http-port", str(h), "--replica-id", f"e{i}",
                     "--time-scale", str(args.time_scale)) for i, (g, h) in enumerate(zip(grpc_ports, http_ports))]
    return engines, grpc_ports, [f"http://127.0.0.1:{p}" for p in http_ports]


async def main(args) -> dict:
    dispatcher = None
    engines, grpc_ports, engine_urls = start_engines(args)
    if args.kind == "cacheroute":
        replicas = ",".join(f"e{i}=127.0.0.1:{p}" for i, p in enumerate(grpc_ports))
    else:
        replicas = ",".join(f"e{i}={args.kind}+{u}" for i, u in enumerate(engine_urls))
    proxy_port = free_port()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            for url in engine_urls:
                await wait_healthy(session, url)
            dispatcher = spawn("services.dispatcher", "--port", str(free_port()), "--http-port", str(proxy_port),
                               "--replicas", replicas, "--engine-kind", args.kind, "--seed", "1")
            proxy_url = f"http://127.0.0.1:{proxy_port}"
            await wait_healthy(session, proxy_url)
            # warm the connection pools of both paths, then the dispatcher's idle CPU rate
            await run_rate(session, engine_urls, proxy_url, 100, 1.0, lambda: cpu_seconds(dispatcher.pid))
            idle0 = cpu_seconds(dispatcher.pid)
            await asyncio.sleep(args.seconds)
            idle_rate = (cpu_seconds(dispatcher.pid) - idle0) / args.seconds
            rows = []
            for rate in args.rates:
                results, errors, lags, cpu, wall = await run_rate(session, engine_urls, proxy_url, rate,
                                                                  args.seconds, lambda: cpu_seconds(dispatcher.pid))
                rows.append(rate_row(rate, results, errors, lags, cpu, wall, idle_rate))
                await asyncio.sleep(0.5)
    finally:
        if dispatcher is not None:
            stop(dispatcher)
        for e in engines:
            stop(e)
    return {"kind": args.kind, "engines": args.engines, "time_scale": args.time_scale, "seconds": args.seconds,
            "idle_cpu_share": idle_rate, "rows": rows}


async def load_only(url: str, rate: float, seconds: float) -> dict:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await run_block(session, [url], min(rate, 200.0), 0.5, 10**6)        # warm the pool
        t0 = time.monotonic()
        got, bad, lag = await run_block(session, [url], rate, seconds, 0)
        wall = time.monotonic() - t0
    total = [r[1] for r in got]
    return {"rate": rate, "achieved": len(got) / wall, "errors": bad, "p50_ms": pct(total, 0.5) * 1e3,
            "p99_ms": pct(total, 0.99) * 1e3, "lag_p99_ms": pct(lag, 0.99) * 1e3}


async def sweep_workers(args) -> None:
    engines, _, engine_urls = start_engines(args)
    replicas = ",".join(f"e{i}={args.kind}+{u}" for i, u in enumerate(engine_urls))
    best: dict[int, float] = {}
    print(f"HTTP proxy vs dispatcher worker processes: kind {args.kind}, {args.engines} simulated engines, "
          f"load generator process, {args.seconds:g} s per rate, goal end-of-stream p99 <= {args.p99_ms:g} ms; "
          f"{os.cpu_count()} cores")
    print(f"{'workers':>7} {'rate':>6} {'achieved':>9} {'err':>5} {'p50 ms':>7} {'p99 ms':>7} {'lag p99':>8}")
    try:
        async with aiohttp.ClientSession() as session:
            for url in engine_urls:
                await wait_healthy(session, url)
            for n in args.workers:
                port = free_port()
                d = spawn("services.dispatcher", "--port", str(free_port()), "--http-port", str(port),
                          "--replicas", replicas, "--engine-kind", args.kind, "--seed", "1", "--workers", str(n))
                url = f"http://127.0.0.1:{port}"
                try:
                    await wait_healthy(session, url)
                    await asyncio.sleep(1.0)

                    def passes(rate: float) -> bool:   # the load generator in its own process
                        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--load", url,
                                              "--load-rate", str(rate), "--seconds", str(args.seconds)],
                                             cwd=ROOT, capture_output=True, text=True, timeout=args.seconds * 10 + 60)
                        r = json.loads(out.stdout.strip().splitlines()[-1])
                        ok = r["errors"] == 0 and r["p99_ms"] <= args.p99_ms and r["achieved"] >= 0.95 * rate
                        print(f"{n:7d} {rate:6.0f} {r['achieved']:9.0f} {r['errors']:5d} {r['p50_ms']:7.2f} "
                              f"{r['p99_ms']:7.2f} {r['lag_p99_ms']:8.2f}{'' if ok else ' over'}")
                        return ok

                    best[n] = highest_passing_rate(passes, args.sweep_from, args.sweep_to)
                finally:
                    stop(d)
    finally:
        for e in engines:
            stop(e)
    for n, rate in best.items():
        print(f"  {n} worker(s): highest rate at p99 <= {args.p99_ms:g} ms: {rate:,.0f} req/s")
    if best.get(1):
        ratio = best.get(2, 0.0) / best[1]
        print(f"  2 workers / 1 worker: {ratio:.2f}x (goal >= 1.5x: {'met' if ratio >= 1.5 else 'NOT met'})")


# ------------------------------------------------------------------ beside the peers (--routers)

# our name -> bench/peers_routers.py's launcher for it: each peer's own command line there (its
# defaults, its default policy cache_aware, --host/ports/--request-timeout-secs set), not a copy
PEER_LAUNCHERS = {"vllm-router": "vllm-ca", "vllm-router-rr": "vllm-rr", "smg": "smg-ca"}
PEER_DISTS = {"vllm-router": "vllm-router", "vllm-router-rr": "vllm-router", "smg": "smg"}   # for the versions
ROUTER_CHOICES = ("cacheroute", *PEER_LAUNCHERS)
PEER_TIMEOUT = 60.0          # the peers' --request-timeout-secs (the client's own is aiohttp's 5 min)


def missing(name: str) -> str | None:
    """Why router `name` cannot run on this machine (None: it can)."""
    if name in ("vllm-router", "vllm-router-rr"):
        exe = Path(sys.executable).parent / "vllm-router"        # where peer_command runs it from
        return None if exe.is_file() else f"vllm-router is not installed ({exe}; pip install -e '.[peers]')"
    if name == "smg":
        return None if importlib.util.find_spec("smg") else "smg is not importable (pip install -e '.[peers]')"
    if name == "cacheroute":
        return None
    raise ValueError(f"unknown router {name!r}; choose from {', '.join(ROUTER_CHOICES)}")


def peer_policy(name: str) -> str:
    """The --policy on peer `name`'s command line in bench/peers_routers.py."""
    cmd = peer_command(PEER_LAUNCHERS[name], ["http://127.0.0.1:1"], 0, 0, PEER_TIMEOUT)
    return cmd[cmd.index("--policy") + 1]


@dataclass
class Running:
    """One router instance up for one block."""
    url: str
    cpu: Callable[[], float]       # CPU seconds of its whole process tree so far
    stop: Callable[[], None]


async def start_router(name: str, engine_urls: list[str], log_dir: Path) -> Running:
    if name == "cacheroute":       # the dispatcher alone, one process, kind vllm: as the default run
        port = free_port()
        replicas = ",".join(f"e{i}=vllm+{u}" for i, u in enumerate(engine_urls))
        proc = spawn("services.dispatcher", "--port", str(free_port()), "--http-port", str(port),
                     "--replicas", replicas, "--engine-kind", "vllm", "--seed", "1")
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as session:
                await wait_healthy(session, url)
        except BaseException:
            stop(proc)
            raise
        return Running(url, lambda: tree_cpu_seconds([proc.pid]), lambda: stop(proc))
    router = await peers_routers.start_router(PEER_LAUNCHERS[name], SimpleNamespace(timeout=PEER_TIMEOUT),
                                              Engines("sim", engine_urls, []), log_dir)
    return Running(router.url, router.cpu, router.stop)


async def beside(args) -> dict:
    """`--blocks` rounds; in each, every router of `--routers` in turn (A B C A B C ...), started
    for its block and stopped after it, so only one router runs at a time."""
    for name in args.routers:
        reason = missing(name)
        if reason:
            raise SystemExit(reason)
    engines, _, engine_urls = start_engines(args)
    load_start = os.getloadavg()
    blocks: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="http_proxy_") as log_dir:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                for url in engine_urls:
                    await wait_healthy(session, url)
                # the engines' model id: smg routes by the `model` field and 404s any other name
                model = await Engines("sim", engine_urls, []).model_id()
                for b in range(args.blocks):
                    for name in args.routers:
                        router = await start_router(name, engine_urls, Path(log_dir))
                        try:
                            # warm both paths' connection pools, then the router's idle rate
                            await run_rate(session, engine_urls, router.url, 100, 1.0, router.cpu, model=model)
                            c0, t0 = router.cpu(), time.monotonic()
                            await asyncio.sleep(args.idle)
                            idle = (router.cpu() - c0) / (time.monotonic() - t0)
                            for rate in args.rates:
                                got = await run_rate(session, engine_urls, router.url, rate, args.seconds,
                                                     router.cpu, block=args.block_seconds, model=model)
                                blocks.append({"router": name, "block": b, "idle_cpu_share": idle,
                                               **rate_row(rate, *got, idle)})
                        finally:
                            await asyncio.to_thread(router.stop)
    finally:
        for e in engines:
            stop(e)
    return {"routers": args.routers, "engines": args.engines, "time_scale": args.time_scale,
            "seconds": args.seconds, "blocks_per_router": args.blocks, "idle_seconds": args.idle,
            "rates": args.rates, "versions": {n: peer_version(PEER_DISTS[n]) for n in PEER_LAUNCHERS if n in args.routers},
            "policies": {n: peer_policy(n) for n in PEER_LAUNCHERS if n in args.routers},
            "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "blocks": blocks}


def summary(doc: dict) -> list[dict]:
    """Per router and rate: the median and range over blocks of each block's figures."""
    out = []
    for name in doc["routers"]:
        for rate in doc["rates"]:
            rows = [r for r in doc["blocks"] if r["router"] == name and r["rate"] == rate]
            spread = {}
            for key, get in (("ttfb_added_p50_ms", lambda r: r["ttfb"]["added_p50_ms"]),
                             ("ttfb_added_p99_ms", lambda r: r["ttfb"]["added_p99_ms"]),
                             ("cpu_ms_per_request", lambda r: r["cpu_s_per_1k"]),
                             ("idle_cpu_share", lambda r: r["idle_cpu_share"])):
                values = [get(r) for r in rows]
                spread[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
            out.append({"router": name, "rate": rate, "blocks": len(rows), **spread,
                        "requests": sum(r["requests"] for r in rows),
                        "errors_proxied": sum(r["errors"]["proxied"] for r in rows),
                        "errors_direct": sum(r["errors"]["direct"] for r in rows),
                        "lag_p99_ms_max": max(r["lag_p99_ms"] for r in rows)})
    return out


def beside_table(doc: dict) -> str:
    def load(t):
        return " ".join(f"{x:.2f}" for x in t)

    def cell(s: dict, fmt: str = ".2f") -> str:
        return f"{s['median']:{fmt}} ({s['min']:{fmt}} to {s['max']:{fmt}})"

    versions = ", ".join(f"{n} {v} (policy {doc['policies'][n]}"
                         f"{', its default' if doc['policies'][n] == 'cache_aware' else ''})"
                         for n, v in doc["versions"].items())
    lines = [f"Bare proxy beside the peers: {doc['engines']} simulated engine(s) (time scale {doc['time_scale']:g}), "
             f"{doc['blocks_per_router']} block(s) per router in turn ({' '.join(doc['routers'])} ...), each router "
             f"started for its block; per block and rate {doc['seconds']:g} s per path (direct/proxied alternating); "
             f"idle measured {doc['idle_seconds']:g} s per block; streamed chat, max_tokens 4",
             f"cacheroute = the dispatcher, one process, kind vllm, no plan; {versions or 'no peers'}",
             f"load average at start {load(doc['loadavg_start'])}, at end {load(doc['loadavg_end'])}; "
             f"median (min to max) over blocks; CPU = the router's process tree, user+system, minus its idle rate",
             f"{'router':>14} {'req/s':>6} {'TTFB added p50 ms':>24} {'TTFB added p99 ms':>26} "
             f"{'CPU ms/request':>22} {'idle core':>9} {'requests':>8} {'errors':>6} {'lag p99':>7}"]
    rows = summary(doc)
    for r in rows:
        lines.append(f"{r['router']:>14} {r['rate']:>6g} {cell(r['ttfb_added_p50_ms']):>24} "
                     f"{cell(r['ttfb_added_p99_ms']):>26} {cell(r['cpu_ms_per_request'], '.3f'):>22} "
                     f"{r['idle_cpu_share']['median']:>9.1%} {r['requests']:>8} "
                     f"{r['errors_proxied']:>6} {r['lag_p99_ms_max']:>7.1f}")
    by = {(r["router"], r["rate"]): r["cpu_ms_per_request"]["median"] for r in rows}
    for rate in doc["rates"]:
        for peer in ("vllm-router", "vllm-router-rr"):
            ours, theirs = by.get(("cacheroute", rate)), by.get((peer, rate))
            if ours is not None and theirs:
                lines.append(f"  {rate:g} req/s: CPU per request cacheroute / {peer} {ours / theirs:.2f}x "
                             f"(medians of the same run; goal <= 1: {'met' if ours <= theirs else 'NOT met'})")
    return "\n".join(lines)


def table(doc: dict) -> str:
    lines = [f"HTTP proxy, kind {doc['kind']}, {doc['engines']} simulated engines (time scale {doc['time_scale']:g}), "
             f"{doc['seconds']:g} s per rate; streamed chat, max_tokens 4; ms on the client",
             f"{'req/s':>6} {'path':>8} {'ttfb p50':>9} {'ttfb p99':>9} {'total p50':>10} {'total p99':>10} "
             f"{'errors':>7}"]
    for r in doc["rows"]:
        for path in ("direct", "proxied"):
            t, f = r["total"], r["ttfb"]
            lines.append(f"{r['rate']:>6g} {path:>8} {f[path + '_p50_ms']:>9.2f} {f[path + '_p99_ms']:>9.2f} "
                         f"{t[path + '_p50_ms']:>10.2f} {t[path + '_p99_ms']:>10.2f} {r['errors'][path]:>7}")
        f = r["ttfb"]
        lines.append(f"{'':>6} {'added':>8} {f['added_p50_ms']:>9.2f} {f['added_p99_ms']:>9.2f} "
                     f"{r['total']['added_p50_ms']:>10.2f} {r['total']['added_p99_ms']:>10.2f}   "
                     f"dispatcher CPU {r['cpu_s_per_1k']:.3f} s / 1k req ({r['cpu_share']:.0%} of a core), "
                     f"client lag p99 {r['lag_p99_ms']:.1f} ms")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="100,500,1000")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--engines", type=int, default=None,
                        help="simulated engines (default 2; 1 with --routers: a bare proxy)")
    parser.add_argument("--routers", type=lambda t: [x.strip() for x in t.split(",") if x.strip()], default=None,
                        help=f"beside the peers: some of {','.join(ROUTER_CHOICES)}, in alternating blocks")
    parser.add_argument("--blocks", type=int, default=6, help="with --routers: blocks per router")
    parser.add_argument("--idle", type=float, default=3.0, help="with --routers: idle seconds measured per block")
    parser.add_argument("--block-seconds", type=float, default=1.0,
                        help="with --routers: seconds of each direct/proxied alternation")
    parser.add_argument("--time-scale", type=float, default=0.01)
    parser.add_argument("--kind", default="vllm", choices=("vllm", "openai", "cacheroute"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workers", type=lambda t: [int(x) for x in t.split(",")], default=None)
    parser.add_argument("--p99-ms", type=float, default=20.0)
    parser.add_argument("--sweep-from", type=float, default=100.0)
    parser.add_argument("--sweep-to", type=float, default=5000.0)
    parser.add_argument("--load", help=argparse.SUPPRESS)
    parser.add_argument("--load-rate", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engines is None:
        args.engines = 1 if args.routers else 2
    if args.load:
        print(json.dumps(asyncio.run(load_only(args.load, args.load_rate, args.seconds))))
    elif args.workers:
        asyncio.run(sweep_workers(args))
    elif args.routers:
        for name in args.routers:
            missing(name)                                  # an unknown name fails before anything starts
        args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
        doc = asyncio.run(beside(args))
        print(json.dumps(doc, indent=2) if args.json else beside_table(doc))
    else:
        args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
        doc = asyncio.run(main(args))
        print(json.dumps(doc, indent=2) if args.json else table(doc))
