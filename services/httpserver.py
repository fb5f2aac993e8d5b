"""Starting and stopping an aiohttp application inside a service's event loop.

aiohttp (3.x) is the HTTP library of the data plane: it is asyncio-native, so the OpenAI
front door shares one event loop with grpc.aio (no thread hand-offs on the request path),
it streams request and response bodies both ways, and it is maintained by the aio-libs
team with a long release history. Handlers are cancelled when their client disconnects
(`handler_cancellation=True`), which is how an abandoned request cancels its upstream.

Protocol errors (a request aiohttp's parser refuses before any handler runs: bad header
bytes, Content-Length with Transfer-Encoding, a bad chunk, oversize or folded headers) are
answered with an OpenAI-shaped JSON error (`{"error": {...}}`, the parser's status, 400 as a
rule) instead of aiohttp's text/plain page, and logged as one WARNING line without a
traceback, at most one a second (the line carries how many were suppressed since the last).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from services.rpc import kv

log = logging.getLogger("cacheroute.http")


class _OneLineLog:
    """The logger aiohttp's request handler writes parse errors to: one line a second at most."""

    def __init__(self, every: float = 1.0) -> None:
        self.every, self.last, self.suppressed = every, 0.0, 0

    def exception(self, message: str, *args, exc_info=None, **_kw) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            self.suppressed += 1
            return
        self.last, suppressed, self.suppressed = now, self.suppressed, 0
        why = " ".join(str(exc_info).split())[:200] if isinstance(exc_info, BaseException) else ""
        log.warning("http protocol error", extra=kv(error=type(exc_info).__name__ if exc_info else "",
                                                      detail=why, suppressed=suppressed))

    def __getattr__(self, name: str):
        return getattr(logging.getLogger("aiohttp.server"), name)


class _JsonErrors(RequestHandler):
    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)       # logs (one line), refuses a sent response
        reason = "bad request" if status < 500 else "internal error"
        text = " ".join(str(getattr(exc, "message", "") or message or reason).split())[:200] or reason
        body = orjson.dumps({"error": {"message": f"malformed HTTP request: {text}" if status < 500 else text,
                                       "type": "invalid_request_error" if status < 500 else "server_error",
                                       "param": None, "code": "bad_http_request" if status < 500 else None}})
        resp = web.Response(status=status, body=body, content_type="application/json")
        resp.force_close()
        return resp


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrors(self, loop=self._loop, **self._kwargs)


class _Runner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server          # aiohttp offers no handler-class option; the same object otherwise
        return server


@dataclass
class RunningHttp:
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_http(app: web.Application, host: str, port: int, *, shutdown_timeout: float = 1.0,
                     reuse_port: bool = False) -> RunningHttp:
    """Serve `app` on host:port (0: ephemeral); the bound port is in the result and in the
    "http serving" log line (field `url`), which `services.stack` reads like gRPC's "serving" line."""
    runner = _Runner(app, handler_cancellation=True, access_log=None, shutdown_timeout=shutdown_timeout,
                     logger=_OneLineLog())
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, reuse_port=reuse_port or None)
    await site.start()
    sockets = site._server.sockets if site._server is not None else ()   # noqa: SLF001 - the only way to read port 0
    bound = sockets[0].getsockname()[1] if sockets else port
    running = RunningHttp(runner, host, bound)
    log.info("http serving", extra=kv(url=running.url))
    return running
