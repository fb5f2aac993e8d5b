"""Session-aware cold tail in live dispatchers: two real dispatchers (--cold-tail chwbl) in front of
four real engine replicas. A cold key hashes to the same replica from either dispatcher while the
loads are balanced; a first-sight key whose ring owner is loaded past the mean is sent by both to
the lighter of its first two ring replicas; a key already served on the loaded replica stays there
while its queue is decoding, not prefilling (a spill would not pay: CacheRoutePolicy._pays)."""

from __future__ import annotations

import asyncio
import inspect
import random

import grpc

from cacheroute.v1 import common_pb2, dispatcher_pb2, dispatcher_pb2_grpc, engine_pb2, engine_pb2_grpc
from services.core.policies._common import Ring
from services.core.policies.cacheroute import CacheRoutePolicy
from services.dispatcher.__main__ import parse_args
from services.dispatcher.service import DispatcherConfig, serve
from services.engine.fleet import EngineFleet
from services.model import DEFAULT_COLD_TAIL
from tests.integration.test_dispatcher import dispatcher_config, wait_until

KEYS = [f"session-{i}" for i in range(16)]
FRESH = [f"fresh-{i}" for i in range(64)]


async def route_all(stubs, keys) -> list[tuple[str, ...]]:
    """Each key through every dispatcher, one key at a time with a poll in between, so a
    dispatcher's count of what it just routed has been reconciled with the engines' queues."""
    out = []
    for key in keys:
        picks = []
        for stub in stubs:
            d = await stub.Route(dispatcher_pb2.RouteRequest(key=key), timeout=2)
            assert d.reason == common_pb2.ROUTE_REASON_COLD
            picks.append(d.replica_id)
        out.append(tuple(picks))
        await asyncio.sleep(0.12)
    return out


async def load(engine: engine_pb2_grpc.EngineStub, n: int) -> list[asyncio.Task]:
    """n long generations straight to one engine: its queue is what the dispatchers poll."""
    rng = random.Random(3)

    async def one(i: int) -> None:
        req = engine_pb2.GenerateRequest(request_id=f"load-{i}", max_tokens=2000, blocks=engine_pb2.PromptBlocks(
            block_hashes=[rng.getrandbits(63) for _ in range(64)], prompt_tokens=1024))
        async for _ in engine.Generate(req, timeout=60):
            pass

    return [asyncio.create_task(one(i)) for i in range(n)]


def test_two_dispatchers_agree_on_cold_keys_and_skip_an_overloaded_replica():
    async def main():
        fleet = await EngineFleet(4, time_scale=1.0).start()
        d1 = await serve(dispatcher_config(fleet, cold="chwbl", poll_interval=0.05, dispatcher_id="d1", seed=1))
        d2 = await serve(dispatcher_config(fleet, cold="chwbl", poll_interval=0.05, dispatcher_id="d2", seed=2))
        out, tasks = {}, []
        try:
            async with grpc.aio.insecure_channel(d1.address) as c1, grpc.aio.insecure_channel(d2.address) as c2, \
                    grpc.aio.insecure_channel(fleet.address(0)) as c0:
                stubs = [dispatcher_pb2_grpc.DispatcherStub(c1), dispatcher_pb2_grpc.DispatcherStub(c2)]
                out["balanced"] = await route_all(stubs, KEYS)
                out["again"] = await route_all(stubs, KEYS)
                # overload e0, the owner of some of the keys, and wait until both dispatchers see it
                tasks = await load(engine_pb2_grpc.EngineStub(c0), 24)
                await wait_until(lambda: all(d.router.engine_load[0] >= 20 for d in (d1, d2)), timeout=10)
                owned = [k for k, picks in zip(KEYS, out["balanced"]) if picks[0] == "e0"]
                out["owned"] = owned
                out["kept"] = await route_all(stubs, owned)
                out["others"] = await route_all(stubs, [k for k in KEYS if k not in owned])
                fresh = [k for k in FRESH if Ring(4).first(k) == 0][:6]
                out["fresh"] = fresh
                out["loaded"] = await route_all(stubs, fresh)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await d1.stop(0)
            await d2.stop(0)
            await fleet.stop()
        return out

    out = asyncio.run(main())
    balanced = out["balanced"]
    assert all(a == b for a, b in balanced), balanced                     # both dispatchers agree
    assert out["again"] == balanced                                       # and keep agreeing (affinity)
    assert len({a for a, _ in balanced}) >= 3                             # the hash spreads keys
    assert out["owned"], "no key hashed to e0; pick other keys"
    assert all(a == b == "e0" for a, b in out["kept"]), out["kept"]      # warm keys stay (decode queue)
    assert out["fresh"], "no fresh key hashed to e0; pick other keys"
    walks = {k: [f"e{r}" for r in Ring(4).walk(k)] for k in out["fresh"]}
    assert all(a == b == walks[k][1] for k, (a, b) in zip(out["fresh"], out["loaded"])), out["loaded"]
    others = [k for k in KEYS if k not in out["owned"]]
    assert out["others"] == [picks for k, picks in zip(KEYS, balanced) if k in others]   # nobody else moves


def test_the_live_default_cold_tail_is_the_simulators():
    simulator_default = inspect.signature(CacheRoutePolicy).parameters["cold"].default
    assert DEFAULT_COLD_TAIL == simulator_default
    assert DispatcherConfig.__dataclass_fields__["cold"].default == simulator_default
    assert parse_args(["--replicas", "a=127.0.0.1:1"]).cold == simulator_default
    assert parse_args(["--replicas", "a=127.0.0.1:1", "--cold-tail", "chwbl"]).cold == "chwbl"
    assert parse_args(["--replicas", "a=127.0.0.1:1", "--cold", "p2c"]).cold == "p2c"
