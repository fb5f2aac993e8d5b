"""One simulated engine replica's wiring: `EngineConfig` and `EngineService` (engine model,
runner, cache-stat reporter and the gRPC server). `services/engine/__main__.py` parses flags
into a config and runs it; tests and services/engine/fleet.py start the service directly."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cacheroute.v1 import engine_pb2_grpc

from services.core.engine import EngineModel, get_profile
from services.engine.reporter import CacheStatsReporter
from services.engine.runner import EngineRunner
from services.engine.servicer import EngineServicer, Limits
from services.rpc import RunningServer, ServerConfig, kv, start_server

log = logging.getLogger("cacheroute.engine")
SERVICE = "cacheroute.v1.Engine"


@dataclass(frozen=True)
class EngineConfig:
    server: ServerConfig
    replica_id: str = "engine-0"
    profile: str = "llama3-8b-h100"
    time_scale: float = 1.0
    kv_blocks: int | None = None
    collector: str = ""
    report_interval: float = 1.0
    limits: Limits = Limits()
    max_requests: int = 4096
    http_port: int = -1                 # OpenAI HTTP API (services.engine.http): -1 off, 0 ephemeral


class EngineService:
    """One engine replica in this event loop: `await start()`, then `await stop()`."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        profile = get_profile(config.profile)
        self.model = EngineModel(profile, config.kv_blocks)
        self.runner = EngineRunner(self.model, time_scale=config.time_scale, max_requests=config.max_requests)
        self.reporter = (CacheStatsReporter(self.model, config.replica_id, config.collector,
                                            interval=config.report_interval, tls=config.server.tls,
                                            token=config.server.auth_token)
                         if config.collector else None)
        self.running: RunningServer | None = None
        self.http = None                # services.http.server.RunningHttp when the HTTP API is on
        self.http_api = None

    @property
    def address(self) -> str:
        assert self.running is not None
        return self.running.address

    @property
    def http_url(self) -> str | None:
        return self.http.url if self.http is not None else None

    async def start(self) -> "EngineService":
        self.runner.start()
        servicer = EngineServicer(self.runner, self.config.replica_id, self.config.profile, self.config.limits)
        self.running = await start_server(self.config.server, [(engine_pb2_grpc.add_EngineServicer_to_server, servicer)],
                                          [SERVICE])
        if self.config.http_port >= 0:
            from services.engine.http import start_engine_http
            self.http_api, self.http = await start_engine_http(
                self.runner, self.config.replica_id, self.config.profile, self.config.limits,
                self.config.server.host, self.config.http_port)
        if self.reporter is not None:
            self.reporter.start()
        log.info("engine ready", extra=kv(replica=self.config.replica_id, profile=self.config.profile,
                                          time_scale=self.config.time_scale, http=self.http_url))
        return self

    async def stop(self, grace: float | None = None) -> None:
        if self.http_api is not None:
            self.http_api.serving = False
        if self.running is not None:
            await self.running.stop(grace)
        if self.http is not None:
            await self.http.stop()
            self.http = None
        if self.reporter is not None:
            await self.reporter.stop()
        await self.runner.stop()


async def serve(config: EngineConfig) -> EngineService:
    return await EngineService(config).start()
