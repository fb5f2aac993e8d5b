"""SSE framings the spec allows (issue 20): events ended by CRLF or CR blank lines are relayed
event by event (the first event reaches the client long before the stream ends), their usage
is recorded, and the usage-only chunk the client did not ask for is dropped."""

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


def _one_engine(url: str) -> DispatcherConfig:
    """A dispatcher with its HTTP API in front of one vLLM-kind engine, polled every 0.1 s."""
    return DispatcherConfig(server=ServerConfig(name="dispatcher", port=0), replicas=parse_replicas(f"e0=vllm+{url}"),
                            poll_interval=0.1, poll_timeout=0.5, seed=2, http=HttpConfig(port=0))


@pytest.mark.parametrize("framing", ["lf", "crlf", "cr"])
def test_sse_events_are_streamed_one_by_one_whatever_the_framing(framing):
    async def main():
        engine = await FakeEngine("slow", events=5, chunk_bytes=16, slow_seconds=0.3).start()
        engine.framing = framing
        service = await serve(_one_engine(engine.url))
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


# An engine that writes its SSE stream in pieces cut inside events (inside the first event's
# JSON, inside the usage chunk's `"usage": {` marker, inside a separator), PAUSE apart, so each
# piece is its own network read at the dispatcher.
PAUSE = 0.3
_USAGE = {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 7}}
_EVENTS = [b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"he"}}],"usage":null}\n\n',
           b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"llo"}}],"usage":null}\n\n',
           b'data: {"id":"x","object":"chat.completion.chunk","choices":[],"usage":' + orjson.dumps(_USAGE) + b'}\n\n',
           b"data: [DONE]\n\n"]
STREAM = b"".join(_EVENTS)
_USAGE_AT = STREAM.index(b'"usage":{')
CUTS = (20, len(_EVENTS[0]) + 1, _USAGE_AT + 4, len(STREAM) - len(_EVENTS[3]) - 1)   # every one inside an event


async def _split_engine():
    from aiohttp import web

    from services.http.server import start_http

    async def health(request):
        return web.json_response({"status": "ok"})

    async def complete(request):
        await request.read()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        start = 0
        for cut in (*CUTS, len(STREAM)):
            await resp.write(STREAM[start:cut])
            start = cut
            await asyncio.sleep(PAUSE)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", complete)
    return await start_http(app, "127.0.0.1", 0)


@pytest.mark.parametrize("include_usage", [True, False])
def test_chunks_cut_inside_events_reach_the_client_unchanged_and_usage_is_found(include_usage):
    async def main():
        engine = await _split_engine()
        service = await serve(_one_engine(engine.url))
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}],
                    **({"stream_options": {"include_usage": True}} if include_usage else {})}
            async with aiohttp.ClientSession() as session:
                async with session.post(service.http_url + "/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200
                    first = await asyncio.wait_for(resp.content.readany(), PAUSE * 3)
                    stream = first + await resp.read()
            if include_usage:
                # each piece is passed on as it came: the first, half an event, before the rest is sent
                assert first == STREAM[:CUTS[0]], first
                assert stream == STREAM
            else:
                # the usage chunk the dispatcher asked for is dropped; everything else byte for byte
                assert first == _EVENTS[0], first
                assert stream == _EVENTS[0] + _EVENTS[1] + _EVENTS[3]
            assert service.http.usage.prompt[0] == 11 and service.http.usage.cached[0] == 7
        finally:
            await service.stop()
            await engine.stop()

    asyncio.run(main())


def test_the_done_event_and_the_end_of_the_body_arrive_together():
    """A client that stops reading at `data: [DONE]` (aiohttp's, bench/peers.py's) holds a finished
    response, so it keeps its connection: the block with [DONE] and the chunked body's end are one
    write. On the old code the end came in a write of its own, after the engine's own end (here
    0.2 s after its [DONE])."""
    async def main():
        engine = await FakeEngine("stream", events=3, chunk_bytes=16).start()
        engine.end_pause = 0.2
        service = await serve(_one_engine(engine.url))
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            host, port = service.http_url.removeprefix("http://").rsplit(":", 1)
            body = orjson.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
            reader, writer = await asyncio.open_connection(host, int(port))
            for _ in range(2):          # the second request rides the same connection
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                got = b""
                while b"[DONE]" not in got:
                    data = await asyncio.wait_for(reader.read(65536), 5)
                    assert data, got
                    got += data
                assert got.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in got.lower(), got[:300]
                # what one read brought with [DONE] ends the body: nothing is left to come
                assert got.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), got[-80:]
            writer.close()
        finally:
            await service.stop()
            await engine.stop()

    asyncio.run(main())
