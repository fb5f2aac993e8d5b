"""Kind `cacheroute`: the simulated engine over gRPC (health service + GetStats, Generate).

An OpenAI API request to it (`complete`) is translated to a Generate call (the prompt's
canonical text, max_tokens, the routing key) and rendered in OpenAI's shapes
(services.http.oai.Renderer); fields the engine cannot honour (tools, logprobs, ...) are refused
as "invalid". The first chunk is awaited before the Reply is handed back, so a failure
before any token is still one the dispatcher may retry elsewhere.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cacheroute.v1 import engine_pb2, engine_pb2_grpc
from services.http import oai
from services.backends.base import ApiCall, Backend, BackendDown, EngineError, EngineStats, Reply
from services.rpc import FAST_RECONNECT, TLSFiles, aio_channel

SERVING = health_pb2.HealthCheckResponse.SERVING
DEFAULT_MAX_TOKENS = 16     # the simulated engine's default, when an API request to it sets none
_KIND_OF = {grpc.StatusCode.INVALID_ARGUMENT: "invalid", grpc.StatusCode.RESOURCE_EXHAUSTED: "full",
            grpc.StatusCode.DEADLINE_EXCEEDED: "timeout", grpc.StatusCode.UNAVAILABLE: "unavailable"}


def engine_error(err: grpc.aio.AioRpcError, *, started: bool = False) -> EngineError:
    """The one mapping of a Generate call's gRPC status to an EngineError (`started`: a chunk
    was received already, so no retry)."""
    code, details = err.code(), " ".join((err.details() or "").split())
    kind = _KIND_OF.get(code, "failed")
    if kind == "invalid":
        return EngineError(kind, code.name, details or "invalid request")
    text = {"full": f": {details}", "timeout": "timed out"}.get(kind, f"failed: {code.name}: {details}")
    return EngineError(kind, code.name, text, retry=not started and kind in ("unavailable", "full"))


class CacheRouteBackend(Backend):
    kind = "cacheroute"
    http = False

    def __init__(self, replica_id: str, address: str, *, tls: TLSFiles | None = None) -> None:
        self.replica_id = replica_id
        self.address = address
        self._tls = tls
        self.channel: grpc.aio.Channel | None = None
        self.engine: engine_pb2_grpc.EngineStub | None = None
        self._health: health_pb2_grpc.HealthStub | None = None
        self.model = ""                  # the engine's profile, from its last poll

    def open_sync(self) -> None:
        if self.channel is None:
            self.channel = aio_channel(self.address, self._tls, reconnect=FAST_RECONNECT)
            self.engine = engine_pb2_grpc.EngineStub(self.channel)
            self._health = health_pb2_grpc.HealthStub(self.channel)

    async def open(self) -> None:
        self.open_sync()

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None

    async def generate(self, request: engine_pb2.GenerateRequest, timeout: float, *,
                       authorization: str | None = None) -> AsyncIterator:
        """The engine's GenerateChunks; EngineError (services.backends.base) for any engine
        failure. Close it (`aclose`) to cancel the call early. The engine takes no key
        (`authorization` is for HTTP engines)."""
        self.open_sync()
        call = self.engine.Generate(request, timeout=timeout)
        started = False
        try:
            async for chunk in call:
                started = True
                yield chunk
        except grpc.aio.AioRpcError as err:
            raise engine_error(err, started=started) from None
        finally:
            call.cancel()

    async def complete(self, call: ApiCall) -> Reply:
        req = call.request
        refused = oai.unsupported_fields(call.doc)
        if refused:
            raise EngineError("invalid", "unsupported_parameter", f"replica {self.replica_id} (kind cacheroute) cannot "
                              f"honour {', '.join(refused)}", param=refused[0])
        message = engine_pb2.GenerateRequest(prompt=req.text, max_tokens=req.max_tokens or DEFAULT_MAX_TOKENS,
                                             key=call.key)
        chunks = self.generate(message, call.deadlines.idle)
        try:
            first = await anext(chunks)
        except StopAsyncIteration:
            raise EngineError("failed", "empty", "sent no tokens") from None
        render = oai.Renderer(req.endpoint, req.model or self.model or self.replica_id,
                              f"{self.replica_id}-{id(chunks):x}", int(time.time()))
        reply = Reply(200, "text/event-stream" if req.stream else "application/json",
                      close=chunks.aclose)
        if req.stream:
            reply.events = _rendered(first, chunks, render, req.include_usage)
        else:
            reply.body = await _whole(first, chunks, render)
        return reply

    async def check(self, timeout: float) -> None:
        self.open_sync()
        try:
            reply = await self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.aio.AioRpcError as err:
            raise BackendDown(err.code().name, timeout=err.code() == grpc.StatusCode.DEADLINE_EXCEEDED) from None
        if reply.status != SERVING:
            raise BackendDown("NOT_SERVING", answered=True)

    async def poll(self, timeout: float) -> EngineStats:
        self.open_sync()
        try:
            health, stats = await asyncio.gather(
                self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout),
                self.engine.GetStats(engine_pb2.GetStatsRequest(), timeout=timeout))
        except grpc.aio.AioRpcError as err:
            raise BackendDown(err.code().name, timeout=err.code() == grpc.StatusCode.DEADLINE_EXCEEDED) from None
        if health.status != SERVING:
            raise BackendDown("NOT_SERVING", answered=True)
        self.model = stats.profile or self.model
        return EngineStats(replica_id=stats.replica_id, model=stats.profile, waiting=stats.waiting,
                           running=stats.running, kv_usage=stats.kv_usage, requests=stats.requests,
                           prompt_tokens=stats.prompt_tokens, cached_tokens=stats.cached_tokens,
                           has_counters=True, has_load=True, kv_blocks=stats.kv_blocks, preemptions=stats.preemptions)


async def _rendered(first, chunks: AsyncIterator, render: oai.Renderer, include_usage: bool) -> AsyncIterator[bytes]:
    """The engine's chunks as OpenAI SSE events, then the usage chunk (if asked) and [DONE]."""
    prompt, cached, emitted, chunk = first.prompt_tokens, first.cached_tokens, 0, first
    while chunk is not None:
        emitted += 1
        yield render.chunk(chunk.text, chunk.finish_reason or None if chunk.finished else None)
        chunk = await anext(chunks, None)
    if include_usage:
        yield render.usage_chunk(oai.usage(prompt, emitted, cached))
    yield oai.DONE


async def _whole(first, chunks: AsyncIterator, render: oai.Renderer) -> bytes:
    texts = [first.text]
    async for chunk in chunks:
        texts.append(chunk.text)
    return render.full("".join(texts), "length", oai.usage(first.prompt_tokens, len(texts), first.cached_tokens))
