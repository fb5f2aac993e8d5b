"""The engine replica service: real gRPC server on 127.0.0.1:0 driving the engine model."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cacheroute.v1 import engine_pb2, engine_pb2_grpc
from services.core.engine import PROFILES
from services.core.routing import prompt_hashes, tokenize
from services.engine.__main__ import parse_args
from services.engine.service import EngineConfig, serve
from services.engine.servicer import Limits
from services.rpc import ServerConfig

PROFILE = PROFILES["llama3-8b-h100"]


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def engine_config(**kw) -> EngineConfig:
    base = dict(server=ServerConfig(name="engine", port=0), replica_id="e1", time_scale=0.02,
                limits=Limits(max_prompt_tokens=20_000, max_output_tokens=512))
    base.update(kw)
    return EngineConfig(**base)


async def collect(stub, request) -> list[engine_pb2.GenerateChunk]:
    return [c async for c in stub.Generate(request, timeout=10)]


def run_engine(scenario, **kw):
    async def main():
        service = await serve(engine_config(**kw))
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                return await scenario(engine_pb2_grpc.EngineStub(ch), service)
        finally:
            await service.stop(0)
    return asyncio.run(main())


def test_streams_tokens_with_model_ttft_and_a_prefix_hit_on_the_second_request():
    shared = words(2000)

    async def scenario(stub, service):
        first = await collect(stub, engine_pb2.GenerateRequest(prompt=shared + " " + words(48, "a"), max_tokens=5))
        second = await collect(stub, engine_pb2.GenerateRequest(prompt=shared + " " + words(48, "b"), max_tokens=3))
        stats = await stub.GetStats(engine_pb2.GetStatsRequest(), timeout=2)
        return first, second, stats

    first, second, stats = run_engine(scenario)
    assert [c.index for c in first] == [0, 1, 2, 3, 4]
    assert first[0].first and not any(c.first for c in first[1:])
    assert first[-1].finished and first[-1].finish_reason == "length"
    assert not any(c.finished for c in first[:-1])
    assert first[0].prompt_tokens == 2048 and first[0].cached_tokens == 0 and first[0].replica_id == "e1"
    # idle replica: TTFT is exactly the one prefill step, in model seconds
    assert first[0].ttft_seconds == pytest.approx(PROFILE.prefill_time(2048), rel=1e-9)
    assert second[0].cached_tokens == 2000     # the shared 125 full blocks
    assert second[0].ttft_seconds == pytest.approx(PROFILE.prefill_time(48, 2000), rel=1e-9)
    assert second[0].ttft_seconds < first[0].ttft_seconds / 2
    assert len(second) == 3 and second[-1].finished
    assert (stats.requests, stats.prompt_tokens, stats.cached_tokens) == (2, 4096, 2000)
    assert stats.replica_id == "e1" and stats.profile == "llama3-8b-h100" and stats.running == 0


def test_block_prompts_hit_like_text_prompts():
    hashes = prompt_hashes(tokenize(words(320)))   # 20 full blocks

    async def scenario(stub, service):
        a = await collect(stub, engine_pb2.GenerateRequest(
            blocks=engine_pb2.PromptBlocks(block_hashes=hashes, prompt_tokens=400), max_tokens=1))
        b = await collect(stub, engine_pb2.GenerateRequest(prompt=words(330), max_tokens=1))
        return a, b

    a, b = run_engine(scenario)
    assert len(a) == 1 and a[0].first and a[0].finished and a[0].cached_tokens == 0
    assert a[0].prompt_tokens == 400
    assert b[0].cached_tokens == 320


def test_concurrent_requests_queue_behind_each_other():
    async def scenario(stub, service):
        reqs = [engine_pb2.GenerateRequest(prompt=words(6000, f"r{i}"), max_tokens=2) for i in range(3)]
        return await asyncio.gather(*(collect(stub, r) for r in reqs))

    results = run_engine(scenario, time_scale=1.0)   # steps long enough that all three arrive during the first
    ttfts = sorted(r[0].ttft_seconds for r in results)
    # 18,000 prefill tokens at an 8,192 budget need three steps: the last one waits for the others
    assert ttfts[-1] > PROFILE.prefill_time(6000) * 1.5
    assert all(len(r) == 2 and r[-1].finished for r in results)


def test_cancelling_a_stream_removes_the_request_from_the_model():
    async def scenario(stub, service):
        call = stub.Generate(engine_pb2.GenerateRequest(prompt=words(100), max_tokens=500), timeout=10)
        first = await call.read()
        running_before = service.model.running
        call.cancel()
        for _ in range(200):
            if service.model.running == 0 and service.runner.in_flight == 0:
                break
            await asyncio.sleep(0.01)
        return first, running_before, service.model.running, service.runner.in_flight

    first, before, after, in_flight = run_engine(scenario)
    assert first.first and before == 1
    assert after == 0 and in_flight == 0


@pytest.mark.parametrize("request_kwargs,message", [
    (dict(prompt="hello", max_tokens=0), "max_tokens"),
    (dict(prompt="hello", max_tokens=513), "max_tokens"),
    (dict(prompt="   ", max_tokens=1), "empty prompt"),
    (dict(max_tokens=1), "no prompt"),
    (dict(prompt=words(20_001), max_tokens=1), "exceeds"),
    (dict(blocks=engine_pb2.PromptBlocks(block_hashes=[1, 2, 3], prompt_tokens=20), max_tokens=1), "block hashes"),
])
def test_bad_requests_are_invalid_argument(request_kwargs, message):
    async def scenario(stub, service):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stub, engine_pb2.GenerateRequest(**request_kwargs))
        return err.value

    err = run_engine(scenario)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.details()


def test_prompt_larger_than_the_kv_pool_is_invalid_argument():
    async def scenario(stub, service):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stub, engine_pb2.GenerateRequest(prompt=words(100), max_tokens=20))
        ok = await collect(stub, engine_pb2.GenerateRequest(prompt=words(10), max_tokens=2))
        return err.value, ok

    err, ok = run_engine(scenario, kv_blocks=4)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "KV pool" in err.details()
    assert len(ok) == 2   # the driver survived


def test_flags_and_env_defaults(monkeypatch):
    monkeypatch.setenv("CACHEROUTE_TIME_SCALE", "0.5")
    cfg = parse_args(["--replica-id", "r7", "--profile", "llama3-70b-fp8-h100x2", "--port", "0"])
    assert (cfg.replica_id, cfg.profile, cfg.time_scale, cfg.server.port) == ("r7", "llama3-70b-fp8-h100x2", 0.5, 0)
    with pytest.raises(SystemExit):
        parse_args(["--profile", "nope"])
