"""The data plane with the real control plane: telemetry into a real collector (and Redis),
plans pushed by a real planner."""

from __future__ import annotations

import asyncio
import time

import grpc

from cacheroute.v1 import dispatcher_pb2, dispatcher_pb2_grpc, engine_pb2
from services.collector.service import CollectorConfig
from services.collector.service import serve as serve_collector
from services.engine.fleet import EngineFleet
from services.rpc import ServerConfig
from services.store import RedisStore
from tests.integration.test_dispatcher import dispatcher_config, wait_until
from services.dispatcher.service import serve


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


def test_plans_pushed_by_a_real_planner_and_redis_fallback_when_it_goes(redis_url):
    from cacheroute.v1 import common_pb2
    from clients import AsyncCacheRouteClient
    from services.planner.service import PlannerConfig
    from services.planner.service import serve as serve_planner
    from services.planner.control import LoopConfig
    from services.store import Mode

    async def main():
        fleet = await EngineFleet(3, time_scale=0.01).start()
        loop = LoopConfig(replica_ids=tuple(fleet.ids), q_cap=10.0, warm_slots=2, planner_id="p1")
        planner = await serve_planner(PlannerConfig(server=ServerConfig(name="planner", port=0), loop=loop,
                                                    redis_url=redis_url, auto=False, watch_poll_seconds=0.2))
        service = await serve(dispatcher_config(fleet, planner=planner.address, redis_url=redis_url))
        store = RedisStore(redis_url)
        out = {}
        try:
            async with AsyncCacheRouteClient(service.address, planner=planner.address) as client:
                out["before"] = await client.route("hot")
                built = await client.build_plan({"hot": 25.0, "warm": 5.0, "mild": 1.0}, activate=True)
                version = built.plan.version
                members = {fleet.ids[i] for e in built.plan.table if e.key == "hot" for i in e.replicas}
                out["push"] = await wait_until(lambda: service.router.plan_version == version, timeout=10)
                out["planned"] = [await client.route("hot") for _ in range(6)]
                out["members"] = members
                out["source"] = service.router.plan_source
                await client.set_mode("flat", reason="test")
                out["flat_push"] = await wait_until(lambda: service.router.flat, timeout=10)
                out["flat"] = await client.route("hot")
                await planner.stop(0)
                await store.set_mode(Mode.PLANNED, reason="planner gone", now=time.time())
                out["redis"] = await wait_until(lambda: service.router.plan_source == "redis" and not service.router.flat,
                                                timeout=5)
                out["after"] = await client.route("hot")
        finally:
            await service.stop(0)
            await planner.stop(0)
            await fleet.stop()
            await store.close()
        return out, version

    out, version = asyncio.run(main())
    assert out["before"].reason == common_pb2.ROUTE_REASON_COLD and out["before"].plan_version == 0
    # pushed: the source says so; the seconds only bound it loosely (a loaded machine is slower)
    assert out["push"] < 3.0 and out["source"] == "watch"
    assert all(d.reason == common_pb2.ROUTE_REASON_PLANNED and d.plan_version == version for d in out["planned"])
    assert {d.replica_id for d in out["planned"]} == out["members"] and len(out["members"]) == 3   # k_b = ceil(25/10)
    assert out["flat_push"] < 3.0 and out["flat"].reason == common_pb2.ROUTE_REASON_FALLBACK
    assert out["after"].reason == common_pb2.ROUTE_REASON_PLANNED and out["after"].plan_version == version
