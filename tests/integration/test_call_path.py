"""A request's call path (issue 25, "Done when"): front door -> dispatch -> router -> backend,
never back into a module it left. Recorded with sys.setprofile while real requests run through
an in-process dispatcher (HTTP API with an OpenAI-HTTP engine and a gRPC engine; gRPC Generate)
in front of simulated engines on 127.0.0.1: for every Python call made under the front door's
handler, the chain of project modules from the handler down to it (consecutive frames of one
module merged). A callback into the front door's module (a lambda or a budget check handed to
dispatch) shows as that module twice in one chain."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import grpc
import pytest

from cacheroute.v1 import dispatcher_pb2_grpc, engine_pb2
from services.auth import KeyRing
from services.dispatcher.budget import BudgetConfig
from services.dispatcher.http import HttpConfig
from services.dispatcher.service import DispatcherConfig, serve
from services.engine.fleet import EngineFleet
from services.model import parse_replicas
from services.rpc import ServerConfig
from tests.integration.test_dispatcher import DEAD, wait_until

ROOT = str(Path(__file__).resolve().parents[2]) + "/"
DOORS = {("services/dispatcher/http.py", "_serve"), ("services/dispatcher/servicer.py", "Generate")}


def _module(code) -> str | None:
    name = code.co_filename
    return name[len(ROOT):] if name.startswith(ROOT + "services/") else None


class Recorder:
    """The module chains (front door first) of every Python call made under a front door's handler."""

    def __init__(self) -> None:
        self.chains: set[tuple[tuple[str, str], ...]] = set()

    def __call__(self, frame, event, arg) -> None:
        if event != "call":
            return
        chain, f = [], frame
        while f is not None:
            module = _module(f.f_code)
            if module is not None:
                if chain and chain[-1][0] == module:
                    chain[-1] = (module, f.f_code.co_name)      # merged: keep the outermost frame's name
                else:
                    chain.append((module, f.f_code.co_name))
                if (module, f.f_code.co_name) in DOORS:
                    self.chains.add(tuple(reversed(chain)))
                    return
            f = f.f_back


def returns(chains) -> list[str]:
    """The chains that come back into a module they left, as `module:function -> ...` lines."""
    out = []
    for chain in chains:
        modules = [m for m, _ in chain]
        if len(set(modules)) < len(modules):
            out.append(" -> ".join(f"{m.removeprefix('services/')}:{fn}" for m, fn in chain))
    return sorted(out)


async def _traffic(service, recorder: Recorder) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello " * 40}], "max_tokens": 3}
    async with aiohttp.ClientSession() as session, grpc.aio.insecure_channel(service.address) as channel:
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)
        sys.setprofile(recorder)
        try:
            for stream in (False, True):
                async with session.post(service.http_url + "/v1/chat/completions", json={**body, "stream": stream},
                                        headers={"Authorization": "Bearer sk-a"}) as resp:
                    await resp.read()
                    assert resp.status == 200
            chunks = [c async for c in stub.Generate(engine_pb2.GenerateRequest(prompt="hello there", max_tokens=3),
                                                     metadata=(("authorization", "Bearer sk-a"),), timeout=20)]
            assert chunks
        finally:
            sys.setprofile(None)


@pytest.mark.parametrize("kind", ["vllm", "cacheroute"])
def test_a_request_never_returns_to_a_module_it_left(kind):
    async def main() -> Recorder:
        fleet = await EngineFleet(2, time_scale=0.02, http=True).start()
        config = DispatcherConfig(
            server=ServerConfig(name="dispatcher", port=0), replicas=parse_replicas(fleet.replicas_flag(kind)),
            planner=DEAD, redis_url="", poll_interval=0.1, poll_timeout=0.5, seed=3, engine_kind=kind,
            http=HttpConfig(port=0), keyring=KeyRing({"sk-a": "acme"}),
            budget=BudgetConfig(rate=100.0, burst=200.0))                 # bounded: the budget is asked
        service = await serve(config)
        recorder = Recorder()
        try:
            await wait_until(lambda: all(service.router.state.healthy))
            await _traffic(service, recorder)
        finally:
            await service.stop()
            await fleet.stop()
        return recorder

    recorder = asyncio.run(main())
    assert returns(recorder.chains) == []
    reached = {tuple(m for m, _ in chain) for chain in recorder.chains}
    for door in ("services/dispatcher/http.py", "services/dispatcher/servicer.py"):
        assert (door, "services/dispatcher/dispatch.py", "services/dispatcher/router.py") in reached
        assert any(c[:2] == (door, "services/dispatcher/dispatch.py") and c[2:3] and c[2].startswith("services/backends/")
                   for c in reached), door
