"""The client library against real servers: dispatcher failover, retries only where safe,
bearer tokens on control calls."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from cacheroute.v1 import common_pb2, planner_pb2, planner_pb2_grpc
from clients import AsyncCacheRouteClient, CacheRouteClient, RetryPolicy, route_request
from services.dispatcher.service import serve
from services.engine.fleet import EngineFleet
from services.errors import Unavailable
from services.rpc import ServerConfig, start_server
from tests.integration.test_dispatcher import DEAD, dispatcher_config

FAST = RetryPolicy(rounds=3, backoff=0.01, max_backoff=0.02)


class Background:
    """An event loop in a thread hosting servers, so the sync client can be tested."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 20):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def two_dispatchers():
    bg = Background()

    async def up():
        fleet = await EngineFleet(2, time_scale=0.01).start()
        d1 = await serve(dispatcher_config(fleet, dispatcher_id="d1"))
        d2 = await serve(dispatcher_config(fleet, dispatcher_id="d2"))
        return fleet, d1, d2

    fleet, d1, d2 = bg.run(up())
    yield bg, fleet, d1, d2

    async def down():
        for d in (d1, d2):
            await d.stop(0)
        await fleet.stop()
    bg.run(down())
    bg.close()


def test_sync_client_fails_over_to_the_next_dispatcher(two_dispatchers):
    bg, fleet, d1, d2 = two_dispatchers
    with CacheRouteClient([DEAD, d1.address, d2.address], retry=FAST) as client:
        first = client.route("tenant-1")                       # the dead address is skipped
        assert first.key == "tenant-1" and first.replica_id in ("e0", "e1")
        assert client.dispatcher_status().dispatcher_id == "d1"
        bg.run(d1.stop(0))
        assert client.route(prompt="hello there").reason == common_pb2.ROUTE_REASON_COLD
        assert client.dispatcher_status().dispatcher_id == "d2"
        batch = client.route_batch([route_request(f"k{i}") for i in range(5)])
        assert [d.key for d in batch] == [f"k{i}" for i in range(5)]
        chunks = list(client.generate("a b c d", max_tokens=3))
        assert len(chunks) == 3 and chunks[0].route.replica_id in ("e0", "e1") and chunks[-1].finished
        bg.run(d2.stop(0))
        with pytest.raises(grpc.RpcError) as err:
            client.route("tenant-1")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_async_client_fails_over_and_streams(two_dispatchers):
    bg, fleet, d1, d2 = two_dispatchers

    async def scenario():
        async with AsyncCacheRouteClient([d1.address, d2.address], retry=FAST) as client:
            before = (await client.dispatcher_status()).dispatcher_id
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(d1.stop(0), bg.loop))
            decision = await client.route("tenant-2")
            after = (await client.dispatcher_status()).dispatcher_id
            chunks = [c async for c in client.generate("x y z", max_tokens=2)]
            return before, decision, after, chunks

    before, decision, after, chunks = asyncio.run(scenario())
    assert (before, after) == ("d1", "d2")
    assert decision.key == "tenant-2"
    assert len(chunks) == 2 and chunks[0].first and chunks[0].route.key


def test_request_builders_reject_ambiguous_sources():
    with pytest.raises(ValueError):
        route_request("k", prompt="p")
    with pytest.raises(ValueError):
        route_request()
    assert route_request(prefix=[1, 2]).prefix.block_hashes == [1, 2]
    with pytest.raises(ValueError):
        CacheRouteClient().set_mode("sideways")


class FlakyPlanner(planner_pb2_grpc.PlannerServicer):
    """A real planner endpoint that answers UNAVAILABLE a set number of times, counting calls."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.failures > 0:
            self.failures -= 1
            raise Unavailable("store down")

    async def GetPlan(self, request, context):
        self._count("GetPlan")
        return common_pb2.Plan(version=request.version or 3)

    async def ActivatePlan(self, request, context):
        self._count("ActivatePlan")
        return planner_pb2.ControlResponse(active_version=request.version)

    async def SetMode(self, request, context):
        self._count("SetMode")
        return planner_pb2.ControlResponse(mode=request.mode)


def test_only_idempotent_calls_are_retried_and_control_calls_carry_the_token():
    async def scenario():
        flaky = FlakyPlanner(failures=2)
        running = await start_server(ServerConfig(name="planner", port=0, auth_token="t0k"),
                                     [(planner_pb2_grpc.add_PlannerServicer_to_server, flaky)],
                                     ["cacheroute.v1.Planner"], protected_methods={"ActivatePlan", "SetMode"})
        out = {}
        try:
            async with AsyncCacheRouteClient(planner=running.address, token="t0k", retry=FAST) as client:
                out["plan"] = (await client.get_plan()).version            # 2 failures, then success
                out["get_calls"] = flaky.calls["GetPlan"]
                flaky.failures = 1
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await client.activate_plan(5, expected_active_version=3)
                out["activate_code"] = err.value.code()
                out["activate_calls"] = flaky.calls["ActivatePlan"]
                out["activated"] = (await client.activate_plan(5, expected_active_version=3)).active_version
                out["mode"] = (await client.set_mode("flat")).mode
            async with AsyncCacheRouteClient(planner=running.address, token="wrong", retry=FAST) as client:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await client.set_mode("flat")
                out["wrong_token"] = err.value.code()
        finally:
            await running.stop(0)
        return out

    out = asyncio.run(scenario())
    assert out["plan"] == 3 and out["get_calls"] == 3
    assert out["activate_code"] == grpc.StatusCode.UNAVAILABLE and out["activate_calls"] == 1
    assert out["activated"] == 5 and out["mode"] == common_pb2.MODE_FLAT
    assert out["wrong_token"] == grpc.StatusCode.PERMISSION_DENIED
