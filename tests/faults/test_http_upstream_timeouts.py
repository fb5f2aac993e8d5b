"""First-byte timeouts toward engines (issue 20): a replica that hangs before its headers, or
after them without a first event, is answered with 504 within `first_byte_timeout` (not the
600 s idle timeout), counts as a failure and leaves rotation; the next request goes elsewhere."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from services.dispatcher.http import HttpConfig
from services.dispatcher.service import DispatcherConfig, serve
from services.model import parse_replicas
from services.rpc import ServerConfig
from tests.faults.fake_engine import FakeEngine
from tests.integration.test_dispatcher import hand_plan, wait_until


@pytest.mark.parametrize("mode", ["hang", "headers"])
def test_an_engine_silent_past_the_first_byte_timeout_is_a_504_and_a_failure(mode):
    async def main():
        bad, good = await FakeEngine(mode).start(), await FakeEngine("stream", events=3).start()
        config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0),
                                  replicas=parse_replicas(f"e0=openai+{bad.url},e1=openai+{good.url}"),
                                  poll_interval=0.1, poll_timeout=0.5, seed=2,
                                  http=HttpConfig(port=0, first_byte_timeout=0.5, eject_after=1))
        service = await serve(config)
        service.router.set_plan(hand_plan(1, ("e0", "e1"), {"k": (0,)}), flat=False, source="test")
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with aiohttp.ClientSession() as session:
                start = time.monotonic()
                async with session.post(service.http_url + "/v1/chat/completions", json=body,
                                        headers={"x-cacheroute-key": "k"}) as resp:
                    data = await resp.read()
                    assert resp.headers["x-cacheroute-replica"] == "e0"
                assert time.monotonic() - start < 5.0    # 0.5 s first-byte timeout, not the default 60 s
                assert (resp.status == 504) if mode == "hang" else (b'"code":504' in data or b"504" in data), data
                assert not service.router.state.healthy[0], "the silent replica stayed in rotation"
                async with session.post(service.http_url + "/v1/chat/completions", json=body,
                                        headers={"x-cacheroute-key": "k"}) as resp:
                    assert resp.status == 200 and resp.headers["x-cacheroute-replica"] == "e1"
                    assert b"[DONE]" in await resp.read()
        finally:
            await service.stop(0)
            await bad.stop()
            await good.stop()

    asyncio.run(main())
