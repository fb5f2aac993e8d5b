"""The shared server bootstrap: health, reflection, auth on control RPCs, error mapping."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from cacheroute.v1 import common_pb2, planner_pb2, planner_pb2_grpc
from services.errors import FailedPrecondition
from services.rpc import ServerConfig, start_server

NAME = "cacheroute.v1.Planner"


class Toy(planner_pb2_grpc.PlannerServicer):
    async def GetStatus(self, request, context):
        return planner_pb2.PlannerStatus(planner_id="toy")

    async def SetMode(self, request, context):
        if request.mode == common_pb2.MODE_UNSPECIFIED:
            raise ValueError("mode must be MODE_PLANNED or MODE_FLAT")
        if request.reason == "boom":
            raise RuntimeError("secret detail")
        if request.reason == "stale":
            raise FailedPrecondition("expected version 3, active is 4")
        return planner_pb2.ControlResponse(mode=request.mode)


async def _scenario(token: str | None):
    cfg = ServerConfig(name="toy", port=0, metrics_port=0, auth_token=token)
    running = await start_server(cfg, [(planner_pb2_grpc.add_PlannerServicer_to_server, Toy())], [NAME],
                                 protected_methods={"SetMode"})
    results = {}
    async with grpc.aio.insecure_channel(running.address) as ch:
        stub = planner_pb2_grpc.PlannerStub(ch)
        health = health_pb2_grpc.HealthStub(ch)
        results["health"] = (await health.Check(health_pb2.HealthCheckRequest(service=NAME), timeout=2)).status

        async def code_of(call):
            try:
                await call
                return grpc.StatusCode.OK, ""
            except grpc.aio.AioRpcError as err:
                return err.code(), err.details()

        good = [("authorization", f"Bearer {token}")] if token else None
        req = planner_pb2.SetModeRequest(mode=common_pb2.MODE_FLAT)
        results["no_token"] = await code_of(stub.SetMode(req, timeout=2))
        results["bad_token"] = await code_of(stub.SetMode(req, timeout=2, metadata=[("authorization", "Bearer nope")]))
        results["good"] = await code_of(stub.SetMode(req, timeout=2, metadata=good))
        results["invalid"] = await code_of(stub.SetMode(planner_pb2.SetModeRequest(), timeout=2, metadata=good))
        results["internal"] = await code_of(stub.SetMode(planner_pb2.SetModeRequest(mode=1, reason="boom"), timeout=2, metadata=good))
        results["stale"] = await code_of(stub.SetMode(planner_pb2.SetModeRequest(mode=1, reason="stale"), timeout=2, metadata=good))
        results["open"] = await code_of(stub.GetStatus(planner_pb2.GetPlannerStatusRequest(), timeout=2))
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        async for resp in refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])):
            results["services"] = {s.name for s in resp.list_services_response.service}
            break
        metrics = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{running.metrics_port}/metrics", timeout=2).read().decode())
        results["metrics"] = metrics
        await running.set_serving(False)
        results["after"] = (await health.Check(health_pb2.HealthCheckRequest(service=NAME), timeout=2)).status
    await running.stop(0)
    return results


def test_control_rpcs_need_the_token_and_errors_map_to_codes():
    r = asyncio.run(_scenario("s3cret"))
    assert r["health"] == health_pb2.HealthCheckResponse.SERVING
    assert r["no_token"][0] == grpc.StatusCode.UNAUTHENTICATED
    assert r["bad_token"][0] == grpc.StatusCode.PERMISSION_DENIED
    assert r["good"][0] == grpc.StatusCode.OK
    assert r["invalid"] == (grpc.StatusCode.INVALID_ARGUMENT, "mode must be MODE_PLANNED or MODE_FLAT")
    assert r["internal"][0] == grpc.StatusCode.INTERNAL and "secret" not in r["internal"][1]
    assert r["stale"][0] == grpc.StatusCode.FAILED_PRECONDITION
    assert r["open"][0] == grpc.StatusCode.OK
    assert {NAME, "grpc.health.v1.Health"} <= r["services"]
    assert 'cacheroute_rpc_total{code="PERMISSION_DENIED",method="SetMode"} 1.0' in r["metrics"]
    assert r["after"] == health_pb2.HealthCheckResponse.NOT_SERVING


def test_without_a_token_control_rpcs_are_open():
    r = asyncio.run(_scenario(None))
    assert r["no_token"][0] == grpc.StatusCode.OK
