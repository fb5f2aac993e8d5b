"""Plans above the gRPC message limit (issue 16, item 2): BuildPlan succeeds or changes
nothing, and the plan reaches dispatchers (WatchPlans chunks) and clients (GetPlan pages)."""

from __future__ import annotations

import asyncio
import time

import grpc

from cacheroute.v1 import common_pb2, planner_pb2 as pb, planner_pb2_grpc
from clients import AsyncCacheRouteClient
from services.dispatcher.service import DispatcherConfig, DispatcherService
from services.engine.fleet import EngineFleet
from services.model import parse_replicas
from services.planner.control import LoopConfig
from services.planner.service import PlannerConfig, PlannerService
from services.rpc import ServerConfig
from services.store import ArrivalRecord, RedisStore, TelemetryConfig

TOKEN = "big-plan-token"
AUTH = [("authorization", f"Bearer {TOKEN}")]
LIMIT = 256 * 1024               # a small message limit, so a few thousand keys exceed it
KEYS = 3000                      # 3000 x ~200-byte keys: ~0.65 MB of table
TELEMETRY = TelemetryConfig(bucket_seconds=1, retention_seconds=120)


def key(i: int) -> str:
    return f"k{i:05d}-" + "x" * 193


async def record_telemetry(redis_url: str) -> None:
    """Arrivals for KEYS keys of ~200 bytes (the planner reads its input from telemetry,
    as in the issue: explicit rates that large would not fit in the request either)."""
    store = RedisStore(redis_url, telemetry=TELEMETRY)
    now = time.time()
    try:
        rows = [ArrivalRecord(key(i), now - 1 - (j % 5), 10, 0) for i in range(KEYS) for j in range(1 + i % 3)]
        await store.record_arrivals("big", rows)
    finally:
        await store.close()


def planner_config(redis_url: str, replicas: tuple[str, ...]) -> PlannerConfig:
    loop = LoopConfig(replica_ids=replicas, q_cap=100_000.0, warm_slots=KEYS, planner_id="p-big", window_seconds=30)
    return PlannerConfig(server=ServerConfig(name="planner", port=0, metrics_port=-1, auth_token=TOKEN,
                                             max_message_bytes=LIMIT),
                         loop=loop, redis_url=redis_url, telemetry=TELEMETRY, auto=False, watch_poll_seconds=0.2,
                         repair=False)


def test_a_plan_above_the_message_limit_is_stored_activated_and_delivered_whole(redis_url):
    async def scenario():
        await record_telemetry(redis_url)
        fleet = await EngineFleet(2, time_scale=0.01).start()
        ids = tuple(f"e{i}" for i in range(2))
        planner = await PlannerService(planner_config(redis_url, ids)).start()
        replicas = parse_replicas(fleet.replicas_flag())
        dispatcher = await DispatcherService(DispatcherConfig(
            server=ServerConfig(name="dispatcher", port=0, metrics_port=-1, auth_token=TOKEN,
                                max_message_bytes=LIMIT),
            replicas=replicas, planner=planner.address, poll_interval=0.1, seed=1)).start()
        out = {}
        try:
            async with grpc.aio.insecure_channel(planner.address, options=[
                    ("grpc.max_receive_message_length", LIMIT)]) as ch:
                stub = planner_pb2_grpc.PlannerStub(ch)
                built = await stub.BuildPlan(pb.BuildPlanRequest(activate=True),
                                             metadata=AUTH, timeout=60)
                out["built"] = built
                out["status"] = await stub.GetStatus(pb.GetPlannerStatusRequest(), timeout=5)
                first = await stub.GetPlan(pb.GetPlanRequest(), timeout=10)
                out["first_page"] = (first.version, first.table_offset, len(first.table), first.table_size,
                                     first.ByteSize())
                # a caller that asks for small pages gets small pages
                small = await stub.GetPlan(pb.GetPlanRequest(version=first.version, table_offset=10,
                                                             max_bytes=32 * 1024), timeout=10)
                out["small_page"] = (small.table_offset, len(small.table), small.ByteSize(),
                                     small.table[0].key == first.table[10].key)
                watch = stub.WatchPlans(pb.WatchPlansRequest(include_table=True), timeout=10)
                chunks = []
                while not chunks or chunks[-1].plan.table_offset + len(chunks[-1].plan.table) < KEYS:
                    chunks.append(await watch.read())
                watch.cancel()
                out["chunks"] = [(c.active_version, c.event, c.plan.table_offset, len(c.plan.table), c.ByteSize())
                                 for c in chunks]
            async with AsyncCacheRouteClient(dispatcher.address, planner=planner.address, token=TOKEN,
                                             max_message_bytes=LIMIT) as client:
                whole = await client.get_plan(0, timeout=20)
                out["whole"] = (whole.version, len(whole.table), whole.table_size, {e.key for e in whole.table})
                deadline = time.monotonic() + 10
                while dispatcher.router.plan_version != built.plan.version and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                out["dispatcher"] = (dispatcher.router.plan_version, len(dispatcher.router.plan.table)
                                     if dispatcher.router.plan else 0, dispatcher.router.plan_source)
                out["route"] = await client.route(key(1234))
        finally:
            await dispatcher.stop(0)
            await planner.stop(0)
            await fleet.stop()
        return out

    out = asyncio.run(scenario())
    built = out["built"]
    version = built.plan.version
    assert built.activated and out["status"].active_version == version and out["status"].latest_version == version
    # the answer is the first slice, within the limit
    assert built.plan.table_size == KEYS and built.plan.table_offset == 0 and 0 < len(built.plan.table) < KEYS
    assert built.ByteSize() <= LIMIT and built.plan.admitted_keys == KEYS
    v, offset, n, size, nbytes = out["first_page"]
    assert (v, offset, size) == (version, 0, KEYS) and 0 < n < KEYS and nbytes <= LIMIT
    offset, n, nbytes, first_key = out["small_page"]
    assert offset == 10 and n > 0 and nbytes <= 32 * 1024 and first_key
    chunks = out["chunks"]
    assert len(chunks) >= 3
    assert {(c[0], c[1]) for c in chunks} == {(version, "initial")}
    assert [c[2] for c in chunks] == [sum(c[3] for c in chunks[:i]) for i in range(len(chunks))]
    assert all(c[4] <= LIMIT for c in chunks)
    assert out["whole"] == (version, KEYS, 0, {key(i) for i in range(KEYS)})
    assert out["dispatcher"] == (version, KEYS, "watch")
    assert out["route"].reason == common_pb2.ROUTE_REASON_PLANNED and out["route"].plan_version == version


def test_build_plan_that_cannot_activate_stores_nothing(redis_url):
    async def scenario():
        planner = await PlannerService(planner_config(redis_url, ("e0", "e1"))).start()
        store = RedisStore(redis_url, telemetry=TELEMETRY)
        try:
            async with grpc.aio.insecure_channel(planner.address) as ch:
                stub = planner_pb2_grpc.PlannerStub(ch)
                rates = [pb.KeyRate(key="a", rate=5.0), pb.KeyRate(key="b", rate=1.0)]
                v1 = (await stub.BuildPlan(pb.BuildPlanRequest(rates=rates, activate=True), metadata=AUTH,
                                           timeout=10)).plan.version
                before = await stub.GetStatus(pb.GetPlannerStatusRequest(), timeout=5)
                try:
                    await stub.BuildPlan(pb.BuildPlanRequest(rates=rates, activate=True, expected_active_version=v1 + 7),
                                         metadata=AUTH, timeout=10)
                    code = grpc.StatusCode.OK
                except grpc.aio.AioRpcError as err:
                    code, detail = err.code(), err.details()
                after = await stub.GetStatus(pb.GetPlannerStatusRequest(), timeout=5)
                listed = await stub.ListPlans(pb.ListPlansRequest(), timeout=5)
        finally:
            await store.close()
            await planner.stop(0)
        return v1, before, code, detail, after, listed

    v1, before, code, detail, after, listed = asyncio.run(scenario())
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "stale expected version" in detail
    assert (after.active_version, after.latest_version) == (before.active_version, before.latest_version) == (v1, v1)
    assert [p.version for p in listed.plans] == [v1]


def test_explicit_rates_above_the_message_limit_go_as_a_stream(redis_url):
    """BuildPlan refuses a request above the limit; the client then sends BuildPlanStream
    slices, and the planner builds from all of them; a malformed stream is refused."""
    rates = {key(i): 1.0 + i % 7 for i in range(KEYS)}           # ~0.65 MB of rates

    async def scenario():
        planner = await PlannerService(planner_config(redis_url, ("e0", "e1"))).start()
        out = {}
        try:
            async with grpc.aio.insecure_channel(planner.address, options=[
                    ("grpc.max_send_message_length", 8 << 20)]) as ch:
                stub = planner_pb2_grpc.PlannerStub(ch)
                whole = pb.BuildPlanRequest(rates=[pb.KeyRate(key=k, rate=v) for k, v in rates.items()])
                try:
                    await stub.BuildPlan(whole, metadata=AUTH, timeout=30)
                except grpc.aio.AioRpcError as err:
                    out["unary"] = err.code()
                bad = [pb.BuildPlanRequest(rates=[pb.KeyRate(key="a", rate=1.0)]),
                       pb.BuildPlanRequest(rates=[pb.KeyRate(key="b", rate=1.0)], activate=True)]
                try:
                    await stub.BuildPlanStream(iter(bad), metadata=AUTH, timeout=30)
                except grpc.aio.AioRpcError as err:
                    out["bad"] = (err.code(), err.details())
                try:
                    await stub.BuildPlanStream(iter(bad[:1]), timeout=30)
                except grpc.aio.AioRpcError as err:
                    out["no_token"] = err.code()
            async with AsyncCacheRouteClient(planner=planner.address, token=TOKEN, max_message_bytes=LIMIT) as client:
                built = await client.build_plan(rates, activate=True, timeout=60)
                out["built"] = (built.activated, built.plan.admitted_keys, len(built.plan.table),
                                {e.key: e.rate for e in built.plan.table})
        finally:
            await planner.stop(0)
        return out

    out = asyncio.run(scenario())
    assert out["unary"] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert out["bad"][0] == grpc.StatusCode.INVALID_ARGUMENT and "only the first message" in out["bad"][1]
    assert out["no_token"] == grpc.StatusCode.UNAUTHENTICATED
    activated, admitted, n, got = out["built"]
    assert activated and admitted == n == KEYS and got == rates


def test_build_requests_slice_within_the_budget():
    from clients.client import build_requests

    rates = {key(i): float(i) for i in range(KEYS)}
    reqs = build_requests(rates, 64 * 1024, activate=True, warm_slots=5)
    assert len(reqs) > 5 and all(r.ByteSize() <= 64 * 1024 for r in reqs)
    assert reqs[0].activate and reqs[0].warm_slots == 5 and all(not r.activate and not r.warm_slots for r in reqs[1:])
    assert [kr.key for r in reqs for kr in r.rates] == list(rates)
    (one,) = build_requests({"a": 1.0}, 64 * 1024)
    assert [kr.key for kr in one.rates] == ["a"]
