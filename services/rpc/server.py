"""Server bootstrap: `start_server` (health, reflection, the interceptor, message limits,
TLS, Prometheus metrics on an HTTP port), graceful shutdown (health NOT_SERVING, then
`server.stop(grace)`; signal handlers only set an event) and `run_service`, the body of
every service's `main()`."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from services.rpc.channels import channel_options, server_keepalive_options
from services.rpc.config import ServerConfig
from services.rpc.interceptor import ServiceInterceptor
from services.rpc.logs import kv, setup_logging
from services.rpc.metrics import RpcMetrics

log = logging.getLogger("cacheroute.rpc")


@dataclass
class RunningServer:
    config: ServerConfig
    server: grpc.aio.Server
    health: health_aio.HealthServicer
    service_names: tuple[str, ...]
    port: int
    metrics: RpcMetrics
    metrics_port: int | None = None
    _metrics_http: Any = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    def request_stop(self) -> None:
        self._stopping.set()

    async def wait_for_stop_signal(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._stopping.set)
            except (NotImplementedError, RuntimeError):  # not the main thread
                pass
        await self._stopping.wait()

    async def stop(self, grace: float | None = None) -> None:
        await self.set_serving(False)
        await self.server.stop(self.config.grace_seconds if grace is None else grace)
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
            self._metrics_http = None
        log.info("stopped", extra=kv(port=self.port))


async def start_server(
    config: ServerConfig,
    servicers: Iterable[tuple[Callable[[Any, grpc.aio.Server], None], Any]],
    service_names: Iterable[str],
    *,
    protected_methods: Iterable[str] = (),
    audited_methods: Iterable[str] = (),
    keyring: Any = None,
    keyring_methods: Iterable[str] = (),
    metrics: RpcMetrics | None = None,
) -> RunningServer:
    """Start an aio server with health, reflection, the interceptor and (optionally) metrics.

    `servicers` pairs generated `add_XServicer_to_server` functions with servicer objects;
    `service_names` are their full names (e.g. "cacheroute.v1.Planner");
    `protected_methods` are method names that need the bearer token when one is configured;
    every call of an `audited_methods` method, allowed or denied, leaves a `cacheroute.audit`
    record (method, caller address, outcome; never the token); `keyring_methods` need a key
    accepted by `keyring` (services.auth.KeyRing: API keys and the deployment token) when it
    has any (the data plane).
    """
    metrics = metrics or RpcMetrics(config.name)
    names = tuple(service_names)
    server = grpc.aio.server(
        interceptors=[ServiceInterceptor(config.auth_token, frozenset(protected_methods), metrics,
                                         frozenset(audited_methods), keyring, frozenset(keyring_methods))],
        options=channel_options(config.max_message_bytes) + server_keepalive_options()
        + [("grpc.so_reuseport", int(config.reuse_port))],
        maximum_concurrent_rpcs=None,
    )
    for add, servicer in servicers:
        add(servicer, server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection((*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                         reflection.SERVICE_NAME), server)
    bind = f"{config.host}:{config.port}"
    if config.tls.server_enabled:
        port = server.add_secure_port(bind, config.tls.server_credentials())
    else:
        port = server.add_insecure_port(bind)
    if port == 0:
        raise OSError(f"cannot bind {bind}")
    await server.start()
    running = RunningServer(config, server, health, names, port, metrics)
    if config.metrics_port >= 0:
        httpd, _thread = start_http_server(config.metrics_port, addr=config.metrics_host, registry=metrics.registry)
        running._metrics_http = httpd
        running.metrics_port = httpd.server_port
    await running.set_serving(True)
    log.info(config.announce, extra=kv(address=running.address, metrics_port=running.metrics_port,
                                 tls=config.tls.server_enabled, auth=bool(config.auth_token),
                                 data_plane_keys=bool(keyring is not None and keyring.enabled)))
    return running


class Service(Protocol):
    """What each service's `serve(config)` returns."""

    running: RunningServer | None

    async def stop(self) -> None: ...


def run_service(name: str, parse_config: Callable[[], Any], serve: Callable[[Any], Awaitable[Service]]) -> int:
    """The body of every service's `main()`: build the config (a ValueError is one line on
    stderr and exit 2), JSON logs, serve until SIGTERM/SIGINT, then stop gracefully."""
    try:
        config = parse_config()
    except ValueError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    setup_logging(name, config.server.log_level)

    async def run() -> None:
        service = await serve(config)
        try:
            assert service.running is not None
            await service.running.wait_for_stop_signal()
        finally:
            await service.stop()

    asyncio.run(run())
    return 0
