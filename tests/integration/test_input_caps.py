"""Small holes from the adversarial pass (issue 16, item 5): a full replica is retried once
on another, operator reasons are capped, every control call leaves an audit record."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import grpc

from cacheroute.v1 import dispatcher_pb2_grpc, engine_pb2, engine_pb2_grpc, planner_pb2 as pb, planner_pb2_grpc
from services.dispatcher.service import serve
from services.engine.service import EngineConfig, EngineService
from services.model import parse_replicas
from services.planner.service import PlannerService
from services.rpc import ServerConfig
from tests.integration.test_dispatcher import dispatcher_config, hand_plan, wait_until
from tests.integration.test_planner import AUTH, TOKEN, config as planner_config


class _Fleet:
    """Two engines, e0 taking one request at a time (the dispatcher_config helper reads replicas_flag)."""

    def __init__(self, engines):
        self.engines = engines

    def replicas_flag(self) -> str:
        return ",".join(f"e{i}={e.address}" for i, e in enumerate(self.engines))


def test_generate_retries_resource_exhausted_once_on_another_healthy_replica():
    async def main():
        engines = [await EngineService(EngineConfig(server=ServerConfig(name="engine", port=0), replica_id=f"e{i}",
                                                    time_scale=0.5, max_requests=1 if i == 0 else 64)).start()
                   for i in range(2)]
        # one health poll at start, none after: health stays what the test sets, whatever the load
        service = await serve(dispatcher_config(_Fleet(engines), poll_interval=3600, poll_timeout=2.0))
        # the key is planned on e0 only, so the first pick is e0
        service.router.set_plan(hand_plan(3, ("e0", "e1"), {"sys": (0,)}), flat=False, source="test")
        out = {}
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            text = " ".join(f"w{i}" for i in range(200))
            async with grpc.aio.insecure_channel(engines[0].address) as ech:
                busy = engine_pb2_grpc.EngineStub(ech).Generate(
                    engine_pb2.GenerateRequest(prompt=text, max_tokens=5000), timeout=30)
                await busy.read()           # e0 now holds its one request
                async with grpc.aio.insecure_channel(service.address) as ch:
                    stub = dispatcher_pb2_grpc.DispatcherStub(ch)
                    req = engine_pb2.GenerateRequest(prompt=text, max_tokens=2, key="sys")
                    try:
                        chunks = [c async for c in stub.Generate(req, timeout=10)]
                        out["result"] = ("OK", chunks[0].replica_id, chunks[0].route.replica_id, len(chunks))
                    except grpc.aio.AioRpcError as err:
                        out["result"] = (err.code().name, err.details())
                    out["healthy"] = list(service.router.state.healthy)
                    # with e1 down too, the caller gets e0's own answer
                    service.router.set_healthy(1, False)
                    try:
                        _ = [c async for c in stub.Generate(req, timeout=10)]
                        out["alone"] = ("OK", "")
                    except grpc.aio.AioRpcError as err:
                        out["alone"] = (err.code().name, err.details())
                busy.cancel()
        finally:
            await service.stop(0)
            for e in engines:
                await e.stop(0)
        return out

    out = asyncio.run(main())
    assert out["result"] == ("OK", "e1", "e1", 2), out["result"]
    assert out["healthy"] == [True, True]        # a full replica is not marked down
    code, detail = out["alone"]
    assert code == "RESOURCE_EXHAUSTED" and detail.startswith("replica e0:") and "\n" not in detail


def test_operator_reasons_are_capped_and_status_stays_readable(redis_url):
    async def main():
        service = await PlannerService(planner_config(redis_url)).start()
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = planner_pb2_grpc.PlannerStub(ch)
                out = {}
                for name, call in (
                        ("mode", lambda r: stub.SetMode(pb.SetModeRequest(mode=2, reason=r), metadata=AUTH, timeout=5)),
                        ("activate", lambda r: stub.ActivatePlan(pb.ActivatePlanRequest(version=1, reason=r),
                                                                 metadata=AUTH, timeout=5)),
                        ("rollback", lambda r: stub.Rollback(pb.RollbackRequest(reason=r), metadata=AUTH, timeout=5))):
                    try:
                        await call("r" * 600)
                        out[name] = "OK"
                    except grpc.aio.AioRpcError as err:
                        out[name] = (err.code().name, err.details())
                out["ok"] = (await stub.SetMode(pb.SetModeRequest(mode=2, reason="é" * 256), metadata=AUTH,
                                                timeout=5)).mode
                out["status"] = await stub.GetStatus(pb.GetPlannerStatusRequest(), timeout=5)
                return out
        finally:
            await service.stop(0)

    out = asyncio.run(main())
    for name in ("mode", "activate", "rollback"):
        assert out[name] == ("INVALID_ARGUMENT", "reason is 600 bytes (max 512)"), name
    assert out["ok"] == 2 and out["status"].mode_reason == "é" * 256


def test_every_control_call_is_audited_with_the_caller_address_never_the_token(redis_url, caplog):
    caplog.set_level(logging.INFO, logger="cacheroute.audit")

    async def main():
        service = await PlannerService(planner_config(redis_url)).start()
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = planner_pb2_grpc.PlannerStub(ch)
                for metadata in (None, [("authorization", "Bearer wrong")], AUTH):
                    try:
                        await stub.SetMode(pb.SetModeRequest(mode=2, reason="drill"), metadata=metadata, timeout=5)
                    except grpc.aio.AioRpcError:
                        pass
                try:
                    await stub.ActivatePlan(pb.ActivatePlanRequest(version=42, expected_active_version=0),
                                            metadata=AUTH, timeout=5)
                except grpc.aio.AioRpcError:
                    pass
                await stub.GetStatus(pb.GetPlannerStatusRequest(), timeout=5)     # a read: not audited
        finally:
            await service.stop(0)

    asyncio.run(main())
    records = [r for r in caplog.records if r.name == "cacheroute.audit"]
    rows = [(r.fields["method"], r.fields["code"], r.fields["credential"], r.fields["allowed"]) for r in records]
    assert rows == [("SetMode", "UNAUTHENTICATED", "missing", False), ("SetMode", "PERMISSION_DENIED", "invalid", False),
                    ("SetMode", "OK", "valid", True), ("ActivatePlan", "NOT_FOUND", "valid", True)]
    assert all(r.fields["peer"].startswith("ipv4:127.0.0.1:") for r in records)
    assert records[2].fields["reason"] == "drill" and records[3].fields["version"] == 42
    assert not any(TOKEN in r.getMessage() or TOKEN in str(r.fields) or "wrong" in str(r.fields) for r in records)
