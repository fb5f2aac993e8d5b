"""Planner service on a real redis-server and real gRPC servers (127.0.0.1, port 0)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cacheroute.v1 import common_pb2, planner_pb2 as pb, planner_pb2_grpc
from services.core.plan import SwitchDecision
from services.local.redis_server import RedisProcess
from services.planner.__main__ import config_from_args, build_parser, main
from services.planner.control import LoopConfig
from services.planner.service import PlannerConfig, PlannerService
from services.rpc import ServerConfig
from services.store import ArrivalRecord, RedisStore, TelemetryConfig

TOKEN = "s3cret"
AUTH = [("authorization", f"Bearer {TOKEN}")]
REPLICAS = ("r0", "r1", "r2", "r3")
TELEMETRY = TelemetryConfig(bucket_seconds=1, retention_seconds=120)


def config(redis_url: str, *, auto: bool = False, planner_id: str = "p1", lease_ttl: float = 15.0,
           interval: float = 30.0, token: str | None = TOKEN) -> PlannerConfig:
    loop = LoopConfig(replica_ids=REPLICAS, q_cap=10.0, warm_slots=2, interval=interval, window_seconds=10.0,
                      planner_id=planner_id, lease_ttl=lease_ttl)
    return PlannerConfig(server=ServerConfig(name="planner", port=0, metrics_port=-1, auth_token=token), loop=loop,
                         redis_url=redis_url, telemetry=TELEMETRY, auto=auto, watch_poll_seconds=0.2)


async def with_planner(cfg: PlannerConfig, scenario):
    service = await PlannerService(cfg).start()
    try:
        async with grpc.aio.insecure_channel(service.address) as ch:
            return await scenario(planner_pb2_grpc.PlannerStub(ch), ch, service)
    finally:
        await service.stop(0)


def rates(**kv) -> list[pb.KeyRate]:
    return [pb.KeyRate(key=k, rate=v, prefix_tokens=1000) for k, v in kv.items()]


async def code_of(call) -> grpc.StatusCode:
    try:
        await call
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as err:
        return err.code()


def test_build_activate_watch_rollback(redis_url):
    async def scenario(stub, ch, service):
        out = {}
        out["unauth"] = await code_of(stub.BuildPlan(pb.BuildPlanRequest(rates=rates(a=5)), timeout=5))
        b1 = await stub.BuildPlan(pb.BuildPlanRequest(rates=rates(a=25, b=8, c=3, d=1), activate=True), metadata=AUTH, timeout=5)
        b2 = await stub.BuildPlan(pb.BuildPlanRequest(rates=rates(a=1, b=2, c=30, e=9)), metadata=AUTH, timeout=5)
        out["b1"], out["b2"] = b1, b2
        watch = stub.WatchPlans(pb.WatchPlansRequest(include_table=True), timeout=10)
        out["initial"] = await watch.read()
        started = time.monotonic()
        out["activate"] = await stub.ActivatePlan(pb.ActivatePlanRequest(version=b2.plan.version,
                                                                         expected_active_version=b1.plan.version),
                                                  metadata=AUTH, timeout=5)
        out["pushed"] = await watch.read()
        out["push_seconds"] = time.monotonic() - started
        out["diff"] = await stub.DiffPlans(pb.DiffPlansRequest(from_version=b1.plan.version), timeout=5)
        out["rollback"] = await stub.Rollback(pb.RollbackRequest(expected_active_version=b2.plan.version),
                                              metadata=AUTH, timeout=5)
        out["rolled"] = await watch.read()
        out["list"] = await stub.ListPlans(pb.ListPlansRequest(), timeout=5)
        out["get0"] = await stub.GetPlan(pb.GetPlanRequest(summary_only=True), timeout=5)
        out["missing"] = await code_of(stub.GetPlan(pb.GetPlanRequest(version=999), timeout=5))
        out["stale"] = await code_of(stub.ActivatePlan(pb.ActivatePlanRequest(version=b2.plan.version, expected_active_version=b2.plan.version), metadata=AUTH, timeout=5))
        out["unknown"] = await code_of(stub.ActivatePlan(pb.ActivatePlanRequest(version=999, expected_active_version=b1.plan.version), metadata=AUTH, timeout=5))
        out["bad_rate"] = await code_of(stub.BuildPlan(pb.BuildPlanRequest(rates=rates(a=float("nan"))), metadata=AUTH, timeout=5))
        out["dup_key"] = await code_of(stub.BuildPlan(pb.BuildPlanRequest(rates=rates(a=1) + rates(a=2)), metadata=AUTH, timeout=5))
        out["no_telemetry"] = await code_of(stub.BuildPlan(pb.BuildPlanRequest(), metadata=AUTH, timeout=5))
        watch.cancel()
        return out

    o = asyncio.run(with_planner(config(redis_url), scenario))
    assert o["unauth"] == grpc.StatusCode.UNAUTHENTICATED
    b1, b2 = o["b1"], o["b2"]
    assert b1.activated and (b1.plan.version, b2.plan.version) == (1, 2)
    assert len(b1.plan.table[0].replicas) == 3          # a: 25 req/s at q_cap 10 -> k = 3
    assert b2.plan.parent_version == 1 and b2.plan.has_parent
    assert (o["initial"].event, o["initial"].active_version, len(o["initial"].plan.table)) == ("initial", 1, b1.plan.admitted_keys)
    assert o["activate"].active_version == 2 and o["activate"].previous_version == 1
    assert (o["pushed"].event, o["pushed"].active_version) == ("activate", 2) and o["push_seconds"] < 1.0
    assert o["diff"].keys_added >= 1 and 0 < o["diff"].churn <= 1
    assert o["rollback"].active_version == 1 and (o["rolled"].event, o["rolled"].active_version) == ("rollback", 1)
    assert [p.version for p in o["list"].plans] == [2, 1] and o["list"].plans[1].active and o["list"].active_version == 1
    assert o["get0"].version == 1 and not o["get0"].table
    assert o["missing"] == grpc.StatusCode.NOT_FOUND
    assert o["stale"] == grpc.StatusCode.FAILED_PRECONDITION and o["unknown"] == grpc.StatusCode.NOT_FOUND
    assert o["bad_rate"] == o["dup_key"] == grpc.StatusCode.INVALID_ARGUMENT
    assert o["no_telemetry"] == grpc.StatusCode.FAILED_PRECONDITION


def test_concurrent_activations_exactly_one_wins(redis_url):
    async def scenario(stub, ch, service):
        versions = []
        for keys in ({"a": 5.0}, {"b": 5.0}, {"c": 5.0}):
            versions.append((await stub.BuildPlan(pb.BuildPlanRequest(rates=rates(**keys)), metadata=AUTH, timeout=5)).plan.version)
        await stub.ActivatePlan(pb.ActivatePlanRequest(version=versions[0]), metadata=AUTH, timeout=5)
        calls = [stub.ActivatePlan(pb.ActivatePlanRequest(version=v, expected_active_version=versions[0]), metadata=AUTH, timeout=5)
                 for v in versions[1:] * 4]
        codes = await asyncio.gather(*(code_of(c) for c in calls))
        return codes, (await stub.GetStatus(pb.GetPlannerStatusRequest(), timeout=5)).active_version, versions

    codes, active, versions = asyncio.run(with_planner(config(redis_url), scenario))
    assert codes.count(grpc.StatusCode.OK) == 1
    assert codes.count(grpc.StatusCode.FAILED_PRECONDITION) == 7
    assert active in versions[1:]


def test_mode_and_pin_are_pushed_and_respected(redis_url):
    async def scenario(stub, ch, service):
        b = await stub.BuildPlan(pb.BuildPlanRequest(rates=rates(a=5, b=4), activate=True), metadata=AUTH, timeout=5)
        watch = stub.WatchPlans(pb.WatchPlansRequest(known_version=b.plan.version), timeout=10)
        await asyncio.sleep(0.1)
        flat = await stub.SetMode(pb.SetModeRequest(mode=common_pb2.MODE_FLAT, reason="p99 out of range"), metadata=AUTH, timeout=5)
        update = await watch.read()                                       # no initial push: known_version
        pinned = await stub.PinPlan(pb.PinPlanRequest(), metadata=AUTH, timeout=5)
        other = await stub.BuildPlan(pb.BuildPlanRequest(rates=rates(c=5)), metadata=AUTH, timeout=5)
        refused = await code_of(stub.ActivatePlan(pb.ActivatePlanRequest(version=other.plan.version, expected_active_version=b.plan.version), metadata=AUTH, timeout=5))
        unpinned = await stub.UnpinPlan(pb.UnpinPlanRequest(), metadata=AUTH, timeout=5)
        bad_mode = await code_of(stub.SetMode(pb.SetModeRequest(), metadata=AUTH, timeout=5))
        status = await stub.GetStatus(pb.GetPlannerStatusRequest(), timeout=5)
        watch.cancel()
        return flat, update, pinned, refused, unpinned, bad_mode, status

    flat, update, pinned, refused, unpinned, bad_mode, status = asyncio.run(with_planner(config(redis_url), scenario))
    assert flat.mode == common_pb2.MODE_FLAT
    assert (update.event, update.mode) == ("mode", common_pb2.MODE_FLAT)
    assert pinned.pinned_version == 1 and refused == grpc.StatusCode.FAILED_PRECONDITION and unpinned.pinned_version == 0
    assert bad_mode == grpc.StatusCode.INVALID_ARGUMENT
    assert status.mode_reason == "p99 out of range" and status.latest_version == 2 and not status.leader


async def feed(store: RedisStore, now: float, key_rates: dict[str, float], seconds: int = 10) -> None:
    arrivals = [ArrivalRecord(k, now - seconds + i / r, 2000, 1500) for k, r in key_rates.items()
                for i in range(int(r * seconds))]
    await store.record_arrivals(f"feed-{now}", arrivals)


def test_control_loop_plans_from_telemetry_and_hands_over_the_lease(redis_url):
    async def scenario():
        store = RedisStore(redis_url, telemetry=TELEMETRY)
        await feed(store, time.time(), {"hot": 30.0, "warm": 8.0, "cool": 2.0})
        a = await PlannerService(config(redis_url, auto=True, planner_id="A", lease_ttl=0.6, interval=0.2)).start()
        await wait_for(lambda: a.loop.leader)
        b = await PlannerService(config(redis_url, auto=True, planner_id="B", lease_ttl=0.6, interval=0.2)).start()
        try:
            await wait_for(lambda: a.loop.status().last_outcome.startswith("switched"))
            state, plan = await store.get_active_plan()
            out = {"first": plan, "b_leader_while_a": b.loop.leader, "a_token": a.loop.status().token}
            await a.loop.stop(release=False)                       # A "crashes": its lease must expire
            started = time.monotonic()
            await wait_for(lambda: b.loop.leader, timeout=3)
            out["takeover_seconds"] = time.monotonic() - started
            out["b_token"] = b.loop.status().token
            await b.loop.stop(release=False)                       # freeze B so its own loop cannot race us
            state = await store.get_control()
            candidate = dataclasses.replace(plan, version=await store.next_version(), parent_version=plan.version,
                                            decision=SwitchDecision(True, "test"))
            await store.put_plan(candidate)
            # the deposed leader A still believes in its token and tries to activate
            out["deposed"] = await a.loop.apply_decision(candidate, state.active_version, out["a_token"], time.time())
            out["active_after"] = (await store.get_control()).active_version
            out["active_before"] = state.active_version
            out["b_wins"] = await b.loop.apply_decision(candidate, state.active_version, out["b_token"], time.time())
            return out
        finally:
            await b.stop(0)
            await a.stop(0)
            await store.close()

    o = asyncio.run(scenario())
    plan = o["first"]
    assert dict(plan.table).keys() == {"hot", "warm", "cool"} and len(plan.table["hot"]) == 3
    assert plan.decision is not None and plan.decision.switch and plan.rates_snapshot_id
    assert o["b_leader_while_a"] is False
    assert o["takeover_seconds"] < 1.5 and o["b_token"] > o["a_token"]
    assert o["deposed"].startswith("refused: deposed") and o["active_after"] == o["active_before"]
    assert o["b_wins"].startswith("switched")


async def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def test_redis_outage_gives_unavailable_and_the_planner_stays_up():
    async def scenario(server):
        cfg = config(server.url, auto=True, interval=0.2)
        service = await PlannerService(cfg).start()
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = planner_pb2_grpc.PlannerStub(ch)
                health = health_pb2_grpc.HealthStub(ch)
                await stub.BuildPlan(pb.BuildPlanRequest(rates=rates(a=3), activate=True), metadata=AUTH, timeout=5)
                server.stop()
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.GetPlan(pb.GetPlanRequest(version=0), timeout=5)
                down = (err.value.code(), err.value.details())
                await asyncio.sleep(0.5)                                # the loop keeps failing, and survives
                serving = (await health.Check(health_pb2.HealthCheckRequest(service="cacheroute.v1.Planner"), timeout=2)).status
                server.start()
                status = await stub.GetStatus(pb.GetPlannerStatusRequest(), timeout=5)
                return down, serving, status
        finally:
            await service.stop(0)

    with RedisProcess(appendonly=True) as server:
        (code, details), serving, status = asyncio.run(scenario(server))
    assert code == grpc.StatusCode.UNAVAILABLE and details.startswith("redis unavailable at 127.0.0.1:")
    assert serving == health_pb2.HealthCheckResponse.SERVING
    assert status.active_version == 1          # appendonly: the plan survived the restart


def test_flags_and_env(monkeypatch):
    monkeypatch.setenv("CACHEROUTE_REPLICAS", "a=127.0.0.1:1,b=127.0.0.1:2")
    cfg = config_from_args(build_parser().parse_args(["--q-cap", "12", "--interval", "5"]))
    assert cfg.loop.replica_ids == ("a", "b") and cfg.loop.q_cap == 12 and cfg.loop.interval == 5
    monkeypatch.delenv("CACHEROUTE_REPLICAS")
    assert main(["--port", "0"]) == 2                                   # no replicas: one-line error
