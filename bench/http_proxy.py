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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from procs import cpu_seconds, highest_passing_rate, pct, spawn, stop, wait_healthy
from services.local.redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent
def body(i: int) -> bytes:
    return json.dumps({"model": "m", "max_tokens": 4, "stream": True, "messages": [
        {"role": "system", "content": f"You are assistant number {i % 64} of the benchmark."},
        {"role": "user", "content": f"request {i}"}]}).encode()


async def one(session: aiohttp.ClientSession, url: str, data: bytes) -> tuple[float, float] | None:
    start = time.perf_counter()
    first = None
    try:
        async with session.post(url + "/v1/chat/completions", data=data,
                                headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                await resp.read()
                return None
            async for _ in resp.content.iter_any():
                if first is None:
                    first = time.perf_counter() - start
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None
    return (first if first is not None else float("nan")), time.perf_counter() - start


async def run_block(session, urls: list[str], rate: float, seconds: float, first_id: int):
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
        tasks.append(asyncio.create_task(fire(urls[i % len(urls)], body(first_id + i))))
    await asyncio.gather(*tasks)
    return latencies, errors, lags


async def run_rate(session, direct_urls: list[str], proxy_url: str, rate: float, seconds: float, dispatcher_pid: int,
                   block: float = 1.0):
    """`seconds` per path at `rate`, in alternating blocks of `block` seconds (direct, proxied, ...),
    so both paths see the same engines, machine load and client."""
    results: dict[str, list[tuple[float, float]]] = {"direct": [], "proxied": []}
    errors = {"direct": 0, "proxied": 0}
    lags: list[float] = []
    cpu = wall = 0.0
    ident = 0
    for _ in range(max(1, round(seconds / block))):
        for path in ("direct", "proxied"):
            urls = direct_urls if path == "direct" else [proxy_url]
            cpu0, t0 = cpu_seconds(dispatcher_pid), time.monotonic()
            got, bad, lag = await run_block(session, urls, rate, block, ident)
            ident += len(got) + bad
            if path == "proxied":
                cpu += cpu_seconds(dispatcher_pid) - cpu0
                wall += time.monotonic() - t0
            results[path] += got
            errors[path] += bad
            lags += lag
    return results, errors, lags, cpu, wall


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
            await run_rate(session, engine_urls, proxy_url, 100, 1.0, dispatcher.pid)
            idle0 = cpu_seconds(dispatcher.pid)
            await asyncio.sleep(args.seconds)
            idle_rate = (cpu_seconds(dispatcher.pid) - idle0) / args.seconds
            rows = []
            for rate in args.rates:
                results, errors, lags, cpu, wall = await run_rate(session, engine_urls, proxy_url, rate,
                                                                  args.seconds, dispatcher.pid)
                row = {"rate": rate, "errors": errors, "lag_p99_ms": pct(lags, 0.99) * 1e3}
                for what, index in (("ttfb", 0), ("total", 1)):
                    d = [r[index] for r in results["direct"]]
                    p = [r[index] for r in results["proxied"]]
                    row[what] = {"direct_p50_ms": pct(d, 0.5) * 1e3, "direct_p99_ms": pct(d, 0.99) * 1e3,
                                 "proxied_p50_ms": pct(p, 0.5) * 1e3, "proxied_p99_ms": pct(p, 0.99) * 1e3,
                                 "added_p50_ms": (pct(p, 0.5) - pct(d, 0.5)) * 1e3,
                                 "added_p99_ms": (pct(p, 0.99) - pct(d, 0.99)) * 1e3}
                proxied = len(results["proxied"]) + errors["proxied"]
                row["cpu_s_per_1k"] = max(0.0, cpu - idle_rate * wall) / proxied * 1000 if proxied else float("nan")
                row["cpu_share"] = cpu / wall
                rows.append(row)
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
    parser.add_argument("--engines", type=int, default=2)
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
    if args.load:
        print(json.dumps(asyncio.run(load_only(args.load, args.load_rate, args.seconds))))
    elif args.workers:
        asyncio.run(sweep_workers(args))
    else:
        args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
        doc = asyncio.run(main(args))
        print(json.dumps(doc, indent=2) if args.json else table(doc))
