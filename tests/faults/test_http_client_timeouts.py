"""Slow, idle and half-closed clients in front of the dispatcher's OpenAI HTTP API (issue 20).

A real dispatcher (HTTP API on 127.0.0.1:0) in front of a fake OpenAI engine
(tests.faults.fake_engine); the clients are raw sockets on loopback:

- slowloris: headers sent a few bytes at a time, never finished -> 408 and closed once the
  header timeout passes (before: held for aiohttp's 3,630 s keep-alive timer);
- slow body: headers whole, the body trickled -> 408 and closed at the body timeout;
- a declared Content-Length of 10^12 bytes with 100 B sent -> 413 at once, closed;
- idle keep-alive: one request answered, then nothing -> closed at the idle timeout;
- half-closed: `shutdown(SHUT_WR)` right after the request, or in the middle of a stream ->
  the whole answer is still delivered (before: nothing), and no engine failure is counted;
  a client that closes its socket outright while its answer is pending still cancels it.

The timeouts are short here (header 0.6 s, body 0.6 s, idle 0.8 s); every wait is a
deadline (a read that returns at EOF), never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from services.dispatcher.http import HttpConfig
from services.dispatcher.service import DispatcherConfig, serve
from services.http.server import HttpTimeouts
from services.model import parse_replicas
from services.rpc import ServerConfig
from tests.faults.fake_engine import FakeEngine
from tests.integration.test_dispatcher import wait_until

TIMEOUTS = HttpTimeouts(header=0.6, body=0.6, idle=0.8)
CLIENTS = 20        # of each kind, at once


def _request(body: bytes, *, declared: int | None = None) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (len(body) if declared is None else declared))


def _body(stream: bool = False) -> bytes:
    return orjson.dumps({"model": "m", "stream": stream, "max_tokens": 5,
                         "messages": [{"role": "user", "content": "hello " * 30}]})


async def _until_closed(reader: asyncio.StreamReader, limit: float) -> tuple[float, bytes]:
    """(seconds until the server closed, bytes it sent); raises if still open after `limit`."""
    start, got = time.monotonic(), b""
    async with asyncio.timeout(limit):
        while more := await reader.read(65536):
            got += more
    return time.monotonic() - start, got


async def _dispatcher(engine: FakeEngine):
    config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0),
                              replicas=parse_replicas(f"e0=vllm+{engine.url}"), poll_interval=0.1,
                              poll_timeout=0.5, seed=3, http=HttpConfig(port=0, timeouts=TIMEOUTS))
    service = await serve(config)
    await wait_until(lambda: all(service.router.state.healthy), timeout=5)
    host, port = service.http_url.rsplit("//", 1)[1].rsplit(":", 1)
    return service, host, int(port)


def _engine_failures(service) -> float:
    return sum(s.value for m in service.dispatcher.failures.collect() for s in m.samples
               if s.name.endswith("_total"))


@pytest.mark.parametrize("kind", ["header", "body", "oversize", "idle"])
def test_slow_and_idle_clients_are_cut_after_the_timeouts(kind):
    async def slowloris(host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        await writer.drain()

        async def trickle():                      # a header line every 0.1 s, never the blank line
            for n in range(100):
                await asyncio.sleep(0.1)
                if writer.is_closing():
                    return
                writer.write(b"x-slow-%d: y\r\n" % n)
        feeder = asyncio.create_task(trickle())
        try:
            return await _until_closed(reader, TIMEOUTS.header + 5)
        finally:
            feeder.cancel()
            writer.close()

    async def slow_body(host, port):
        body = _body()
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(_request(body) + body[:10])
        await writer.drain()

        async def trickle():
            for b in body[10:-1]:
                await asyncio.sleep(0.05)
                if writer.is_closing():
                    return
                writer.write(bytes([b]))
        feeder = asyncio.create_task(trickle())
        try:
            return await _until_closed(reader, TIMEOUTS.body + 5)
        finally:
            feeder.cancel()
            writer.close()

    async def huge(host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(_request(b"", declared=10 ** 12) + b"{" * 100)
        await writer.drain()
        try:
            return await _until_closed(reader, 5)
        finally:
            writer.close()

    async def idle(host, port):
        body = _body()
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(_request(body) + body)
        await writer.drain()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await asyncio.wait_for(reader.readexactly(length), 5)
            waited, rest = await _until_closed(reader, TIMEOUTS.idle + 5)
            return waited, head + rest
        finally:
            writer.close()

    async def main():
        engine = await FakeEngine("ok").start()
        service, host, port = await _dispatcher(engine)
        try:
            figures = {}
            clients = {"header": slowloris, "body": slow_body, "oversize": huge, "idle": idle}
            for name, client in ((kind, clients[kind]),):
                results = await asyncio.gather(*(client(host, port) for _ in range(CLIENTS)))
                waits = sorted(w for w, _ in results)
                figures[name] = (waits[0], waits[-1])
                for _, got in results:
                    status = got.split(b"\r\n", 1)[0]
                    if name in ("header", "body"):
                        assert status == b"HTTP/1.1 408 Request Timeout", got[:200]
                        assert b'"code":"request_timeout"' in got
                    elif name == "oversize":
                        assert status.startswith(b"HTTP/1.1 413"), got[:200]
                        assert b'"code":"request_too_large"' in got
                    else:
                        assert status == b"HTTP/1.1 200 OK", got[:200]
            limit = {"header": TIMEOUTS.header, "body": TIMEOUTS.body, "idle": TIMEOUTS.idle, "oversize": 0.0}
            for name, (low, high) in figures.items():
                assert low >= limit[name] * 0.9, f"{name}: cut after {low:.2f}s, before its timeout"
                assert high < limit[name] + 2.5, f"{name}: still open {high:.2f}s later"
            assert engine.served == (CLIENTS if kind == "idle" else 0), "only whole requests reach the engine"
            print("FIGURES", {k: f"{lo:.2f}-{hi:.2f}s" for k, (lo, hi) in figures.items()}, f"clients={CLIENTS} each")
        finally:
            await service.stop()
            await engine.stop()

    asyncio.run(main())


def test_half_closed_clients_get_their_answer_and_count_against_no_engine():
    async def half_closed(host, port, *, stream: bool, after: int):
        """Send a request, shut the write side after `after` response bytes (0: at once), read to EOF."""
        body = _body(stream)
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(_request(body) + body)
        await writer.drain()
        got = b""
        if after:
            while len(got) < after:
                more = await asyncio.wait_for(reader.read(4096), 5)
                assert more, "closed before the half-close"
                got += more
        writer.write_eof()
        try:
            _, rest = await _until_closed(reader, 10)
        finally:
            writer.close()
        got += rest
        interim = b"HTTP/1.1 100 Continue\r\n\r\n"     # the server's probe of a half-open peer
        return got[len(interim):] if got.startswith(interim) else got

    async def main():
        engine = await FakeEngine("ok", events=200, chunk_bytes=512).start()
        service, host, port = await _dispatcher(engine)
        try:
            answers = await asyncio.gather(*(half_closed(host, port, stream=False, after=0) for _ in range(CLIENTS)))
            for got in answers:
                assert got.startswith(b"HTTP/1.1 200 OK"), got[:200]
                assert b'"content": "hi"' in got
            engine.mode, engine.slow_seconds = "slow", 0.002
            streams = await asyncio.gather(*(half_closed(host, port, stream=True, after=2048) for _ in range(8)))
            for got in streams:
                assert got.startswith(b"HTTP/1.1 200 OK"), got[:200]
                assert got.count(b"data: {") == 200 and b"data: [DONE]" in got, "the stream was cut short"
            assert all(service.router.state.healthy)
            assert _engine_failures(service) == 0, "a half-closed client counted against the engine"
            # a client that closes its socket outright (FIN, like a half-close) while the engine
            # has not answered: its request is still cancelled (the probe's reset tells them apart)
            engine.mode = "hang"
            body = _body()
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(_request(body) + body)
            await writer.drain()
            await wait_until(lambda: service.router.outstanding == [1], timeout=5)
            writer.close()
            gone = await wait_until(lambda: service.router.outstanding == [0], timeout=5)
            print("FIGURES", f"half-closed: {len(answers)} whole answers, {len(streams)} whole streams of 200 events; "
                  f"a closed client's pending request cancelled after {gone:.2f}s")
        finally:
            await service.stop()
            await engine.stop()

    asyncio.run(main())
