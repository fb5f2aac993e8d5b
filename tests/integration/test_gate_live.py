"""Shadow gate in the live planner: real redis-server, real planner (gRPC on 127.0.0.1:0), the
replay in its worker process. Telemetry is written to the store the way the collector writes it,
at times on a clock the test controls, so a minute of traffic costs no minute of waiting."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import threading

import grpc

from cacheroute.v1 import planner_pb2 as pb, planner_pb2_grpc
from services.core.planning import build_plan
from services.core.workloads import make_workload
from services.planner.control import LoopConfig
from services.planner.gate import GateConfig, guard
from services.planner.service import PlannerConfig, PlannerService
from services.rpc import ServerConfig
from services.store import ArrivalRecord, Mode, RedisStore, TelemetryConfig

TOKEN = "gate-token"
AUTH = [("authorization", f"Bearer {TOKEN}")]
REPLICAS = ("r0", "r1", "r2", "r3")
TELEMETRY = TelemetryConfig(bucket_seconds=1, retention_seconds=900)
T0 = 1_800_000_000.0
# 24 keys with ~3.5k-token prefixes on 4 replicas of 40k cached tokens (kv_blocks 2,500): Flat-LB
# cannot keep every prefix everywhere, a plan can (the fixture of tests/unit/test_shadow.py)
GATE = GateConfig(enabled=True, margin=0.10, window_seconds=60, profile="llama3-8b-h100", kv_blocks=2500,
                  slo_p99=1.5, timeout=25, max_requests=800, load_scales=(1.0, 2.0, 3.0))


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def good_traffic(start: float, seed: int = 0) -> list[ArrivalRecord]:
    """A minute of the paper workload's top 24 keys at 24 req/s: affinity pays."""
    wl = make_workload("paper", qps=24, duration=60, seed=seed, active_set=24)
    return [ArrivalRecord(q.key, start + q.arrival, q.prompt_tokens, q.prefix_tokens) for q in wl.requests]


def low_reuse_traffic(start: float, keys: int = 200, qps: float = 24, seed: int = 1) -> list[ArrivalRecord]:
    """A minute of 200 keys without any shared prefix: a plan cannot beat Flat-LB."""
    rng, t, out = random.Random(seed), start, []
    while t < start + 60:
        t += rng.expovariate(qps)
        out.append(ArrivalRecord(f"lr{rng.randrange(keys)}", t, 3500, 0))
    return out


async def record(redis_url: str, records: list[ArrivalRecord], batch: str) -> None:
    store = RedisStore(redis_url, telemetry=TELEMETRY)
    try:
        await store.record_arrivals(batch, records)
    finally:
        await store.close()


def planner_config(redis_url: str, clock: Clock, *, auto: bool, gate: GateConfig = GATE) -> PlannerConfig:
    loop = LoopConfig(replica_ids=REPLICAS, q_cap=4.0, warm_slots=8, interval=3600, window_seconds=60,
                      planner_id="gate-test")
    return PlannerConfig(server=ServerConfig(name="planner", port=0, auth_token=TOKEN), loop=loop,
                         redis_url=redis_url, telemetry=TELEMETRY, auto=auto, watch_poll_seconds=0.2, gate=gate,
                         clock=clock)


async def code_of(call) -> grpc.StatusCode:
    try:
        await call
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as err:
        return err.code()


def test_build_plan_with_shadow_stores_the_report_and_shadow_plan_replays_on_demand(redis_url):
    clock = Clock(T0 + 61)
    traffic = good_traffic(T0)

    async def main():
        await record(redis_url, traffic, "good")
        service = await PlannerService(planner_config(redis_url, clock, auto=False)).start()
        out = {}
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = planner_pb2_grpc.PlannerStub(ch)
                built = await stub.BuildPlan(pb.BuildPlanRequest(shadow=True, activate=True), metadata=AUTH, timeout=60)
                out["built"] = built
                out["got"] = await stub.GetPlan(pb.GetPlanRequest(summary_only=True), timeout=5)
                # a plan that pins every key on one replica, stored directly: the gate must refuse it
                good = service.store
                plan = await good.get_plan(built.plan.version)
                bad = dataclasses.replace(plan, version=await good.next_version(), parent_version=plan.version,
                                          table={k: (0,) for k in plan.table}, shadow=None, decision=None)
                await good.put_plan(bad)
                out["bad"] = await stub.ShadowPlan(pb.ShadowPlanRequest(version=bad.version), metadata=AUTH, timeout=60)
                out["again"] = await stub.ShadowPlan(pb.ShadowPlanRequest(), metadata=AUTH, timeout=60)
                out["unauth"] = await code_of(stub.ShadowPlan(pb.ShadowPlanRequest(), timeout=5))
                out["bad_window"] = await code_of(stub.ShadowPlan(pb.ShadowPlanRequest(window_seconds=float("nan")),
                                                                  metadata=AUTH, timeout=5))
                out["status"] = await stub.GetStatus(pb.GetPlannerStatusRequest(), timeout=5)
                # gated BuildPlan on traffic where a plan cannot help: stored with its report, not activated
                clock.now = T0 + 400
                await record(redis_url, low_reuse_traffic(T0 + 339), "low")
                out["refused"] = await stub.BuildPlan(pb.BuildPlanRequest(shadow=True, activate=True,
                                                                          expected_active_version=built.plan.version),
                                                      metadata=AUTH, timeout=60)
                out["active_after"] = (await stub.GetStatus(pb.GetPlannerStatusRequest(), timeout=5)).active_version
        finally:
            await service.stop(0)
        return out

    out = asyncio.run(main())
    built = out["built"]
    s = built.plan.shadow
    print(f"gate: p99 {s.candidate_ttft_p99:.3f}s vs flat {s.flat_ttft_p99:.3f}s, capacity {s.candidate_capacity:.3g} "
          f"vs {s.flat_capacity:.3g} qps, hit {s.candidate_hit_rate:.2f} vs {s.flat_hit_rate:.2f}")
    assert built.activated and built.plan.shadow.ran and built.plan.shadow.passed, built.plan.shadow.reason
    s = built.plan.shadow
    assert s.requests == 800 and s.active_keys == 24
    assert s.candidate_ttft_p99 <= s.flat_ttft_p99 * 0.9 or s.candidate_capacity >= s.flat_capacity * 1.1
    assert s.candidate_hit_rate > s.flat_hit_rate
    assert out["got"].shadow == s                                        # stored on the version
    assert out["bad"].ran and not out["bad"].passed and out["bad"].candidate_ttft_p99 > out["bad"].flat_ttft_p99
    assert out["again"].ran and out["again"].passed                      # version 0: the active one
    assert out["unauth"] == grpc.StatusCode.UNAUTHENTICATED
    assert out["bad_window"] == grpc.StatusCode.INVALID_ARGUMENT
    assert out["status"].active_version == built.plan.version
    refused = out["refused"]
    assert not refused.activated and refused.plan.shadow.ran and not refused.plan.shadow.passed
    assert "neither p99 nor capacity" in refused.plan.shadow.reason
    assert out["active_after"] == built.plan.version


def test_plans_show_prints_the_shadow_figures(redis_url, capsys):
    from clients.cli import main as cli_main

    clock = Clock(T0 + 61)
    holder: dict = {}
    ready = threading.Event()

    def serve() -> None:
        async def body():
            await record(redis_url, good_traffic(T0), "good")
            service = await PlannerService(planner_config(redis_url, clock, auto=False)).start()
            async with grpc.aio.insecure_channel(service.address) as ch:
                await planner_pb2_grpc.PlannerStub(ch).BuildPlan(pb.BuildPlanRequest(shadow=True, activate=True),
                                                                 metadata=AUTH, timeout=60)
            holder.update(address=service.address, loop=asyncio.get_running_loop(), stop=asyncio.Event())
            ready.set()
            await holder["stop"].wait()
            await service.stop(0)

        asyncio.run(body())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert ready.wait(60)
        code = cli_main(["plans", "show", "0", "--planner", holder["address"]])
        shown = json.loads(capsys.readouterr().out)
    finally:
        if "loop" in holder:
            holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(15)
    assert code == 0
    assert shown["shadow"]["ran"] and shown["shadow"]["passed"] and shown["shadow"]["active_keys"] == 24
    assert shown["shadow"]["candidate_ttft_p99"] < shown["shadow"]["flat_ttft_p99"]


def test_a_replay_that_overruns_its_time_bound_fails_the_gate_and_rpcs_stay_responsive(redis_url):
    clock = Clock(T0 + 61)
    # three minutes of traffic (4,320 records, ~3 s of replay) cut at 1 s: an event loop blocked
    # by the replay would stall GetStatus for that second
    slow = dataclasses.replace(GATE, timeout=1.0, window_seconds=180, max_requests=5000,
                               load_scales=(1.0, 1.5, 2.0, 3.0, 4.0))
    traffic = good_traffic(T0 - 120, seed=3) + good_traffic(T0 - 60, seed=4) + good_traffic(T0)

    async def main():
        await record(redis_url, traffic, "good")
        service = await PlannerService(planner_config(redis_url, clock, auto=False, gate=slow)).start()
        try:
            await service.gate.warm_up()
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = planner_pb2_grpc.PlannerStub(ch)
                loop = asyncio.get_running_loop()
                idle = []
                for _ in range(12):
                    started = loop.time()
                    await stub.GetStatus(pb.GetPlannerStatusRequest(), timeout=5)
                    idle.append(loop.time() - started)
                call = asyncio.ensure_future(stub.BuildPlan(pb.BuildPlanRequest(shadow=True, activate=True),
                                                            metadata=AUTH, timeout=30))
                latencies = []
                while not call.done():
                    started = loop.time()
                    await stub.GetStatus(pb.GetPlannerStatusRequest(), timeout=5)
                    latencies.append(loop.time() - started)
                    await asyncio.sleep(0.02)
                built = await call
                # the worker was killed; the next replay gets a fresh one
                again = await stub.ShadowPlan(pb.ShadowPlanRequest(version=built.plan.version), metadata=AUTH,
                                              timeout=30)
        finally:
            await service.stop(0)
        return built, latencies, again, idle

    built, latencies, again, idle = asyncio.run(main())
    print(f"GetStatus during an overrunning replay: {len(latencies)} calls, median "
          f"{sorted(latencies)[len(latencies) // 2] * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms; idle median "
          f"{sorted(idle)[6] * 1000:.1f} ms, max {max(idle) * 1000:.1f} ms")
    assert not built.activated and not built.plan.shadow.passed
    assert "did not finish within 1s" in built.plan.shadow.reason
    assert len(latencies) >= 10 and max(latencies) < 0.5
    assert not again.passed and "did not finish" in again.reason


def test_guard_rule_table():
    base = dict(gate_reason="r", switch=True, switch_reason="switch: s", mode=Mode.PLANNED, mode_reason="",
                has_active=True, pinned=False, check=("planned", "inside"))
    assert guard(passed=True, **base).activate
    assert not guard(passed=True, **{**base, "switch": False}).activate              # the switching rule keeps
    assert not guard(passed=False, **base).activate and guard(passed=False, **base).mode is None
    out = guard(passed=False, **{**base, "check": ("flat", "active keys 200 outside 16..36")})
    assert out.mode == Mode.FLAT and out.reason.startswith("auto-fallback: active keys 200")
    out = guard(passed=True, **{**base, "check": ("flat", "keys out")})
    assert out.activate and out.mode is None                                          # a fresh validated plan
    flat = {**base, "mode": Mode.FLAT, "mode_reason": "auto-fallback: keys out"}
    assert guard(passed=True, **flat).mode == Mode.PLANNED and guard(passed=True, **flat).activate
    assert not guard(passed=False, **flat).activate
    manual = {**base, "mode": Mode.FLAT, "mode_reason": "operator"}
    assert not guard(passed=True, **manual).activate and guard(passed=True, **manual).mode is None
    assert not guard(passed=True, **{**base, "pinned": True}).activate
    assert guard(passed=True, **{**base, "has_active": False, "check": None}).activate
    assert not guard(passed=False, **{**base, "has_active": False, "check": None}).activate


def test_plan_for_traffic_helper_is_sound():
    # the fixture's premise: the good traffic has 24 keys, the low-reuse one ~200 and no prefix
    good, low = good_traffic(T0), low_reuse_traffic(T0)
    assert len({r.key for r in good}) == 24 and all(r.prefix_tokens > 0 for r in good)
    assert len({r.key for r in low}) > 150 and all(r.prefix_tokens == 0 for r in low)
    counts: dict[str, int] = {}
    for r in good:
        counts[r.key] = counts.get(r.key, 0) + 1
    plan = build_plan(sorted(counts), [counts[k] / 60 for k in sorted(counts)], REPLICAS, q_cap=4.0, warm_slots=8)
    assert plan.admitted_keys == 24
