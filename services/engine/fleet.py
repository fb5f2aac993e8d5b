"""Several engine replicas in one event loop, for tests, benchmarks and local stacks."""

from __future__ import annotations

import dataclasses

from services.engine.service import EngineConfig, EngineService
from services.rpc import ServerConfig


class EngineFleet:
    """`n` replicas "e0".."e{n-1}" on ephemeral loopback ports (or the given ports)."""

    def __init__(self, n: int, *, prefix: str = "e", time_scale: float = 1.0, profile: str = "llama3-8b-h100",
                 collector: str = "", report_interval: float = 1.0, kv_blocks: int | None = None,
                 host: str = "127.0.0.1", http: bool = False) -> None:
        self.configs = [EngineConfig(server=ServerConfig(name="engine", host=host, port=0), replica_id=f"{prefix}{i}",
                                     profile=profile, time_scale=time_scale, kv_blocks=kv_blocks,
                                     collector=collector, report_interval=report_interval,
                                     http_port=0 if http else -1)
                        for i in range(n)]
        self.services: list[EngineService | None] = [None] * n

    async def start(self) -> "EngineFleet":
        for i in range(len(self.configs)):
            await self.start_one(i)
        return self

    async def start_one(self, i: int) -> EngineService:
        """(Re)start replica i; a restart binds the port it had before."""
        service = await EngineService(self.configs[i]).start()
        assert service.running is not None
        if self.configs[i].server.port == 0:
            server = dataclasses.replace(self.configs[i].server, port=service.running.port)
            self.configs[i] = dataclasses.replace(self.configs[i], server=server)
        if self.configs[i].http_port == 0 and service.http is not None:
            self.configs[i] = dataclasses.replace(self.configs[i], http_port=service.http.port)
        self.services[i] = service
        return service

    async def stop_one(self, i: int, grace: float = 0) -> None:
        service = self.services[i]
        if service is not None:
            self.services[i] = None
            await service.stop(grace)

    async def stop(self) -> None:
        for i in range(len(self.services)):
            await self.stop_one(i)

    @property
    def ids(self) -> list[str]:
        return [c.replica_id for c in self.configs]

    def address(self, i: int) -> str:
        server = self.configs[i].server
        return f"{server.host}:{server.port}"

    def http_url(self, i: int) -> str:
        """Replica i's OpenAI HTTP API (fleets started with http=True)."""
        config = self.configs[i]
        return f"http://{config.server.host}:{config.http_port}"

    def replicas_flag(self, kind: str = "cacheroute") -> str:
        """The dispatcher's --replicas value for this fleet: gRPC addresses, or for an HTTP
        kind (e.g. "vllm") the HTTP API URLs as `id=KIND+http://...`."""
        if kind == "cacheroute":
            return ",".join(f"{rid}={self.address(i)}" for i, rid in enumerate(self.ids))
        return ",".join(f"{rid}={kind}+{self.http_url(i)}" for i, rid in enumerate(self.ids))
