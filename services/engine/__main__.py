"""`cacheroute serve engine` / `python -m services.engine`: one simulated engine replica.

Environment variables (flags override them):
  CACHEROUTE_REPLICA_ID (engine-0)            id reported in chunks, stats and telemetry
  CACHEROUTE_PROFILE (llama3-8b-h100)         engine profile (services.core.engine.PROFILES)
  CACHEROUTE_TIME_SCALE (1.0)                 wall seconds slept per model second
  CACHEROUTE_KV_BLOCKS (profile's)            KV pool size in 16-token blocks
  CACHEROUTE_COLLECTOR ("")                   collector address for cache stats (off if empty)
  CACHEROUTE_REPORT_INTERVAL (1.0)            seconds between cache-stat reports
  CACHEROUTE_MAX_PROMPT_TOKENS (131072)       longer prompts are INVALID_ARGUMENT
  CACHEROUTE_MAX_OUTPUT_TOKENS (8192)         larger max_tokens is INVALID_ARGUMENT
  CACHEROUTE_MAX_REQUESTS (4096)              more in flight is RESOURCE_EXHAUSTED
  CACHEROUTE_HTTP_PORT (-1)                   OpenAI HTTP API port (services/engine/http.py), -1 off, 0 ephemeral
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass

from cacheroute.v1 import engine_pb2_grpc

from services.core.engine import EngineModel, get_profile
from services.engine.reporter import CacheStatsReporter
from services.engine.runner import EngineRunner
from services.engine.servicer import EngineServicer, Limits
from services.rpc import (
    RunningServer,
    ServerConfig,
    add_server_flags,
    env,
    env_number,
    kv,
    run_service,
    server_config,
    start_server,
)

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
        self.http = None                # services.httpserver.RunningHttp when the HTTP API is on
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


def parse_args(argv: list[str] | None) -> EngineConfig:
    parser = argparse.ArgumentParser(prog="cacheroute serve engine", description="A simulated engine replica.",
                                     epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_flags(parser, default_port=50061, default_metrics_port=9161)
    g = parser.add_argument_group("engine")
    g.add_argument("--replica-id", default=env("REPLICA_ID", "engine-0"), help="(env CACHEROUTE_REPLICA_ID)")
    g.add_argument("--profile", default=env("PROFILE", "llama3-8b-h100"), help="(env CACHEROUTE_PROFILE)")
    g.add_argument("--time-scale", type=float, default=env_number("TIME_SCALE", "1.0", float),
                   help="wall seconds per model second (env CACHEROUTE_TIME_SCALE, default 1.0)")
    g.add_argument("--kv-blocks", type=int, default=env_number("KV_BLOCKS", "0", int) or None,
                   help="KV pool in 16-token blocks (env CACHEROUTE_KV_BLOCKS, default: the profile's)")
    g.add_argument("--collector", default=env("COLLECTOR", ""), help="collector address (env CACHEROUTE_COLLECTOR)")
    g.add_argument("--report-interval", type=float, default=env_number("REPORT_INTERVAL", "1.0", float),
                   help="(env CACHEROUTE_REPORT_INTERVAL)")
    g.add_argument("--max-prompt-tokens", type=int, default=env_number("MAX_PROMPT_TOKENS", "131072", int),
                   help="(env CACHEROUTE_MAX_PROMPT_TOKENS)")
    g.add_argument("--max-output-tokens", type=int, default=env_number("MAX_OUTPUT_TOKENS", "8192", int),
                   help="(env CACHEROUTE_MAX_OUTPUT_TOKENS)")
    g.add_argument("--max-requests", type=int, default=env_number("MAX_REQUESTS", "4096", int),
                   help="(env CACHEROUTE_MAX_REQUESTS)")
    g.add_argument("--http-port", type=int, default=env_number("HTTP_PORT", "-1", int),
                   help="OpenAI HTTP API port, -1 = off, 0 = ephemeral (env CACHEROUTE_HTTP_PORT, default -1)")
    args = parser.parse_args(argv)
    try:
        get_profile(args.profile)
    except ValueError as exc:
        parser.error(str(exc))
    if args.time_scale <= 0:
        parser.error("--time-scale must be > 0")
    return EngineConfig(
        server=server_config("engine", args), replica_id=args.replica_id, profile=args.profile,
        time_scale=args.time_scale, kv_blocks=args.kv_blocks, collector=args.collector,
        report_interval=args.report_interval,
        limits=Limits(max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens),
        max_requests=args.max_requests, http_port=args.http_port)


def main(argv: list[str] | None = None) -> int:
    return run_service("engine", lambda: parse_args(argv), serve)


if __name__ == "__main__":
    sys.exit(main())
