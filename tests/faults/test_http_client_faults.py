"""Hostile clients in front of the dispatcher's OpenAI HTTP API (issue 20).

Four healthy fake engines (tests.faults.fake_engine) stream large SSE responses; clients
that read a little and then reset their connection (SO_LINGER 0) must never count against
an engine: no replica is ejected and no engine failure is recorded.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import aiohttp
import orjson
from aiohttp import web

from services.dispatcher.http import HttpConfig
from services.dispatcher.service import DispatcherConfig, serve
from services.model import parse_replicas
from services.rpc import ServerConfig
from tests.faults.fake_engine import FakeEngine
from tests.integration.test_dispatcher import wait_until


async def _reset_mid_stream(host: str, port: int, n: int) -> int:
    """One client: a streamed request, a few bytes read, then a TCP reset. Bytes read."""
    body = orjson.dumps({"model": "m", "stream": True, "max_tokens": 50,
                         "messages": [{"role": "user", "content": f"client {n} " * 20}]})
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"x-cacheroute-key: k%d\r\nContent-Length: %d\r\n\r\n" % (n, len(body)) + body)
    await writer.drain()
    got = b""
    while len(got) < 20_000 * (1 + n % 7):      # read at full speed, then reset in the middle of it
        more = await reader.read(65536)
        if not more:
            break
        got += more
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
    return len(got)


def test_clients_resetting_mid_stream_eject_no_replica():
    async def main():
        engines = [await FakeEngine("stream", events=2000, chunk_bytes=2048).start() for _ in range(4)]
        replicas = ",".join(f"e{i}=vllm+{e.url}" for i, e in enumerate(engines))
        config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0), replicas=parse_replicas(replicas),
                                  poll_interval=0.1, poll_timeout=0.5, seed=2, http=HttpConfig(port=0))
        service = await serve(config)
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            host, port = service.http_url.rsplit("//", 1)[1].rsplit(":", 1)
            for wave in range(3):
                got = await asyncio.gather(*(_reset_mid_stream(host, int(port), wave * 100 + n) for n in range(30)))
                assert all(got), "every client saw the start of its stream"
            await asyncio.sleep(0.5)
            assert sum(e.served for e in engines) >= 90
            assert all(service.router.state.healthy), "a client's reset ejected a healthy replica"
            errors = [s for m in service.dispatcher.failures.collect() for s in m.samples
                      if s.name.endswith("_total") and s.value]
            assert errors == [], "a client's reset was counted as an engine failure"
        finally:
            await service.stop()
            for engine in engines:
                await engine.stop()

    asyncio.run(main())


def test_a_write_to_a_closing_client_is_not_an_engine_failure(monkeypatch):
    """Deterministic form of the race above: the dispatcher's write to its client raises what
    aiohttp raises on a closing transport (ClientConnectionResetError). Before the fix each
    such stream counted as an engine failure, and three in a row ejected a healthy replica."""
    real_write = web.StreamResponse.write
    written: list[int] = []       # bytes written, per dispatcher response (ids of dead objects are reused)

    async def write(self, data):
        if "x-cacheroute-replica" in self.headers:      # the dispatcher's side only
            if not hasattr(self, "_test_stream"):
                self._test_stream = len(written)
                written.append(0)
            written[self._test_stream] += len(data)
            if written[self._test_stream] > 10_000:
                raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
        return await real_write(self, data)

    monkeypatch.setattr(web.StreamResponse, "write", write)

    async def main():
        engines = [await FakeEngine("stream", events=200, chunk_bytes=1024).start() for _ in range(2)]
        replicas = ",".join(f"e{i}=vllm+{e.url}" for i, e in enumerate(engines))
        config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0), replicas=parse_replicas(replicas),
                                  poll_interval=0.1, poll_timeout=0.5, seed=2, http=HttpConfig(port=0))
        service = await serve(config)
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with aiohttp.ClientSession() as session:
                for n in range(8):
                    async with session.post(service.http_url + "/v1/chat/completions", json=body,
                                            headers={"x-cacheroute-key": "same"}) as resp:
                        assert resp.status == 200
                        try:
                            await resp.read()
                        except aiohttp.ClientPayloadError:
                            pass      # the stream was cut: what a client that went away would not see anyway
            assert all(service.router.state.healthy), "client write errors ejected a healthy replica"
            errors = [s for m in service.dispatcher.failures.collect() for s in m.samples
                      if s.name.endswith("_total") and s.value]
            assert errors == []
            assert len(written) == 8
        finally:
            await service.stop()
            for engine in engines:
                await engine.stop()

    asyncio.run(main())


async def _stall_after_headers(host: str, port: int) -> socket.socket:
    """A client with a tiny receive buffer that sends a streamed request, reads the first bytes
    and then stops reading (keeping the connection open). Returns its socket."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    body = orjson.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "stall"}]})
    await asyncio.get_running_loop().sock_sendall(
        sock, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"x-cacheroute-key: stall\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    first = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 1024), 5)
    assert first.startswith(b"HTTP/1.1 200")
    return sock


def test_a_client_that_stops_reading_is_dropped_and_its_engine_request_cancelled():
    """--client-write-timeout: a stream whose client takes no write for that long is dropped,
    the engine's request is cancelled (its stream ends early), and it counts as a client error,
    never as an engine failure. Without the timeout the engine stream stays open for as long as
    the client keeps its connection."""
    async def main():
        engine = await FakeEngine("stream", events=100_000, chunk_bytes=4096).start()
        config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0),
                                  replicas=parse_replicas(f"e0=vllm+{engine.url}"), poll_interval=0.1,
                                  poll_timeout=0.5, seed=2, http=HttpConfig(port=0, client_write_timeout=1.0))
        service = await serve(config)
        sock = None
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            host, port = service.http_url.rsplit("//", 1)[1].rsplit(":", 1)
            sock = await _stall_after_headers(host, int(port))
            await wait_until(lambda: engine.open_streams == 1, timeout=5)
            await wait_until(lambda: engine.open_streams == 0, timeout=8)     # cancelled, well before its end
            assert engine.aborted == 1
            client = {s.labels["reason"]: s.value for m in service.dispatcher.client_errors.collect()
                      for s in m.samples if s.name.endswith("_total")}
            assert client == {"write_timeout": 1.0}
            errors = [s for m in service.dispatcher.failures.collect() for s in m.samples
                      if s.name.endswith("_total") and s.value]
            assert errors == [] and all(service.router.state.healthy)
            assert service.router.outstanding == [0]
        finally:
            if sock is not None:
                sock.close()
            await service.stop()
            await engine.stop()

    asyncio.run(main())


def _dechunk(raw: bytes) -> bytes:
    """The body of an HTTP/1.1 chunked response (headers included in `raw`)."""
    rest = raw.split(b"\r\n\r\n", 1)[1]
    out = []
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            return b"".join(out)
        out.append(rest[:size])
        assert rest[size:size + 2] == b"\r\n"
        rest = rest[size + 2:]


def test_a_slow_client_that_keeps_reading_gets_every_byte():
    """A client reading 4 KiB at a time from an 8 MiB stream (more than the kernel buffers on
    loopback, so the dispatcher's writes back up) still gets the engine's stream byte for byte,
    usage included (the client asked for it), as one chunked response, within
    --client-write-timeout; nothing counts as a client or an engine error, and the engine's
    request is not cancelled."""
    N = 2000                 # 8 MiB: past what the kernel buffers on loopback

    async def main():
        engine = await FakeEngine("stream", events=N, chunk_bytes=4096).start()
        config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0),
                                  replicas=parse_replicas(f"e0=vllm+{engine.url}"), poll_interval=0.1,
                                  poll_timeout=0.5, seed=2, http=HttpConfig(port=0, client_write_timeout=5.0))
        service = await serve(config)
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            host, port = service.http_url.rsplit("//", 1)[1].rsplit(":", 1)
            loop = asyncio.get_running_loop()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await loop.sock_connect(sock, (host, int(port)))
            body = orjson.dumps({"model": "m", "stream": True, "stream_options": {"include_usage": True},
                                 "messages": [{"role": "user", "content": "slow"}]})
            await loop.sock_sendall(sock, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                                    % len(body) + body)
            raw = bytearray()
            try:
                while more := await asyncio.wait_for(loop.sock_recv(sock, 4096), 10):
                    raw += more
                    await asyncio.sleep(0.001)
            finally:
                sock.close()
            assert raw.startswith(b"HTTP/1.1 200")
            events = _dechunk(bytes(raw)).split(b"\n\n")
            assert events[-2:] == [b"data: [DONE]", b""]
            assert len(events) == N + 3 and all(e.startswith(b'data: {') for e in events[:-2])
            assert all(b"x" * 4096 in e for e in events[:N]) and b'"usage"' in events[N]
            assert engine.aborted == 0 and service.router.outstanding == [0]
            client = [s for m in service.dispatcher.client_errors.collect() for s in m.samples
                      if s.name.endswith("_total") and s.value]
            assert client == []
        finally:
            await service.stop()
            await engine.stop()

    asyncio.run(main())
