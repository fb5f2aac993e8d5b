"""The hold rule live (services/dispatcher/dispatch.py): a dispatcher in front of a real simulated
engine over gRPC whose KV pool holds about two of the test's requests. Requests the KV cannot take
wait at the dispatcher and are served once a request finishes; a held request whose client goes
away leaves the hold without reaching the engine."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cacheroute.v1 import dispatcher_pb2_grpc, engine_pb2
from services.dispatcher.service import serve
from services.engine.fleet import EngineFleet
from tests.integration.test_dispatcher import dispatcher_config, wait_until

KV_BLOCKS = 100                    # 1,600 tokens: two 600-token prompts with 200 output tokens each


def prompt(n: int) -> str:
    return " ".join(f"p{n}w{i}" for i in range(600))    # 600 tokens, nothing shared between prompts


def sample(service, name: str) -> float:
    return service.running.metrics.registry.get_sample_value(name) or 0.0


async def start(hold_limit: float):
    fleet = await EngineFleet(1, time_scale=0.2, kv_blocks=KV_BLOCKS).start()
    service = await serve(dispatcher_config(fleet, poll_interval=0.05, hold_limit=hold_limit))
    await wait_until(lambda: all(service.router.state.healthy) and service.router.state.kv_blocks[0] == KV_BLOCKS)
    return fleet, service


@pytest.mark.parametrize("hold_limit", [10.0, 0.0])
def test_requests_the_kv_cannot_take_are_held_then_served_without_preemption(hold_limit):
    async def main():
        fleet, service = await start(hold_limit)
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = dispatcher_pb2_grpc.DispatcherStub(ch)

                async def one(n: int) -> list:
                    req = engine_pb2.GenerateRequest(prompt=prompt(n), max_tokens=200, key=f"k{n}")
                    return [c async for c in stub.Generate(req, timeout=60)]

                answers = await asyncio.gather(*(one(n) for n in range(4)))
            await wait_until(lambda: service.router.engine_stats[0].requests == 4)
            await asyncio.sleep(0.2)       # one more poll: the engine's final counters
            return (answers, sample(service, "cacheroute_held_total"), sample(service, "cacheroute_hold_seconds_count"),
                    sample(service, "cacheroute_held_now"), service.router.engine_stats[0].preemptions)
        finally:
            await service.stop(0)
            await fleet.stop()

    answers, held, observed, now, preemptions = asyncio.run(main())
    assert all(len(chunks) == 200 and chunks[-1].finished for chunks in answers)   # every request served whole
    if hold_limit:
        assert held >= 1 and observed == held and now == 0
        assert preemptions == 0
    else:                                  # hold off: nothing is held (the engine queued them itself here)
        assert held == 0
