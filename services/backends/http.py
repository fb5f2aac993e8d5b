"""HTTP engine kinds (vllm, sglang, llamacpp, openai): health from `GET /health`, load and
cache counters from `GET /metrics` (the kind's names, see its module).

Healthy means /health answered 2xx within the deadline; for kinds with metrics the
/metrics page must also parse (a page without the kind's load gauges leaves the load to
the dispatcher's in-flight count). Both requests run concurrently on the dispatcher's
shared aiohttp session (keep-alive connections); a session is created here when none is
given (the planner's health checks).
"""

from __future__ import annotations

import asyncio

import aiohttp

from services.backends import llamacpp, sglang, vllm
from services.backends.base import Backend, BackendDown, EngineStats
from services.backends.metrics import sample_sums

READERS = {"vllm": vllm.read_stats, "sglang": sglang.read_stats, "llamacpp": llamacpp.read_stats}


class HttpBackend(Backend):
    http = True

    def __init__(self, replica_id: str, base_url: str, kind: str, *, session: aiohttp.ClientSession | None = None) -> None:
        self.replica_id = replica_id
        self.address = base_url
        self.base_url = base_url
        self.kind = kind
        self.session = session
        self._own_session = session is None
        self._reader = READERS.get(kind)

    async def open(self) -> None:
        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            self._own_session = True

    async def close(self) -> None:
        if self._own_session and self.session is not None:
            await self.session.close()
            self.session = None

    async def _get(self, path: str, timeout: float) -> tuple[int, bytes]:
        await self.open()
        try:
            async with self.session.get(self.base_url + path,
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                return resp.status, await resp.read()
        except asyncio.TimeoutError:
            raise BackendDown(f"GET {path} timed out", timeout=True) from None
        except aiohttp.ClientError as exc:
            raise BackendDown(f"GET {path}: {type(exc).__name__}") from None

    async def check(self, timeout: float) -> None:
        status, _ = await self._get("/health", timeout)
        if not 200 <= status < 300:
            raise BackendDown(f"/health answered {status}", answered=True)

    async def poll(self, timeout: float) -> EngineStats:
        if self._reader is None:
            await self.check(timeout)
            return EngineStats(replica_id=self.replica_id)
        (h_status, _), (m_status, page) = await asyncio.gather(self._get("/health", timeout),
                                                               self._get("/metrics", timeout))
        if not 200 <= h_status < 300:
            raise BackendDown(f"/health answered {h_status}", answered=True)
        stats = EngineStats(replica_id=self.replica_id)
        if m_status == 200:
            try:
                samples = sample_sums(page.decode("utf-8", "replace"))
            except ValueError:
                raise BackendDown("/metrics did not parse") from None
            self._reader(samples, stats)
        return stats
