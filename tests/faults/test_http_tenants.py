"""Tenants against each other (issue 20): a per-tenant cap on open completions
(--max-tenant-requests) and per-tenant cache isolation on vLLM (--tenant-cache-salt)."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from services.auth import KeyRing
from services.dispatcher.http import HttpConfig
from services.dispatcher.service import DispatcherConfig, serve
from services.model import parse_replicas
from services.rpc import ServerConfig
from tests.faults.fake_engine import FakeEngine
from tests.integration.test_dispatcher import wait_until

KEYS = {"sk-a": "acme", "sk-b": "beta"}
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def _dispatcher(engine: FakeEngine, **http):
    config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0),
                              replicas=parse_replicas(f"e0=vllm+{engine.url}"), poll_interval=0.1,
                              poll_timeout=0.5, seed=2, http=HttpConfig(port=0, **http), keyring=KeyRing(KEYS))
    service = await serve(config)
    await wait_until(lambda: all(service.router.state.healthy), timeout=5)
    return service


async def _post(session, service, key: str, body=BODY) -> tuple[int, bytes]:
    async with session.post(service.http_url + "/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {key}"}) as resp:
        return resp.status, await resp.read()


def test_a_tenant_over_its_cap_gets_429_and_the_other_tenant_is_served():
    async def main():
        engine = await FakeEngine("slow", events=4, slow_seconds=0.2).start()
        service = await _dispatcher(engine, max_tenant_requests=2)
        try:
            async with aiohttp.ClientSession() as session:
                body = {**BODY, "stream": True}
                got = await asyncio.gather(*(_post(session, service, k, body) for k in ("sk-a",) * 3 + ("sk-b",)))
                statuses = [status for status, _ in got]
                assert sorted(statuses[:3]) == [200, 200, 429] and statuses[3] == 200, statuses
                error = orjson.loads(next(data for status, data in got if status == 429))["error"]
                assert error["code"] == "too_many_requests" and "\n" not in error["message"]
                assert (await _post(session, service, "sk-a", body))[0] == 200      # the cap frees with the streams
                assert service.http.front._open == {}
        finally:
            await service.stop()
            await engine.stop()

    asyncio.run(main())


def test_tenant_cache_salt_gives_each_tenant_its_own_vllm_cache_salt():
    async def main():
        engine = await FakeEngine("ok").start()
        salted, plain = await _dispatcher(engine, tenant_cache_salt=True), await _dispatcher(engine)
        try:
            async with aiohttp.ClientSession() as session:
                salts = []
                for key in ("sk-a", "sk-a", "sk-b"):
                    assert (await _post(session, salted, key))[0] == 200
                    salts.append(orjson.loads(engine.last_body).get("cache_salt"))
                assert salts[0] and salts[0] == salts[1] != salts[2] and salts[2]
                assert "acme" not in salts[0]                   # the tenant's name is not sent
                assert (await _post(session, plain, "sk-a"))[0] == 200
                assert "cache_salt" not in orjson.loads(engine.last_body)
        finally:
            for service in (salted, plain):
                await service.stop()
            await engine.stop()

    asyncio.run(main())
