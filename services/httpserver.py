"""Starting and stopping an aiohttp application inside a service's event loop.

aiohttp (3.x) is the HTTP library of the data plane: it is asyncio-native, so the OpenAI
front door shares one event loop with grpc.aio (no thread hand-offs on the request path),
it streams request and response bodies both ways, and it is maintained by the aio-libs
team with a long release history. Handlers are cancelled when their client disconnects
(`handler_cancellation=True`), which is how an abandoned request cancels its upstream.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiohttp import web

from services.rpc import kv

log = logging.getLogger("cacheroute.http")


@dataclass
class RunningHttp:
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_http(app: web.Application, host: str, port: int, *, shutdown_timeout: float = 1.0,
                     reuse_port: bool = False) -> RunningHttp:
    """Serve `app` on host:port (0: ephemeral); the bound port is in the result and in the
    "http serving" log line (field `url`), which `services.stack` reads like gRPC's "serving" line."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, reuse_port=reuse_port or None)
    await site.start()
    sockets = site._server.sockets if site._server is not None else ()   # noqa: SLF001 - the only way to read port 0
    bound = sockets[0].getsockname()[1] if sockets else port
    running = RunningHttp(runner, host, bound)
    log.info("http serving", extra=kv(url=running.url))
    return running
