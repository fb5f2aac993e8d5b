"""Mode changes, pin and unpin fenced like activation: a deposed planner's automatic fallback
cannot land after it lost the lease, while operator calls (no token) stay unfenced.

The store contract on both stores, then two live planners (real redis-server, real gRPC,
the shadow gate's replay in its worker process) where the deposed one reaches the fallback."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest

from cacheroute.v1 import common_pb2, planner_pb2 as pb, planner_pb2_grpc
from services.planner.service import PlannerService
from services.store import Fenced, Mode
from tests.integration.test_fallback_live import wait_leader
from tests.integration.test_gate_live import AUTH, T0, Clock, good_traffic, low_reuse_traffic, planner_config, record
from tests.integration.test_store_contract import make_store, plan, run  # noqa: F401 - make_store is a fixture

# ------------------------------------------------------------------ store contract


def test_a_stale_token_changes_no_mode_and_no_pin(make_store):  # noqa: F811 - the imported fixture
    async def scenario(store):
        out = {}
        await store.put_plan(plan(1))
        await store.activate(1, expected=0, now=T0)
        old = await store.acquire_lease("p1", 0.3)
        await asyncio.sleep(0.45)                                   # p1's lease expires
        new = await store.acquire_lease("p2", 5.0)
        async with store.subscribe() as sub:
            for name, call in (("mode", lambda t: store.set_mode(Mode.FLAT, reason="stale", now=T0, fencing_token=t)),
                               ("pin", lambda t: store.pin(1, fencing_token=t))):
                with pytest.raises(Fenced):
                    await call(old)
                out[name, "after_stale"] = await store.get_control()
                out[name, "current"] = await call(new)
            with pytest.raises(Fenced):
                await store.unpin(fencing_token=old)
            out["unpin", "after_stale"] = await store.get_control()
            out["unpin", "current"] = await store.unpin(fencing_token=new)
            out["events"] = []
            while (event := await sub.get(timeout=0.3)) is not None:
                out["events"].append((event.event, event.mode))
        await store.release_lease("p2", new)
        with pytest.raises(Fenced):                                 # no lease at all: any token is stale
            await store.set_mode(Mode.PLANNED, reason="gone", now=T0 + 1, fencing_token=new)
        out["operator"] = await store.set_mode(Mode.PLANNED, reason="operator", now=T0 + 2)   # unfenced
        out["operator_pin"] = await store.pin(1)
        return out

    out = run(make_store, scenario)
    assert out["mode", "after_stale"].mode is Mode.PLANNED                     # the stale call wrote nothing
    assert out["mode", "current"].mode is Mode.FLAT
    assert out["pin", "after_stale"].pinned_version == 0 and out["pin", "current"].pinned_version == 1
    assert out["unpin", "after_stale"].pinned_version == 1 and out["unpin", "current"].pinned_version == 0
    assert out["events"] == [("mode", Mode.FLAT)]                              # only the current token's change
    assert out["operator"].mode is Mode.PLANNED and out["operator"].mode_reason == "operator"
    assert out["operator_pin"].pinned_version == 1


# ------------------------------------------------------------------ two live planners


def two_planner_config(redis_url: str, clock: Clock, planner_id: str):
    cfg = planner_config(redis_url, clock, auto=True)
    return dataclasses.replace(cfg, loop=dataclasses.replace(cfg.loop, planner_id=planner_id, lease_ttl=0.6))


def test_a_deposed_planner_cannot_write_its_automatic_fallback(redis_url):
    clock = Clock(T0 + 61)

    async def main():
        await record(redis_url, good_traffic(T0), "a")
        a = await PlannerService(two_planner_config(redis_url, clock, "A")).start()
        await wait_leader(a)                                        # A leads; its first loop goes live
        b = await PlannerService(two_planner_config(redis_url, clock, "B")).start()
        out: dict = {}
        try:
            out["a_first"] = a.loop.status().last_outcome
            a_token = a.loop.status().token
            await a.loop.stop(release=False)                        # A stalls: its lease must expire
            await wait_leader(b)                                    # B takes over and runs its first loop
            b_token = b.loop.status().token
            await b.loop.stop(release=False)                        # from here the test drives both loops
            assert await b.store.acquire_lease("B", 30.0) == b_token   # B's lease outlives the test
            clock.now = T0 + 400                                    # traffic the gate rejects: fallback due
            await record(redis_url, low_reuse_traffic(T0 + 339), "b")
            before = await a.store.get_control()
            out["a_deposed"] = await a.loop.run_once(a_token)      # A still believes in its old token
            out["after_a"] = await a.store.get_control()
            out["before"] = before
            out["a_leader"] = a.loop.leader
            out["b_current"] = await b.loop.run_once(b_token)
            out["after_b"] = await b.store.get_control()
            async with grpc.aio.insecure_channel(a.address) as ch:  # the operator's SetMode stays unfenced
                stub = planner_pb2_grpc.PlannerStub(ch)
                reply = await stub.SetMode(pb.SetModeRequest(mode=common_pb2.MODE_PLANNED, reason="operator"),
                                           metadata=AUTH, timeout=5)
                out["operator"] = reply.mode
            out["tokens"] = (a_token, b_token)
        finally:
            await b.stop(0)
            await a.stop(0)
        return out

    out = asyncio.run(main())
    assert out["a_first"].startswith("switched"), out["a_first"]
    a_token, b_token = out["tokens"]
    assert b_token > a_token
    assert out["a_deposed"].startswith("refused: deposed") and "mode not changed" in out["a_deposed"], out["a_deposed"]
    assert out["after_a"].mode is Mode.PLANNED and out["after_a"].mode_reason == out["before"].mode_reason
    assert out["after_a"].active_version == out["before"].active_version
    assert out["a_leader"] is False                                 # a Fenced refusal deposes the loop
    assert out["b_current"].startswith("fallback"), out["b_current"]
    assert out["after_b"].mode is Mode.FLAT and out["after_b"].mode_reason.startswith("auto-fallback")
    assert out["operator"] == common_pb2.MODE_PLANNED
