"""HTTP engine kinds (vllm, sglang, llamacpp, openai): health from `GET /health`, load and
cache counters from `GET /metrics` (the kind's names, see its module), and the requests.

Requests. `complete` POSTs the client's body unchanged (two exceptions: a vllm replica gets
the tenant's `cache_salt`, and a stream whose client did not ask for usage is sent with
`stream_options.include_usage` set so cache telemetry sees it; services.backends.relay
drops that chunk again) and hands back the engine's status, content type and bytes
(services.backends.relay). `generate` serves a gRPC GenerateRequest with a text prompt
as a streamed `/v1/completions` call and yields one GenerateChunk per text delta, then a
last one with `finished`, the finish reason and, from the usage chunk, prompt and cached
tokens (an OpenAI stream carries them at its end, not on its first chunk).

Failures (EngineError): no connection within `connect` seconds "timeout" and refused
"unreachable" (both retryable: nothing was sent), no headers within `first_byte` seconds
"timeout", a 5xx answer "failed" (retryable: nothing was relayed), any other client error
"failed". For `generate`, 4xx answers map too: 400/404/413/422 "invalid", 429 "full",
401/403 "denied".

Credentials. Every request carries `Authorization: Bearer <api_key>` when the replica has
a key (services.auth.EngineKeys), or the client's own Authorization when the deployment
forwards it (`authorization` argument). Keys never appear in a repr or a log line.

Healthy means /health answered 2xx within the deadline; for kinds with metrics the
/metrics page must also parse (a page without the kind's load gauges leaves the load to
the dispatcher's in-flight count). Both requests run concurrently, on the replica's
keep-alive connections (services.backends.rawhttp, shared with its requests). With
`health_every` > 0 (the dispatcher's --health-every, default 1 s) a poll whose /health is
less than that old and came back 2xx reads /metrics alone: an answered /metrics page says
the server is up, and /health comes again within the second (it was half of every poll's
requests; docs/benchmarks.md "/health once a second while /metrics answers"). A /metrics that
does not answer 200 in such a poll is followed by /health, so a replica never counts healthy
on a page that says nothing. A failed /health is asked again at the next poll.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

import orjson

from cacheroute.v1 import engine_pb2
from services.backends import llamacpp, sglang, vllm
from services.backends.base import ApiCall, Backend, BackendDown, Deadlines, EngineError, EngineStats, Reply
from services.backends.metrics import sample_sums
from services.backends.rawhttp import Answer, ConnectError, ConnectTimeout, HttpError, Origin
from services.backends.relay import EVENT_END, read_whole, relay_events, whole_usage

READERS = {"vllm": vllm.read_stats, "sglang": sglang.read_stats, "llamacpp": llamacpp.read_stats}


_REFUSED = {400: "invalid", 404: "invalid", 413: "invalid", 422: "invalid", 429: "full", 401: "denied", 403: "denied"}


class HttpBackend(Backend):
    http = True

    def __init__(self, replica_id: str, base_url: str, kind: str, *, api_key: str | None = None,
                 deadlines: Deadlines = Deadlines(), health_every: float = 0.0) -> None:
        self.replica_id = replica_id
        self.address = base_url
        self.base_url = base_url
        self.kind = kind
        self.origin = Origin(base_url)      # keep-alive connections; ValueError for a URL that is not http(s)
        self.deadlines = deadlines          # of `generate` (an ApiCall carries its own)
        self._reader = READERS.get(kind)
        self._auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._json = {"content-type": "application/json", **self._auth}
        self._model = ""
        self.health_every = health_every    # seconds a 2xx /health stands for while /metrics answers
        self._health_until = 0.0            # monotonic time until which the last 2xx /health stands

    def __repr__(self) -> str:              # never the key
        return f"HttpBackend({self.replica_id!r}, {self.base_url!r}, {self.kind!r})"

    async def close(self) -> None:
        await self.origin.close()

    async def _get(self, path: str, timeout: float) -> tuple[int, bytes]:
        try:
            async with asyncio.timeout(timeout):
                answer = await self.origin.request("GET", path, headers=self._auth, connect=timeout)
                try:
                    return answer.status, await answer.read()
                finally:
                    answer.release()
        except TimeoutError:
            raise BackendDown(f"GET {path} timed out", timeout=True) from None
        except HttpError as exc:
            raise BackendDown(f"GET {path}: {type(exc).__name__}") from None

    async def check(self, timeout: float) -> None:
        status, _ = await self._get("/health", timeout)
        if not 200 <= status < 300:
            raise BackendDown(f"/health answered {status}", answered=True)

    async def _health(self, timeout: float) -> None:
        self._health_until = 0.0
        status, _ = await self._get("/health", timeout)
        self._healthy(status)

    def _healthy(self, status: int) -> None:
        if not 200 <= status < 300:         # the window stays shut: /health again at the next poll
            raise BackendDown(f"/health answered {status}", answered=True)
        if self.health_every > 0:
            self._health_until = time.monotonic() + self.health_every

    async def poll(self, timeout: float) -> EngineStats:
        if self._reader is None:
            await self.check(timeout)
            return EngineStats(replica_id=self.replica_id)
        if time.monotonic() < self._health_until:
            m_status, page = await self._get("/metrics", timeout)
            if m_status != 200:
                await self._health(timeout)
        else:
            (h_status, _), (m_status, page) = await asyncio.gather(self._get("/health", timeout),
                                                                   self._get("/metrics", timeout))
            self._healthy(h_status)
        stats = EngineStats(replica_id=self.replica_id)
        if m_status == 200:
            try:
                samples = sample_sums(page.decode("utf-8", "replace"))
            except ValueError:
                raise BackendDown("/metrics did not parse") from None
            self._reader(samples, stats)
        return stats

    # ------------------------------------------------------------ requests

    def _headers(self, authorization: str | None) -> dict:
        if authorization:
            return {"content-type": "application/json", "authorization": authorization}
        return self._json

    async def _post(self, path: str, body: bytes, d: Deadlines, authorization: str | None) -> Answer:
        """The engine's answer with its headers; EngineError (module header) if none came."""
        try:
            async with asyncio.timeout(d.first_byte):      # not wait_for: no task per request (Python 3.11)
                return await self.origin.request("POST", path, body, self._headers(authorization),
                                                 connect=d.connect, idle=d.idle)
        except ConnectTimeout:
            raise EngineError("timeout", "connect", f"accepted no connection within {d.connect:g}s",
                              retry=True) from None
        except TimeoutError:
            raise EngineError("timeout", "first_byte", f"sent nothing for {min(d.first_byte, d.idle):g}s") from None
        except ConnectError:
            raise EngineError("unreachable", "connect", "is unreachable (no connection)", retry=True) from None
        except HttpError as exc:
            raise EngineError("failed", type(exc).__name__, f"failed: {type(exc).__name__}") from None

    @staticmethod
    async def _server_error(upstream: Answer) -> EngineError:
        try:
            async with asyncio.timeout(1.0):
                await upstream.read()
        except (TimeoutError, HttpError):
            pass
        upstream.release()
        return EngineError("failed", f"HTTP {upstream.status}", f"answered HTTP {upstream.status}", retry=True)

    async def complete(self, call: ApiCall) -> Reply:
        doc, body, req, d = call.doc, call.body, call.request, call.deadlines
        strip = req.stream and not req.include_usage
        fields: dict = {}
        if call.cache_salt is not None and self.kind == "vllm":
            fields["cache_salt"] = call.cache_salt
        if strip:
            options = doc.get("stream_options")
            fields["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        if fields:
            body = with_fields(body, doc, fields)
        upstream = await self._post(call.path, body, d, call.authorization)
        status, ctype = upstream.status, upstream.headers.get("content-type", "application/json")
        if status >= 500:
            raise await self._server_error(upstream)
        if not req.stream or status != 200 or not ctype.startswith("text/event-stream"):
            try:
                data = await read_whole(upstream, d.idle)
            finally:
                upstream.release()
            return Reply(status, ctype, body=data, usage=whole_usage(data) if status == 200 else None)
        reply = Reply(status, ctype)
        reply.events = relay_events(upstream, reply, strip, d)
        reply.close = lambda: _finish(upstream, reply.events)
        return reply

    async def generate(self, request, timeout: float, *, authorization: str | None = None) -> AsyncIterator:
        if request.WhichOneof("prompt_source") != "prompt":
            raise EngineError("invalid", "blocks", f"replica {self.replica_id} ({self.kind}) needs a text prompt, "
                              "not block hashes", param="prompt")
        doc = {"prompt": request.prompt, "max_tokens": request.max_tokens, "stream": True,
               "stream_options": {"include_usage": True}}
        if model := await self._model_id():
            doc["model"] = model
        d = self.deadlines
        d = Deadlines(connect=min(d.connect, timeout), first_byte=min(d.first_byte, timeout), idle=min(d.idle, timeout))
        started = time.monotonic()
        upstream = await self._post("/v1/completions", orjson.dumps(doc), d, authorization)
        reply = Reply(upstream.status, upstream.headers.get("content-type", ""))
        reply.events = relay_events(upstream, reply, False, d, whole=True)     # parsed below: whole events
        try:
            if upstream.status >= 500:
                raise await self._server_error(upstream)
            if upstream.status != 200:
                raise _refusal(upstream.status, await read_whole(upstream, d.idle))
            index, finish = 0, ""
            async for block in reply.events:
                for doc in _event_docs(block):
                    choice = (doc.get("choices") or [{}])[0]
                    finish = choice.get("finish_reason") or finish
                    if doc.get("choices"):
                        yield engine_pb2.GenerateChunk(index=index, text=str(choice.get("text") or ""),
                                                       first=index == 0, replica_id=self.replica_id,
                                                       ttft_seconds=time.monotonic() - started if index == 0 else 0)
                        index += 1
            if index == 0:
                raise EngineError("failed", "empty", "sent no tokens")
            prompt, cached, _ = reply.usage or (0, 0, None)
            yield engine_pb2.GenerateChunk(index=index, first=False, replica_id=self.replica_id, finished=True,
                                           finish_reason=finish or "length", prompt_tokens=prompt,
                                           cached_tokens=cached)
        finally:
            await _finish(upstream, reply.events)

    async def _model_id(self) -> str:
        """The first model the engine lists (vLLM and SGLang want `model`), fetched once."""
        if not self._model:
            entries = await self.models(2.0)
            self._model = next((e["id"] for e in entries if isinstance(e.get("id"), str)), "")
        return self._model

    async def models(self, timeout: float) -> list[dict]:
        try:
            status, page = await self._get("/v1/models", timeout)
            doc = orjson.loads(page) if status == 200 else {}
        except (BackendDown, orjson.JSONDecodeError):
            return []
        return [e for e in doc.get("data", []) if isinstance(e, dict)] if isinstance(doc, dict) else []


def with_fields(body: bytes, doc: dict, fields: dict) -> bytes:
    """The JSON object `body` (parsed: `doc`) with `fields` set. When it has none of them they
    are added as members before its closing brace and the client's bytes are otherwise kept
    (no parse-and-serialise of a long prompt per request, issue 22); else `doc` is updated and
    serialised again."""
    if doc and not any(name in doc for name in fields):
        end = body.rstrip().rfind(b"}")         # a JSON object's last byte (orjson parsed it)
        return body[:end] + b"," + orjson.dumps(fields)[1:]
    return orjson.dumps({**doc, **fields})


def _refusal(status: int, data: bytes) -> EngineError:
    """A 4xx answer to `generate` as an EngineError, with the engine's own one-line message."""
    try:
        doc = orjson.loads(data)
        message = doc["error"]["message"] if isinstance(doc.get("error"), dict) else doc.get("error", "")
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
        message = ""
    message = " ".join(str(message).split())[:300] or f"HTTP {status}"
    kind = _REFUSED.get(status, "failed")
    return EngineError(kind, f"HTTP {status}", message if kind == "invalid" else f"answered HTTP {status}: {message}",
                       retry=kind == "full")


def _event_docs(block: bytes) -> list[dict]:
    """The JSON objects of the `data:` lines of a block of whole SSE events ([DONE] skipped)."""
    out = []
    for event in EVENT_END.split(block)[::2]:
        for line in event.splitlines():
            if line.startswith(b"data:") and (payload := line[5:].strip()) and payload != b"[DONE]":
                try:
                    doc = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    raise EngineError("failed", "bad_event", "sent an event that is not JSON") from None
                if isinstance(doc, dict) and "error" in doc:
                    error = doc["error"]
                    message = error.get("message", "") if isinstance(error, dict) else error
                    raise EngineError("failed", "stream_error", "failed mid-stream: " + " ".join(str(message).split())[:300])
                if isinstance(doc, dict):
                    out.append(doc)
    return out


async def _finish(upstream: Answer, events) -> None:
    """Release an engine answer: its connection closed (the engine's request aborted) if unfinished."""
    if events is not None:
        await events.aclose()
    upstream.release()
