"""SSE framings the spec allows (issue 20): events ended by CRLF or CR blank lines are relayed
event by event (the first event reaches the client long before the stream ends), their usage
is recorded, and the usage-only chunk the client did not ask for is dropped."""

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
from tests.integration.test_dispatcher import wait_until


@pytest.mark.parametrize("framing", ["lf", "crlf", "cr"])
def test_sse_events_are_streamed_one_by_one_whatever_the_framing(framing):
    async def main():
        engine = await FakeEngine("slow", events=5, chunk_bytes=16, slow_seconds=0.3).start()
        engine.framing = framing
        config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0),
                                  replicas=parse_replicas(f"e0=vllm+{engine.url}"), poll_interval=0.1,
                                  poll_timeout=0.5, seed=2, http=HttpConfig(port=0))
        service = await serve(config)
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with aiohttp.ClientSession() as session:
                start = time.monotonic()
                async with session.post(service.http_url + "/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200
                    first = await resp.content.readany()
                    first_at = time.monotonic() - start
                    rest = await resp.read()
                total = time.monotonic() - start
            assert first.startswith(b"data: {") and first_at < 0.8 < total, (first_at, total)
            stream = first + rest
            assert stream.count(b'"delta"') == 5 and b"[DONE]" in stream
            assert b'"choices":[]' not in stream, "the usage chunk the client did not ask for was relayed"
            assert service.http.usage.prompt[0] == 5 and service.http.usage.cached[0] == 3
        finally:
            await service.stop()
            await engine.stop()

    asyncio.run(main())
