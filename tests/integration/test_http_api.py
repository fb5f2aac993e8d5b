"""The dispatcher's OpenAI HTTP API with the official `openai` SDK (sync and async, streaming and
not) against simulated engines over their own HTTP API (kind vllm) and over gRPC (kind
cacheroute), a plan from a real Redis, all on 127.0.0.1 with ephemeral ports."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest

from services.auth import KeyRing
from services.dispatcher.service import DispatcherConfig, serve
from services.dispatcher.http import HttpConfig
from services.dispatcher.keys import request_key
from services.model import parse_replicas
from services.engine.fleet import EngineFleet
from services.http.oai import chat_text
from services.rpc import ServerConfig
from services.store import RedisStore
from tests.integration.test_dispatcher import DEAD, hand_plan, wait_until

KEYS = {"sk-acme": "acme", "sk-beta": "beta"}


def system_prompt(tenant: str) -> str:
    return f"You are the assistant of {tenant}. " + " ".join(f"{tenant}-rule-{i}" for i in range(120))


def messages(tenant: str, question: str) -> list[dict]:
    return [{"role": "system", "content": system_prompt(tenant)}, {"role": "user", "content": question}]


def tenant_key(tenant: str) -> str:
    return request_key(chat_text(messages(tenant, "x")), None, tenant=tenant)


async def start(redis_url: str, fleet: EngineFleet, kind: str, table: dict | None = None):
    store = RedisStore(redis_url)
    if table is not None:
        await store.put_plan(hand_plan(1, tuple(fleet.ids), table))
        await store.activate(1, expected=0, now=time.time())
    config = DispatcherConfig(
        server=ServerConfig(name="dispatcher", port=0), replicas=parse_replicas(fleet.replicas_flag(kind)),
        planner=DEAD, redis_url=redis_url, poll_interval=0.1, poll_timeout=0.5, plan_backoff_max=0.3, seed=3,
        engine_kind=kind, http=HttpConfig(port=0), keyring=KeyRing(KEYS))
    service = await serve(config)
    await wait_until(lambda: service.router.plan_version == (1 if table else 0) and all(service.router.state.healthy))
    return service, store


@pytest.mark.parametrize("kind", ["vllm", "cacheroute"])
def test_openai_sdk_sync_and_async_streaming_and_not(redis_url, kind):
    async def main():
        fleet = await EngineFleet(2, time_scale=0.02, http=True).start()
        table = {tenant_key("acme"): (1,), tenant_key("beta"): (0,)}
        service, store = await start(redis_url, fleet, kind, table)
        base = service.http_url + "/v1"
        try:
            def sync_calls():
                client = openai.OpenAI(base_url=base, api_key="sk-acme", max_retries=0)
                raw = client.chat.completions.with_raw_response.create(
                    model="any", messages=messages("acme", "hello"), max_tokens=4)
                first = raw.parse()
                again = client.chat.completions.with_raw_response.create(
                    model="any", messages=messages("acme", "and again"), max_tokens=4)
                pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
                    model="any", messages=messages("acme", "stream it"), max_tokens=5, stream=True) if c.choices]
                completion = client.completions.create(model="any", prompt=system_prompt("acme"), max_tokens=3)
                models = client.models.list()
                return raw.headers, first, again.headers, again.parse(), pieces, completion, models

            headers, first, headers2, second, pieces, completion, models = await asyncio.to_thread(sync_calls)
            assert headers["x-cacheroute-replica"] == "e1" and headers["x-cacheroute-reason"] == "planned"
            assert headers["x-cacheroute-plan-version"] == "1"
            assert first.choices[0].message.content.strip() and first.usage.completion_tokens == 4
            prefix = first.usage.prompt_tokens // 16 * 16
            assert headers2["x-cacheroute-replica"] == "e1"
            assert second.usage.prompt_tokens_details.cached_tokens >= prefix - 16 > 0   # the system prompt hit
            assert len(pieces) == 5 and all(p.strip() for p in pieces)
            assert completion.choices[0].text.strip() and completion.usage.completion_tokens == 3
            assert [m.id for m in models.data] == ["llama3-8b-h100"]

            client = openai.AsyncOpenAI(base_url=base, api_key="sk-beta", max_retries=0)
            chunks = [c async for c in await client.chat.completions.create(
                model="any", messages=messages("beta", "one"), max_tokens=3, stream=True,
                stream_options={"include_usage": True})]
            assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
            again = [c async for c in await client.chat.completions.create(
                model="any", messages=messages("beta", "two"), max_tokens=3, stream=True,
                stream_options={"include_usage": True})]
            assert again[-1].usage.prompt_tokens_details.cached_tokens > 100
            plain = [c async for c in await client.chat.completions.create(
                model="any", messages=messages("beta", "three"), max_tokens=3, stream=True)]
            assert plain and all(c.choices for c in plain) and all(c.usage is None for c in plain)  # stripped again
            raw = await client.chat.completions.with_raw_response.create(
                model="any", messages=messages("beta", "four"), max_tokens=2)
            assert raw.headers["x-cacheroute-replica"] == "e0" and raw.headers["x-cacheroute-reason"] == "planned"
            # a tenant never shares another's key: acme's system prompt under beta's key is cold
            raw = await client.chat.completions.with_raw_response.create(
                model="any", messages=messages("acme", "five"), max_tokens=2)
            assert raw.headers["x-cacheroute-reason"] == "cold"
            raw = await client.chat.completions.with_raw_response.create(
                model="any", messages=messages("beta", "six"), max_tokens=2,
                extra_headers={"x-cacheroute-key": "session-9"})
            assert raw.headers["x-cacheroute-reason"] == "cold"
            await client.close()
            if kind == "vllm":   # the dispatcher took the usage of every proxied response, stripped or not
                assert sum(service.http.usage.requests) == 10   # 4 from acme, 6 from beta
                assert service.http.usage.cached[0] > 0 and service.http.usage.cached[1] > 0
                assert sum(service.http.usage.completed) == 10 and sum(service.http.usage.completion) >= 10
            async with aiohttp.ClientSession() as http:
                async with http.get(service.http_url + "/health") as resp:
                    assert resp.status == 200 and (await resp.json())["healthy_replicas"] == 2
            assert service.router.counts[1] >= 6     # planned
        finally:
            await service.stop(0)
            await store.close()
            await fleet.stop()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["vllm", "cacheroute"])
def test_a_client_that_disconnects_cancels_the_engine_request(redis_url, kind):
    async def main():
        fleet = await EngineFleet(1, time_scale=1.0, http=True).start()     # real time: a long stream
        service, store = await start(redis_url, fleet, kind)
        runner = fleet.services[0].runner
        try:
            for stream in (True, False):
                async with aiohttp.ClientSession() as http:
                    body = {"model": "m", "messages": messages("acme", "long"), "max_tokens": 4000, "stream": stream}

                    async def call():
                        async with http.post(service.http_url + "/v1/chat/completions", json=body,
                                             headers={"Authorization": "Bearer sk-acme"}) as resp:
                            assert resp.status == 200
                            await resp.content.readany()          # a stream: the first event
                            await asyncio.sleep(3600)

                    task = asyncio.create_task(call())
                    await wait_until(lambda: runner.in_flight == 1 and runner.model.running == 1, timeout=5)
                    task.cancel()                                 # the client goes away
                    await asyncio.gather(task, return_exceptions=True)
                await wait_until(lambda: runner.in_flight == 0 and runner.model.running == 0, timeout=3)
                await wait_until(lambda: service.router.outstanding == [0], timeout=3)
        finally:
            await service.stop(0)
            await store.close()
            await fleet.stop()

    asyncio.run(main())


def test_cache_telemetry_of_http_engines_reaches_the_collector(redis_url):
    """Kind vllm: the engines report nothing themselves; the dispatcher sends the usage of the
    responses it proxied (stripped usage chunks included) to a real collector and Redis, and
    the arrivals of served requests."""
    from services.collector.service import CollectorConfig, CollectorService
    from services.store import TelemetryConfig

    async def main():
        telemetry = TelemetryConfig(bucket_seconds=1, retention_seconds=600)
        collector = await CollectorService(CollectorConfig(server=ServerConfig(name="collector", port=0),
                                                           redis_url=redis_url, telemetry=telemetry)).start()
        fleet = await EngineFleet(2, time_scale=0.02, http=True).start()
        config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0),
                                  replicas=parse_replicas(fleet.replicas_flag("vllm")), collector=collector.address,
                                  poll_interval=0.1, poll_timeout=0.5, telemetry_interval=0.2, seed=3,
                                  engine_kind="vllm", http=HttpConfig(port=0))
        service = await serve(config)
        store = RedisStore(redis_url, telemetry=telemetry)
        try:
            await wait_until(lambda: all(service.router.state.healthy))
            client = openai.AsyncOpenAI(base_url=service.http_url + "/v1", api_key="none", max_retries=0,
                                        default_headers={"x-cacheroute-key": "tenant-7"})
            for turn in range(4):
                if turn % 2:
                    await client.chat.completions.create(model="m", messages=messages("acme", str(turn)), max_tokens=2)
                else:
                    async for _ in await client.chat.completions.create(
                            model="m", messages=messages("acme", str(turn)), max_tokens=2, stream=True):
                        pass
            await client.close()
            plain = openai.AsyncOpenAI(base_url=service.http_url + "/v1", api_key="none", max_retries=0)
            for turn in range(2):      # no key header: the key is the text's first key_tokens tokens
                await plain.chat.completions.create(model="m", messages=messages("acme", f"plain {turn}"), max_tokens=2)
            await plain.close()
            await service.cache_sender.flush()
            await service.reporter.flush()

            async def landed():
                totals = await store.cache_totals()
                return sum(c.requests for c in totals.values()) == 6 and sum(c.cached_tokens for c in totals.values()) > 0

            await wait_until(landed, timeout=5)
            rates = await store.window_rates(time.time(), 60)
            assert "tenant-7" in rates.keys and len(rates.keys) == 2 and rates.total_arrivals == 6
            by_key = dict(zip(rates.keys, zip(rates.mean_prompt_tokens, rates.mean_prefix_tokens)))
            assert by_key.pop("tenant-7")[1] == 0                    # a header key's shared prefix is unknown
            (prompt, prefix), = by_key.values()                      # a text key shares its first key_tokens
            assert prompt > 0 and prefix == min(prompt, service.config.http.key_tokens), (prompt, prefix)
        finally:
            await service.stop(0)
            await store.close()
            await fleet.stop()
            await collector.stop(0)

    asyncio.run(main())


@pytest.mark.parametrize("extra,named", [({"n": 2}, "n"), ({"tools": [{"type": "function", "function": {"name": "f"}}]},
                                                           "tools"),
                                         ({"response_format": {"type": "json_object"}}, "response_format")])
def test_fields_the_grpc_engine_cannot_honour_are_400_naming_them(redis_url, extra, named):
    """Issue 20: on the gRPC engine kind n=2, tools and response_format were silently dropped."""
    async def main():
        fleet = await EngineFleet(1, time_scale=0.02, http=True).start()
        service, store = await start(redis_url, fleet, "cacheroute")
        try:
            async with aiohttp.ClientSession() as session:
                body = {"model": "m", "messages": messages("acme", "hi"), "max_tokens": 2, **extra}
                async with session.post(service.http_url + "/v1/chat/completions", json=body,
                                        headers={"Authorization": "Bearer sk-acme"}) as resp:
                    doc = await resp.json()
                    assert resp.status == 400, doc
                assert doc["error"]["param"] == named and named in doc["error"]["message"]
                body = {"model": "m", "messages": messages("acme", "hi"), "max_tokens": 2, "n": 1}
                async with session.post(service.http_url + "/v1/chat/completions", json=body,
                                        headers={"Authorization": "Bearer sk-acme"}) as resp:
                    assert resp.status == 200
        finally:
            await service.stop()
            await store.close()
            await fleet.stop()

    asyncio.run(main())
