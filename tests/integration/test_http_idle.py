"""A stream whose engine goes quiet after its first event ends with an SSE error event once
`upstream_timeout` seconds passed without a byte (services.backends.relay: the session's
sock_read after the first event), and one that keeps sending within the deadline is relayed
whole however long it lasts."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest

from services.dispatcher.http import HttpConfig
from services.dispatcher.service import DispatcherConfig, serve
from services.model import parse_replicas
from services.rpc import ServerConfig
from tests.faults.fake_engine import FakeEngine
from tests.integration.test_dispatcher import wait_until

pytestmark = [pytest.mark.timeout(60)]
BODY = orjson.dumps({"model": "m", "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "hi"}]})


def test_a_quiet_engine_mid_stream_times_out_and_a_steady_one_does_not():
    async def main():
        engine = await FakeEngine("slow", events=3, slow_seconds=30.0).start()
        service = await serve(DispatcherConfig(
            server=ServerConfig(name="dispatcher", port=0), replicas=parse_replicas(f"e0=vllm+{engine.url}"),
            poll_interval=0.1, seed=1, http=HttpConfig(port=0, upstream_timeout=0.6)))
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=10)
            async with aiohttp.ClientSession() as session:
                start = time.monotonic()
                async with session.post(service.http.url + "/v1/chat/completions", data=BODY,
                                        headers={"content-type": "application/json"}) as resp:
                    data = await resp.read()
                seconds = time.monotonic() - start
                assert resp.status == 200 and data.count(b"data: ") == 2, data     # one event, then the error
                assert b"sent nothing for 0.6s" in data and 0.5 < seconds < 3.0, (data, seconds)
                engine.slow_seconds = 0.25                                        # 4 gaps of 0.25 s: 1 s > 0.6 s
                async with session.post(service.http.url + "/v1/chat/completions", data=BODY,
                                        headers={"content-type": "application/json"}) as resp:
                    data = await resp.read()
                assert resp.status == 200 and data.count(b"data: ") == 4 and data.endswith(b"data: [DONE]\n\n"), data
                assert b"error" not in data
        finally:
            await service.stop()
            await engine.stop()

    asyncio.run(main())
