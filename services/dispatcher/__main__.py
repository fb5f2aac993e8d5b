"""`cacheroute serve dispatcher` / `python -m services.dispatcher`: a stateless dispatcher.

Environment variables (flags override them):
  CACHEROUTE_REPLICAS ("")                  engine replicas, id=host:port,... (required)
  CACHEROUTE_PLANNER ("")                   planner address for WatchPlans (off if empty)
  CACHEROUTE_REDIS_URL ("")                 Redis for the fallback plan read (off if empty)
  CACHEROUTE_COLLECTOR ("")                 collector for arrival telemetry (off if empty)
  CACHEROUTE_DISPATCHER_ID (dispatcher-0)   source id in telemetry and status
  CACHEROUTE_KEY_BLOCKS (4)                 key = chained hash of the first N prefix blocks
  CACHEROUTE_KEY_TOKENS (64)                key = hash of the first N prompt tokens
  CACHEROUTE_COLD_TAIL (policy default)     cold-tail policy: p2c (power of two choices) or chwbl
                                            (session-aware: bounded-load consistent hashing on the key,
                                            so every dispatcher with the same --replicas list sends a
                                            cold key to the same replica while loads are balanced);
                                            default: the cacheroute policy's, as in the simulator
                                            (CACHEROUTE_COLD is read when CACHEROUTE_COLD_TAIL is unset)
  CACHEROUTE_POLL_INTERVAL (0.25)           replica health/stats poll period, seconds
  CACHEROUTE_POLL_TIMEOUT (0.2)             deadline of each poll RPC, seconds
  CACHEROUTE_TELEMETRY_INTERVAL (0.5)       arrival flush period, seconds
  CACHEROUTE_TELEMETRY_CAPACITY (100000)    buffered arrivals before new ones are dropped
  CACHEROUTE_MAX_BATCH (10000)              RouteBatch requests per call
  CACHEROUTE_CALLER_TELEMETRY_RATE (100)    Route/RouteBatch arrivals per second one caller (tenant, else
                                            peer host) may add to the planner's input; 0 = no bound
                                            (services/dispatcher/budget.py). Generate arrivals count once served.
  CACHEROUTE_CALLER_TELEMETRY_BURST (1000)  that budget's bucket size
  CACHEROUTE_SEED ("")                      P2C seed (random if empty)
  CACHEROUTE_ENGINE_KIND (cacheroute)       kind of replicas given without KIND+ (services/backends):
                                            cacheroute (gRPC engine), vllm, sglang, llamacpp, openai
OpenAI HTTP API (services/dispatcher/http.py):
  CACHEROUTE_HTTP_PORT (8080)               port, -1 off, 0 ephemeral (host: --host)
  CACHEROUTE_API_KEY / CACHEROUTE_API_KEY_FILE
                                            accepted API keys (file: key[:tenant] lines; services/auth.py);
                                            the deployment token CACHEROUTE_AUTH_TOKEN is accepted too
  CACHEROUTE_HTTP_MAX_BODY_BYTES (8388608)  larger request bodies are 413
  CACHEROUTE_MAX_OUTPUT_TOKENS (32768)      larger max_tokens is 400
  CACHEROUTE_UPSTREAM_TIMEOUT (600)         seconds without a byte from the engine -> 504
  CACHEROUTE_EJECT_SECONDS (5)              a replica that answered 5xx / timed out stays out this long
"""

from __future__ import annotations

import argparse
import inspect
import logging
import sys
from dataclasses import dataclass

from cacheroute.v1 import dispatcher_pb2_grpc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services.core.policies.cacheroute import COLD_TAILS, CacheRoutePolicy
from services.auth import KeyRing, keyring
from services.backends import KINDS, parse_endpoint
from services.dispatcher.http import HttpApi, HttpConfig
from services.dispatcher.budget import BudgetConfig, CallerBudget
from services.dispatcher.monitor import ReplicaMonitor
from services.dispatcher.plans import PlanFeed
from services.dispatcher.router import Replica, Router, parse_replicas
from services.dispatcher.servicer import DispatcherServicer, KeyRules
from services.dispatcher.telemetry import ArrivalReporter
from services.rpc import (
    RpcMetrics,
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

log = logging.getLogger("cacheroute.dispatcher")
SERVICE = "cacheroute.v1.Dispatcher"
# the live default is the simulator's: whatever the cacheroute policy defaults to
DEFAULT_COLD_TAIL: str = inspect.signature(CacheRoutePolicy).parameters["cold"].default


@dataclass(frozen=True)
class DispatcherConfig:
    server: ServerConfig
    replicas: tuple[Replica, ...]
    dispatcher_id: str = "dispatcher-0"
    planner: str = ""
    redis_url: str = ""
    collector: str = ""
    rules: KeyRules = KeyRules()
    cold: str = DEFAULT_COLD_TAIL
    poll_interval: float = 0.25
    poll_timeout: float = 0.2
    telemetry_interval: float = 0.5
    telemetry_capacity: int = 100_000
    plan_backoff_max: float = 5.0
    seed: int | None = None
    engine_kind: str = "cacheroute"
    http: HttpConfig = HttpConfig()
    keyring: KeyRing = KeyRing()
    budget: BudgetConfig = BudgetConfig()


class RouterMetrics:
    """Prometheus view of the router, read at scrape time (nothing on the request path)."""

    def __init__(self, router: Router) -> None:
        self.router = router

    def collect(self):
        r = self.router
        routed = CounterMetricFamily("cacheroute_dispatcher_routed", "requests routed, by reason", labels=["reason"])
        for name, value in (("planned", r.counts[1]), ("cold", r.counts[2]), ("fallback", r.counts[3])):
            routed.add_metric([name], value)
        yield routed
        yield GaugeMetricFamily("cacheroute_dispatcher_plan_version", "active plan version (0: none)", r.plan_version)
        yield GaugeMetricFamily("cacheroute_dispatcher_flat_mode", "1 in flat-fallback mode", int(r.flat))
        yield CounterMetricFamily("cacheroute_dispatcher_telemetry_dropped", "arrivals not delivered to the collector",
                                  r.telemetry_dropped)
        yield CounterMetricFamily("cacheroute_dispatcher_telemetry_capped",
                                  "Route/RouteBatch arrivals left out of telemetry: caller over its budget",
                                  r.telemetry_capped)
        healthy = GaugeMetricFamily("cacheroute_dispatcher_replica_healthy", "1 if the replica is healthy", labels=["replica"])
        load = GaugeMetricFamily("cacheroute_dispatcher_replica_load", "load signal (engine queue + recent routes)",
                                 labels=["replica"])
        for i, rid in enumerate(r.ids):
            healthy.add_metric([rid], int(r.state.healthy[i]))
            load.add_metric([rid], r.state.in_flight[i])
        yield healthy
        yield load


class DispatcherService:
    """One dispatcher in this event loop: `await start()`, then `await stop()`."""

    def __init__(self, config: DispatcherConfig) -> None:
        self.config = config
        self.router = Router(config.replicas, seed=config.seed, cold=config.cold,
                             telemetry_capacity=config.telemetry_capacity)
        tls = config.server.tls
        self.monitor = ReplicaMonitor(self.router, interval=config.poll_interval, timeout=config.poll_timeout, tls=tls,
                                      default_kind=config.engine_kind)
        self.store = None
        if config.redis_url:
            from services.store import RedisStore
            self.store = RedisStore(config.redis_url)
        self.feed = PlanFeed(self.router, planner=config.planner, store=self.store, tls=tls,
                             backoff_max=config.plan_backoff_max, seed=config.seed)
        self.reporter = (ArrivalReporter(self.router, config.collector, config.dispatcher_id,
                                         interval=config.telemetry_interval, tls=tls,
                                         token=config.server.auth_token)
                         if config.collector else None)
        self.running: RunningServer | None = None
        self.http: HttpApi | None = None

    @property
    def address(self) -> str:
        assert self.running is not None
        return self.running.address

    @property
    def http_url(self) -> str | None:
        return self.http.url if self.http is not None else None

    async def start(self) -> "DispatcherService":
        await self.monitor.start()
        await self.feed.start()
        metrics = RpcMetrics("dispatcher")
        metrics.registry.register(RouterMetrics(self.router))
        servicer = DispatcherServicer(self.router, self.monitor, self.config.rules, self.config.dispatcher_id,
                                      budget=CallerBudget(self.config.budget))
        self.running = await start_server(self.config.server,
                                          [(dispatcher_pb2_grpc.add_DispatcherServicer_to_server, servicer)],
                                          [SERVICE], metrics=metrics)
        if self.config.http.port >= 0:
            self.http = await HttpApi(self.router, self.monitor, self.config.http, self.config.keyring,
                                      collector=self.config.collector, source=self.config.dispatcher_id,
                                      tls=self.config.server.tls, token=self.config.server.auth_token,
                                      registry=metrics.registry).start()
        if self.reporter is not None:
            self.reporter.start()
        log.info("dispatcher ready", extra=kv(id=self.config.dispatcher_id, replicas=len(self.router.ids),
                                              healthy=sum(self.router.state.healthy), http=self.http_url,
                                              plan_version=self.router.plan_version, source=self.router.plan_source))
        return self

    async def stop(self, grace: float | None = None) -> None:
        if self.http is not None:
            self.http.front.serving = False
        if self.running is not None:
            await self.running.stop(grace)
        if self.http is not None:
            await self.http.stop()
        await self.feed.stop()
        if self.reporter is not None:
            await self.reporter.stop()
        await self.monitor.stop()
        if self.store is not None:
            await self.store.close()


async def serve(config: DispatcherConfig) -> DispatcherService:
    return await DispatcherService(config).start()


def parse_args(argv: list[str] | None) -> DispatcherConfig:
    parser = argparse.ArgumentParser(prog="cacheroute serve dispatcher", description="A stateless dispatcher.",
                                     epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_flags(parser, default_port=50053, default_metrics_port=9153)
    g = parser.add_argument_group("dispatcher")
    g.add_argument("--replicas", default=env("REPLICAS"), help="id=host:port,... (env CACHEROUTE_REPLICAS)")
    g.add_argument("--planner", default=env("PLANNER"), help="planner address (env CACHEROUTE_PLANNER)")
    g.add_argument("--redis", default=env("REDIS_URL"), help="Redis URL for the fallback plan read (env CACHEROUTE_REDIS_URL)")
    g.add_argument("--collector", default=env("COLLECTOR"), help="collector address (env CACHEROUTE_COLLECTOR)")
    g.add_argument("--dispatcher-id", default=env("DISPATCHER_ID", "dispatcher-0"), help="(env CACHEROUTE_DISPATCHER_ID)")
    g.add_argument("--key-blocks", type=int, default=env_number("KEY_BLOCKS", "4", int), help="(env CACHEROUTE_KEY_BLOCKS, default 4)")
    g.add_argument("--key-tokens", type=int, default=env_number("KEY_TOKENS", "64", int), help="(env CACHEROUTE_KEY_TOKENS, default 64)")
    g.add_argument("--cold-tail", "--cold", dest="cold", default=env("COLD_TAIL", env("COLD", DEFAULT_COLD_TAIL)),
                   choices=COLD_TAILS, help=f"cold-tail policy (env CACHEROUTE_COLD_TAIL, default {DEFAULT_COLD_TAIL})")
    g.add_argument("--poll-interval", type=float, default=env_number("POLL_INTERVAL", "0.25", float))
    g.add_argument("--poll-timeout", type=float, default=env_number("POLL_TIMEOUT", "0.2", float))
    g.add_argument("--telemetry-interval", type=float, default=env_number("TELEMETRY_INTERVAL", "0.5", float))
    g.add_argument("--telemetry-capacity", type=int, default=env_number("TELEMETRY_CAPACITY", "100000", int))
    g.add_argument("--max-batch", type=int, default=env_number("MAX_BATCH", "10000", int))
    g.add_argument("--seed", type=int, default=int(env("SEED")) if env("SEED") else None)
    g.add_argument("--engine-kind", default=env("ENGINE_KIND", "cacheroute"), choices=KINDS,
                   help="kind of replicas given without KIND+ (env CACHEROUTE_ENGINE_KIND, default cacheroute)")
    h = parser.add_argument_group("OpenAI HTTP API")
    h.add_argument("--http-port", type=int, default=env_number("HTTP_PORT", "8080", int),
                   help="-1 = off, 0 = ephemeral (env CACHEROUTE_HTTP_PORT, default 8080)")
    h.add_argument("--api-key", default=env("API_KEY") or None, help="accepted API key (env CACHEROUTE_API_KEY)")
    h.add_argument("--api-key-file", default=env("API_KEY_FILE") or None,
                   help="file of key[:tenant] lines (env CACHEROUTE_API_KEY_FILE)")
    h.add_argument("--http-max-body-bytes", type=int, default=env_number("HTTP_MAX_BODY_BYTES", str(8 * 1024 * 1024), int))
    h.add_argument("--max-output-tokens", type=int, default=env_number("MAX_OUTPUT_TOKENS", "32768", int))
    h.add_argument("--upstream-timeout", type=float, default=env_number("UPSTREAM_TIMEOUT", "600", float))
    h.add_argument("--eject-seconds", type=float, default=env_number("EJECT_SECONDS", "5", float))
    g.add_argument("--caller-telemetry-rate", type=float, default=env_number("CALLER_TELEMETRY_RATE", "100", float),
                   help="Route/RouteBatch arrivals/s one caller may add to the planner's input, 0 = unbounded "
                        "(env CACHEROUTE_CALLER_TELEMETRY_RATE, default 100)")
    g.add_argument("--caller-telemetry-burst", type=float, default=env_number("CALLER_TELEMETRY_BURST", "1000", float),
                   help="that budget's bucket size (env CACHEROUTE_CALLER_TELEMETRY_BURST, default 1000)")
    args = parser.parse_args(argv)
    try:
        replicas = parse_replicas(args.replicas or "")
    except ValueError as exc:
        parser.error(f"--replicas: {exc}")
    try:
        for replica in replicas:
            parse_endpoint(replica.address, args.engine_kind)
    except ValueError as exc:
        parser.error(f"--replicas: {exc}")
    if args.key_blocks < 1 or args.key_tokens < 1:
        parser.error("--key-blocks and --key-tokens must be >= 1")
    if not (0 < args.poll_timeout and 0 < args.poll_interval):
        parser.error("--poll-interval and --poll-timeout must be > 0")
    server = server_config("dispatcher", args)
    try:
        ring = keyring(args.api_key, args.api_key_file, server.auth_token)
    except (OSError, ValueError) as exc:
        parser.error(f"--api-key-file: {exc}")
    http = HttpConfig(host=args.host, port=args.http_port, max_body_bytes=args.http_max_body_bytes,
                      max_output_tokens=args.max_output_tokens, upstream_timeout=args.upstream_timeout,
                      eject_seconds=args.eject_seconds, key_tokens=args.key_tokens)
    try:
        budget = BudgetConfig(rate=args.caller_telemetry_rate, burst=args.caller_telemetry_burst)
    except ValueError as exc:
        parser.error(str(exc))
    return DispatcherConfig(
        server=server, replicas=replicas, dispatcher_id=args.dispatcher_id,
        planner=args.planner, redis_url=args.redis, collector=args.collector,
        rules=KeyRules(blocks=args.key_blocks, tokens=args.key_tokens, max_batch=args.max_batch),
        cold=args.cold, poll_interval=args.poll_interval, poll_timeout=args.poll_timeout,
        telemetry_interval=args.telemetry_interval, telemetry_capacity=args.telemetry_capacity, seed=args.seed,
        engine_kind=args.engine_kind, http=http, keyring=ring, budget=budget)


def main(argv: list[str] | None = None) -> int:
    return run_service("dispatcher", lambda: parse_args(argv), serve)


if __name__ == "__main__":
    sys.exit(main())
