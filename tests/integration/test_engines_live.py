"""Engines that come and go on a running stack: real engines (EngineFleet), real Redis, a real
planner and a real dispatcher following its plans and its engine set, under bounded Generate
traffic. Add two engines: they take keys in the plan and requests in the dispatcher. Drain one:
only its keys move, at once; the dispatcher stops sending it requests; no request fails. Remove
it: its slot is retired. Then: DNS discovery (the real resolver on "localhost") adds an engine,
and the CLI lists the set."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from cacheroute.v1 import dispatcher_pb2_grpc, engine_pb2, planner_pb2 as pb, planner_pb2_grpc
from services.dispatcher.service import serve as serve_dispatcher
from services.engine.fleet import EngineFleet
from services.model import parse_replicas
from services.planner.control import LoopConfig
from services.planner.engines import Discovery, parse_discovery, resolve
from services.planner.service import PlannerConfig, PlannerService
from services.rpc import ServerConfig
from tests.integration.test_dispatcher import dispatcher_config, wait_until
from tests.integration.test_repair_live import RATES, TELEMETRY, keys_on, members, next_loop, record_rates

ROOT = Path(__file__).resolve().parents[2]


def planner_config(redis_url: str, addresses: dict[str, str], **kw) -> PlannerConfig:
    loop = LoopConfig(replica_ids=tuple(addresses), q_cap=10.0, warm_slots=8, interval=3600, window_seconds=10,
                      planner_id=kw.pop("planner_id", "engines-test"), max_moves=None)
    return PlannerConfig(server=ServerConfig(name="planner", port=0), loop=loop, redis_url=redis_url,
                         telemetry=TELEMETRY, auto=True, watch_poll_seconds=0.2, replica_addresses=addresses,
                         health_interval=0.2, health_timeout=0.2, repair_grace=1.0, **kw)


class Traffic:
    """Generate calls through the dispatcher, one every `gap` seconds over RATES' keys, at most
    `limit` in all; every failure is kept."""

    def __init__(self, address: str, gap: float = 0.02, limit: int = 3000) -> None:
        self.address, self.gap, self.limit = address, gap, limit
        self.served: dict[str, int] = {}
        self.failures: list[str] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        keys = list(RATES)
        async with grpc.aio.insecure_channel(self.address) as ch:
            stub = dispatcher_pb2_grpc.DispatcherStub(ch)
            n = 0
            while not self._stop.is_set() and n < self.limit:
                key = keys[n % len(keys)]
                n += 1
                try:
                    chunks = [c async for c in stub.Generate(engine_pb2.GenerateRequest(
                        prompt=f"prompt of {key}", max_tokens=2, key=key), timeout=10)]
                    rid = chunks[0].replica_id
                    self.served[rid] = self.served.get(rid, 0) + 1
                except grpc.aio.AioRpcError as err:
                    self.failures.append(f"{key}: {err.code().name} {err.details()}")
                await asyncio.sleep(self.gap)

    def stop(self) -> None:
        self._stop.set()


def test_added_engines_take_keys_and_a_drained_one_gives_them_up_with_no_failed_request(redis_url):
    async def main():
        fleet = await EngineFleet(4, time_scale=0.01).start()
        first = {rid: fleet.address(i) for i, rid in enumerate(fleet.ids[:2])}
        planner = await PlannerService(planner_config(redis_url, first)).start()
        dispatcher = await serve_dispatcher(dispatcher_config(
            fleet, planner=planner.address, replicas=parse_replicas(",".join(f"{r}={a}" for r, a in first.items()))))
        store, out = planner.store, {}
        traffic = Traffic(dispatcher.address)
        task = None
        try:
            await wait_until(lambda: planner.loop.leader, timeout=5)
            async with grpc.aio.insecure_channel(planner.address) as ch:
                stub = planner_pb2_grpc.PlannerStub(ch)
                out["initial"] = await stub.ListEngines(pb.ListEnginesRequest(), timeout=5)
                rates = [pb.KeyRate(key=k, rate=r, prefix_tokens=900) for k, r in RATES.items()]
                built = await stub.BuildPlan(pb.BuildPlanRequest(rates=rates, activate=True), timeout=5)
                await wait_until(lambda: dispatcher.router.plan_version == built.plan.version, timeout=3)
                task = asyncio.create_task(traffic.run())
                await asyncio.sleep(0.5)

                # ---- add two engines: the set grows, the next re-plans place keys there
                for i in (2, 3):
                    out[f"add{i}"] = await stub.AddEngine(pb.AddEngineRequest(address=fleet.address(i)), timeout=5)
                try:
                    await stub.AddEngine(pb.AddEngineRequest(address=fleet.address(2)), timeout=5)
                except grpc.aio.AioRpcError as err:
                    out["again"] = err.code()
                await wait_until(lambda: set(dispatcher.router.ids) == {"e0", "e1", "e2", "e3"}, timeout=3)
                for _ in range(4):
                    await record_rates(store, time.time())
                    await next_loop(planner)
                    _, active = await store.get_active_plan()
                    if keys_on(active, "e2") and keys_on(active, "e3"):
                        break
                out["grown"] = active
                await wait_until(lambda: dispatcher.router.plan_version == active.version, timeout=3)
                await wait_until(lambda: traffic.served.get("e2", 0) > 0 and traffic.served.get("e3", 0) > 0,
                                 timeout=5)

                # ---- drain e2: only its keys move, now; the dispatcher stops sending it requests
                out["drain"] = await stub.DrainEngine(pb.DrainEngineRequest(engine="e2"), timeout=5)
                _, out["drained"] = await store.get_active_plan()
                slot = dispatcher.router.index_of("e2")
                await wait_until(lambda: slot in dispatcher.monitor.closed, timeout=3)
                served = traffic.served.get("e2", 0)
                await asyncio.sleep(1.0)
                out["after_drain"] = traffic.served.get("e2", 0) - served
                out["listed"] = await stub.ListEngines(pb.ListEnginesRequest(planned_keys=True), timeout=5)
                try:
                    await stub.RemoveEngine(pb.RemoveEngineRequest(engine="e3"), timeout=5)
                except grpc.aio.AioRpcError as err:
                    out["remove_active"] = err.code()
                out["remove"] = await stub.RemoveEngine(pb.RemoveEngineRequest(engine="e2"), timeout=5)
                await wait_until(lambda: slot in dispatcher.monitor.retired, timeout=3)
                await asyncio.sleep(0.3)
        finally:
            traffic.stop()
            if task is not None:
                await task
            await dispatcher.stop(0)
            await planner.stop(0)
            await fleet.stop()
        out["traffic"] = traffic
        return out

    out = asyncio.run(main())
    traffic, grown, drained = out["traffic"], out["grown"], out["drained"]
    print(f"served per engine {traffic.served}, failures {len(traffic.failures)}; keys on e2 before the drain "
          f"{len(keys_on(grown, 'e2'))}, drain outcome {out['drain'].outcome!r}")
    assert [(e.slot, e.id, e.state, e.source) for e in out["initial"].engines] == [
        (0, "e0", "active", "config"), (1, "e1", "active", "config")]
    assert out["add2"].engine.id == "e2" and out["add3"].engine.slot == 3
    assert out["again"] == grpc.StatusCode.ALREADY_EXISTS
    assert keys_on(grown, "e2") and keys_on(grown, "e3") and set(grown.replica_ids) == {"e0", "e1", "e2", "e3"}
    # the drain's plan: e2 gone, only e2's keys moved
    assert drained.builder == "drain" and drained.parent_version == grown.version and "e2" not in drained.replica_ids
    for key in grown.table:
        if key in keys_on(grown, "e2"):
            assert "e2" not in members(drained, key) and members(drained, key)
        else:
            assert members(drained, key) == members(grown, key), key
    assert out["drain"].engine.state == "draining" and "moved off e2" in out["drain"].outcome
    listed = {e.id: e for e in out["listed"].engines}
    assert listed["e2"].planned_keys == 0 and listed["e3"].planned_keys > 0 and all(e.healthy for e in listed.values())
    assert out["after_drain"] == 0                   # nothing new went to the drained engine
    assert out["remove_active"] == grpc.StatusCode.FAILED_PRECONDITION
    assert out["remove"].engine.state == "removed"
    assert traffic.failures == [] and sum(traffic.served.values()) > 50


def test_discovery_follows_a_dns_name_and_the_cli_lists_the_set(redis_url):
    """The real resolver on "localhost": its loopback address becomes an engine of source
    dns:localhost:PORT; an empty answer (a failed lookup) changes nothing."""
    assert parse_discovery("vllm+http://engines.ns.svc:8000").template == "vllm+http://{host}:8000"
    with pytest.raises(ValueError):
        parse_discovery("engines.ns.svc")

    async def main():
        fleet = await EngineFleet(2, time_scale=0.01).start()
        port = int(fleet.address(1).rsplit(":", 1)[1])
        out = {"hosts": await resolve("localhost", port), "none": await resolve("no-such-host.invalid", port)}
        planner = await PlannerService(planner_config(
            redis_url, {"e0": fleet.address(0)},
            discovery=parse_discovery(f"localhost:{port}", 0.2))).start()
        try:
            await wait_until(lambda: planner.loop.leader, timeout=5)
            await wait_until(lambda: len(planner.engines.current.engines) == 1 + len(out["hosts"]), timeout=5)
            out["set"] = planner.engines.current
            none = await planner.engine_control.discover_once(
                Discovery("no-such-host.invalid", port, "{host}:" + str(port)), planner.loop.status().token)
            out["after_failed_lookup"] = (none, planner.engines.current.version)
            env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'protos'}"}
            cli = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "clients.cli", "engines", "list",
                                                           "--keys", "--planner", planner.address],
                                          capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
            out["cli"] = cli
            bad = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "clients.cli", "engines", "drain",
                                                           "nope", "--planner", planner.address],
                                          capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
            out["bad"] = bad
        finally:
            await planner.stop(0)
            await fleet.stop()
        return out

    out = asyncio.run(main())
    assert "127.0.0.1" in out["hosts"] and out["none"] == []
    found = {e.address: e for e in out["set"].engines[1:]}
    assert len(found) == len(out["hosts"])
    loopback = next(e for a, e in found.items() if a.startswith("127.0.0.1:"))
    assert loopback.source.startswith("dns:localhost:") and loopback.state == "active"
    assert out["after_failed_lookup"] == (None, out["set"].version)
    assert out["cli"].returncode == 0, out["cli"].stderr
    listed = json.loads(out["cli"].stdout)
    assert [e["id"] for e in listed["engines"]][:2] == ["e0", "e1"] and listed["version"] == out["set"].version
    assert out["bad"].returncode == 2 and out["bad"].stderr.strip() == "cacheroute: error: NOT_FOUND: no engine 'nope'"


def test_bad_engine_requests_get_clear_statuses(redis_url):
    async def main():
        planner = await PlannerService(planner_config(redis_url, {"e0": "127.0.0.1:1"})).start()
        out = {}
        try:
            async with grpc.aio.insecure_channel(planner.address) as ch:
                stub = planner_pb2_grpc.PlannerStub(ch)
                calls = {"url for a grpc engine": stub.AddEngine(pb.AddEngineRequest(address="http://x:1"), timeout=5),
                         "no address": stub.AddEngine(pb.AddEngineRequest(address=""), timeout=5),
                         "bad id": stub.AddEngine(pb.AddEngineRequest(address="127.0.0.1:2", id="a b"), timeout=5),
                         "no engine": stub.DrainEngine(pb.DrainEngineRequest(engine=" "), timeout=5),
                         "last active": stub.DrainEngine(pb.DrainEngineRequest(engine="e0"), timeout=5),
                         "unknown": stub.RemoveEngine(pb.RemoveEngineRequest(engine="zz"), timeout=5)}
                for name, call in calls.items():
                    try:
                        await call
                        out[name] = "OK"
                    except grpc.aio.AioRpcError as err:
                        out[name] = err.code().name
                out["version"] = (await stub.ListEngines(pb.ListEnginesRequest(), timeout=5)).version
        finally:
            await planner.stop(0)
        return out

    out = asyncio.run(main())
    assert out == {"url for a grpc engine": "INVALID_ARGUMENT", "no address": "INVALID_ARGUMENT",
                   "bad id": "INVALID_ARGUMENT", "no engine": "INVALID_ARGUMENT", "last active": "FAILED_PRECONDITION",
                   "unknown": "NOT_FOUND", "version": 1}


def test_list_engines_long_poll_is_held_until_the_set_changes_or_the_wait_passes(redis_url):
    """ListEngines with `wait_seconds` (the dispatcher's EngineFeed long poll): a caller holding the
    current version waits; an AddEngine answers it at once with the new set; with no change it gets
    `unchanged` after the wait; a stale version or no wait is answered at once."""
    async def main():
        planner = await PlannerService(planner_config(redis_url, {"e0": "127.0.0.1:1"})).start()
        out = {}
        try:
            async with grpc.aio.insecure_channel(planner.address) as ch:
                stub = planner_pb2_grpc.PlannerStub(ch)
                v = (await stub.ListEngines(pb.ListEnginesRequest(), timeout=5)).version
                t0 = time.monotonic()
                quiet = await stub.ListEngines(pb.ListEnginesRequest(known_version=v, wait_seconds=0.6), timeout=5)
                out["quiet"] = (quiet.unchanged, time.monotonic() - t0)
                t0 = time.monotonic()
                held = asyncio.ensure_future(stub.ListEngines(pb.ListEnginesRequest(known_version=v, wait_seconds=20),
                                                              timeout=25))
                await asyncio.sleep(0.3)
                out["pending"] = not held.done()
                await stub.AddEngine(pb.AddEngineRequest(address="127.0.0.1:2"), timeout=5)
                changed = await held
                out["changed"] = (changed.unchanged, changed.version > v, len(changed.engines), time.monotonic() - t0)
                t0 = time.monotonic()
                stale = await stub.ListEngines(pb.ListEnginesRequest(known_version=v, wait_seconds=20), timeout=5)
                out["stale"] = (stale.unchanged, time.monotonic() - t0)
                held = asyncio.ensure_future(stub.ListEngines(
                    pb.ListEnginesRequest(known_version=changed.version, wait_seconds=20), timeout=25))
                await asyncio.sleep(0.3)
                t0 = time.monotonic()
                await planner.stop(10)           # a held poll must not keep a stopping planner for its grace
                out["stop"] = time.monotonic() - t0
                out["released"] = (await held).unchanged
                planner = None
        finally:
            if planner is not None:
                await planner.stop(0)
        return out

    out = asyncio.run(main())
    assert out["quiet"][0] is True and 0.55 <= out["quiet"][1] < 3
    assert out["pending"] is True
    unchanged, newer, n, waited = out["changed"]
    assert (unchanged, newer, n) == (False, True, 2) and waited < 3
    assert out["stale"][0] is False and out["stale"][1] < 2
    assert out["stop"] < 3 and out["released"] is True
