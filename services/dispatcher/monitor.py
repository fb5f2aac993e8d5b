"""Replica health and load polling for the dispatcher.

Every `interval` seconds (default 0.25, so ~4×/s) each replica gets a grpc health check
and a GetStats call, both with a short deadline (default 0.2 s), concurrently. A replica
is healthy when the health service says SERVING and the stats call succeeds. A refused
connection, an error or NOT_SERVING takes it out of T(b) and P2C at once (the policy skips
unhealthy replicas); a poll that only ran out of time counts once `timeouts_to_down`
(default 2) polls in a row did, because a busy dispatcher (or machine) misses a 0.2 s
deadline now and then, and marking every replica down on one slow poll would fail requests
that a healthy cluster could serve. A dead or hung replica is still out within
interval + 2 x timeout < 1 s, and back after its first good poll. A proxied stream that
fails with UNAVAILABLE marks its replica down immediately too (`mark_down`).
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cacheroute.v1 import engine_pb2, engine_pb2_grpc
from services.dispatcher.router import Router
from services.rpc import FAST_RECONNECT, TLSFiles, aio_channel, every, kv, stop_tasks

log = logging.getLogger("cacheroute.dispatcher.monitor")
SERVING = health_pb2.HealthCheckResponse.SERVING


class ReplicaMonitor:
    def __init__(self, router: Router, *, interval: float = 0.25, timeout: float = 0.2,
                 tls: TLSFiles | None = None, timeouts_to_down: int = 2) -> None:
        self.router = router
        self.interval = interval
        self.timeout = timeout
        self.timeouts_to_down = timeouts_to_down
        self._timeouts = [0] * len(router.replicas)
        self._tls = tls
        self.channels: list[grpc.aio.Channel] = []
        self.engines: list[engine_pb2_grpc.EngineStub] = []
        self._health: list[health_pb2_grpc.HealthStub] = []
        self._task: asyncio.Task | None = None

    def open(self) -> None:
        for replica in self.router.replicas:
            channel = aio_channel(replica.address, self._tls, reconnect=FAST_RECONNECT)
            self.channels.append(channel)
            self.engines.append(engine_pb2_grpc.EngineStub(channel))
            self._health.append(health_pb2_grpc.HealthStub(channel))

    async def start(self) -> None:
        if not self.channels:
            self.open()
        await self.poll_once()
        self._task = asyncio.get_running_loop().create_task(every(self.interval, self.poll_once),
                                                            name="replica-monitor")

    async def stop(self) -> None:
        await stop_tasks([self._task])
        self._task = None
        for channel in self.channels:
            await channel.close()
        self.channels.clear()

    async def poll_once(self) -> None:
        await asyncio.gather(*(self._poll(i) for i in range(len(self.router.replicas))))

    async def _poll(self, i: int) -> None:
        router = self.router
        marker = router.poll_sent(i)
        try:
            health, stats = await asyncio.gather(
                self._health[i].Check(health_pb2.HealthCheckRequest(service=""), timeout=self.timeout),
                self.engines[i].GetStats(engine_pb2.GetStatsRequest(), timeout=self.timeout))
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                self._timeouts[i] += 1
                if self._timeouts[i] < self.timeouts_to_down:
                    return  # one slow poll: keep the replica's last state
            self._set(i, False, err.code().name)
            return
        self._timeouts[i] = 0
        if health.status != SERVING:
            self._set(i, False, "NOT_SERVING")
            return
        router.stats_received(i, marker, stats.waiting, stats.running, stats.kv_usage, stats)
        self._set(i, True, "OK")

    def mark_down(self, i: int, why: str) -> None:
        self._set(i, False, why)

    def _set(self, i: int, healthy: bool, why: str) -> None:
        if self.router.set_healthy(i, healthy):
            replica = self.router.replicas[i]
            log.log(logging.INFO if healthy else logging.WARNING, "replica %s", "up" if healthy else "down",
                    extra=kv(replica=replica.id, address=replica.address, reason=why))
