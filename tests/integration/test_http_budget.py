"""The caller budget is charged once per caller per flush, not once per request (issue 22,
services/dispatcher/budget.py `DeferredArrivals`): a real dispatcher (HTTP API on
127.0.0.1:0) with the budget in a real redis-server, in front of a fake OpenAI engine.

Ten completions of one caller are served while the budget has room for four: none of them
calls the store (Redis counts its own EVALSHA calls) and none reaches the telemetry buffer
until the settle, which makes one call for all ten and keeps four of them, in time order with
their own arrival times; the other six are `telemetry_capped`. Routing and the answers are
untouched (all ten are 200 with the engine's body)."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import redis

from services.dispatcher.budget import BudgetConfig
from services.dispatcher.http import HttpConfig
from services.dispatcher.service import DispatcherConfig, serve
from services.model import parse_replicas
from services.rpc import ServerConfig
from tests.faults.fake_engine import FakeEngine
from tests.integration.test_dispatcher import wait_until


def _evalsha_calls(client: redis.Redis) -> int:
    """Lua calls Redis ran (a NOSCRIPT miss, which redis-py follows with SCRIPT LOAD, is a failed call)."""
    stats = client.info("commandstats")
    return sum(v["calls"] - v.get("failed_calls", 0) for k, v in stats.items()
               if k in ("cmdstat_evalsha", "cmdstat_eval"))


def test_http_arrivals_are_charged_per_caller_per_flush(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.config_resetstat()

    async def main():
        engine = await FakeEngine("ok").start()
        config = DispatcherConfig(
            server=ServerConfig(name="dispatcher", port=0), replicas=parse_replicas(f"e0=vllm+{engine.url}"),
            redis_url=redis_url, poll_interval=0.1, poll_timeout=0.5, seed=4, http=HttpConfig(port=0),
            telemetry_interval=3600.0,              # the test settles by hand
            budget=BudgetConfig(rate=0.001, burst=4.0, scope="shared"))
        service = await serve(config)
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            assert service.arrivals is not None and service.dispatcher.deferred is service.arrivals
            before = _evalsha_calls(client)
            body = orjson.dumps({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
            async with aiohttp.ClientSession() as session:
                for n in range(10):
                    async with session.post(service.http_url + "/v1/chat/completions", data=body,
                                            headers={"content-type": "application/json",
                                                     "x-cacheroute-key": f"key-{n}"}) as resp:
                        assert resp.status == 200, await resp.text()
                        assert orjson.loads(await resp.read())["usage"]["prompt_tokens"] == 5
            router = service.router
            assert len(service.arrivals) == 10 and router.telemetry == [], "arrivals wait for the settle"
            assert _evalsha_calls(client) == before, "no store call per request"
            await service.arrivals.settle()
            assert _evalsha_calls(client) == before + 1 and service.arrivals.calls == 1, "one call for ten"
            kept = [a[0] for a in router.telemetry]
            times = [a[1] for a in router.telemetry]
            assert len(kept) == 4 and router.telemetry_capped == 6, (kept, router.telemetry_capped)
            assert kept == sorted(kept, key=lambda k: int(k.split("-")[1])) and times == sorted(times)
            assert all(a[5] == "e0" for a in router.telemetry)
            assert len(service.arrivals) == 0
            await service.arrivals.settle()                   # nothing waiting: no call
            assert _evalsha_calls(client) == before + 1
        finally:
            await service.stop()
            await engine.stop()

    try:
        asyncio.run(main())
    finally:
        client.close()


def test_without_a_collector_deferred_arrivals_settle_on_their_own(redis_url):
    async def main():
        engine = await FakeEngine("ok").start()
        config = DispatcherConfig(
            server=ServerConfig(name="dispatcher", port=0), replicas=parse_replicas(f"e0=vllm+{engine.url}"),
            redis_url=redis_url, poll_interval=0.1, poll_timeout=0.5, seed=4, http=HttpConfig(port=0),
            telemetry_interval=0.2, budget=BudgetConfig(rate=100.0, burst=200.0, scope="shared"))
        service = await serve(config)
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            body = orjson.dumps({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
            async with aiohttp.ClientSession() as session:
                for _ in range(3):
                    async with session.post(service.http_url + "/v1/chat/completions", data=body,
                                            headers={"content-type": "application/json"}) as resp:
                        assert resp.status == 200
            await wait_until(lambda: len(service.router.telemetry) == 3, timeout=3)
            assert len(service.arrivals) == 0 and service.router.telemetry_capped == 0
        finally:
            await service.stop()
            await engine.stop()

    asyncio.run(main())
