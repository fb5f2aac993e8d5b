"""The data plane with the real control plane: telemetry into a real collector (and Redis),
plans pushed by a real planner."""

from __future__ import annotations

import asyncio
import time

import grpc

from cacheroute.v1 import dispatcher_pb2, dispatcher_pb2_grpc, engine_pb2
from services.collector.__main__ import CollectorConfig
from services.collector.__main__ import serve as serve_collector
from services.engine.fleet import EngineFleet
from services.rpc import ServerConfig
from services.store import RedisStore
from tests.integration.test_dispatcher import dispatcher_config, wait_until
from services.dispatcher.__main__ import serve


def test_arrivals_and_cache_stats_reach_a_real_collector(redis_url):
    async def main():
        collector = await serve_collector(CollectorConfig(server=ServerConfig(name="collector", port=0),
                                                          redis_url=redis_url))
        fleet = await EngineFleet(2, time_scale=0.01, collector=collector.address, report_interval=0.1).start()
        service = await serve(dispatcher_config(fleet, collector=collector.address, telemetry_interval=0.1,
                                                dispatcher_id="d1"))
        store = RedisStore(redis_url)
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = dispatcher_pb2_grpc.DispatcherStub(ch)
                for i in range(30):
                    await stub.Route(dispatcher_pb2.RouteRequest(key="a" if i % 3 else "b", prompt_tokens=100), timeout=2)
                text = " ".join(f"w{i}" for i in range(64))
                for _ in range(2):
                    req = engine_pb2.GenerateRequest(prompt=text, max_tokens=2, key="gen")
                    _ = [c async for c in stub.Generate(req, timeout=10)]

                async def counted():
                    snap = await store.window_rates(time.time(), 60)
                    return snap.total_arrivals == 32 and snap
                await wait_until(counted, timeout=5)
                snap = await store.window_rates(time.time(), 60)

                async def stats_in():
                    totals = await store.cache_totals()
                    return sum(c.requests for c in totals.values()) == 2 and totals
                await wait_until(stats_in, timeout=5)
                totals = await store.cache_totals()
        finally:
            await service.stop(0)
            await fleet.stop()
            await collector.stop(0)
            await store.close()
        return snap, totals, service.router.telemetry_dropped

    snap, totals, dropped = asyncio.run(main())
    counts = {k: round(r * snap.window_seconds) for k, r in zip(snap.keys, snap.rates)}
    assert counts == {"a": 20, "b": 10, "gen": 2}
    assert dropped == 0
    assert sum(c.prompt_tokens for c in totals.values()) == 128
    assert set(totals) <= {"e0", "e1"}
