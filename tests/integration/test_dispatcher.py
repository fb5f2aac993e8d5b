"""The dispatcher against real engine replicas, a real Redis store (and a real planner and
collector in test_dispatcher_stack.py), all on 127.0.0.1 with ephemeral ports."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from cacheroute.v1 import common_pb2, dispatcher_pb2, dispatcher_pb2_grpc, engine_pb2
from services.core.plan import Plan
from services.dispatcher.__main__ import parse_args
from services.dispatcher.service import DispatcherConfig, serve
from services.engine.fleet import EngineFleet
from services.model import parse_replicas
from services.rpc import ServerConfig
from services.store import Mode, RedisStore

PLANNED, COLD, FALLBACK = common_pb2.ROUTE_REASON_PLANNED, common_pb2.ROUTE_REASON_COLD, common_pb2.ROUTE_REASON_FALLBACK
DEAD = "127.0.0.1:1"   # nothing listens on port 1


def hand_plan(version: int, replica_ids: tuple[str, ...], table: dict[str, tuple[int, ...]]) -> Plan:
    n = len(replica_ids)
    return Plan(version=version, parent_version=version - 1, created_at=time.time(), replica_ids=replica_ids,
                q_cap=10.0, warm_slots=4, table=table, rates={k: 1.0 for k in table},
                expected_load=(1.0,) * n, predicted_imbalance=1.0, total_keys=len(table) + 5,
                admitted_keys=len(table), admitted_rate_share=0.5)


def dispatcher_config(fleet: EngineFleet, **kw) -> DispatcherConfig:
    base = dict(server=ServerConfig(name="dispatcher", port=0, metrics_port=0), replicas=parse_replicas(fleet.replicas_flag()),
                poll_interval=0.1, poll_timeout=0.2, plan_backoff_max=0.3, seed=7)
    base.update(kw)
    return DispatcherConfig(**base)


async def code_of(awaitable) -> grpc.StatusCode:
    try:
        await awaitable
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


async def wait_until(predicate, timeout: float = 10.0, step: float = 0.02) -> float:
    """Seconds until `predicate()` (awaited if needed) holds; raises on timeout. The default
    deadline is generous (10 s, was 3 s): it costs nothing when the condition holds, and on
    a loaded machine health polls and flushes take longer than on a quiet one."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return time.monotonic() - start
        await asyncio.sleep(step)
    raise AssertionError("condition not met in time")


def test_routes_planned_cold_and_flat_with_the_plan_from_redis(redis_url):
    async def main():
        fleet = await EngineFleet(3, time_scale=0.01).start()
        store = RedisStore(redis_url)
        # the plan lists replicas in another order than the dispatcher: indices must be re-mapped
        plan = hand_plan(1, ("e2", "e0", "e1"), {"hot": (0,), "warm": (1, 2)})   # hot -> e2, warm -> e0/e1
        await store.put_plan(plan)
        await store.activate(1, expected=0, now=time.time())
        service = await serve(dispatcher_config(fleet, planner=DEAD, redis_url=redis_url))
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = dispatcher_pb2_grpc.DispatcherStub(ch)
                hot = [await stub.Route(dispatcher_pb2.RouteRequest(key="hot"), timeout=2) for _ in range(5)]
                warm = [await stub.Route(dispatcher_pb2.RouteRequest(key="warm"), timeout=2) for _ in range(6)]
                cold = [await stub.Route(dispatcher_pb2.RouteRequest(key=f"cold{i}"), timeout=2) for i in range(30)]
                status = await stub.GetStatus(dispatcher_pb2.GetDispatcherStatusRequest(), timeout=2)
                await store.set_mode(Mode.FLAT, reason="test", now=time.time())
                await wait_until(lambda: service.router.flat)
                flat = await stub.Route(dispatcher_pb2.RouteRequest(key="hot"), timeout=2)
                status_flat = await stub.GetStatus(dispatcher_pb2.GetDispatcherStatusRequest(), timeout=2)
        finally:
            await service.stop(0)
            await fleet.stop()
            await store.close()
        return hot, warm, cold, status, flat, status_flat

    hot, warm, cold, status, flat, status_flat = asyncio.run(main())
    assert {d.replica_id for d in hot} == {"e2"} and all(d.reason == PLANNED and d.plan_version == 1 for d in hot)
    assert hot[0].key == "hot" and hot[0].address.startswith("127.0.0.1:")
    # least-loaded member: the recent-routes term spreads a key over its members between polls
    assert {d.replica_id for d in warm} == {"e0", "e1"} and all(d.reason == PLANNED for d in warm)
    assert all(d.reason == COLD for d in cold) and {d.replica_id for d in cold} == {"e0", "e1", "e2"}
    assert (status.plan_version, status.mode, status.plan_source) == (1, common_pb2.MODE_PLANNED, "redis")
    assert (status.routed, status.planned, status.cold, status.fallback) == (41, 11, 30, 0)
    assert [r.replica_id for r in status.replicas] == ["e0", "e1", "e2"] and all(r.healthy for r in status.replicas)
    assert flat.reason == FALLBACK and status_flat.mode == common_pb2.MODE_FLAT


def test_key_sources_and_invalid_requests():
    async def main():
        fleet = await EngineFleet(2, time_scale=0.01).start()
        service = await serve(dispatcher_config(fleet))
        out = {}
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = dispatcher_pb2_grpc.DispatcherStub(ch)
                text = " ".join(f"w{i}" for i in range(100))
                from services.core.routing import key_from_hashes, prompt_hashes, tokenize
                hashes = prompt_hashes(tokenize(text))
                out["by_prompt"] = (await stub.Route(dispatcher_pb2.RouteRequest(prompt=text), timeout=2)).key
                out["by_prefix"] = (await stub.Route(dispatcher_pb2.RouteRequest(
                    prefix=common_pb2.PrefixHashes(block_hashes=hashes)), timeout=2)).key
                out["expected"] = key_from_hashes(hashes, 4)
                out["no_plan"] = await stub.Route(dispatcher_pb2.RouteRequest(key="k"), timeout=2)
                for name, req in {"empty": dispatcher_pb2.RouteRequest(key=""),
                                  "unset": dispatcher_pb2.RouteRequest(),
                                  "long": dispatcher_pb2.RouteRequest(key="x" * 257),
                                  "no_hashes": dispatcher_pb2.RouteRequest(prefix=common_pb2.PrefixHashes())}.items():
                    out[name] = await code_of(stub.Route(req, timeout=2))
                batch = dispatcher_pb2.RouteBatchRequest(requests=[dispatcher_pb2.RouteRequest(key="a"),
                                                                   dispatcher_pb2.RouteRequest(key="")])
                out["bad_batch"] = await code_of(stub.RouteBatch(batch, timeout=2))
                out["routed_after_bad_batch"] = service.router.routed
                await fleet.stop()
                await wait_until(lambda: not any(service.router.state.healthy))
                out["none_healthy"] = await code_of(stub.Route(dispatcher_pb2.RouteRequest(key="k"), timeout=2))
        finally:
            await service.stop(0)
            await fleet.stop()
        return out

    out = asyncio.run(main())
    assert out["by_prompt"] == out["by_prefix"] == out["expected"]
    assert out["no_plan"].reason == COLD and out["no_plan"].plan_version == 0
    for name in ("empty", "unset", "long", "no_hashes", "bad_batch"):
        assert out[name] == grpc.StatusCode.INVALID_ARGUMENT, name
    assert out["routed_after_bad_batch"] == 3    # nothing of the bad batch was routed
    assert out["none_healthy"] == grpc.StatusCode.UNAVAILABLE


def test_route_batch_keeps_request_order():
    async def main():
        fleet = await EngineFleet(3, time_scale=0.01).start()
        service = await serve(dispatcher_config(fleet))
        service.router.set_plan(hand_plan(4, ("e0", "e1", "e2"), {f"k{i}": (i % 3,) for i in range(30)}),
                                flat=False, source="test")
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = dispatcher_pb2_grpc.DispatcherStub(ch)
                reqs = [dispatcher_pb2.RouteRequest(key=f"k{i}") for i in range(40)]
                reply = await stub.RouteBatch(dispatcher_pb2.RouteBatchRequest(requests=reqs), timeout=2)
        finally:
            await service.stop(0)
            await fleet.stop()
        return reply

    reply = asyncio.run(main())
    assert [d.key for d in reply.decisions] == [f"k{i}" for i in range(40)]
    assert all(d.replica_id == f"e{i % 3}" and d.reason == PLANNED for i, d in enumerate(reply.decisions[:30]))
    assert all(d.reason == COLD for d in reply.decisions[30:])
    assert all(d.plan_version == 4 for d in reply.decisions)


def test_unhealthy_replica_leaves_within_a_second_and_returns():
    async def main():
        fleet = await EngineFleet(2, time_scale=0.01).start()
        service = await serve(dispatcher_config(fleet, poll_interval=0.25, poll_timeout=0.2))
        service.router.set_plan(hand_plan(1, ("e0", "e1"), {"both": (0, 1)}), flat=False, source="test")
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = dispatcher_pb2_grpc.DispatcherStub(ch)

                async def targets(n=20):
                    return {(await stub.Route(dispatcher_pb2.RouteRequest(key="both"), timeout=2)).replica_id
                            for _ in range(n)} | {(await stub.Route(dispatcher_pb2.RouteRequest(key=f"c{i}"), timeout=2)).replica_id
                                                  for i in range(n)}
                before = await targets()
                await fleet.stop_one(1)
                t_down = await wait_until(lambda: not service.router.state.healthy[1])
                during = await targets()
                await fleet.start_one(1)
                t_up = await wait_until(lambda: service.router.state.healthy[1])
                after = await targets()
        finally:
            await service.stop(0)
            await fleet.stop()
        return before, t_down, during, t_up, after

    before, t_down, during, t_up, after = asyncio.run(main())
    assert before == {"e0", "e1"}
    assert t_down < 1.0 and during == {"e0"}
    assert t_up < 1.0 and after == {"e0", "e1"}


def test_generate_proxies_the_engine_stream_and_fails_fast_when_the_engine_dies():
    async def main():
        fleet = await EngineFleet(1, time_scale=0.5).start()
        service = await serve(dispatcher_config(fleet))
        service.router.set_plan(hand_plan(2, ("e0",), {"sys": (0,)}), flat=False, source="test")
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = dispatcher_pb2_grpc.DispatcherStub(ch)
                text = " ".join(f"w{i}" for i in range(600))
                req = engine_pb2.GenerateRequest(prompt=text, max_tokens=3, key="sys")
                chunks = [c async for c in stub.Generate(req, timeout=10)]
                bad = await code_of(stub.Generate(engine_pb2.GenerateRequest(prompt=text, max_tokens=0), timeout=2).read())
                long_call = stub.Generate(engine_pb2.GenerateRequest(prompt=text, max_tokens=5000, key="sys"), timeout=30)
                await long_call.read()
                await long_call.read()
                started = time.monotonic()
                await fleet.stop_one(0)
                try:
                    while await long_call.read() is not grpc.aio.EOF:
                        pass
                    code = grpc.StatusCode.OK
                except grpc.aio.AioRpcError as err:
                    code = err.code()
                elapsed = time.monotonic() - started
        finally:
            await service.stop(0)
            await fleet.stop()
        return chunks, bad, code, elapsed

    chunks, bad, code, elapsed = asyncio.run(main())
    assert len(chunks) == 3 and chunks[0].first and chunks[-1].finished
    assert chunks[0].route.replica_id == "e0" and chunks[0].route.reason == PLANNED and chunks[0].route.plan_version == 2
    assert chunks[0].route.key == "sys" and not chunks[1].HasField("route")
    assert chunks[0].prompt_tokens == 600 and chunks[0].ttft_seconds > 0
    assert bad == grpc.StatusCode.INVALID_ARGUMENT
    assert code == grpc.StatusCode.UNAVAILABLE and elapsed < 1.0


def test_telemetry_is_dropped_and_counted_when_the_collector_is_down():
    async def main():
        fleet = await EngineFleet(1, time_scale=0.01).start()
        service = await serve(dispatcher_config(fleet, collector=DEAD, telemetry_interval=0.05))
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = dispatcher_pb2_grpc.DispatcherStub(ch)
                started = time.monotonic()
                for i in range(50):
                    await stub.Route(dispatcher_pb2.RouteRequest(key=f"k{i}"), timeout=2)
                routing_time = time.monotonic() - started
                await wait_until(lambda: service.router.telemetry_dropped == 50)
                status = await stub.GetStatus(dispatcher_pb2.GetDispatcherStatusRequest(), timeout=2)
        finally:
            await service.stop(0)
            await fleet.stop()
        return status, routing_time

    status, routing_time = asyncio.run(main())
    assert status.telemetry_dropped == 50 and status.routed == 50
    assert routing_time < 2.0


def test_flags_and_env(monkeypatch):
    monkeypatch.setenv("CACHEROUTE_REPLICAS", "a=127.0.0.1:1,b=127.0.0.1:2")
    cfg = parse_args(["--key-blocks", "2", "--dispatcher-id", "d9", "--port", "0"])
    assert [r.id for r in cfg.replicas] == ["a", "b"] and cfg.rules.blocks == 2 and cfg.dispatcher_id == "d9"
    for bad in (["--replicas", "a=x:1,a=y:2"], ["--replicas", "nohost"], ["--replicas", ""]):
        with pytest.raises(SystemExit):
            parse_args(bad)
