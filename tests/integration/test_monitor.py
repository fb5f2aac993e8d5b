"""The dispatcher's replica monitor against a real gRPC replica whose polls can be slowed:
one slow poll keeps the replica in service, repeated ones take it out, a refusal at once. A second,
healthy replica stays in rotation throughout, so the monitor's panic mode (health checks alone
must not empty the rotation) does not apply."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cacheroute.v1 import engine_pb2, engine_pb2_grpc
from services.dispatcher.monitor import ReplicaMonitor
from services.dispatcher.router import Router
from services.model import Replica


class SlowHealth(health_pb2_grpc.HealthServicer):
    def __init__(self) -> None:
        self.delay = 0.0
        self.status = health_pb2.HealthCheckResponse.SERVING

    async def Check(self, request, context):
        await asyncio.sleep(self.delay)
        return health_pb2.HealthCheckResponse(status=self.status)


class Stats(engine_pb2_grpc.EngineServicer):
    async def GetStats(self, request, context):
        return engine_pb2.EngineStats(replica_id="r0", waiting=1, running=2)


async def scenario() -> list[bool]:
    health = SlowHealth()
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    engine_pb2_grpc.add_EngineServicer_to_server(Stats(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    other = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(SlowHealth(), other)
    engine_pb2_grpc.add_EngineServicer_to_server(Stats(), other)
    other_port = other.add_insecure_port("127.0.0.1:0")
    await other.start()
    router = Router([Replica("r0", f"127.0.0.1:{port}"), Replica("r1", f"127.0.0.1:{other_port}")])
    monitor = ReplicaMonitor(router, interval=10.0, timeout=0.1)
    monitor.open()
    seen = []
    try:
        await monitor.poll_once()
        seen.append(router.state.healthy[0])        # True: first good poll
        health.delay = 0.3
        await monitor.poll_once()
        seen.append(router.state.healthy[0])        # True: one timeout is not enough
        await monitor.poll_once()
        seen.append(router.state.healthy[0])        # False: two in a row
        health.delay = 0.0
        await monitor.poll_once()
        seen.append(router.state.healthy[0])        # True: back after a good poll
        health.status = health_pb2.HealthCheckResponse.NOT_SERVING
        await monitor.poll_once()
        seen.append(router.state.healthy[0])        # False: NOT_SERVING counts at once
    finally:
        await monitor.stop()
        await server.stop(0)
        await other.stop(0)
    return seen


def test_one_slow_poll_keeps_a_replica_two_take_it_out():
    assert asyncio.run(scenario()) == [True, True, False, True, False]
