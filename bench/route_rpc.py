"""Route RPC latency at a fixed request rate, RouteBatch throughput, one vs two dispatchers.

Everything runs on loopback in separate processes: a private redis-server holding the
active plan (128 keys over 4 replicas, read by the dispatcher's Redis fallback), 4 engine
replicas (`python -m services.engine`, idle), one or two dispatchers
(`python -m services.dispatcher`), and this process as the load generator (grpc.aio).

1. Route at each rate of `--rates` req/s, open loop, `--seconds` each: calls are issued
   on schedule whether or not earlier ones finished; latency is send → reply on the
   client; the client's own scheduling lag is reported separately. Keys: 75% admitted,
   25% cold. Goal: p99 ≤ 2 ms at 2,000 req/s. Baseline, same run and same load: a bare
   grpc.aio server (no interceptor, no routing) whose Route returns a constant decision,
   i.e. the floor of a Python gRPC server on this machine.
2. RouteBatch decisions/s, closed loop (`--callers` concurrent calls of `--batch` keys),
   against one dispatcher and then split over two. Goal ≥ 200,000 decisions/s.

    .venv/bin/python bench/route_rpc.py [--rates 500,1000,2000] [--seconds 4] [--batch 1000]

3. `--workers 1,2`: dispatcher worker processes (`--workers N`, SO_REUSEPORT) instead of the
   parts above. For each N, one dispatcher with N workers; a load generator in its own
   process (`--load`: open loop over `--channels` connections, so the kernel spreads them
   over the workers) at rising rates (x1.25 from `--sweep-from`); the highest rate whose Route
   p99 is <= `--p99-ms` (10) with no errors and >= 95% of the rate achieved, per N, and the
   ratio N=2 : N=1 (goal >= 1.5x on 2 cores).

    .venv/bin/python bench/route_rpc.py --workers 1,2 [--seconds 4] [--channels 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from cacheroute.v1 import common_pb2, dispatcher_pb2, dispatcher_pb2_grpc
from services.core.plan import Plan
from procs import cpu_seconds, highest_passing_rate, pct, spawn, stop
from services.local.redis_server import RedisProcess, free_port
from services.store import RedisStore

ROOT = Path(__file__).resolve().parent.parent
REPLICAS = 4
KEYS = 128


async def wait_serving(address: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with grpc.aio.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{address} did not become ready")


async def put_plan(redis_url: str, ids: list[str]) -> list[str]:
    table = {f"tenant-{k}": ((k % REPLICAS, (k + 1) % REPLICAS) if k % 8 == 0 else (k % REPLICAS,)) for k in range(KEYS)}
    plan = Plan(version=1, parent_version=0, created_at=time.time(), replica_ids=tuple(ids), q_cap=10.0, warm_slots=64,
                table=table, rates={k: 1.0 for k in table}, expected_load=(1.0,) * len(ids), predicted_imbalance=1.0,
                total_keys=KEYS * 4, admitted_keys=KEYS, admitted_rate_share=0.75)
    store = RedisStore(redis_url)
    await store.put_plan(plan)
    await store.activate(1, expected=0, now=time.time())
    await store.close()
    return list(table)


class BareDispatcher(dispatcher_pb2_grpc.DispatcherServicer):
    async def Route(self, request, context):
        return common_pb2.RouteDecision(replica_id="e0", address="127.0.0.1:1", plan_version=1, key=request.key,
                                        reason=common_pb2.ROUTE_REASON_PLANNED)


async def serve_bare(port: int) -> None:
    server = grpc.aio.server()
    dispatcher_pb2_grpc.add_DispatcherServicer_to_server(BareDispatcher(), server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def open_loop(address: str, keys: list[str], rate: float, seconds: float) -> dict[str, float]:
    rng = random.Random(3)
    latencies: list[float] = []
    lags: list[float] = []
    errors = 0
    async with grpc.aio.insecure_channel(address) as ch:
        stub = dispatcher_pb2_grpc.DispatcherStub(ch)
        requests = [dispatcher_pb2.RouteRequest(key=rng.choice(keys) if rng.random() < 0.75 else f"cold-{i}",
                                                prompt_tokens=1000) for i in range(int(rate * seconds))]
        for r in requests[:200]:                       # warm-up: connection, code paths
            await stub.Route(r, timeout=2)

        async def one(req, scheduled: float) -> None:
            nonlocal errors
            t0 = time.perf_counter()
            lags.append(t0 - scheduled)
            try:
                await stub.Route(req, timeout=1.0)
            except grpc.aio.AioRpcError:
                errors += 1
                return
            latencies.append(time.perf_counter() - t0)

        tasks = []
        start = time.perf_counter()
        for i, req in enumerate(requests):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(req, scheduled)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    return {"sent": len(requests), "achieved_rps": len(latencies) / elapsed, "errors": errors,
            "p50_ms": pct(latencies, 0.50) * 1e3, "p99_ms": pct(latencies, 0.99) * 1e3,
            "p999_ms": pct(latencies, 0.999) * 1e3, "mean_ms": statistics.fmean(latencies) * 1e3,
            "lag_p99_ms": pct(lags, 0.99) * 1e3}


async def batch_throughput(addresses: list[str], keys: list[str], batch: int, callers: int, seconds: float) -> float:
    rng = random.Random(4)
    req = dispatcher_pb2.RouteBatchRequest(requests=[
        dispatcher_pb2.RouteRequest(key=rng.choice(keys) if rng.random() < 0.75 else f"cold-{i}") for i in range(batch)])
    channels = [grpc.aio.insecure_channel(a) for a in addresses]
    stubs = [dispatcher_pb2_grpc.DispatcherStub(c) for c in channels]
    for s in stubs:
        await s.RouteBatch(req, timeout=5)
    done = 0
    stop_at = time.perf_counter() + seconds

    async def caller(stub) -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            reply = await stub.RouteBatch(req, timeout=5)
            done += len(reply.decisions)

    start = time.perf_counter()
    await asyncio.gather(*(caller(stubs[i % len(stubs)]) for i in range(callers * len(stubs))))
    elapsed = time.perf_counter() - start
    for c in channels:
        await c.close()
    return done / elapsed



async def cpu_per_call(address: str, pid: int, keys: list[str], seconds: float, callers: int = 8) -> float:
    """Closed loop (`callers` concurrent Route calls back to back): server CPU microseconds per call."""
    rng = random.Random(5)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)
        done = 0
        stop_at = time.perf_counter() + seconds

        async def caller() -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                await stub.Route(dispatcher_pb2.RouteRequest(key=rng.choice(keys)), timeout=2)
                done += 1

        before = cpu_seconds(pid)
        await asyncio.gather(*(caller() for _ in range(callers)))
        return (cpu_seconds(pid) - before) / max(done, 1) * 1e6

async def run(args: argparse.Namespace) -> None:
    with ExitStack() as stack:
        redis = stack.enter_context(RedisProcess())
        ids = [f"e{i}" for i in range(REPLICAS)]
        ports = [free_port() for _ in ids]
        engines = [spawn("services.engine", "--port", str(p), "--replica-id", rid) for rid, p in zip(ids, ports)]
        for proc in engines:
            stack.callback(stop, proc)
        replicas = ",".join(f"{rid}=127.0.0.1:{p}" for rid, p in zip(ids, ports))
        keys = await put_plan(redis.url, ids)
        for p in ports:
            await wait_serving(f"127.0.0.1:{p}")
        d_ports = [free_port(), free_port()]
        dispatchers = [spawn("services.dispatcher", "--http-port", "-1", "--port", str(p), "--replicas", replicas, "--redis", redis.url,
                             "--dispatcher-id", f"d{i}") for i, p in enumerate(d_ports)]
        for proc in dispatchers:
            stack.callback(stop, proc)
        addresses = [f"127.0.0.1:{p}" for p in d_ports]
        for a in addresses:
            await wait_serving(a)
        await asyncio.sleep(1.0)                     # first health polls and plan read

        bare_port = free_port()
        bare = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve-bare", str(bare_port)],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(stop, bare)
        await wait_serving(f"127.0.0.1:{bare_port}")

        print(f"Route RPC, open loop, {args.seconds:.0f} s per rate, one server process ({REPLICAS} replicas, "
              f"{KEYS}-key plan from Redis, 25% cold keys), python {sys.version.split()[0]}, {os.cpu_count()} cores")
        print(f"{'server':22} {'rate':>6} {'achieved':>9} {'err':>5} {'p50 ms':>7} {'p99 ms':>7} {'p99.9 ms':>8} "
              f"{'client lag p99 ms':>17}")
        at_goal = None
        for rate in args.rates if not args.batch_only else []:
            for name, address in (("bare grpc.aio", f"127.0.0.1:{bare_port}"), ("dispatcher", addresses[0])):
                r = await open_loop(address, keys, rate, args.seconds)
                print(f"{name:22} {rate:6.0f} {r['achieved_rps']:9.0f} {r['errors']:5d} {r['p50_ms']:7.2f} "
                      f"{r['p99_ms']:7.2f} {r['p999_ms']:8.2f} {r['lag_p99_ms']:17.2f}")
                if name == "dispatcher" and rate >= 2000:
                    at_goal = r
        if at_goal is not None:
            print(f"  goal p99 <= 2 ms at 2,000 req/s: {'met' if at_goal['p99_ms'] <= 2 else 'NOT met'}")
        if not args.batch_only:
            bare_cpu = await cpu_per_call(f"127.0.0.1:{bare_port}", bare.pid, keys, args.seconds)
            disp_cpu = await cpu_per_call(addresses[0], dispatchers[0].pid, keys, args.seconds)
            print(f"server CPU per Route call, closed loop (8 callers, {args.seconds:.0f} s): bare grpc.aio "
                  f"{bare_cpu:.0f} us, dispatcher {disp_cpu:.0f} us ({disp_cpu / bare_cpu:.2f}x bare)")

        one = await batch_throughput(addresses[:1], keys, args.batch, args.callers, args.batch_seconds)
        two = await batch_throughput(addresses, keys, args.batch, args.callers, args.batch_seconds)
        print(f"RouteBatch ({args.batch} keys per call, {args.callers} concurrent callers per dispatcher, "
              f"{args.batch_seconds:.0f} s): one dispatcher {one:,.0f} decisions/s; two dispatchers {two:,.0f} "
              f"decisions/s ({two / one:.2f}x one)")
        print(f"  goal >= 200,000 decisions/s on one dispatcher: {'met' if one >= 200_000 else 'NOT met'}")


async def load_many(address: str, keys: list[str], rate: float, seconds: float, channels: int) -> dict[str, float]:
    """Open loop over `channels` connections (round robin), as `open_loop` does over one."""
    rng = random.Random(3)
    latencies: list[float] = []
    errors = 0
    chans = [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
             for _ in range(channels)]
    stubs = [dispatcher_pb2_grpc.DispatcherStub(c) for c in chans]
    requests = [dispatcher_pb2.RouteRequest(key=rng.choice(keys) if rng.random() < 0.75 else f"cold-{i}",
                                            prompt_tokens=1000) for i in range(int(rate * seconds))]
    for i, r in enumerate(requests[:50 * channels]):
        await stubs[i % channels].Route(r, timeout=2)

    async def one(stub, req) -> None:
        nonlocal errors
        t0 = time.perf_counter()
        try:
            await stub.Route(req, timeout=1.0)
        except grpc.aio.AioRpcError:
            errors += 1
            return
        latencies.append(time.perf_counter() - t0)

    tasks = []
    start = time.perf_counter()
    for i, req in enumerate(requests):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(stubs[i % channels], req)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    for c in chans:
        await c.close()
    return {"rate": rate, "achieved_rps": len(latencies) / elapsed, "errors": errors,
            "p50_ms": pct(latencies, 0.5) * 1e3 if latencies else float("inf"),
            "p99_ms": pct(latencies, 0.99) * 1e3 if latencies else float("inf")}


def run_load(address: str, rate: float, seconds: float, channels: int) -> dict[str, float]:
    """The load generator as its own process; its JSON line."""
    import orjson

    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--load", address, "--load-rate", str(rate),
                          "--seconds", str(seconds), "--channels", str(channels)],
                         cwd=ROOT, capture_output=True, text=True, timeout=seconds * 10 + 60)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-500:])
    return orjson.loads(out.stdout.strip().splitlines()[-1])


async def run_workers(args: argparse.Namespace) -> None:
    with ExitStack() as stack:
        redis = stack.enter_context(RedisProcess())
        ids = [f"e{i}" for i in range(REPLICAS)]
        ports = [free_port() for _ in ids]
        engines = [spawn("services.engine", "--port", str(p), "--replica-id", rid) for rid, p in zip(ids, ports)]
        for proc in engines:
            stack.callback(stop, proc)
        replicas = ",".join(f"{rid}=127.0.0.1:{p}" for rid, p in zip(ids, ports))
        await put_plan(redis.url, ids)
        for p in ports:
            await wait_serving(f"127.0.0.1:{p}")
        print(f"Route RPC vs dispatcher worker processes: open loop over {args.channels} connections from a load "
              f"generator process, {args.seconds:.0f} s per rate, goal p99 <= {args.p99_ms:g} ms; "
              f"{os.cpu_count()} cores")
        print(f"{'workers':>7} {'rate':>6} {'achieved':>9} {'err':>5} {'p50 ms':>7} {'p99 ms':>7}")
        best: dict[int, float] = {}
        for n in args.workers:
            port = free_port()
            proc = spawn("services.dispatcher", "--http-port", "-1", "--port", str(port), "--replicas", replicas, "--redis", redis.url,
                         "--workers", str(n))
            address = f"127.0.0.1:{port}"
            try:
                await wait_serving(address)
                await asyncio.sleep(1.5)

                def passes(rate: float) -> bool:
                    r = run_load(address, rate, args.seconds, args.channels)
                    ok = r["errors"] == 0 and r["p99_ms"] <= args.p99_ms and r["achieved_rps"] >= 0.95 * rate
                    print(f"{n:7d} {rate:6.0f} {r['achieved_rps']:9.0f} {r['errors']:5d} {r['p50_ms']:7.2f} "
                          f"{r['p99_ms']:7.2f} {'' if ok else ' over'}")
                    return ok

                best[n] = highest_passing_rate(passes, args.sweep_from, args.sweep_to)
            finally:
                stop(proc)
        for n, rate in best.items():
            print(f"  {n} worker(s): highest rate at p99 <= {args.p99_ms:g} ms: {rate:,.0f} req/s")
        if 1 in best and 2 in best and best[1] > 0:
            ratio = best[2] / best[1]
            print(f"  2 workers / 1 worker: {ratio:.2f}x (goal >= 1.5x: {'met' if ratio >= 1.5 else 'NOT met'})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=lambda t: [float(x) for x in t.split(",")], default=[500.0, 1000.0, 2000.0])
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--serve-bare", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--callers", type=int, default=2)
    ap.add_argument("--batch-seconds", type=float, default=5)
    ap.add_argument("--batch-only", action="store_true", help="skip the Route latency part")
    ap.add_argument("--workers", type=lambda t: [int(x) for x in t.split(",")], default=None,
                    help="worker counts to compare (part 3), e.g. 1,2")
    ap.add_argument("--channels", type=int, default=8, help="load generator connections (part 3)")
    ap.add_argument("--p99-ms", type=float, default=10.0)
    ap.add_argument("--sweep-from", type=float, default=500.0)
    ap.add_argument("--sweep-to", type=float, default=12_000.0)
    ap.add_argument("--load", help=argparse.SUPPRESS)
    ap.add_argument("--load-rate", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.load:
        import orjson

        keys = [f"tenant-{i}" for i in range(KEYS)]
        print(orjson.dumps(asyncio.run(load_many(args.load, keys, args.load_rate, args.seconds,
                                                 args.channels))).decode())
        return 0
    if args.serve_bare:
        asyncio.run(serve_bare(args.serve_bare))
    elif args.workers:
        asyncio.run(run_workers(args))
    else:
        asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
