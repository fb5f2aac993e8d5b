"""Collector ingest rate (arrival events/s) vs redis-benchmark on the same redis-server.

A private redis-server (no persistence) and the collector (`python -m services.collector`)
run as separate processes on loopback; this process streams ArrivalBatch messages
(`--batch` arrivals each, keys drawn from a log-normal popularity over 10,000 keys,
current timestamps, unique batch ids) on `--streams` concurrent ReportArrivals calls for
`--seconds`, and counts the arrivals the collector accepted (from its IngestSummary).
Baseline, same run and same redis-server: `redis-benchmark` HINCRBY (one counter update
per request, like one arrival) without pipelining and with `-P 16`. Goal ≥ 100,000 events/s.

    .venv/bin/python bench/collector_ingest.py [--seconds 8] [--batch 2000] [--streams 2]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import grpc

from cacheroute.v1 import collector_pb2, collector_pb2_grpc
from services.local.redis_server import RedisProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from route_rpc import stop, wait_serving  # noqa: E402


def redis_benchmark(port: int, pipeline: int, n: int) -> float:
    binary = shutil.which("redis-benchmark")
    if binary is None:
        raise SystemExit("redis-benchmark not found on PATH (Debian package redis-tools)")
    out = subprocess.run([binary, "-h", "127.0.0.1", "-p", str(port), "-n", str(n), "-c", "8", "-P", str(pipeline),
                          "-q", "-r", "10000", "hincrby", "bench:h", "k__rand_int__", "1"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    found = re.findall(r"([\d.]+) requests per second", out)
    if not found:
        raise RuntimeError(f"unexpected redis-benchmark output: {out!r}")
    return float(found[-1])


async def ingest(address: str, seconds: float, batch: int, streams: int, batches_per_stream: int) -> tuple[float, int, int]:
    rng = random.Random(5)
    keys = [f"tenant-{i}" for i in range(10_000)]
    weights = [rng.lognormvariate(0, 1.65) for _ in keys]
    pool = rng.choices(keys, weights, k=50_000)
    accepted = rejected = 0
    seq = 0
    # Messages are built before the clock starts and copied per send (a C copy), so the
    # generator, which shares the 2 cores with the collector and Redis, costs little.
    now = time.time()
    templates = []
    for _ in range(16):
        start = rng.randrange(len(pool) - batch)
        templates.append(collector_pb2.ArrivalBatch(source="bench", arrivals=[
            collector_pb2.Arrival(key=k, time=now + j * 1e-4, prompt_tokens=2000, prefix_tokens=1500)
            for j, k in enumerate(pool[start:start + batch])]))

    def batches():
        nonlocal seq
        for _ in range(batches_per_stream):
            seq += 1
            msg = collector_pb2.ArrivalBatch()
            msg.CopyFrom(templates[seq % len(templates)])
            msg.batch_id = f"bench-{seq}"
            yield msg

    async with grpc.aio.insecure_channel(address) as ch:
        stub = collector_pb2_grpc.CollectorStub(ch)
        stop_at = time.perf_counter() + seconds

        async def streamer() -> None:
            nonlocal accepted, rejected
            while time.perf_counter() < stop_at:
                summary = await stub.ReportArrivals(batches(), timeout=60)
                accepted += summary.accepted
                rejected += summary.rejected

        started = time.perf_counter()
        await asyncio.gather(*(streamer() for _ in range(streams)))
        elapsed = time.perf_counter() - started
    return accepted / elapsed, accepted, rejected


async def run(args: argparse.Namespace) -> None:
    with ExitStack() as stack:
        redis = stack.enter_context(RedisProcess())
        port = free_port()
        collector = subprocess.Popen([sys.executable, "-m", "services.collector", "--port", str(port),
                                      "--metrics-port", "-1", "--log-level", "WARNING", "--redis", redis.url],
                                     cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(stop, collector)
        await wait_serving(f"127.0.0.1:{port}")
        rate, accepted, rejected = await ingest(f"127.0.0.1:{port}", args.seconds, args.batch, args.streams,
                                                args.batches_per_stream)
        plain = redis_benchmark(redis.port, 1, 100_000)
        piped = redis_benchmark(redis.port, 16, 400_000)
        print(f"collector ingest, {args.streams} streams x {args.batches_per_stream} batches of {args.batch} arrivals, "
              f"{args.seconds:.0f} s, private redis-server on loopback")
        print(f"  collector: {rate:,.0f} events/s accepted ({accepted:,} accepted, {rejected} rejected)")
        print(f"  redis-benchmark HINCRBY, 8 clients: {plain:,.0f} req/s unpipelined, {piped:,.0f} req/s with -P 16")
        print(f"  collector / redis-benchmark: {rate / plain:.2f}x unpipelined, {rate / piped:.2f}x pipelined")
        print(f"  goal >= 100,000 events/s: {'met' if rate >= 100_000 else 'NOT met'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--batches-per-stream", type=int, default=10)
    asyncio.run(run(ap.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
