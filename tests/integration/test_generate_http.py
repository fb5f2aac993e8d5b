"""gRPC Generate through HTTP engines (issue 21 item 2): the dispatcher serves a Generate call
to a vllm/openai-kind replica as a streamed /v1/completions call, with the same retry,
ejection and accounting as its OpenAI HTTP API (services.dispatcher.dispatch). Engines: the
simulated engine's real HTTP API (services.engine.http) and tests/faults/fake_engine.py."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cacheroute.v1 import dispatcher_pb2_grpc, engine_pb2
from services.dispatcher.http import HttpConfig
from services.dispatcher.service import DispatcherConfig, serve
from services.engine.fleet import EngineFleet
from services.model import parse_replicas
from services.rpc import ServerConfig
from tests.faults.fake_engine import FakeEngine
from tests.integration.test_dispatcher import wait_until

pytestmark = [pytest.mark.timeout(60)]


def _config(replicas: str, **http) -> DispatcherConfig:
    return DispatcherConfig(server=ServerConfig(name="dispatcher", port=0), replicas=parse_replicas(replicas),
                            poll_interval=0.1, poll_timeout=0.5, seed=2, http=HttpConfig(port=-1, **http))


async def _generate(address: str, request: engine_pb2.GenerateRequest) -> tuple[list, str, str]:
    """(chunks, status code name, details) of one Generate call through the dispatcher."""
    chunks = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)
        try:
            async for chunk in stub.Generate(request, timeout=20):
                chunks.append(chunk)
        except grpc.aio.AioRpcError as err:
            return chunks, err.code().name, err.details() or ""
    return chunks, "OK", ""


def test_generate_through_the_simulated_engines_http_api():
    async def main():
        fleet = await EngineFleet(2, time_scale=0.01, http=True).start()
        replicas = ",".join(f"e{i}=vllm+{fleet.http_url(i)}" for i in range(2))
        service = await serve(_config(replicas))
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            prompt = " ".join(f"w{j}" for j in range(80))
            for _ in range(2):
                chunks, code, detail = await _generate(
                    service.address, engine_pb2.GenerateRequest(prompt=prompt, max_tokens=4, key="same"))
                assert code == "OK", detail
            first, last = chunks[0], chunks[-1]
            assert first.first and first.route.replica_id in ("e0", "e1") and first.route.plan_version == 0
            assert last.finished and last.finish_reason == "length"
            assert "".join(c.text for c in chunks).strip()
            assert last.prompt_tokens == 80 and last.cached_tokens >= 64     # the second call hit the prefix
            i = service.router.ids.index(first.route.replica_id)
            assert service.usage.requests[i] == 2 and service.usage.cached[i] >= 64    # accounted as the HTTP API does
            assert service.usage.completed[i] == 2 and service.usage.completion[i] == 8  # 4 output tokens each
            assert len(service.router.telemetry) == 2                                   # two served arrivals
            assert service.router.outstanding == [0, 0]
        finally:
            await service.stop()
            await fleet.stop()

    asyncio.run(main())


def test_generate_to_http_engines_retries_once_ejects_and_maps_errors():
    async def main():
        engines = [await FakeEngine("stream", events=3).start() for _ in range(2)]
        replicas = ",".join(f"e{i}=vllm+{e.url}" for i, e in enumerate(engines))
        service = await serve(_config(replicas, eject_after=1, eject_seconds=30))
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            chunks, code, detail = await _generate(service.address,
                                                   engine_pb2.GenerateRequest(prompt="hello there", max_tokens=3))
            assert code == "OK", detail
            assert [c.text for c in chunks[:3]] == ["x" * 64] * 3 and chunks[-1].finished
            assert (chunks[-1].prompt_tokens, chunks[-1].cached_tokens) == (5, 3)
            sent = next(e for e in engines if e.served).last_body
            assert b'"prompt":"hello there"' in sent and b'"include_usage":true' in sent and b'"model":"m"' in sent

            # the replica the key goes to answers 500: retried once on the other, which serves it
            first = chunks[0].route.replica_id
            bad, good = engines[int(first[1])], engines[1 - int(first[1])]
            bad.mode = "500"
            chunks, code, detail = await _generate(service.address,
                                                   engine_pb2.GenerateRequest(prompt="hello there", max_tokens=3))
            assert code == "OK" and chunks[0].route.replica_id != first, (code, detail)
            assert not service.router.state.healthy[int(first[1])]          # ejected (eject_after=1)
            failures = {s.labels["replica"]: s.value for m in service.dispatcher.failures.collect()
                        for s in m.samples if s.name.endswith("_total")}
            assert failures == {first: 1.0}

            # the only healthy replica fails too: its error, mapped once (502 -> UNAVAILABLE)
            good.mode = "500"
            chunks, code, detail = await _generate(service.address,
                                                   engine_pb2.GenerateRequest(prompt="again", max_tokens=3))
            assert code == "UNAVAILABLE" and "answered HTTP 500" in detail and "\n" not in detail, detail
            # a prompt given as block hashes cannot go to an HTTP engine: INVALID_ARGUMENT, no failure counted
            good.mode = "stream"
            await wait_until(lambda: service.router.state.healthy[engines.index(good)], timeout=5)
            blocks = engine_pb2.PromptBlocks(block_hashes=[1, 2, 3], prompt_tokens=48)
            chunks, code, detail = await _generate(service.address,
                                                   engine_pb2.GenerateRequest(blocks=blocks, max_tokens=3))
            assert code == "INVALID_ARGUMENT" and "text prompt" in detail, detail
            assert service.router.outstanding == [0, 0]
        finally:
            await service.stop()
            for engine in engines:
                await engine.stop()

    asyncio.run(main())
