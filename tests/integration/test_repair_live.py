"""Live failure repair: real engines (EngineFleet), real Redis, a real planner health-checking the
replicas and a real dispatcher following its plans. Kill a replica: a repaired version is active
within a few seconds, only that replica's keys moved. Bring it back: the control loop hands it
keys again within a bounded number of loops, at most `max_moves` key shares per loop."""

from __future__ import annotations

import asyncio
import time

import grpc

from cacheroute.v1 import planner_pb2 as pb, planner_pb2_grpc
from services.dispatcher.service import serve as serve_dispatcher
from services.engine.fleet import EngineFleet
from services.planner.control import LoopConfig
from services.planner.service import PlannerConfig, PlannerService
from services.rpc import ServerConfig
from services.store import ArrivalRecord, TelemetryConfig
from tests.integration.test_dispatcher import dispatcher_config, wait_until

TELEMETRY = TelemetryConfig(bucket_seconds=1, retention_seconds=600)
RATES = {f"k{i:02d}": 4.0 + 0.25 * i for i in range(16)}     # 16 keys, k_b = 1 each at q_cap 10
MAX_MOVES = 2


def members(plan, key: str) -> set[str]:
    return {plan.replica_ids[i] for i in plan.table[key]}


def keys_on(plan, rid: str) -> set[str]:
    return {k for k in plan.table if rid in members(plan, k)}


async def record_rates(store, now: float) -> None:
    """Ten seconds of arrivals at RATES, as the collector would have recorded them."""
    records = []
    for key, rate in RATES.items():
        n = int(rate * 10)
        records += [ArrivalRecord(key, now - 10 + (j + 0.5) * 10 / n, 1000, 900) for j in range(n)]
    await store.record_arrivals(f"rates-{now}", records)


async def next_loop(service: PlannerService) -> str:
    before = service.loop.status().last_loop_at
    service.loop.wake()
    await wait_until(lambda: service.loop.status().last_loop_at != before, timeout=10)
    return service.loop.status().last_outcome


def test_a_dead_replica_is_repaired_and_a_returning_one_gets_keys_back_gradually(redis_url):
    async def main():
        fleet = await EngineFleet(4, time_scale=0.01).start()
        loop = LoopConfig(replica_ids=tuple(fleet.ids), q_cap=10.0, warm_slots=8, interval=3600, window_seconds=10,
                          planner_id="repair-test", max_moves=MAX_MOVES)
        addresses = {rid: fleet.address(i) for i, rid in enumerate(fleet.ids)}
        planner = await PlannerService(PlannerConfig(
            server=ServerConfig(name="planner", port=0), loop=loop, redis_url=redis_url, telemetry=TELEMETRY,
            auto=True, watch_poll_seconds=0.2, replica_addresses=addresses, health_interval=0.2,
            health_timeout=0.2, repair_grace=1.0)).start()
        dispatcher = await serve_dispatcher(dispatcher_config(fleet, planner=planner.address))
        store, out = planner.store, {}
        try:
            await wait_until(lambda: planner.loop.leader, timeout=5)
            async with grpc.aio.insecure_channel(planner.address) as ch:
                stub = planner_pb2_grpc.PlannerStub(ch)
                rates = [pb.KeyRate(key=k, rate=r, prefix_tokens=900) for k, r in RATES.items()]
                built = await stub.BuildPlan(pb.BuildPlanRequest(rates=rates, activate=True), timeout=5)
            v1 = await store.get_plan(built.plan.version)
            out["v1"] = v1
            await wait_until(lambda: dispatcher.router.plan_version == v1.version, timeout=3)

            await fleet.stop_one(1)                                       # e1 dies
            killed = time.monotonic()

            async def repaired():
                _, active = await store.get_active_plan()
                return active is not None and active.builder == "repair" and active
            await wait_until(repaired, timeout=8, step=0.05)
            out["repair_seconds"] = time.monotonic() - killed
            _, out["repaired"] = await store.get_active_plan()
            await wait_until(lambda: dispatcher.router.plan_version == out["repaired"].version, timeout=3)
            out["history"] = (await store.history(1))[0]

            await fleet.start_one(1)                                      # e1 is back, empty
            await wait_until(lambda: "e1" not in planner.health.down_for(), timeout=5)
            out["loops"] = []
            for _ in range(4):
                await record_rates(store, time.time())
                outcome = await next_loop(planner)
                _, active = await store.get_active_plan()
                out["loops"].append((outcome, active))
                if keys_on(active, "e1"):
                    break
        finally:
            await dispatcher.stop(0)
            await planner.stop(0)
            await fleet.stop()
        return out

    out = asyncio.run(main())
    v1, repaired = out["v1"], out["repaired"]
    orphans = keys_on(v1, "e1")
    print(f"repair: active {out['repair_seconds']:.2f}s after the kill (grace 1.0s, health every 0.2s), "
          f"{len(orphans)}/{len(v1.table)} keys moved, churn {repaired.churn:.3f}; return: "
          f"{len(keys_on(out['loops'][-1][1], 'e1'))} keys on e1 after {len(out['loops'])} loop(s)")
    assert orphans and out["repair_seconds"] < 5.0
    assert repaired.parent_version == v1.version and "e1" not in repaired.replica_ids
    assert out["history"].reason.startswith("repair: replica(s) e1 down")
    for key in v1.table:
        if key in orphans:
            assert "e1" not in members(repaired, key) and members(repaired, key)
        else:
            assert members(repaired, key) == members(v1, key), key       # nobody else moved
    rate = sum(v1.rates[k] for k in orphans) / sum(v1.rates.values())
    assert abs(repaired.churn - rate) < 1e-9                              # churn = the orphans' rate share

    outcome, back = out["loops"][-1]
    assert len(out["loops"]) <= 3, [o for o, _ in out["loops"]]
    assert outcome.startswith("switched") and "replica set changed" in outcome
    assert "e1" in back.replica_ids and 1 <= len(keys_on(back, "e1")) <= MAX_MOVES
    unchanged = [k for k in repaired.table if k in back.table and members(back, k) == members(repaired, k)]
    assert len(unchanged) >= len(repaired.table) - MAX_MOVES              # no storm: bounded moves
