"""services.backends.rawhttp against real servers on loopback: an aiohttp app (keep-alive,
chunked and sized bodies, SSE) and raw asyncio servers for what a well-behaved server never
does (a close while pooled, a body ended by the close, garbage, silence)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from services.backends import rawhttp
from services.backends.rawhttp import BadResponse, ConnectError, Disconnected, Origin


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


async def app_server():
    seen = {"peers": set(), "bodies": [], "headers": []}

    async def echo(request):
        seen["peers"].add(request.transport.get_extra_info("peername"))
        seen["bodies"].append(await request.read())
        seen["headers"].append(dict(request.headers))
        return web.json_response({"ok": True, "path": request.path})

    async def stream(request):
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(int(request.query.get("n", "3"))):
            await resp.write(b"data: %d\n\n" % i)
            await asyncio.sleep(float(request.query.get("gap", "0")))
        await resp.write_eof()
        return resp

    async def big(request):
        return web.Response(body=b"x" * int(request.query["n"]))

    app = web.Application()
    app.router.add_route("*", "/echo", echo)
    app.router.add_route("*", "/base/echo", echo)
    app.router.add_get("/stream", stream)
    app.router.add_get("/big", big)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, port, seen


async def raw_server(handler):
    """A TCP server on loopback whose connections `handler(reader, writer)` serves."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def read_head(reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head + (await reader.readexactly(length) if length else b"")


def test_keep_alive_reuses_one_connection_and_sends_the_body_and_headers_unchanged():
    async def main():
        runner, port, seen = await app_server()
        origin = Origin(f"http://127.0.0.1:{port}")
        try:
            for i in range(5):
                body = b'{"n": %d}' % i
                answer = await origin.request("POST", "/echo", body, {"content-type": "application/json",
                                                                      "authorization": "Bearer k"})
                assert answer.status == 200 and answer.headers["content-type"].startswith("application/json")
                assert b'"ok": true' in await answer.read() and answer.at_eof()
                answer.release()
            assert seen["bodies"] == [b'{"n": %d}' % i for i in range(5)]
            assert seen["headers"][0]["Authorization"] == "Bearer k"
            assert seen["headers"][0]["Host"] == f"127.0.0.1:{port}"
            assert len(seen["peers"]) == 1                 # one keep-alive connection for all five
        finally:
            await origin.close()
            await runner.cleanup()
    run(main())


def test_a_base_url_path_prefixes_every_request():
    async def main():
        runner, port, _ = await app_server()
        origin = Origin(f"http://127.0.0.1:{port}/base/")
        try:
            answer = await origin.request("GET", "/echo")
            assert b'"/base/echo"' in await answer.read()
            answer.release()
        finally:
            await origin.close()
            await runner.cleanup()
    run(main())


def test_a_chunked_stream_arrives_chunk_by_chunk_and_a_big_body_whole():
    async def main():
        runner, port, _ = await app_server()
        origin = Origin(f"http://127.0.0.1:{port}")
        try:
            answer = await origin.request("GET", "/stream?n=4&gap=0.05", idle=2.0)
            assert answer.headers["transfer-encoding"] == "chunked"
            chunks = []
            while data := await answer.readany():
                chunks.append(data)
            assert b"".join(chunks) == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\n" and len(chunks) >= 3
            answer.release()
            n = 5 * rawhttp.HIGH_WATER                   # more than the high water: reading pauses and resumes
            answer = await origin.request("GET", f"/big?n={n}")
            await asyncio.sleep(0.3)                     # let it pile up unread
            assert answer._conn.paused and answer._size < 2 * rawhttp.HIGH_WATER
            assert len(await answer.read()) == n
            answer.release()
        finally:
            await origin.close()
            await runner.cleanup()
    run(main())


def test_a_connection_the_server_closed_while_pooled_is_replaced_and_the_request_sent_once():
    async def main():
        requests = []

        async def handler(reader, writer):
            try:
                requests.append(await read_head(reader))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
            finally:
                writer.close()                           # keep-alive announced, then closed anyway
        server, port = await raw_server(handler)
        origin = Origin(f"http://127.0.0.1:{port}")
        try:
            for _ in range(3):
                answer = await origin.request("POST", "/x", b"{}")
                assert await answer.read() == b"ok"
                answer.release()
            assert len(requests) == 3
        finally:
            await origin.close()
            server.close()
    run(main())


def test_a_body_without_a_length_ends_with_the_connection():
    async def main():
        async def handler(reader, writer):
            await read_head(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
            await writer.drain()
            writer.close()
        server, port = await raw_server(handler)
        origin = Origin(f"http://127.0.0.1:{port}")
        try:
            answer = await origin.request("GET", "/")
            assert await answer.read() == b"all of it"
            answer.release()
        finally:
            await origin.close()
            server.close()
    run(main())


def test_a_cut_answer_garbage_a_refusal_and_silence_fail_clearly():
    async def main():
        async def cut(reader, writer):
            await read_head(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
            await writer.drain()
            writer.close()

        async def garbage(reader, writer):
            await read_head(reader)
            writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
            await writer.drain()

        async def silent(reader, writer):
            await read_head(reader)
            await asyncio.sleep(5)
            writer.close()

        servers = []
        try:
            server, port = await raw_server(cut)
            servers.append(server)
            answer = await Origin(f"http://127.0.0.1:{port}").request("GET", "/")
            with pytest.raises(Disconnected):
                await answer.read()
            answer.release()

            server, port = await raw_server(garbage)
            servers.append(server)
            with pytest.raises(BadResponse):
                await Origin(f"http://127.0.0.1:{port}").request("GET", "/")

            server, port = await raw_server(silent)
            servers.append(server)
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(TimeoutError):
                await Origin(f"http://127.0.0.1:{port}").request("GET", "/", idle=0.3)
            assert 0.25 < loop.time() - started < 1.5

            closed = servers.pop()
            closed.close()
            await closed.wait_closed()
            with pytest.raises(ConnectError):
                await Origin(f"http://127.0.0.1:{port}").request("GET", "/", connect=1.0)
        finally:
            for server in servers:
                server.close()
    run(main())


def test_the_idle_deadline_fires_mid_stream_and_a_cancelled_request_closes_its_connection():
    async def main():
        closed = asyncio.Event()

        async def handler(reader, writer):
            await read_head(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
            await writer.drain()
            await reader.read()                          # until the client closes
            closed.set()
        server, port = await raw_server(handler)
        origin = Origin(f"http://127.0.0.1:{port}")
        try:
            answer = await origin.request("GET", "/", idle=0.3)
            assert await answer.readany() == b"hello"
            with pytest.raises(TimeoutError):
                await answer.readany()
            answer.release()
            await asyncio.wait_for(closed.wait(), 2)     # the idle deadline closed the connection
            closed.clear()

            answer = await origin.request("GET", "/")
            assert await answer.readany() == b"hello"
            answer.close()                               # the reader gave up: the engine sees the close
            await asyncio.wait_for(closed.wait(), 2)
        finally:
            await origin.close()
            server.close()
    run(main())


def test_bad_urls_and_header_values_are_refused():
    with pytest.raises(ValueError):
        Origin("ftp://example.com")
    with pytest.raises(ValueError):
        rawhttp._header_bytes({"authorization": "Bearer a\r\nx-evil: 1"})
    assert Origin("http://[::1]:8000")._host_header == b"host: [::1]:8000\r\n"
    assert Origin("https://api.example.com")._host_header == b"host: api.example.com\r\n"
