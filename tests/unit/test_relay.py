"""services.backends.relay's event boundary: the endswith fast path gives the full scan's answer."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.backends.relay import last_event_end


def scan(data: bytes) -> int:
    """The definition: just past the last blank line of any framing (LF, CRLF, CR); -1 without one."""
    ends = [at + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (at := data.rfind(sep)) >= 0]
    return max(ends) if ends else -1


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"\r", b"\n", b"data: {}", b"\r\n", b"\n\n"]), max_size=24).map(b"".join))
def test_last_event_end_is_the_scan(data):
    assert last_event_end(data) == scan(data)


def test_usual_blocks():
    assert last_event_end(b"data: 1\n\ndata: 2\n\n") == 18
    assert last_event_end(b"data: 1\r\n\r\ndata: 2") == 11
    assert last_event_end(b"data: 1\r\rdata") == 9
    assert last_event_end(b"data: 1\n") == -1


def test_a_block_read_with_the_end_of_stream_is_marked_last():
    """relay_events on a real aiohttp stream: the engine sends its last event together with the
    stream's end (one write), so the block that carries it is marked `ended` (the front door
    then sends it with the response's own end); earlier blocks are not."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from services.backends.base import Deadlines, Reply
    from services.backends.relay import relay_events
    from services.http.server import start_http

    async def stream(request):
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: 1\n\n")
        await asyncio.sleep(0.2)
        await resp.write_eof(b"data: [DONE]\n\n")      # the last event and the end in one write
        return resp

    async def main():
        app = web.Application()
        app.router.add_get("/s", stream)
        running = await start_http(app, "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session, session.get(running.url + "/s") as upstream:
                reply = Reply(200, "text/event-stream")
                return [(block, reply.ended) async for block in relay_events(upstream, reply, False, Deadlines())]
        finally:
            await running.stop()

    assert asyncio.run(main()) == [(b"data: 1\n\n", False), (b"data: [DONE]\n\n", True)]
