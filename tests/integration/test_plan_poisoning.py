"""Issue 16, item 1: traffic that never reaches an engine must not take over the plan.

The attack as reported: with the deployment token set, 25 RouteBatch calls of 9,000
requests over 300 made-up keys each (no Generate; here 3,000 per call, same shape) while 20 real tenants route and
generate at ~40/s; the next BuildPlan admitted only made-up keys. Here the same shape on
a real stack (Redis, collector, two engines, a dispatcher with API keys, the planner):
a caller without a key is refused, and one holding a valid key of its own (a compromised
tenant) is held to its per-caller telemetry budget, so the tenants stay admitted."""

from __future__ import annotations

import asyncio
import time

import grpc

from cacheroute.v1 import dispatcher_pb2, dispatcher_pb2_grpc, engine_pb2, planner_pb2 as pb, planner_pb2_grpc
from services.auth import KeyRing
from services.collector.service import CollectorConfig, CollectorService
from services.dispatcher.service import DispatcherConfig, DispatcherService
from services.model import parse_replicas
from services.engine.fleet import EngineFleet
from services.planner.service import PlannerConfig, PlannerService
from services.planner.control import LoopConfig
from services.rpc import ServerConfig
from services.store import RedisStore, TelemetryConfig
from tests.integration.test_dispatcher import wait_until

TOKEN = "deployment-token"
TENANTS = 20
CALLS, BATCH, FAKE_KEYS = 25, 3000, 300     # the 9,000 per call scaled down to keep the test fast
TELEMETRY = TelemetryConfig(bucket_seconds=1, retention_seconds=300)


def bearer(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


async def tenant(stub, i: int, stop: asyncio.Event, sent: list[int]) -> None:
    """One tenant at ~2 requests/s, alternating Route and a (served) Generate."""
    key, meta, n = f"tenant-{i:02d}", bearer(f"key-{i:02d}"), 0
    while not stop.is_set():
        if n % 2 == 0:
            await stub.Route(dispatcher_pb2.RouteRequest(key=key, prompt_tokens=400), metadata=meta, timeout=5)
        else:
            req = engine_pb2.GenerateRequest(prompt=f"tenant {i} asks something", max_tokens=1, key=key)
            _ = [c async for c in stub.Generate(req, metadata=meta, timeout=10)]
        n += 1
        sent[0] += 1
        await asyncio.sleep(0.5)


async def flood(stub, meta) -> list[str]:
    """The attack: CALLS RouteBatch calls, each BATCH requests over the same FAKE_KEYS made-up keys."""
    req = dispatcher_pb2.RouteBatchRequest(requests=[
        dispatcher_pb2.RouteRequest(key=f"made-up-{j % FAKE_KEYS:03d}", prompt_tokens=4000) for j in range(BATCH)])
    codes = []
    for _ in range(CALLS):
        try:
            await stub.RouteBatch(req, metadata=meta, timeout=30)
            codes.append("OK")
        except grpc.aio.AioRpcError as err:
            codes.append(err.code().name)
        await asyncio.sleep(0.02)
    return codes


def test_made_up_route_batches_do_not_displace_real_tenants(redis_url):
    async def scenario():
        def server(name: str) -> ServerConfig:
            return ServerConfig(name=name, port=0, metrics_port=-1, auth_token=TOKEN)
        collector = await CollectorService(CollectorConfig(server=server("collector"), redis_url=redis_url,
                                                           telemetry=TELEMETRY, window_seconds=60)).start()
        fleet = await EngineFleet(2, time_scale=0.01).start()
        loop = LoopConfig(replica_ids=tuple(fleet.ids), q_cap=50.0, warm_slots=16, window_seconds=60,
                          planner_id="p")
        planner = await PlannerService(PlannerConfig(server=server("planner"), loop=loop, redis_url=redis_url,
                                                     telemetry=TELEMETRY, auto=False, repair=False)).start()
        keys = {f"key-{i:02d}": f"t{i:02d}" for i in range(TENANTS)} | {"key-mallory": "mallory"}
        dispatcher = await DispatcherService(DispatcherConfig(
            server=server("dispatcher"), replicas=parse_replicas(fleet.replicas_flag()), collector=collector.address,
            telemetry_interval=0.1, poll_interval=0.25, poll_timeout=1.0, seed=3, keyring=KeyRing(keys))).start()
        out = {}
        try:
            async with grpc.aio.insecure_channel(dispatcher.address) as ch, \
                    grpc.aio.insecure_channel(planner.address) as pch:
                stub = dispatcher_pb2_grpc.DispatcherStub(ch)
                sent, stop = [0], asyncio.Event()
                tenants = [asyncio.create_task(tenant(stub, i, stop, sent)) for i in range(TENANTS)]
                await asyncio.sleep(1.0)
                out["no_key"] = await flood(stub, None)                       # an outsider
                out["wrong_key"] = await flood(stub, bearer("guess"))
                started = time.monotonic()
                out["mallory"] = await flood(stub, bearer("key-mallory"))     # a tenant's valid key
                out["flood_seconds"] = time.monotonic() - started
                await asyncio.sleep(4.0)            # the tenants go on (in the issue they ran all along)
                stop.set()
                await asyncio.gather(*tenants)
                out["tenant_requests"] = sent[0]
                # the last telemetry flush: the dispatcher's buffer and the collector's queue both
                # empty at two polls 0.1 s apart (a deadline, not a fixed sleep: a loaded machine waits longer)
                async def flushed():
                    return not dispatcher.router.telemetry and collector.ingestor.queue.qsize() == 0
                await wait_until(flushed, timeout=15, step=0.1)
                await asyncio.sleep(0.1)
                await wait_until(flushed, timeout=15, step=0.1)
                built = await planner_pb2_grpc.PlannerStub(pch).BuildPlan(pb.BuildPlanRequest(), metadata=bearer(TOKEN),
                                                                          timeout=30)
                out["admitted"] = {e.key for e in built.plan.table}
                out["capped"] = dispatcher.router.telemetry_capped
                store = RedisStore(redis_url, telemetry=TELEMETRY)
                try:
                    snap = await store.window_rates(time.time(), 60)
                finally:
                    await store.close()
                out["counts"] = {k: round(r * snap.window_seconds) for k, r in zip(snap.keys, snap.rates)}
        finally:
            await dispatcher.stop(0)
            await planner.stop(0)
            await fleet.stop()
            await collector.stop(0)
        return out

    out = asyncio.run(scenario())
    assert set(out["no_key"]) == {"UNAUTHENTICATED"} and set(out["wrong_key"]) == {"PERMISSION_DENIED"}
    assert set(out["mallory"]) == {"OK"}                       # routed: a decision is never refused
    tenants = {f"tenant-{i:02d}" for i in range(TENANTS)}
    fake = {k: n for k, n in out["counts"].items() if k.startswith("made-up-")}
    print(f"FIGURES tenant requests {out['tenant_requests']}, flood {out['flood_seconds']:.2f} s, "
          f"made-up arrivals counted {sum(fake.values())} of {CALLS * BATCH} (max {max(fake.values(), default=0)} "
          f"per key), tenant minimum {min(out['counts'].get(t, 0) for t in tenants)}, admitted {len(out['admitted'])}")
    assert out["tenant_requests"] >= TENANTS * 2 * (out["flood_seconds"] + 5) * 0.5   # ~2/s each, slower while flooded
    assert tenants <= out["admitted"], sorted(tenants - out["admitted"])
    # mallory's 75,000 decisions added at most its budget (burst 200 + 100/s) to the telemetry
    assert sum(fake.values()) <= 200 + 100 * (out["flood_seconds"] + 1)
    assert out["capped"] >= CALLS * BATCH - sum(fake.values())
    assert min(out["counts"][t] for t in tenants) > max(fake.values(), default=0)


def test_the_data_plane_needs_a_key_or_the_token_when_the_deployment_has_one():
    async def scenario():
        fleet = await EngineFleet(1, time_scale=0.01).start()
        dispatcher = await DispatcherService(DispatcherConfig(
            server=ServerConfig(name="dispatcher", port=0, metrics_port=-1, auth_token=TOKEN),
            replicas=parse_replicas(fleet.replicas_flag()), poll_interval=0.1, seed=1,
            keyring=KeyRing({"key-00": "t00"}))).start()
        out = {}
        try:
            async with grpc.aio.insecure_channel(dispatcher.address) as ch:
                stub = dispatcher_pb2_grpc.DispatcherStub(ch)
                deadline = time.monotonic() + 5
                while not dispatcher.router.state.healthy[0] and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                calls = {
                    "Route": lambda m: stub.Route(dispatcher_pb2.RouteRequest(key="k"), metadata=m, timeout=5),
                    "RouteBatch": lambda m: stub.RouteBatch(dispatcher_pb2.RouteBatchRequest(
                        requests=[dispatcher_pb2.RouteRequest(key="k")]), metadata=m, timeout=5),
                    "Generate": lambda m: stub.Generate(engine_pb2.GenerateRequest(prompt="hi", max_tokens=1),
                                                        metadata=m, timeout=5).read(),
                }
                for name, call in calls.items():
                    for label, meta in (("none", None), ("wrong", bearer("nope")), ("basic", [("authorization", "Basic a")]),
                                        ("tenant", bearer("key-00")), ("token", bearer(TOKEN))):
                        try:
                            await call(meta)
                            out[name, label] = "OK"
                        except grpc.aio.AioRpcError as err:
                            out[name, label] = err.code().name
                out["status"] = (await stub.GetStatus(dispatcher_pb2.GetDispatcherStatusRequest(), timeout=5)).dispatcher_id
        finally:
            await dispatcher.stop(0)
            await fleet.stop()
        return out, dispatcher.router.routed

    out, routed = asyncio.run(scenario())
    for name in ("Route", "RouteBatch", "Generate"):
        assert (out[name, "none"], out[name, "wrong"], out[name, "basic"]) == (
            "UNAUTHENTICATED", "PERMISSION_DENIED", "PERMISSION_DENIED"), name
        assert out[name, "tenant"] == out[name, "token"] == "OK", name
    assert out["status"] == "dispatcher-0"        # status stays open
    assert routed == 6                            # refused calls routed nothing
