"""Credentials to engines (issue 21 item 1): per-backend API keys (flag, env, file with one key
per engine URL), optional forwarding of the client's Authorization, never logged. Engines:
tests/faults/fake_engine.py requiring a key (401 otherwise, as vLLM's --api-key does)."""

from __future__ import annotations

import asyncio
import io
import logging

import aiohttp
import grpc
import pytest

from cacheroute.v1 import dispatcher_pb2_grpc, engine_pb2
from services.auth import KeyRing, engine_keys
from services.dispatcher.__main__ import parse_args
from services.dispatcher.http import HttpConfig
from services.dispatcher.service import DispatcherConfig, serve
from services.model import parse_replicas
from services.rpc import ServerConfig
from services.rpc.logs import JsonFormatter
from tests.faults.fake_engine import FakeEngine
from tests.integration.test_dispatcher import wait_until

pytestmark = [pytest.mark.timeout(60)]
KEYS = ("sk-zero-0f9e8d7c6b5a", "sk-one-1a2b3c4d5e6f", "sk-default-77aa88bb")


class _Captured:
    """Every log record at DEBUG, formatted as the services format them (JSON lines)."""

    def __enter__(self) -> io.StringIO:
        self.text = io.StringIO()
        self.handler = logging.StreamHandler(self.text)
        self.handler.setFormatter(JsonFormatter("dispatcher"))
        root = logging.getLogger()
        self.level = root.level
        root.setLevel(logging.DEBUG)          # setLevel, not .level =: it clears the loggers' level caches
        root.addHandler(self.handler)
        return self.text

    def __exit__(self, *exc) -> None:
        root = logging.getLogger()
        root.removeHandler(self.handler)
        root.setLevel(self.level)


async def _chat(session: aiohttp.ClientSession, url: str, key: str, **headers) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with session.post(url + "/v1/chat/completions", json=body,
                            headers={"x-cacheroute-key": key, **headers}) as resp:
        await resp.read()
        return resp.status


def test_each_engine_gets_its_own_key_over_both_front_doors_and_no_key_is_logged(tmp_path):
    async def main(log: io.StringIO):
        engines = [await FakeEngine("ok").start() for _ in range(3)]
        for engine, key in zip(engines, KEYS):
            engine.api_key = key
        keys_file = tmp_path / "engine-keys"
        keys_file.write_text(f"# one key per engine URL\n{engines[0].url} {KEYS[0]}\n{engines[1].url}/ {KEYS[1]}\n")
        keys = engine_keys(KEYS[2], str(keys_file))           # the flag's key: every engine not in the file
        replicas = ",".join(f"e{i}=vllm+{e.url}" for i, e in enumerate(engines))
        config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0), replicas=parse_replicas(replicas),
                                  poll_interval=0.1, poll_timeout=0.5, seed=2, http=HttpConfig(port=0),
                                  engine_keys=keys)
        service = await serve(config)
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            async with aiohttp.ClientSession() as session:
                statuses = [await _chat(session, service.http_url, f"k{n}") for n in range(30)]
            assert statuses == [200] * 30 and all(e.served for e in engines)
            assert [e.last_auth for e in engines] == [f"Bearer {k}" for k in KEYS]
            async with grpc.aio.insecure_channel(service.address) as channel:
                stub = dispatcher_pb2_grpc.DispatcherStub(channel)
                for engine in engines:
                    engine.mode = "stream"
                chunks = [c async for c in stub.Generate(engine_pb2.GenerateRequest(prompt="p", max_tokens=2),
                                                         timeout=10)]
            assert chunks[-1].finished
            i = service.router.ids.index(chunks[0].route.replica_id)
            assert engines[i].last_auth == f"Bearer {KEYS[i]}"
            shown = repr(config) + repr(service.monitor.backends) + repr(keys)
        finally:
            await service.stop()
            for engine in engines:
                await engine.stop()
        return shown

    with _Captured() as log:
        shown = asyncio.run(main(log))
    assert log.getvalue() and not any(k in log.getvalue() or k in shown for k in KEYS)


def test_without_a_key_the_engines_401_passes_through_and_a_wrong_key_is_never_logged():
    async def main():
        engine = await FakeEngine("ok").start()
        engine.api_key = KEYS[0]
        config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0),
                                  replicas=parse_replicas(f"e0=vllm+{engine.url}"), poll_interval=0.1,
                                  poll_timeout=0.5, seed=2, http=HttpConfig(port=0),
                                  engine_keys=engine_keys(KEYS[1]))
        service = await serve(config)
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            async with aiohttp.ClientSession() as session:
                assert await _chat(session, service.http_url, "k") == 401       # the engine's answer, unchanged
            assert engine.last_auth == f"Bearer {KEYS[1]}" and all(service.router.state.healthy)
        finally:
            await service.stop()
            await engine.stop()

    with _Captured() as log:
        asyncio.run(main())
    assert KEYS[1] not in log.getvalue()


def test_forward_client_auth_sends_the_clients_own_authorization():
    async def main():
        engine = await FakeEngine("ok").start()
        engine.api_key = "client-key-123456"
        config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0),
                                  replicas=parse_replicas(f"e0=vllm+{engine.url}"), poll_interval=0.1,
                                  poll_timeout=0.5, seed=2, http=HttpConfig(port=0, forward_client_auth=True),
                                  keyring=KeyRing({"client-key-123456": "acme"}))
        service = await serve(config)
        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            async with aiohttp.ClientSession() as session:
                status = await _chat(session, service.http_url, "k", Authorization="Bearer client-key-123456")
            assert status == 200 and engine.last_auth == "Bearer client-key-123456"
        finally:
            await service.stop()
            await engine.stop()

    asyncio.run(main())


def test_the_flags_and_env_build_engine_keys_that_do_not_show(tmp_path, monkeypatch):
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"http://10.0.0.5:8000 {KEYS[0]}\n")
    monkeypatch.setenv("CACHEROUTE_ENGINE_API_KEY", KEYS[2])
    config = parse_args(["--replicas", "e0=vllm+http://10.0.0.5:8000,e1=vllm+http://10.0.0.6:8000",
                         "--engine-api-keys-file", str(keys_file), "--forward-client-auth"])
    assert config.engine_keys.for_url("http://10.0.0.5:8000") == KEYS[0]
    assert config.engine_keys.for_url("http://10.0.0.6:8000/") == KEYS[2]
    assert config.http.forward_client_auth and not any(k in repr(config) for k in KEYS)
    keys_file.write_text("http://10.0.0.5:8000 a b\n")
    with pytest.raises(SystemExit):
        parse_args(["--replicas", "e0=vllm+http://10.0.0.5:8000", "--engine-api-keys-file", str(keys_file)])
