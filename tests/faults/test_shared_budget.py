"""One per-caller telemetry budget across dispatchers (issue 20): measured, 2 dispatchers.

Two real dispatchers (gRPC and the OpenAI HTTP API on 127.0.0.1:0) in front of two fake
OpenAI engines, a real redis-server, and one caller (the open data plane names it by its
host, so every connection of the test is the same caller). The budget is small (20
arrivals/s, burst 20) and the caller far above it: RouteBatch calls of 10 requests every
20 ms for ~2 s, either spread over both dispatchers or all sent to one (the client library
sticks to one dispatcher until it fails). What counts is the number of arrivals that reach
the dispatchers' telemetry, against what one budget allows over the run (burst + rate x
seconds). Three designs:

  local    a bucket per dispatcher (before):         spread -> 2 budgets
  divided  a bucket per dispatcher at rate / 2:       sticky -> half a budget
  shared   one bucket in the store (now the default): 1 budget either way

Then: HTTP and gRPC arrivals of one caller draw on the same shared bucket, and with the
store unreachable each dispatcher falls back to its local bucket (routing unaffected). Served
(HTTP) arrivals are charged once per caller per flush (services/dispatcher/budget.py
`DeferredArrivals`): the measurement settles them before counting.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import grpc
import orjson

from cacheroute.v1 import dispatcher_pb2, dispatcher_pb2_grpc
from services.dispatcher.budget import BudgetConfig
from services.dispatcher.http import HttpConfig
from services.dispatcher.service import DispatcherConfig, serve
from services.model import parse_replicas
from services.rpc import ServerConfig
from tests.faults.fake_engine import FakeEngine
from tests.integration.test_dispatcher import wait_until

RATE, BURST, BATCH, EVERY, SECONDS = 20.0, 20.0, 10, 0.02, 2.0
DEAD_REDIS = "redis://127.0.0.1:1"


async def _dispatchers(engines, budget: BudgetConfig, redis_url: str = ""):
    replicas = parse_replicas(",".join(f"e{i}=vllm+{e.url}" for i, e in enumerate(engines)))
    out = []
    for n in range(2):
        out.append(await serve(DispatcherConfig(
            server=ServerConfig(name="dispatcher", port=0), replicas=replicas, dispatcher_id=f"d{n}",
            redis_url=redis_url, poll_interval=0.2, poll_timeout=0.5, seed=n, budget=budget,
            http=HttpConfig(port=0))))
    for d in out:
        await wait_until(lambda d=d: all(d.router.state.healthy), timeout=5)
    return out


def _counted(dispatchers) -> int:
    return sum(len(d.router.telemetry) for d in dispatchers)


async def _flood(dispatchers, targets: list[int], *, http: bool = False) -> float:
    """RouteBatch calls (or, `http`, single completions on the second target) for SECONDS;
    returns the seconds the flood lasted."""
    channels = [grpc.aio.insecure_channel(d.address) for d in dispatchers]
    stubs = [dispatcher_pb2_grpc.DispatcherStub(ch) for ch in channels]
    session = aiohttp.ClientSession()
    body = orjson.dumps({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    start, n = time.monotonic(), 0
    try:
        while time.monotonic() - start < SECONDS:
            target = targets[n % len(targets)]
            if http and n % 2:
                async with session.post(dispatchers[target].http_url + "/v1/chat/completions", data=body,
                                        headers={"content-type": "application/json",
                                                 "x-cacheroute-key": f"made-up-{n % 64}"}) as resp:
                    assert resp.status == 200, await resp.text()
            else:
                batch = dispatcher_pb2.RouteBatchRequest(requests=[
                    dispatcher_pb2.RouteRequest(key=f"made-up-{(n * BATCH + i) % 64}") for i in range(BATCH)])
                reply = await stubs[target].RouteBatch(batch, timeout=5)
                assert len(reply.decisions) == BATCH, "decisions are made whatever the budget"
            n += 1
            await asyncio.sleep(EVERY)
        return time.monotonic() - start
    finally:
        await session.close()
        for ch in channels:
            await ch.close()


async def _measure(engines, budget: BudgetConfig, targets: list[int], redis_url: str = "", *,
                   http: bool = False) -> tuple[float, int]:
    """(arrivals counted / one budget over the run, fallbacks to the local bucket)."""
    dispatchers = await _dispatchers(engines, budget, redis_url)
    try:
        seconds = await _flood(dispatchers, targets, http=http)
        for d in dispatchers:           # served (HTTP) arrivals are charged at the flush (budget.py)
            if d.arrivals is not None:
                await d.arrivals.settle()
        allowed = BURST + RATE * seconds
        return _counted(dispatchers) / allowed, sum(d.budget.fallbacks for d in dispatchers)
    finally:
        for d in dispatchers:
            await d.stop(0)


def test_one_budget_per_caller_across_two_dispatchers(redis_url):
    import redis

    def flush():
        client = redis.Redis.from_url(redis_url)
        client.flushall()
        client.close()

    async def main():
        engines = [await FakeEngine("ok").start() for _ in range(2)]
        try:
            local = BudgetConfig(rate=RATE, burst=BURST, scope="local")
            divided = BudgetConfig(rate=RATE / 2, burst=BURST / 2, scope="local")
            shared = BudgetConfig(rate=RATE, burst=BURST, scope="shared")
            figures = {}
            for name, budget in (("local", local), ("divided", divided), ("shared", shared)):
                for pattern, targets in (("spread", [0, 1]), ("sticky", [0])):
                    flush()
                    figures[name, pattern], _ = await _measure(engines, budget, targets, redis_url)
            flush()
            figures["shared", "http+grpc"], _ = await _measure(engines, shared, [0, 1], redis_url, http=True)
            figures["shared", "store down"], fallbacks = await _measure(engines, shared, [0], DEAD_REDIS)
            return figures, fallbacks
        finally:
            for e in engines:
                await e.stop()

    figures, fallbacks = asyncio.run(main())
    print("FIGURES", {f"{k[0]}/{k[1]}": round(v, 2) for k, v in figures.items()}, f"fallbacks={fallbacks}")
    # arrivals counted, in budgets (burst + rate x seconds) of the one caller
    assert 1.6 < figures["local", "spread"] < 2.3, "a bucket per dispatcher: two budgets"
    assert 0.8 < figures["local", "sticky"] < 1.15
    assert 0.8 < figures["divided", "spread"] < 1.15
    assert 0.35 < figures["divided", "sticky"] < 0.6, "divided: a caller on one dispatcher gets half"
    for pattern in ("spread", "sticky", "http+grpc"):
        assert 0.8 < figures["shared", pattern] < 1.15, f"shared/{pattern}: one budget"
    assert 0.8 < figures["shared", "store down"] < 1.15 and fallbacks > 0, "store down: the local bucket"
