"""A response stream's writes to an aiohttp client, for the front door's relay (services.dispatcher.http).

`ClientStream(request, resp, writer, write_timeout)` after `writer = await resp.prepare(request)`:

- `await send(block)`: one block through aiohttp (the first one carries the headers aiohttp
  holds back until the body starts). A write waits only while the transport is paused (its
  buffer past the high-water mark); when it is not, and the block cannot push it there, the
  write needs no deadline (no timer armed and cancelled per block), else it gets one.
- `write(block) -> bool`: the block written to the transport here, chunk-framed when the
  response is chunked (HTTP/1.1), with no await: what services.backends.relay's pushed
  relay calls from the engine connection's callback. False once the transport is paused: the
  caller stops and awaits `room()`.
- `await room()`: the transport drained below its low-water mark.

A client that does not take a write for `write_timeout` seconds is dropped (its connection
aborted) and ClientGone("write_timeout") raised; a client that reset or closed gives
ClientGone("reset"). Never TimeoutError: in the relay that means the engine went quiet.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

WRITE_MARGIN = 4096      # bytes a write may add beyond the block (chunk framing, buffered headers)


class ClientGone(Exception):
    """Writing to the client failed (it reset or closed) or timed out: never the engine's failure."""


class ClientStream:
    """One streamed response's writes (module header); also a services.backends.relay.Sink."""

    __slots__ = ("request", "resp", "writer", "transport", "protocol", "chunked", "timeout")

    def __init__(self, request: web.Request, resp: web.StreamResponse, writer, write_timeout: float) -> None:
        self.request, self.resp, self.writer = request, resp, writer
        self.transport = request.transport
        self.protocol = request.protocol
        self.chunked = bool(getattr(writer, "chunked", False))
        self.timeout = write_timeout

    async def send(self, block: bytes) -> None:
        transport = self.transport
        try:
            if transport is not None and not self.protocol.writing_paused and \
                    transport.get_write_buffer_size() + len(block) + WRITE_MARGIN < transport.get_write_buffer_limits()[1]:
                await self.resp.write(block)
                return
            async with asyncio.timeout(self.timeout):
                await self.resp.write(block)
        except TimeoutError:
            self._drop()
            raise ClientGone("write_timeout") from None
        except (ConnectionError, RuntimeError, aiohttp.ClientConnectionError):
            raise ClientGone("reset") from None

    first = send

    def write(self, block: bytes) -> bool:
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ClientGone("reset")
        transport.write(b"%x\r\n%b\r\n" % (len(block), block) if self.chunked else block)
        return not self.protocol.writing_paused

    async def room(self) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                await self.writer.drain()
        except TimeoutError:
            self._drop()
            raise ClientGone("write_timeout") from None
        except (ConnectionError, RuntimeError, aiohttp.ClientConnectionError):
            raise ClientGone("reset") from None
        if self.transport is None or self.transport.is_closing():
            raise ClientGone("reset")

    def _drop(self) -> None:
        transport = self.request.transport
        if transport is not None:
            transport.abort()       # drop the client; closing the engine's Reply cancels its request
