"""A young plan catches up (issue 12): the live planner's first plan knows only the keys seen in
its first seconds; the next interval's candidate adds the rest and goes live although the
switching rule's 120 s dwell has not passed, because it moves no key the first plan placed,
and it admits the newcomers on the replicas the cold tail had been sending them to.
Real redis-server, real planner (gRPC on 127.0.0.1:0), telemetry written as the collector
writes it, on a clock the test controls."""

from __future__ import annotations

import asyncio

from services.core.replan import ring_homes
from services.planner.control import LoopConfig
from services.planner.service import PlannerConfig, PlannerService
from services.rpc import ServerConfig
from services.store import ArrivalRecord
from tests.integration.test_fallback_live import wait_leader
from tests.integration.test_gate_live import T0, TELEMETRY, Clock, record

REPLICAS = tuple(f"e{i}" for i in range(8))
TENANTS = [f"tenant-{i}" for i in range(100)]


def arrivals(keys: list[str], start: float, seconds: float = 10.0, per_key: int = 5) -> list[ArrivalRecord]:
    return [ArrivalRecord(k, start + (j + 0.5) * seconds / per_key, 2300, 2200) for k in keys for j in range(per_key)]


def test_a_young_plan_takes_the_keys_that_arrive_after_it_within_the_dwell(redis_url):
    clock = Clock(T0 + 10)
    loop = LoopConfig(replica_ids=REPLICAS, q_cap=20.0, warm_slots=64, interval=3600, window_seconds=60,
                      planner_id="growth-test")
    config = PlannerConfig(server=ServerConfig(name="planner", port=0), loop=loop, redis_url=redis_url,
                           telemetry=TELEMETRY, auto=True, watch_poll_seconds=0.2, clock=clock)

    async def main():
        await record(redis_url, arrivals(TENANTS[::4], T0), "first-10s")
        planner = await PlannerService(config).start()
        out = {}
        try:
            await wait_leader(planner)                           # its first loop: the first plan
            _, out["first"] = await planner.store.get_active_plan()
            out["first_outcome"] = planner.loop.status().last_outcome
            token = planner.loop.status().token
            await planner.loop.stop(release=False)                # from here the test drives the loop
            await record(redis_url, arrivals(TENANTS, T0 + 10), "next-10s")
            clock.now = T0 + 20
            out["second_outcome"] = await planner.loop.run_once(token)
            _, out["second"] = await planner.store.get_active_plan()
        finally:
            await planner.stop(0)
        return out

    out = asyncio.run(main())
    first, second = out["first"], out["second"]
    assert out["first_outcome"].startswith("switched") and len(first.table) == 25, out["first_outcome"]
    assert out["second_outcome"].startswith("switched"), out["second_outcome"]
    assert "growth only" in second.decision.reason, second.decision.reason
    assert second.parent_version == first.version and len(second.table) == 100
    for key, row in first.table.items():                         # nothing the first plan placed moved
        assert {second.replica_ids[i] for i in second.table[key]} >= {first.replica_ids[i] for i in row}, key
    home = ring_homes(len(REPLICAS))                             # and the newcomers stay where the cold tail had them
    new = [k for k in second.table if k not in first.table]
    assert sum(second.table[k] == (home(k),) for k in new) >= 0.7 * len(new)
