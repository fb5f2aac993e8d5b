"""The dispatcher's HTTP/1.1 client to engines: keep-alive connections to one origin, answers
parsed by httptools (llhttp, the parser aiohttp's and uvicorn's C speedups use), body bytes
handed over as they arrive.

Why not aiohttp's client (it was, until issue 22's CPU work): per request it builds a
ClientRequest, its header multidicts and a StreamReader, wakes a future per engine chunk and
re-arms a read timer per chunk; with ~10 SSE chunks a request that was ~23% of a dispatcher's
samples (docs/benchmarks.md). Here a request is one write of its head and body, an answer's
headers one dict, and each chunk one append (plus one future wake-up when a reader waits).

  origin = Origin("http://10.0.0.5:8000")
  answer = await origin.request("POST", "/v1/chat/completions", body, {"content-type": ...}, connect=3.0)
  answer.status, answer.headers.get("content-type")     # lower-case names
  while data := await answer.readany(): ...             # or: await answer.read()
  answer.release()                                      # connection back to the pool (or closed)
  answer.close()                                        # the engine's request aborted

Timeouts: `connect` seconds to a connection (ConnectTimeout); `idle` seconds without a byte
from the engine once the request is sent, the headers included (TimeoutError from `request`,
`readany` or `read`; one timer per request, moved forward lazily when it fires, not re-armed
per chunk; not counted while reading is paused for a slow reader). Callers bound the whole
wait for the headers with `asyncio.timeout`; a request cancelled there closes its connection.

Failures are HttpError subclasses: ConnectError (refused, no route, a name that does not
resolve: nothing was sent), ConnectTimeout, Disconnected (the engine closed the connection
before the answer ended), BadResponse (not HTTP/1.x). A pooled connection that the engine
closed while it sat idle is detected when it closes; if the close races the request (no byte
of an answer came back), the request is sent once more on a new connection, as HTTP clients do
for a connection that was reused.

Reading is paused while more than HIGH_WATER bytes wait for a slow reader and resumed below
LOW_WATER. Idle connections are kept (up to MAX_IDLE per origin) for KEEPALIVE seconds.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 1 << 20
LOW_WATER = 1 << 18
KEEPALIVE = 15.0
MAX_IDLE = 64


class HttpError(Exception):
    """The connection failed or an answer broke off."""


class ConnectError(HttpError):
    """No connection (refused, unreachable, unresolvable): nothing was sent."""


class ConnectTimeout(HttpError):
    """No connection within the connect deadline: nothing was sent."""


class Disconnected(HttpError):
    """The engine closed the connection before its answer ended."""


class BadResponse(HttpError):
    """What came back is not an HTTP/1.x answer."""


class Answer:
    """One engine answer: `status`, `headers` (lower-case names; a repeated header keeps its
    last value), the body through `readany` / `read`, then `release` or `close`."""

    __slots__ = ("status", "headers", "_conn", "_chunks", "_size", "_done", "_exc", "_waiter", "_loop", "_released")

    def __init__(self, conn: "_Connection", status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers
        self._conn = conn
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._done = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._loop = conn.loop
        self._released = False

    def __repr__(self) -> str:
        return f"Answer({self.status}, done={self._done})"

    # -- fed by the connection
    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER:
            self._conn.pause()
        self._wake()

    def _end(self, exc: BaseException | None = None) -> None:
        if self._done or self._exc is not None:
            return
        if exc is None:
            self._done = True
        else:
            self._exc = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the reader's side
    def at_eof(self) -> bool:
        """The whole body has been read."""
        return self._done and not self._chunks

    async def readany(self) -> bytes:
        """The bytes that arrived since the last call (waiting for some); b"" at the end."""
        if not self._chunks:
            if self._exc is not None:
                raise self._exc
            if self._done:
                return b""
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
            if not self._chunks:
                if self._exc is not None:
                    raise self._exc
                return b""
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._size = 0
        if self._conn.paused:
            self._conn.resume()
        return data

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = []
        while data := await self.readany():
            parts.append(data)
        return b"".join(parts)

    def release(self) -> None:
        """Done with this answer: its connection goes back to the pool if the answer ended and
        the engine keeps connections alive, else it is closed."""
        if self._released:
            return
        self._released = True
        self._conn.finished(self._done)

    def close(self) -> None:
        """Drop the answer and its connection (an unfinished engine request is aborted)."""
        if not self._released:
            self._released = True
            self._conn.finished(False)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self, origin: "Origin", loop: asyncio.AbstractEventLoop) -> None:
        self.origin, self.loop = origin, loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.paused = False
        self.idle_since = 0.0
        self._parser = None
        self._head: asyncio.Future | None = None
        self._answer: Answer | None = None
        self._headers: dict[str, str] = {}
        self._informational = False
        self._complete = False
        self._eof_body = False
        self._got_bytes = False
        self._keep = False
        self._idle: float | None = None
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        if self._idle:
            self._last = self.loop.time()
        parser = self._parser
        if parser is None or self._complete and self._answer is None:     # bytes while idle: not HTTP we can use
            self.abort()
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(f"bad HTTP answer: {exc}"))
            self.abort()

    def eof_received(self):
        return False                        # close our side too

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._stop_timer()
        self.origin.forget(self)
        answer = self._answer
        if answer is not None and self._eof_body and not answer._done and exc is None:
            answer._end()                   # a body delimited by the connection's end
            return
        self._fail(Disconnected("the engine closed the connection" + (f": {exc}" if exc else "")))

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        if self._complete:                  # more bytes after the answer ended: not an engine we can trust
            raise BadResponse("bytes after the end of the answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        headers, self._headers = self._headers, {}
        if 100 <= status < 200:             # 100 Continue and friends: the answer follows
            self._informational = True
            return
        self._eof_body = ("content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "")
                          and status not in (204, 304))
        self._keep = self._parser.should_keep_alive() and not self._eof_body
        answer = self._answer = Answer(self, status, headers)
        head = self._head
        if head is not None and not head.done():
            head.set_result(answer)

    def on_body(self, body: bytes) -> None:
        if self._answer is not None:
            self._answer._feed(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        self._complete = True
        self._stop_timer()
        if self._answer is not None:
            self._answer._end()

    # -- the origin's side
    def send(self, method: str, target: str, head: bytes, body: bytes, idle: float | None) -> asyncio.Future:
        """Write one request; the future resolves to its Answer once the headers are in."""
        self._parser = httptools.HttpResponseParser(self)
        self._head = self.loop.create_future()
        self._answer, self._headers, self._informational, self._got_bytes = None, {}, False, False
        self._complete = False
        self._idle = idle
        if idle:
            self._last = self.loop.time()
            self._timer = self.loop.call_at(self._last + idle, self._check_idle)
        length = b"content-length: %d\r\n" % len(body) if body or method not in ("GET", "HEAD") else b""
        self.transport.write(f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + head + length + b"\r\n" + body)
        return self._head

    @property
    def answered(self) -> bool:
        """Some byte of an answer came back on this request."""
        return self._got_bytes

    def _check_idle(self) -> None:
        """The idle deadline: moved forward if a byte came since it was set (or reading is paused
        for a slow reader), else the request fails with TimeoutError and the connection closes."""
        self._timer = None
        if self._complete or self.closed:
            return
        now = self.loop.time()
        if self.paused:
            self._last = now
        if now < self._last + self._idle:
            self._timer = self.loop.call_at(self._last + self._idle, self._check_idle)
            return
        self._fail(TimeoutError(f"no byte for {self._idle:g}s"))
        self.abort()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, exc: BaseException) -> None:
        head = self._head
        if head is not None and not head.done():
            head.set_exception(exc)
        if self._answer is not None:
            self._answer._end(exc)
        self._parser = None

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            if not self.closed:
                self.transport.resume_reading()

    def finished(self, whole: bool) -> None:
        """The caller is done with the answer: back to the pool or closed."""
        self._answer, self._head = None, None
        self._stop_timer()
        if whole and self._keep and self._complete and not self.closed and not self.paused:
            self.origin.keep(self)
        else:
            self.abort()

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        self.origin.forget(self)


class Origin:
    """Keep-alive connections to one `scheme://host:port` (an engine's base URL; its path, if
    any, is a prefix of every request's)."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        default = (parts.scheme == "http" and self.port == 80) or (parts.scheme == "https" and self.port == 443)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host_header = (f"host: {host}\r\n" if default else f"host: {host}:{self.port}\r\n").encode("latin-1")
        self._ssl: ssl.SSLContext | None = None
        self._pool: list[_Connection] = []
        self._open: set[_Connection] = set()

    def __repr__(self) -> str:
        return f"Origin({self.scheme}://{self.host}:{self.port}{self.prefix})"

    async def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None, *,
                      connect: float = 3.0, idle: float | None = None) -> Answer:
        """Send a request; its Answer once the headers are in (module header for the errors)."""
        head = self._host_header + _header_bytes(headers)
        target = self.prefix + path
        for attempt in (0, 1):
            conn = self._take()
            reused = conn is not None
            if conn is None:
                conn = await self._connect(connect)
            try:
                return await conn.send(method, target, head, body, idle)
            except Disconnected:
                conn.abort()
                if reused and not conn.answered and attempt == 0:
                    continue                # closed while pooled: once more on a new connection
                raise
            except BaseException:           # cancelled (the caller's deadline), a bad answer
                conn.abort()
                raise
        raise AssertionError("unreachable")

    def _take(self) -> _Connection | None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._pool:
            conn = self._pool.pop()
            if not conn.closed and conn.loop is loop and now - conn.idle_since < KEEPALIVE:
                return conn
            conn.abort()
        return None

    async def _connect(self, timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        if self.scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(lambda: _Connection(self, loop), self.host, self.port,
                                                       ssl=self._ssl if self.scheme == "https" else None)
        except TimeoutError:
            raise ConnectTimeout(f"no connection to {self.host}:{self.port} within {timeout:g}s") from None
        except (OSError, ssl.SSLError) as exc:
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        self._open.add(conn)
        return conn

    def keep(self, conn: _Connection) -> None:
        if len(self._pool) >= MAX_IDLE:
            conn.abort()
            return
        conn.idle_since = conn.loop.time()
        self._pool.append(conn)

    def forget(self, conn: _Connection) -> None:
        self._open.discard(conn)
        if conn in self._pool:
            self._pool.remove(conn)

    async def close(self) -> None:
        """Close every connection (answers still being read end with Disconnected)."""
        for conn in list(self._open):
            conn.abort()
        self._pool.clear()


def _header_bytes(headers: dict[str, str] | None) -> bytes:
    if not headers:
        return b""
    out = []
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} has a line break")
        out.append(f"{name}: {value}\r\n")
    return "".join(out).encode("latin-1")
