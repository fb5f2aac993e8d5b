"""The dispatcher's OpenAI-compatible HTTP API (aiohttp, in the same event loop as its gRPC server).

Endpoints (port `--http-port`, env CACHEROUTE_HTTP_PORT, default 8080; -1 off):
  POST /v1/chat/completions, POST /v1/completions   routed, then proxied to the replica
  GET  /v1/models                                   the replicas' models (merged by id)
  GET  /health                                      200 while a replica is healthy, else 503

A completion request is: API key -> body (at most `max_body_bytes`) -> JSON -> the few
fields routing needs (services.oai) -> routing key (services.dispatcher.keys) -> one
`Router.route` call (the same decision and telemetry as gRPC Route) -> the replica:

- HTTP kinds (vllm, sglang, llamacpp, openai): the body is forwarded unchanged and the
  engine's status, content type and body bytes come back unchanged, streamed event by event
  for SSE (events framed with LF, CRLF or CR blank lines, as the SSE spec allows). One exception, for cache telemetry: a stream whose client did not set
  `stream_options.include_usage` is sent with it set, and the engine's final usage chunk
  (`"choices": []`) is dropped before it reaches the client. Usage figures go to
  services.dispatcher.cachestats.
- `cacheroute` (the simulated gRPC engine): translated to Generate and rendered in
  OpenAI's shapes (services.oai.Renderer).

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
a 5xx answered before any byte was relayed, is retried once on another replica, like gRPC
Generate; if no other replica is healthy the client gets the first replica's error. After a stream's headers went out an
error arrives as a final SSE `data: {"error": ...}` event.

A client that disconnects cancels its handler (aiohttp `handler_cancellation`), which
closes the upstream connection (HTTP engines abort the request) or cancels the Generate
call.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import Sequence

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from cacheroute.v1 import engine_pb2
from services import oai
from services.auth import AuthError, KeyRing, bearer
from services.backends.base import Backend, EngineError
from services.core import routing
from services.core.policy import NoHealthyReplica, Reason
from services.dispatcher.budget import http_caller
from services.dispatcher.cachestats import CacheUsage
from services.dispatcher.keys import KEY_HEADER, request_key, tenant_cache_salt
from services.dispatcher.monitor import Ejection
from services.dispatcher.router import Router
from services.httpserver import HttpTimeouts
from services.rpc import kv

log = logging.getLogger("cacheroute.dispatcher.http")
REASONS = {Reason.PLANNED: "planned", Reason.COLD: "cold", Reason.FALLBACK: "fallback"}
DEFAULT_MAX_TOKENS = 16     # the simulated engine's default, when a request to it sets none
_JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class HttpConfig:
    host: str = "127.0.0.1"
    port: int = -1                        # -1: off, 0: ephemeral
    max_body_bytes: int = 8 * 1024 * 1024
    max_output_tokens: int = 32_768
    upstream_timeout: float = 600.0       # idle: seconds without a byte from the engine mid-response -> 504
    first_byte_timeout: float = 60.0      # seconds to the engine's headers, and to a stream's first event -> 504
    connect_timeout: float = 3.0
    eject_seconds: float = 5.0
    eject_after: int = 3                  # consecutive failures before a replica is ejected
    max_ejected_fraction: float = 0.5     # passive ejection's cap on the share of replicas out
    key_tokens: int = routing.DEFAULT_KEY_TOKENS
    max_tenant_requests: int = 0          # open completions per tenant (0: no cap) -> 429 over it
    tenant_cache_salt: bool = False       # vllm replicas: a per-tenant cache_salt (cache isolation)
    reuse_port: bool = False              # share the port with sibling worker processes (SO_REUSEPORT)
    timeouts: HttpTimeouts = HttpTimeouts()   # toward clients: header, body, idle (services.httpserver)


class _Retry(Exception):
    """The engine was unreachable before anything was sent to the client: try another replica.
    `status`/`code`: the error the client gets if the second replica fails the same way."""

    def __init__(self, message: str, status: int = 502, code: str = "engine_unreachable") -> None:
        super().__init__(message)
        self.status, self.code = status, code


# the end of an SSE event: a blank line, with any of the spec's line endings (LF, CRLF, CR)
_EVENT_END = re.compile(rb"(\r\n\r\n|\n\n|\r\r)")


def _last_event_end(data: bytes) -> int:
    """The offset just past the last complete SSE event in `data`; -1 if there is none."""
    ends = [at + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (at := data.rfind(sep)) >= 0]
    return max(ends) if ends else -1


class _ClientGone(Exception):
    """Writing to the client failed (it reset or closed): never counted against the engine."""


async def _to_client(resp: web.StreamResponse, data: bytes) -> None:
    try:
        await resp.write(data)
    except (ConnectionError, RuntimeError, aiohttp.ClientConnectionError) as exc:
        raise _ClientGone(type(exc).__name__) from None


class FrontDoor:
    def __init__(self, router: Router, monitor, backends: Sequence[Backend], keyring: KeyRing,
                 config: HttpConfig, usage: CacheUsage, registry: CollectorRegistry | None = None) -> None:
        self.router = router
        self.monitor = monitor
        self.backends = list(backends)
        self.keyring = keyring
        self.config = config
        self.usage = usage
        self.serving = True
        self.session: aiohttp.ClientSession | None = None
        self._models: tuple[float, list] = (0.0, [])
        self._open: dict[str, int] = {}             # open completions by tenant (max_tenant_requests)
        self.budget = None                          # services.dispatcher.budget.SharedBudget, set by the service
        self._timeout = aiohttp.ClientTimeout(total=None, connect=config.connect_timeout,
                                              sock_read=config.upstream_timeout)
        self._requests = Counter("cacheroute_http_requests", "HTTP API requests by endpoint and status",
                                 ["endpoint", "status"], registry=registry)
        self._upstream = Counter("cacheroute_http_upstream_errors", "engine failures seen by the HTTP API",
                                 ["replica", "kind"], registry=registry)

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
        self._requests.labels(endpoint, str(resp.status)).inc()
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
            try:
                async with self.session.get(backend.base_url + "/v1/models",
                                            timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
                    doc = orjson.loads(await resp.read()) if resp.status == 200 else {}
            except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError):
                return
            for entry in doc.get("data", []) if isinstance(doc, dict) else []:
                if isinstance(entry, dict) and isinstance(entry.get("id"), str):
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
            key = request_key(req.text, header_key, tenant=tenant, salt=req.salt, key_tokens=self.config.key_tokens)
        except UnicodeEncodeError:
            raise oai.bad_request("routing key: not valid UTF-8", KEY_HEADER) from None
        except ValueError as exc:
            raise oai.bad_request(f"routing key: {exc}", KEY_HEADER if header_key else None) from None
        prompt_tokens = routing.count_tokens(req.text)
        now, avoid, first_error = time.time(), -1, None
        counted = await self._within_budget(request, tenant, now)
        for attempt in range(2):
            try:   # the arrival counts as planner input once the engine answered (`_served`), as for Generate
                pick = self.router.route(key, now, prompt_tokens, 0, report=False, avoid=avoid)
            except NoHealthyReplica:
                if first_error is not None:     # nobody else to try: the first replica's answer
                    raise first_error from None
                raise oai.ApiError(503, "no healthy replica", "service_unavailable", "no_healthy_replica") from None
            i = pick.replica
            # every request with a text-derived key shares its first key_tokens tokens: the shared
            # prefix the planner's switching rule prices (a header key's prefix is not known: 0)
            shared = 0 if header_key else min(prompt_tokens, self.config.key_tokens)
            served = (key, now, prompt_tokens, shared) if counted else None
            headers = {"x-cacheroute-replica": self.router.ids[i],
                       "x-cacheroute-plan-version": str(self.router.plan_version),
                       "x-cacheroute-reason": REASONS[pick.reason]}
            backend = self.backends[i]
            self.router.stream_opened(i)
            try:
                if backend.http:
                    return await self._proxy(request, i, backend, path, req, doc, body, headers, served,
                                             tenant=tenant)
                refused = oai.unsupported_fields(doc)
                if refused:
                    raise oai.ApiError(400, f"replica {self.router.ids[i]} (kind cacheroute) cannot honour "
                                       f"{', '.join(refused)}", "invalid_request_error", "unsupported_parameter",
                                       refused[0])
                return await self._generate(request, i, backend, key, req, headers, served)
            except _Retry as why:
                avoid = i
                first_error = oai.ApiError(why.status, f"replica {self.router.ids[i]}: {why}",
                                           "timeout" if why.status == 504 else "upstream_error", why.code)
                first_error.headers = headers
                if attempt == 1:
                    raise first_error from None
            except oai.ApiError as error:
                error.headers = headers
                raise
            finally:
                self.router.stream_closed(i)
        raise AssertionError("unreachable")

    async def _within_budget(self, request: web.Request, tenant: str, now: float) -> bool:
        """Whether this request's arrival may count as planner input (services/dispatcher/budget.py)."""
        if self.budget is None or not self.budget.bounded:
            return True
        caller = http_caller(tenant, self.keyring.enabled, request.remote)
        return caller is None or await self.budget.take(caller, 1, now) == 1

    def _eject(self, i: int, why: str, *, at_once: bool = False) -> None:
        """One engine failure of replica `i`: counted, then the monitor's passive ejection."""
        self._upstream.labels(self.router.ids[i], self.backends[i].kind).inc()
        self.monitor.failed(i, why, at_once=at_once)

    # ------------------------------------------------------------ HTTP engines

    async def _proxy(self, request: web.Request, i: int, backend: Backend, path: str, req: oai.ApiRequest,
                     doc: dict, body: bytes, headers: dict, served: tuple, *, tenant: str = "") -> web.StreamResponse:
        rid = self.router.ids[i]
        strip = req.stream and not req.include_usage
        if self.config.tenant_cache_salt and tenant and backend.kind == "vllm":
            doc = {**doc, "cache_salt": tenant_cache_salt(tenant, req.salt)}
            body = orjson.dumps(doc)
        if strip:
            options = doc.get("stream_options")
            doc = {**doc, "stream_options": {**(options if isinstance(options, dict) else {}), "include_usage": True}}
            body = orjson.dumps(doc)
        try:
            up_cm = self.session.post(backend.base_url + path, data=body, timeout=self._timeout, headers=_JSON)
            upstream = await asyncio.wait_for(up_cm.__aenter__(), self.config.first_byte_timeout)
        except aiohttp.ConnectionTimeoutError:
            self._eject(i, "connect timed out")
            raise _Retry(f"accepted no connection within {self.config.connect_timeout:g}s", 504,
                         "engine_timeout") from None
        except asyncio.TimeoutError:
            self._eject(i, "timed out")
            waited = min(self.config.first_byte_timeout, self.config.upstream_timeout)
            raise oai.ApiError(504, f"replica {rid} sent nothing for {waited:g}s",
                               "timeout", "engine_timeout") from None
        except aiohttp.ClientConnectorError as exc:
            self._eject(i, "connection refused", at_once=True)
            raise _Retry(f"unreachable ({type(exc).__name__})") from None
        except aiohttp.ClientError as exc:
            self._eject(i, type(exc).__name__)
            raise oai.ApiError(502, f"replica {rid} failed: {type(exc).__name__}", "upstream_error",
                               "engine_error") from None
        try:
            return await self._relay(request, i, upstream, req, strip, headers, served)
        finally:
            await up_cm.__aexit__(None, None, None)

    async def _relay(self, request: web.Request, i: int, upstream: aiohttp.ClientResponse, req: oai.ApiRequest,
                     strip: bool, headers: dict, served: tuple) -> web.StreamResponse:
        rid, status = self.router.ids[i], upstream.status
        ctype = upstream.headers.get("content-type", "application/json")
        if status >= 500:
            try:
                await asyncio.wait_for(upstream.read(), 1.0)
            except (asyncio.TimeoutError, aiohttp.ClientError):
                pass
            self._eject(i, f"answered {status}")
            raise _Retry(f"answered HTTP {status}", 502, "engine_error")    # nothing was relayed yet
        self.monitor.answered(i)
        if status == 200:
            if served is None:               # its caller is over its telemetry budget
                self.router.telemetry_capped += 1
            else:
                self.router.record_arrival(*served)
        if not req.stream or status != 200 or not ctype.startswith("text/event-stream"):
            return await self._relay_whole(i, upstream, ctype, headers)
        resp = web.StreamResponse(status=status, headers={"content-type": ctype, "cache-control": "no-cache", **headers})
        await resp.prepare(request)
        seen_usage = False
        tail, waiting = b"", self.config.first_byte_timeout
        try:
            while data := await asyncio.wait_for(upstream.content.readany(), waiting):
                waiting = None          # after the first event: the session's idle timeout (sock_read)
                data = tail + data if tail else data
                cut = _last_event_end(data)
                if cut < 0:
                    tail = data
                    continue
                ready, tail = data[:cut], data[cut:]
                if b'"usage":{' in ready or b'"usage": {' in ready:     # not the `"usage":null` of every chunk
                    ready, found = self._usage_events(i, ready, strip)
                    seen_usage = seen_usage or found
                if ready:
                    await _to_client(resp, ready)
            if tail:
                await _to_client(resp, tail)
        except _ClientGone:       # the client's side broke: not the engine's failure (issue 20)
            self.monitor.answered(i)
            return resp
        except asyncio.TimeoutError:
            self._eject(i, "timed out mid-stream")
            waited = self.config.upstream_timeout if waiting is None else waiting
            await self._stream_error(resp, f"replica {rid} sent nothing for {waited:g}s", "timeout", 504)
            return resp
        except aiohttp.ClientError as exc:
            self._eject(i, "closed mid-stream")
            await self._stream_error(resp, f"replica {rid} closed the stream: {type(exc).__name__}",
                                     "upstream_error", 502)
            return resp
        if not seen_usage:
            self.usage.record_missing(i)
        await resp.write_eof()
        return resp

    async def _relay_whole(self, i: int, upstream: aiohttp.ClientResponse, ctype: str,
                           headers: dict) -> web.Response:
        """A response that is not a stream, relayed once whole."""
        rid, status = self.router.ids[i], upstream.status
        try:
            data = await upstream.read()
        except asyncio.TimeoutError:
            self._eject(i, "timed out")
            raise oai.ApiError(504, f"replica {rid} sent nothing for {self.config.upstream_timeout:g}s",
                               "timeout", "engine_timeout") from None
        except aiohttp.ClientError as exc:
            self._eject(i, type(exc).__name__)
            raise oai.ApiError(502, f"replica {rid} closed the response: {type(exc).__name__}",
                               "upstream_error", "engine_error") from None
        if status == 200:
            self._record(i, data)
        return web.Response(status=status, body=data, headers={"content-type": ctype, **headers})

    @staticmethod
    async def _stream_error(resp: web.StreamResponse, message: str, type_: str, code: int) -> None:
        try:
            await resp.write(b"data: " + oai.error_body(message, type_, code) + b"\n\n")
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass

    def _record(self, i: int, data: bytes) -> None:
        try:
            found = oai.usage_of(orjson.loads(data))
        except orjson.JSONDecodeError:
            found = None
        if found is None:
            self.usage.record_missing(i)
        else:
            self.usage.record(i, *found)

    def _usage_events(self, i: int, ready: bytes, strip: bool) -> tuple[bytes, bool]:
        """Record the usage of the SSE events in `ready` (whole events, any of the spec's
        framings); drop the usage-only chunk if `strip`. Separators are kept as they came."""
        parts = _EVENT_END.split(ready)          # event, separator, event, separator, ..., ""
        out, found = [], False
        for event, sep in zip(parts[::2], parts[1::2] + [b""]):
            line = event.lstrip(b"\r\n")
            if (b'"usage":{' in line or b'"usage": {' in line) and line.startswith(b"data: {"):
                try:
                    doc = orjson.loads(line[6:])
                except orjson.JSONDecodeError:
                    doc = None
                figures = oai.usage_of(doc)
                if figures is not None:
                    self.usage.record(i, *figures)
                    found = True
                    if strip and doc.get("choices") == []:
                        continue
            out += (event, sep)
        return b"".join(out), found

    # ------------------------------------------------------------ the gRPC engine

    async def _generate(self, request: web.Request, i: int, backend, key: str, req: oai.ApiRequest,
                        headers: dict, served: tuple) -> web.StreamResponse:
        rid = self.router.ids[i]
        message = engine_pb2.GenerateRequest(prompt=req.text, max_tokens=req.max_tokens or DEFAULT_MAX_TOKENS, key=key)
        call = backend.generate(message, self.config.upstream_timeout)
        render = oai.Renderer(req.endpoint, req.model or "", f"{rid}-{id(call):x}", int(time.time()))
        resp: web.StreamResponse | None = None
        texts: list[str] = []
        prompt = cached = emitted = 0
        try:
            async for chunk in call:
                if chunk.first:
                    prompt, cached = chunk.prompt_tokens, chunk.cached_tokens
                    if not req.model:
                        stats = self.router.engine_stats[i]
                        render.model = getattr(stats, "model", "") or rid
                emitted += 1
                if not req.stream:
                    texts.append(chunk.text)
                    continue
                if resp is None:
                    resp = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache",
                                                       **headers})
                    await resp.prepare(request)
                await resp.write(render.chunk(chunk.text, chunk.finish_reason or None if chunk.finished else None))
        except EngineError as failure:
            if failure.kind == "invalid":
                error = oai.ApiError(400, failure.detail or "invalid request")
            elif failure.kind == "full":
                error = oai.ApiError(429, f"replica {rid}: {failure.detail}", "rate_limit_error", "too_many_requests")
            elif failure.kind == "timeout":
                self._eject(i, "timed out")
                error = oai.ApiError(504, f"replica {rid} timed out", "timeout", "engine_timeout")
            else:
                self._eject(i, failure.code, at_once=failure.kind == "unavailable")
                if failure.kind == "unavailable" and resp is None and not texts:
                    raise _Retry(failure.code) from None
                error = oai.ApiError(502, f"replica {rid} failed: {failure.code}", "upstream_error", "engine_error")
            if resp is None:
                raise error from None
            await self._stream_error(resp, str(error), error.type, error.status)
            return resp
        finally:
            await call.aclose()
        self.monitor.answered(i)
        figures = oai.usage(prompt, emitted, cached)
        if not req.stream:
            return web.Response(body=render.full("".join(texts), "length", figures),
                                headers={"content-type": "application/json", **headers})
        if resp is None:   # an engine stream that ended without a chunk
            raise oai.ApiError(502, f"replica {rid} sent no tokens", "upstream_error", "engine_error")
        if req.include_usage:
            await resp.write(render.usage_chunk(figures))
        await resp.write(oai.DONE)
        await resp.write_eof()
        return resp


async def open_session() -> aiohttp.ClientSession:
    """The dispatcher's one client session to its HTTP engines: unbounded keep-alive pool, no cookies."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
                                 cookie_jar=aiohttp.DummyCookieJar())


__all__ = ["FrontDoor", "HttpConfig", "open_session", "kv"]


class HttpApi:
    """The front door's lifecycle inside a DispatcherService: session, app, cache telemetry."""

    def __init__(self, router: Router, monitor, config: HttpConfig, keyring: KeyRing, *, collector: str = "",
                 source: str = "dispatcher-0", tls=None, token: str | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        from services.dispatcher.cachestats import CacheStatsSender

        self.config = config
        self.usage = CacheUsage(router.ids)
        monitor.on_stats = lambda i, s: self.usage.counters(i, s.requests, s.prompt_tokens, s.cached_tokens)
        monitor.ejection = Ejection(config.eject_after, config.max_ejected_fraction, config.eject_seconds)
        self.front = FrontDoor(router, monitor, monitor.backends, keyring, config, self.usage, registry)
        any_http = any(b.http for b in monitor.backends)
        self.sender = (CacheStatsSender(self.usage, collector, source, tls=tls, token=token)
                       if collector and any_http else None)
        self.running = None

    @property
    def url(self) -> str | None:
        return self.running.url if self.running is not None else None

    async def start(self) -> "HttpApi":
        from services.httpserver import start_http

        self.front.session = await open_session()
        self.running = await start_http(self.front.app(), self.config.host, self.config.port,
                                        reuse_port=self.config.reuse_port, timeouts=self.config.timeouts)
        if self.sender is not None:
            self.sender.start()
        return self

    async def stop(self) -> None:
        self.front.serving = False
        if self.running is not None:
            await self.running.stop()
            self.running = None
        if self.sender is not None:
            await self.sender.stop()
        if self.front.session is not None:
            await self.front.session.close()
            self.front.session = None
