"""Automatic fallback and return in the live planner: real redis-server, real planner running its
control loop with the shadow gate. The traffic changes shape (24 reusable keys -> 200 keys without
reuse -> the 24 keys again); the mode must flip to flat with the reason recorded, reach a watcher
as a mode event (the path dispatchers follow), and come back to planned once a candidate passes."""

from __future__ import annotations

import asyncio

import grpc

from cacheroute.v1 import common_pb2, planner_pb2 as pb, planner_pb2_grpc
from services.planner.service import PlannerService
from services.store import Mode
from tests.integration.test_gate_live import T0, Clock, good_traffic, low_reuse_traffic, planner_config, record


async def next_loop(service: PlannerService, timeout: float = 30.0) -> str:
    """Wake the control loop and return its outcome line (the caller moves the clock first:
    the loop stamps last_loop_at with it)."""
    before = service.loop.status().last_loop_at
    service.loop.wake()
    deadline = asyncio.get_running_loop().time() + timeout
    while service.loop.status().last_loop_at == before:
        assert asyncio.get_running_loop().time() < deadline, "the control loop did not run"
        await asyncio.sleep(0.05)
    return service.loop.status().last_outcome


async def wait_leader(service: PlannerService) -> None:
    for _ in range(200):
        if service.loop.leader and service.loop.status().last_loop_at:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("planner never led")


def test_traffic_that_invalidates_the_gate_flips_to_flat_and_a_passing_candidate_returns(redis_url):
    clock = Clock(T0 + 61)

    async def main():
        await record(redis_url, good_traffic(T0), "a")
        service = await PlannerService(planner_config(redis_url, clock, auto=True)).start()
        out: dict = {}
        try:
            await wait_leader(service)            # the lease's first loop runs on phase A traffic
            out["a"] = service.loop.status().last_outcome
            state, active = await service.store.get_active_plan()
            out["a_state"], out["a_plan"] = state, active
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = planner_pb2_grpc.PlannerStub(ch)
                watch = stub.WatchPlans(pb.WatchPlansRequest(), timeout=120)
                out["initial"] = await watch.read()

                clock.now = T0 + 400                   # phase B: the window holds only the new shape
                await record(redis_url, low_reuse_traffic(T0 + 339), "b")
                out["b"] = await next_loop(service)
                out["b_state"] = await service.store.get_control()
                out["b_event"] = await asyncio.wait_for(watch.read(), 5)
                out["b_status"] = await stub.GetStatus(pb.GetPlannerStatusRequest(), timeout=5)
                out["b_stored"] = await service.store.get_plan(out["b_state"].latest_version)

                clock.now = T0 + 800                   # phase C: the original shape is back
                await record(redis_url, good_traffic(T0 + 739, seed=2), "c")
                out["c"] = await next_loop(service)
                out["c_state"], out["c_plan"] = await service.store.get_active_plan()
                out["c_events"] = []
                while not out["c_events"] or out["c_events"][-1][1] != common_pb2.MODE_PLANNED:
                    e = await asyncio.wait_for(watch.read(), 5)
                    out["c_events"].append((e.event, e.mode, e.active_version))
                watch.cancel()
        finally:
            await service.stop(0)
        return out

    out = asyncio.run(main())
    # phase A: the first candidate passes the gate and goes live with its report
    assert out["a"].startswith("switched"), out["a"]
    a_plan = out["a_plan"]
    assert a_plan.shadow.ran and a_plan.shadow.passed and a_plan.shadow.active_keys == 24
    assert out["a_state"].mode == Mode.PLANNED
    assert (out["initial"].event, out["initial"].mode) == ("initial", common_pb2.MODE_PLANNED)
    # phase B: 200 keys is outside the validated 16..36, and the new candidate cannot beat Flat-LB
    assert out["b"].startswith("fallback"), out["b"]
    b = out["b_state"]
    assert b.mode == Mode.FLAT and b.active_version == a_plan.version
    assert b.mode_reason.startswith("auto-fallback: active keys") and "outside the validated range" in b.mode_reason
    assert "candidate shadow gate failed" in b.mode_reason
    assert (out["b_event"].event, out["b_event"].mode) == ("mode", common_pb2.MODE_FLAT)
    assert out["b_status"].mode == common_pb2.MODE_FLAT and out["b_status"].mode_reason == b.mode_reason
    stored = out["b_stored"]
    assert stored.shadow.ran and not stored.shadow.passed and not stored.decision.switch
    # phase C: a passing candidate is activated and the mode returns to planned
    assert out["c"].startswith("returned"), out["c"]
    c_state, c_plan = out["c_state"], out["c_plan"]
    assert c_state.mode == Mode.PLANNED and c_state.mode_reason.startswith("auto-return: shadow gate passed")
    assert c_plan.version > stored.version and c_plan.shadow.passed
    # watchers see the new version, and planned mode (one update when both changes land together)
    assert out["c_events"][-1][1:] == (common_pb2.MODE_PLANNED, c_plan.version)
    assert all(version == c_plan.version for _, _, version in out["c_events"])


def test_an_operators_flat_mode_is_not_undone_by_the_gate(redis_url):
    clock = Clock(T0 + 61)

    async def main():
        await record(redis_url, good_traffic(T0), "a")
        service = await PlannerService(planner_config(redis_url, clock, auto=True)).start()
        try:
            await wait_leader(service)
            await service.store.set_mode(Mode.FLAT, reason="operator: maintenance", now=clock.now)
            clock.now += 1
            outcome = await next_loop(service)
            state = await service.store.get_control()
        finally:
            await service.stop(0)
        return outcome, state

    outcome, state = asyncio.run(main())
    assert outcome.startswith("kept") and "flat mode set by an operator" in outcome
    assert state.mode == Mode.FLAT and state.mode_reason == "operator: maintenance"
