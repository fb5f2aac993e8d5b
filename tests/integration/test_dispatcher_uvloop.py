"""The dispatcher on uvloop (its default event loop, services.rpc.loops.use_uvloop; issue 22):
grpc.aio serves Route and Generate and calls the gRPC engine, and aiohttp serves the OpenAI API
and relays HTTP engines' streams, on one uvloop loop. In process (the loop's type checked) and
as a real `python -m services.dispatcher` process, whose memory maps show which loop it runs:
uvloop's extension is loaded with `--uvloop 1` (the default) and never imported with `--uvloop 0`."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import aiohttp
import grpc
import pytest
import uvloop

from cacheroute.v1 import dispatcher_pb2, dispatcher_pb2_grpc, engine_pb2
from services.dispatcher.__main__ import parse_args
from services.dispatcher.http import HttpConfig
from services.dispatcher.service import DispatcherConfig, serve
from services.model import parse_replicas
from services.rpc import ServerConfig
from services.rpc.loops import use_uvloop
from tests.faults.fake_engine import FakeEngine
from tests.faults.procs import Procs
from tests.integration.test_dispatcher import wait_until

pytestmark = [pytest.mark.timeout(90)]


def _chat(stream: bool) -> dict:
    return {"model": "m", "max_tokens": 4, "stream": stream,
            "messages": [{"role": "system", "content": " ".join(f"w{i}" for i in range(300))},
                         {"role": "user", "content": "hi"}]}


def test_grpc_aio_and_the_http_api_serve_on_uvloop():
    async def main():
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        engines = [await FakeEngine("stream", events=5).start() for _ in range(2)]
        replicas = ",".join(f"e{i}=vllm+{e.url}" for i, e in enumerate(engines))
        service = await serve(DispatcherConfig(server=ServerConfig(name="dispatcher", port=0),
                                               replicas=parse_replicas(replicas), poll_interval=0.1, seed=1,
                                               http=HttpConfig(port=0)))
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=10)
            async with grpc.aio.insecure_channel(service.address) as channel:
                stub = dispatcher_pb2_grpc.DispatcherStub(channel)
                routed = await stub.Route(dispatcher_pb2.RouteRequest(key="k1"), timeout=5)
                assert routed.replica_id in ("e0", "e1")
                chunks = [c async for c in stub.Generate(engine_pb2.GenerateRequest(prompt="a b c", max_tokens=3),
                                                         timeout=10)]
                assert chunks and chunks[-1].finished
            async with aiohttp.ClientSession() as session:
                async with session.post(service.http.url + "/v1/chat/completions", json=_chat(True)) as resp:
                    body = await resp.read()
                    assert resp.status == 200 and resp.headers["x-cacheroute-replica"] in ("e0", "e1")
                assert body.count(b"data: ") == 6 and body.endswith(b"data: [DONE]\n\n")   # 5 events + [DONE]
                assert b'"choices":[]' not in body                 # the usage chunk the dispatcher asked for
                for e in engines:
                    e.mode = "ok"
                async with session.post(service.http.url + "/v1/chat/completions", json=_chat(False)) as resp:
                    assert resp.status == 200 and (await resp.json())["usage"]["prompt_tokens"] == 5
            assert sum(service.usage.requests) == 3 and service.router.outstanding == [0, 0]   # Generate + 2
        finally:
            await service.stop()
            for e in engines:
                await e.stop()

    assert use_uvloop(True)
    try:
        asyncio.run(main())
    finally:
        use_uvloop(False)
    assert not isinstance(asyncio.new_event_loop(), uvloop.Loop)


def _maps_uvloop(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as fh:
        return "uvloop/loop" in fh.read()


@pytest.mark.parametrize("flag,expect", [(None, True), ("0", False)])
def test_a_dispatcher_process_runs_on_uvloop_unless_told_not_to(tmp_path, flag, expect):
    procs = Procs(tmp_path / "logs")
    try:
        engine = procs.start("engine", "engine-1", ["--replica-id", "engine-1", "--time-scale", "0.01"])
        extra = [] if flag is None else ["--uvloop", flag]
        d = procs.start("dispatcher", "d1", ["--replicas", f"engine-1={engine.address}", "--poll-interval", "0.1",
                                             *extra], timeout=60)
        assert _maps_uvloop(d.pid) is expect
        with grpc.insecure_channel(d.address) as ch:      # gRPC Route, and the engine polled over gRPC
            stub = dispatcher_pb2_grpc.DispatcherStub(ch)
            assert stub.Route(dispatcher_pb2.RouteRequest(key="k"), timeout=5).replica_id == "engine-1"
        http = next(json.loads(line)["url"] for line in d.log_text().splitlines() if '"http serving"' in line)
        request = urllib.request.Request(http + "/v1/chat/completions", data=json.dumps(_chat(False)).encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=20) as resp:   # translated to the engine's Generate
            assert resp.status == 200 and json.loads(resp.read())["choices"][0]["message"]["content"]
    finally:
        procs.cleanup()


def test_the_uvloop_flag_and_its_env():
    assert parse_args(["--replicas", "a=127.0.0.1:1"]).uvloop is True
    assert parse_args(["--replicas", "a=127.0.0.1:1", "--uvloop", "0"]).uvloop is False
