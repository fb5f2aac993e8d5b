"""A fake OpenAI engine (aiohttp on 127.0.0.1:0) whose behaviour is switched at run time.

`FakeEngine.mode` picks what the next completion gets:
  ok       a JSON completion with usage
  stream   an SSE stream of `events` chunks of `chunk_bytes` bytes each, then usage and [DONE]
  crlf     the same stream framed with CRLF (`\\r\\n\\r\\n`)
  500      HTTP 500 with an OpenAI-shaped error
  hang     headers are never sent (the handler sleeps)
  headers  200 and SSE headers, then nothing
  garbage  an SSE stream of bytes that are not events
  close    one event, then the connection is aborted mid-stream
  slow     the stream, one event every `slow_seconds`
`end_pause` seconds pass between a stream's [DONE] and the end of its body (0: none).
`framing` ("lf", "crlf" or "cr") picks the blank line that ends each event of stream and slow.
`/health` answers 200 unless `healthy` is False (then 503) or `hang_health` is True (never). `served` counts completions,
`open_streams` the streams being written now, `aborted` the streams whose reader went away before their end.
`api_key` set: every request but /health needs `Authorization: Bearer <api_key>` (else 401, as vLLM's
--api-key answers); `last_auth` is the last Authorization seen. `/v1/completions` answers like the chat route.
"""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from services.http.server import start_http

MODES = ("ok", "stream", "crlf", "500", "hang", "headers", "garbage", "close", "slow")


def _chunk(text: str, chat: bool = True) -> bytes:
    if not chat:
        return orjson.dumps({"id": "x", "object": "text_completion", "created": 0, "model": "m",
                             "choices": [{"index": 0, "text": text, "finish_reason": None}]})
    return orjson.dumps({"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                         "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 3}}


class FakeEngine:
    def __init__(self, mode: str = "ok", *, events: int = 20, chunk_bytes: int = 64, slow_seconds: float = 0.2) -> None:
        self.mode, self.events, self.chunk_bytes, self.slow_seconds = mode, events, chunk_bytes, slow_seconds
        self.framing = "lf"
        self.end_pause = 0.0
        self.healthy = True
        self.hang_health = False       # /health never answers
        self.served = 0
        self.open_streams = 0
        self.aborted = 0
        self.api_key: str | None = None
        self.last_auth: str | None = None
        self.last_body = b""
        self.metrics_page: str | None = None     # GET /metrics: this page (None: 404, no metrics)
        self.running = None

    @property
    def url(self) -> str:
        return self.running.url

    async def start(self) -> "FakeEngine":
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        self.running = await start_http(app, "127.0.0.1", 0)
        return self

    async def stop(self) -> None:
        if self.running is not None:
            await self.running.stop()

    async def _health(self, request: web.Request) -> web.Response:
        if self.hang_health:
            await asyncio.sleep(3600)
        return web.json_response({"status": "ok"}, status=200 if self.healthy else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics_page is None:
            raise web.HTTPNotFound()
        return web.Response(text=self.metrics_page, content_type="text/plain")

    def _refused(self, request: web.Request) -> web.Response | None:
        self.last_auth = request.headers.get("Authorization")
        if self.api_key is not None and self.last_auth != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "invalid api key", "type": "authentication_error"}},
                                     status=401)
        return None

    async def _models(self, request: web.Request) -> web.Response:
        return self._refused(request) or web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self.last_body = await request.read()
        refused = self._refused(request)
        if refused is not None:
            return refused
        self.served += 1
        mode = self.mode
        if mode == "ok":
            return web.json_response({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                                   "finish_reason": "stop"}], "usage": USAGE})
        if mode == "500":
            return web.json_response({"error": {"message": "boom", "type": "server_error"}}, status=500)
        if mode == "hang":
            await asyncio.sleep(3600)
        self.open_streams += 1
        try:
            return await self._stream(request, mode)
        except (ConnectionError, asyncio.CancelledError):
            self.aborted += 1
            raise
        finally:
            self.open_streams -= 1

    async def _stream(self, request: web.Request, mode: str) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        if mode == "headers":
            await asyncio.sleep(3600)
        if mode == "garbage":
            await resp.write(b"\x00\xffnot an event\x01" * 10)
            return resp
        sep = b"\r\n\r\n" if mode == "crlf" else {"lf": b"\n\n", "crlf": b"\r\n\r\n", "cr": b"\r\r"}[self.framing]
        for n in range(self.events):
            await resp.write(b"data: " + _chunk("x" * self.chunk_bytes, request.path.endswith("/chat/completions")) + sep)
            if mode == "close":
                await asyncio.sleep(0.05)
                request.transport.abort()
                return resp
            if mode == "slow":
                await asyncio.sleep(self.slow_seconds)
            elif n % 8 == 7:
                await asyncio.sleep(0)
        usage = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [],
                 "usage": USAGE}
        await resp.write(b"data: " + orjson.dumps(usage) + sep + b"data: [DONE]" + sep)
        if self.end_pause:
            await asyncio.sleep(self.end_pause)
        await resp.write_eof()
        return resp
