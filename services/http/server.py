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

Timeouts toward clients (`HttpTimeouts`, every server started here; the dispatcher's flags
`--http-header-timeout`, `--http-body-timeout`, `--http-idle-timeout`, env
CACHEROUTE_HTTP_HEADER_TIMEOUT / _BODY_TIMEOUT / _IDLE_TIMEOUT). aiohttp 3.14 has only an
idle (keep-alive) timer, 3,630 s by default, so a slowloris client held a connection for an
hour (issue 20). Here:

- header (20 s): from a request's first byte to the end of its headers; then 408 (an
  OpenAI-shaped body) and the connection is closed. As Apache's mod_reqtimeout (20-40 s).
- body (60 s): the whole request body must arrive within it (a total, not a gap between
  reads, so a client trickling one byte every few seconds is cut too); then 408 and close. A
  body whose declared Content-Length is over the app's `client_max_size` is refused with 413
  at once, before any of it is read, and the connection closed (no lingering read).
- idle (75 s): a connection without a request in progress, from its accept or its last
  response, is closed. 75 s is nginx's keepalive_timeout: longer than the 60 s idle timeout
  of common load balancers in front (which must close first, else they reuse a connection
  the server is closing and answer 502) and than the dispatcher's engine client pool (15 s,
  services.backends.rawhttp.KEEPALIVE), so its keep-alive connections to engines served from
  here never race it.

Half-closed clients: a client that shuts down its write side after sending a whole request
(`shutdown(SHUT_WR)`) still gets its answer: the connection stays open for writing until the
response is sent, then closes (asyncio closes a transport on EOF unless the protocol keeps
it). A half-close before the body is complete, or on an idle connection, closes it at once.
A client that closed its socket instead looks the same until the peer answers a write with a
reset; `_JsonErrors.eof_received` says how that is probed, so a client that went away still
cancels its request within ~0.3 s (the `handler_cancellation` contract above).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import dataclass

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from services.rpc import kv

log = logging.getLogger("cacheroute.http")
_TCP_CLOSE = 7          # tcpi_state of a socket the peer reset (Linux include/net/tcp_states.h)


@dataclass(frozen=True)
class HttpTimeouts:
    """Client-side timeouts, seconds (module header: what each bounds and why the default)."""
    header: float = 20.0     # a request's first byte -> the end of its headers
    body: float = 60.0       # the whole request body
    idle: float = 75.0       # a connection with no request in progress

    def __post_init__(self) -> None:
        if not (self.header > 0 and self.body > 0 and self.idle > 0):
            raise ValueError("HTTP header, body and idle timeouts must be > 0 seconds")


def _error_body(message: str, type_: str, code: str | None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


def _late_bytes(message: str) -> bytes:
    """A whole 408 response, written raw (no request object exists while headers are late)."""
    body = _error_body(message, "invalid_request_error", "request_timeout")
    return (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


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
    """aiohttp's request handler with JSON protocol errors, a header timeout and half-close."""

    def __init__(self, *args, header_timeout: float = HttpTimeouts.header, cut_log=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout = header_timeout
        self._cut_log = cut_log or _CutLog()
        self._header_timer: asyncio.TimerHandle | None = None
        self._last_body = None              # the payload of the last request whose headers were parsed
        self._peer_timer: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        parsed = self._request_count
        super().data_received(data)
        if self._request_count != parsed and self._messages:
            self._last_body = self._messages[-1][1]
        if self._request_count != parsed or self._force_close or self._close:
            self._stop_header_timer()           # a request's headers are complete (or the end)
        elif data and self._header_timer is None and not self._request_in_progress and not self._messages:
            self._header_timer = self._loop.call_later(self._header_timeout, self._headers_late)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self._request_in_progress or self._messages or self.transport is None:
            return
        why = f"request headers not complete within {self._header_timeout:g}s"
        self._cut_log(why, "header")
        self.transport.write(_late_bytes(why))
        self.force_close()                       # the transport flushes the 408, then closes

    def eof_received(self) -> bool | None:
        """The client shut down its write side, or closed its socket: TCP cannot tell which.
        A request already received whole is still answered (True keeps the transport open for
        writing) and the connection closes after it; with nothing whole to answer, None lets
        asyncio close it. To tell a half-close from a client that went away (whose request
        must be cancelled, so the engine stops working on it), the peer is probed: a response
        not begun yet gets an interim `100 Continue` (every HTTP/1.1 client skips 1xx; most
        streams are writing anyway), a peer that has closed answers it with a reset, and a
        check of the socket's TCP state every 0.25 s aborts the connection once it sees the
        reset, which cancels the handler as a disconnect does."""
        idle = self._waiter is not None and not self._waiter.done() and not self._messages
        if idle or self._last_body is None or not self._last_body.is_eof():
            return None
        self._close = True                      # no request can follow: close after this response
        request = self._current_request
        if (request is not None and request.version >= (1, 1) and request.writer.output_size == 0
                and self.transport is not None):
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._peer_timer = self._loop.call_later(0.05, self._check_peer)
        return True

    def _check_peer(self) -> None:
        """Abort a half-open connection whose peer has reset it (module header: half-close)."""
        self._peer_timer = None
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None or not hasattr(socket, "TCP_INFO"):
            return
        try:
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
        except OSError:
            state = _TCP_CLOSE
        if state == _TCP_CLOSE:
            self.transport.abort()              # connection_lost: the handler is cancelled
        elif self._request_in_progress or self._messages:
            self._peer_timer = self._loop.call_later(0.25, self._check_peer)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_timer()
        if self._peer_timer is not None:
            self._peer_timer.cancel()
        super().connection_lost(exc)

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)       # logs (one line), refuses a sent response
        reason = "bad request" if status < 500 else "internal error"
        text = " ".join(str(getattr(exc, "message", "") or message or reason).split())[:200] or reason
        body = _error_body(f"malformed HTTP request: {text}" if status < 500 else text,
                           "invalid_request_error" if status < 500 else "server_error",
                           "bad_http_request" if status < 500 else None)
        resp = web.Response(status=status, body=body, content_type="application/json")
        resp.force_close()
        return resp


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrors(self, loop=self._loop, **self._kwargs)


class _CutLog:
    """One WARNING line a second at most for clients cut by a timeout (how many since the last)."""

    def __init__(self) -> None:
        self.last, self.counts = 0.0, {"header": 0, "body": 0, "oversize": 0}

    def __call__(self, why: str, kind: str) -> None:
        self.counts[kind] += 1
        now = time.monotonic()
        if now - self.last >= 1.0:
            self.last = now
            log.warning("http client cut", extra=kv(reason=why, **{f"{k}_total": v for k, v in self.counts.items()}))


async def _answer_and_close(request: web.BaseRequest, status: int, message: str, code: str) -> web.Response:
    """Send an OpenAI-shaped error and close the connection without reading the rest of the body."""
    resp = web.Response(status=status, body=_error_body(message, "invalid_request_error", code),
                        content_type="application/json")
    resp.force_close()
    await resp.prepare(request)
    await resp.write_eof()
    request.protocol.force_close()       # flushes the answer; no lingering read of a body not coming
    return resp


def body_deadline(seconds: float, cut_log: _CutLog | None = None):
    """Middleware: a request's whole body within `seconds` (408 and close after it), and a
    declared Content-Length over the app's `client_max_size` refused with 413 before any read.
    The body is read here, so `await request.read()` in the handler returns it at once."""

    cut = cut_log or _CutLog()

    @web.middleware
    async def deadline(request: web.Request, handler):
        if request.body_exists:
            limit, declared = request.client_max_size, request.content_length
            if limit and declared is not None and declared > limit:
                cut(f"declared body of {declared} bytes", "oversize")
                return await _answer_and_close(request, 413, f"request body of {declared} bytes is over {limit} bytes",
                                               "request_too_large")
            try:
                async with asyncio.timeout(seconds):     # not wait_for: no task per request (Python 3.11)
                    await request.read()
            except TimeoutError:
                cut(f"request body not complete within {seconds:g}s", "body")
                return await _answer_and_close(request, 408, f"request body not complete within {seconds:g}s",
                                               "request_timeout")
        return await handler(request)

    return deadline


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
                     reuse_port: bool = False, timeouts: HttpTimeouts = HttpTimeouts()) -> RunningHttp:
    """Serve `app` on host:port (0: ephemeral); the bound port is in the result and in the
    "http serving" log line (field `url`), which `services.local.stack` reads like gRPC's "serving" line.
    `timeouts`: toward clients (module header). The body deadline runs inside the app's own
    middlewares, so their error mapping sees what the handler would have."""
    cut_log = _CutLog()
    app.middlewares.append(body_deadline(timeouts.body, cut_log))
    runner = _Runner(app, handler_cancellation=True, access_log=None, shutdown_timeout=shutdown_timeout,
                     logger=_OneLineLog(), keepalive_timeout=timeouts.idle, header_timeout=timeouts.header,
                     cut_log=cut_log)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, reuse_port=reuse_port or None)
    await site.start()
    sockets = site._server.sockets if site._server is not None else ()   # noqa: SLF001 - the only way to read port 0
    bound = sockets[0].getsockname()[1] if sockets else port
    running = RunningHttp(runner, host, bound)
    log.info("http serving", extra=kv(url=running.url))
    return running
