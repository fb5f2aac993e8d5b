"""Panic mode (issue 20): when every replica's /health answers 503 (or hangs) while its
completions still work, the dispatcher routes over all of them instead of answering 503;
when one replica passes its polls again, the others leave rotation."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from services.dispatcher.http import HttpConfig
from services.dispatcher.service import DispatcherConfig, serve
from services.model import parse_replicas
from services.rpc import ServerConfig
from tests.faults.fake_engine import FakeEngine
from tests.integration.test_dispatcher import wait_until

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("failure", ["503", "hang"])
def test_health_checks_alone_never_empty_the_rotation(failure):
    async def main():
        engines = [await FakeEngine("ok").start() for _ in range(3)]
        replicas = ",".join(f"e{i}=openai+{e.url}" for i, e in enumerate(engines))
        config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0), replicas=parse_replicas(replicas),
                                  poll_interval=0.05, poll_timeout=0.2, seed=2, http=HttpConfig(port=0))
        service = await serve(config)
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            for engine in engines:
                if failure == "503":
                    engine.healthy = False
                else:
                    engine.hang_health = True
            await wait_until(lambda: service.monitor.panic, timeout=5)
            async with aiohttp.ClientSession() as session:
                seen = set()
                for i in range(12):   # 12 keys: one key keeps to its replica (the cold tail's memory)
                    body = {**BODY, "messages": [{"role": "user", "content": f"hi {i}"}]}
                    async with session.post(service.http_url + "/v1/chat/completions", json=body) as resp:
                        assert resp.status == 200, await resp.read()
                        seen.add(resp.headers["x-cacheroute-replica"])
                assert len(seen) >= 2, "panic mode routes over all replicas, not one"
                engines[0].healthy, engines[0].hang_health = True, False
                await wait_until(lambda: not service.monitor.panic and service.router.state.healthy == [True, False, False],
                                 timeout=5)
                async with session.post(service.http_url + "/v1/chat/completions", json=BODY) as resp:
                    assert resp.status == 200 and resp.headers["x-cacheroute-replica"] == "e0"
        finally:
            await service.stop(0)
            for engine in engines:
                await engine.stop()

    asyncio.run(main())
