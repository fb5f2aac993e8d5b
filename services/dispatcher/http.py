"""The dispatcher's OpenAI-compatible HTTP API (aiohttp, in the same event loop as its gRPC server).

Endpoints (port `--http-port`, env CACHEROUTE_HTTP_PORT, default 8080; -1 off):
  POST /v1/chat/completions, POST /v1/completions   routed, then proxied to the replica
  GET  /v1/models                                   the replicas' models (merged by id)
  GET  /health                                      200 while a replica is healthy, else 503

A completion request is: API key -> body (at most `max_body_bytes`) -> JSON -> the few
fields routing needs (services.http.oai) -> routing key (services.dispatcher.keys) -> one
`Dispatcher.dispatch` (services.dispatcher.dispatch: the same route, retry, ejection and
accounting as gRPC Generate) -> the replica's backend (services.backends), whose Reply is
written to the client here:

- HTTP kinds (vllm, sglang, llamacpp, openai): the body is forwarded unchanged and the
  engine's status, content type and body bytes come back unchanged, streamed for SSE as the
  engine's chunks arrive, one client write each (events framed with LF, CRLF or CR blank
  lines, as the SSE spec allows; services.backends.relay), except that a chunk ending in
  `data: [DONE]` waits for the engine's end of body and goes out with the chunked end in one
  write (a client that stops reading at [DONE] then keeps its connection; an engine that
  stalls after its [DONE] holds it back until `upstream_timeout`). One exception, for cache telemetry: a stream whose client did not set
  `stream_options.include_usage` is sent with it set, and the engine's final usage chunk
  (`"choices": []`) is dropped before it reaches the client. Usage figures go to
  services.dispatcher.cachestats.
- `cacheroute` (the simulated gRPC engine): translated to Generate and rendered in
  OpenAI's shapes (services.backends.cacheroute, services.http.oai.Renderer).

Engine credentials: each HTTP replica may have its own API key (services.auth.EngineKeys,
`--engine-api-key`, `--engine-api-keys-file`); with `forward_client_auth` the client's own
`Authorization` goes to the engine instead (when it sent one). Keys are never logged.

Per-tenant cache isolation (`--tenant-cache-salt`, default off): requests to `vllm` replicas
carry a `cache_salt` derived from the tenant (and the client's own salt), so vLLM never
serves one tenant's cached prefix to another (issue 20's side channel). Routing keys are
per tenant either way. Other kinds have no such field (SGLang, llama.cpp and `openai`
servers share their prefix cache across callers): isolate tenants there by giving them
separate replicas.

Decision headers on every routed response: `x-cacheroute-replica` (replica id),
`x-cacheroute-plan-version` (0: none), `x-cacheroute-reason` (planned, cold, fallback).

Errors, all `{"error": {"message", "type", "param", "code"}}` with a one-line message:
  400 malformed JSON, wrong field types or values (also max_tokens over --max-output-tokens),
      an invalid x-cacheroute-key; nothing is routed
  401 missing or wrong API key (services.auth; nothing is read past the headers)
  404 unknown path, 405 wrong method, 413 body over the limit
  429 a tenant with `max_tenant_requests` completions open already (--max-tenant-requests,
      default 0: no cap; the empty tenant of an open data plane is one tenant too)
  429 / 4xx an engine's own client error, passed through unchanged
  503 no healthy replica
  502 the engine answered 5xx, refused the connection or closed it mid-response
  504 no headers (or, for a stream, no first event) from the engine within
      `first_byte_timeout` seconds (default 60), no byte for `upstream_timeout` seconds
      (default 600) after that, or no connection within `connect_timeout` seconds on two
      replicas. Each counts as a failure of the replica (a replica that hangs after its
      headers leaves rotation like one that never answers).
Passive ejection (outlier detection, after Envoy's: consecutive failures, a cap on the share
ejected; counted by services.dispatcher.monitor). Only engine failures count: a client
that resets or closes while its stream is written to is not the engine's failure. A replica that answered 5xx, timed out or broke a connection `eject_after` times in
a row (default 3; any answer below 500 resets the count) is taken out of rotation and kept
out for `eject_seconds` (default 5) even if its /health says OK, then returns with its next
good poll. Passive ejection never takes out more than `max_ejected_fraction` of the replicas
(default 0.5, at least one): on an overloaded machine it is the dispatcher that misses its
deadlines, every replica looks slow at once, and ejecting them all would turn a slow cluster
into one that answers only 503 (issue 12 measured exactly that). A dead engine still leaves:
a refused connection ejects at once, without the cap, and the health poll takes it out. A
connection that is refused or not accepted within `connect_timeout` (nothing was sent), and
a 5xx answered before any byte was relayed, is retried once on another replica (the one
rule of services.dispatcher.dispatch, shared with gRPC Generate); if no other replica is healthy the client gets the first replica's error. After a stream's headers went out an
error arrives as a final SSE `data: {"error": ...}` event.

A client that disconnects cancels its handler (aiohttp `handler_cancellation`), which
closes the upstream connection (HTTP engines abort the request) or cancels the Generate
call. A client that stops reading a stream for longer than `client_write_timeout` seconds
(default 30) is dropped the same way: its connection is aborted, the engine request
cancelled, and it counts as a client error (`cacheroute_dispatcher_client_errors`,
reason `write_timeout`), never against the engine.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from services.http import oai
from services.auth import AuthError, KeyRing, bearer
from services.backends.base import ApiCall, Backend, Deadlines, EngineError
from services.backends.relay import ends_with_done
from services.core import routing
from services.dispatcher.budget import http_caller
from services.dispatcher.dispatch import Dispatcher, Job, Served, completing, http_error
from services.dispatcher.keys import KEY_HEADER, PromptKeys, request_key, tenant_cache_salt
from services.dispatcher.router import Router
from services.http.server import HttpTimeouts, start_http


@dataclass(frozen=True)
class HttpConfig:
    host: str = "127.0.0.1"
    port: int = -1                        # -1: off, 0: ephemeral
    max_body_bytes: int = 8 * 1024 * 1024
    max_output_tokens: int = 32_768
    upstream_timeout: float = 600.0       # idle: seconds without a byte from the engine mid-response -> 504
    first_byte_timeout: float = 60.0      # seconds to the engine's headers, and to a stream's first event -> 504
    connect_timeout: float = 3.0
    client_write_timeout: float = 30.0    # a client that does not take a write for this long is dropped
    eject_seconds: float = 5.0
    eject_after: int = 3                  # consecutive failures before a replica is ejected
    max_ejected_fraction: float = 0.5     # passive ejection's cap on the share of replicas out
    key_tokens: int = routing.DEFAULT_KEY_TOKENS
    max_tenant_requests: int = 0          # open completions per tenant (0: no cap) -> 429 over it
    tenant_cache_salt: bool = False       # vllm replicas: a per-tenant cache_salt (cache isolation)
    forward_client_auth: bool = False     # send the client's Authorization to HTTP engines
    reuse_port: bool = False              # share the port with sibling worker processes (SO_REUSEPORT)
    timeouts: HttpTimeouts = HttpTimeouts()   # toward clients: header, body, idle (services.http.server)

    @property
    def deadlines(self) -> Deadlines:
        return Deadlines(connect=self.connect_timeout, first_byte=self.first_byte_timeout, idle=self.upstream_timeout)


WRITE_MARGIN = 4096      # bytes a write may add beyond the block (chunk framing, buffered headers)


class _ClientGone(Exception):
    """Writing to the client failed (it reset or closed) or timed out: never the engine's failure."""


class FrontDoor:
    def __init__(self, router: Router, dispatcher: Dispatcher, keyring: KeyRing, config: HttpConfig,
                 registry: CollectorRegistry | None = None) -> None:
        self.router = router
        self.dispatcher = dispatcher
        self.backends: list[Backend] = dispatcher.backends
        self.keyring = keyring
        self.config = config
        self.serving = True
        self._deadlines = config.deadlines
        self._models: tuple[float, list] = (0.0, [])
        self._open: dict[str, int] = {}             # open completions by tenant (max_tenant_requests)
        self._requests = Counter("cacheroute_http_requests", "HTTP API requests by endpoint and status",
                                 ["endpoint", "status"], registry=registry)
        self._counted: dict[tuple[str, int], Counter] = {}
        self._keys = PromptKeys(config.key_tokens)   # text-derived keys, memoised by their words

    # ------------------------------------------------------------ app

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[self._errors])
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        endpoint = request.match_info.route.resource.canonical if request.match_info.route.resource else "unknown"
        try:
            resp = await handler(request)
        except oai.ApiError as exc:
            resp = self._error(exc)
        except web.HTTPRequestEntityTooLarge:
            resp = self._error(oai.ApiError(413, f"request body over {self.config.max_body_bytes} bytes",
                                            code="request_too_large"))
        except web.HTTPNotFound:
            resp = self._error(oai.ApiError(404, f"unknown path {request.path[:200]}", "not_found_error", "unknown_url"))
        except web.HTTPMethodNotAllowed:
            resp = self._error(oai.ApiError(405, f"{request.method} is not allowed on {request.path[:200]}",
                                            code="method_not_allowed"))
        except web.HTTPException as exc:
            resp = self._error(oai.ApiError(exc.status, exc.reason or "bad request"))
        counter = self._counted.get((endpoint, resp.status))
        if counter is None:                 # labels() once per (endpoint, status): a lock and a dict otherwise
            counter = self._counted[endpoint, resp.status] = self._requests.labels(endpoint, str(resp.status))
        counter.inc()
        return resp

    @staticmethod
    def _error(exc: oai.ApiError) -> web.Response:
        return web.Response(status=exc.status, body=exc.body(), content_type="application/json", headers=exc.headers)

    def _tenant(self, request: web.Request) -> str:
        try:
            return self.keyring.tenant_of(bearer(request.headers.get("Authorization")))
        except AuthError as exc:
            raise oai.ApiError(401, str(exc), "authentication_error",
                               "missing_api_key" if exc.missing else "invalid_api_key") from None

    # ------------------------------------------------------------ small endpoints

    async def health(self, request: web.Request) -> web.Response:
        healthy = sum(self.router.state.healthy)
        if not self.serving:
            raise oai.ApiError(503, "dispatcher is stopping", "service_unavailable", "stopping")
        if not healthy:
            raise oai.ApiError(503, "no healthy replica", "service_unavailable", "no_healthy_replica")
        return web.json_response({"status": "ok", "healthy_replicas": healthy,
                                  "replicas": len(self.router.ids), "plan_version": self.router.plan_version})

    async def models(self, request: web.Request) -> web.Response:
        self._tenant(request)
        at, data = self._models
        if time.monotonic() - at > 5.0 or not data:
            data = await self._fetch_models()
            self._models = (time.monotonic(), data)
        return web.json_response({"object": "list", "data": data})

    async def _fetch_models(self) -> list:
        seen: dict[str, dict] = {}

        async def one(i: int, backend: Backend) -> None:
            if not self.router.state.healthy[i]:
                return
            if not backend.http:
                stats = self.router.engine_stats[i]
                model = getattr(stats, "model", "") or getattr(stats, "profile", "")
                if model:
                    seen.setdefault(model, {"id": model, "object": "model", "created": 0, "owned_by": "cacheroute"})
                return
            for entry in await backend.models(2.0):
                if isinstance(entry.get("id"), str):
                    seen.setdefault(entry["id"], entry)

        await asyncio.gather(*(one(i, b) for i, b in enumerate(self.backends)))
        return list(seen.values())

    # ------------------------------------------------------------ completions

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, oai.CHAT, "/v1/chat/completions")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, oai.COMPLETIONS, "/v1/completions")

    async def _complete(self, request: web.Request, endpoint: str, path: str) -> web.StreamResponse:
        tenant = self._tenant(request)
        if not self.serving:
            raise oai.ApiError(503, "dispatcher is stopping", "service_unavailable", "stopping")
        cap = self.config.max_tenant_requests
        if cap and self._open.get(tenant, 0) >= cap:
            raise oai.ApiError(429, f"{cap} requests of this tenant are open already", "rate_limit_error",
                               "too_many_requests")
        self._open[tenant] = self._open.get(tenant, 0) + 1
        try:
            return await self._serve(request, endpoint, path, tenant)
        finally:
            left = self._open[tenant] - 1
            if left:
                self._open[tenant] = left
            else:
                del self._open[tenant]

    async def _serve(self, request: web.Request, endpoint: str, path: str, tenant: str) -> web.StreamResponse:
        body = await request.read()
        doc = oai.parse_json(body)
        req = oai.parse_request(doc, endpoint, max_output_tokens=self.config.max_output_tokens)
        header_key = request.headers.get(KEY_HEADER)
        try:
            if header_key:
                header_key.encode("utf-8")      # aiohttp keeps undecodable bytes as surrogates
            key = request_key(req.text, header_key, tenant=tenant, salt=req.salt, key_tokens=self.config.key_tokens,
                              keys=self._keys)
        except UnicodeEncodeError:
            raise oai.bad_request("routing key: not valid UTF-8", KEY_HEADER) from None
        except ValueError as exc:
            raise oai.bad_request(f"routing key: {exc}", KEY_HEADER if header_key else None) from None
        prompt_tokens = routing.count_tokens(req.text)
        # every request with a text-derived key shares its first key_tokens tokens: the shared
        # prefix the planner's switching rule prices (a header key's prefix is not known: 0)
        shared = 0 if header_key else min(prompt_tokens, self.config.key_tokens)
        salt = tenant_cache_salt(tenant, req.salt) if self.config.tenant_cache_salt and tenant else None
        forwarded = request.headers.get("Authorization") if self.config.forward_client_auth else None
        call = ApiCall(path, doc, body, req, key, self._deadlines, salt, forwarded)
        try:
            job = Job(key, time.time(), prompt_tokens, shared, shared, output_tokens=req.max_tokens or 0,
                      caller=http_caller(tenant, self.keyring.enabled, request.remote))
            served = await self.dispatcher.dispatch(job, completing(call))
        except EngineError as error:
            raise http_error(error) from None
        try:
            return await self._send(request, served)
        finally:
            await served.close()

    async def _send(self, request: web.Request, served: Served) -> web.StreamResponse:
        """Write the engine's Reply to the client: whole, or event by event."""
        reply, headers = served.opened, served.headers
        if reply.events is None:
            served.finish(reply.usage)
            return web.Response(status=reply.status, body=reply.body,
                                headers={"content-type": reply.content_type, **headers})
        resp = web.StreamResponse(status=reply.status, headers={"content-type": reply.content_type,
                                                                "cache-control": "no-cache", **headers})
        await resp.prepare(request)
        held = b""      # a block ending in `data: [DONE]`: written with the body's end (below)
        try:
            async for block in reply.events:
                if held:
                    await self._to_client(request, resp, held)
                    held = b""
                if ends_with_done(block):
                    held = block
                else:
                    await self._to_client(request, resp, block)
            # The last block and the chunked body's end in one write: a client that stops
            # reading at [DONE] (aiohttp's, bench/peers.py's) then holds a finished response
            # and keeps the connection, instead of closing it and opening a new one for its
            # next request (an accept and a fresh connection handler per request here).
            await self._to_client(request, resp, held, last=True)
            served.finish(reply.usage)
        except _ClientGone as gone:     # the client's side broke or stalled: not the engine's failure (issue 20)
            served.client_gone(str(gone))
            return resp
        except EngineError as error:
            served.failed(error)
            mapped = http_error(error)
            if held:
                try:
                    await self._to_client(request, resp, held)
                except _ClientGone:
                    return resp
            await _stream_error(resp, str(mapped), mapped.type, mapped.status)
            return resp
        return resp

    async def _to_client(self, request: web.Request, resp: web.StreamResponse, data: bytes,
                         last: bool = False) -> None:
        """Write one relayed block (`last`: with the end of the body); _ClientGone if the client's
        side broke or stalled for the write timeout."""
        transport = request.transport
        write = resp.write_eof if last else resp.write
        try:
            # A write waits only while the transport is paused (its buffer past the high-water
            # mark): when it is not, and this block cannot push it there, the write cannot block
            # and needs no deadline (a timer armed and cancelled per relayed block otherwise).
            if transport is not None and not request.protocol.writing_paused and \
                    transport.get_write_buffer_size() + len(data) + WRITE_MARGIN < transport.get_write_buffer_limits()[1]:
                await write(data)
                return
            async with asyncio.timeout(self.config.client_write_timeout):
                await write(data)
        except TimeoutError:
            if request.transport is not None:
                request.transport.abort()       # drop the client; closing the Reply cancels the engine request
            raise _ClientGone("write_timeout") from None
        except (ConnectionError, RuntimeError, aiohttp.ClientConnectionError):
            raise _ClientGone("reset") from None


async def _stream_error(resp: web.StreamResponse, message: str, type_: str, code: int) -> None:
    try:
        await resp.write(b"data: " + oai.error_body(message, type_, code) + b"\n\n")
        await resp.write_eof()
    except (ConnectionError, RuntimeError):
        pass


__all__ = ["FrontDoor", "HttpApi", "HttpConfig"]


class HttpApi:
    """The front door's lifecycle inside a DispatcherService: the aiohttp app on its port."""

    def __init__(self, router: Router, dispatcher: Dispatcher, config: HttpConfig, keyring: KeyRing, *,
                 registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.usage = dispatcher.usage
        self.front = FrontDoor(router, dispatcher, keyring, config, registry)
        self.running = None

    @property
    def url(self) -> str | None:
        return self.running.url if self.running is not None else None

    async def start(self) -> "HttpApi":
        self.running = await start_http(self.front.app(), self.config.host, self.config.port,
                                        reuse_port=self.config.reuse_port, timeouts=self.config.timeouts)
        return self

    async def stop(self) -> None:
        self.front.serving = False
        if self.running is not None:
            await self.running.stop()
            self.running = None
