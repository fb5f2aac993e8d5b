"""Kind `cacheroute`: the simulated engine over gRPC (health service + GetStats)."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cacheroute.v1 import engine_pb2, engine_pb2_grpc
from services.backends.base import Backend, BackendDown, EngineError, EngineStats
from services.rpc import FAST_RECONNECT, TLSFiles, aio_channel

SERVING = health_pb2.HealthCheckResponse.SERVING
_KIND_OF = {grpc.StatusCode.INVALID_ARGUMENT: "invalid", grpc.StatusCode.RESOURCE_EXHAUSTED: "full",
            grpc.StatusCode.DEADLINE_EXCEEDED: "timeout", grpc.StatusCode.UNAVAILABLE: "unavailable"}


def engine_error(err: grpc.aio.AioRpcError) -> EngineError:
    """The one mapping of a Generate call's gRPC status to an EngineError."""
    code = err.code()
    return EngineError(_KIND_OF.get(code, "failed"), code.name, err.details() or "")


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

    async def generate(self, request: engine_pb2.GenerateRequest, timeout: float) -> AsyncIterator:
        """The engine's GenerateChunks; EngineError (services.backends.base) for any engine
        failure. Close it (`contextlib.aclosing`) to cancel the call early."""
        self.open_sync()
        call = self.engine.Generate(request, timeout=timeout)
        try:
            async for chunk in call:
                yield chunk
        except grpc.aio.AioRpcError as err:
            raise engine_error(err) from None
        finally:
            call.cancel()

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
        return EngineStats(replica_id=stats.replica_id, model=stats.profile, waiting=stats.waiting,
                           running=stats.running, kv_usage=stats.kv_usage, requests=stats.requests,
                           prompt_tokens=stats.prompt_tokens, cached_tokens=stats.cached_tokens,
                           has_counters=True, has_load=True)
