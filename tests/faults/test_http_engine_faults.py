"""Engine faults behind the dispatcher's OpenAI HTTP API.

Two replicas: e0 is the faulty one, e1 a healthy simulated engine (kind vllm, over its HTTP
API). A plan sends key "k" to e0 only. The faults are real: a loopback HTTP server that
answers 500, one that never answers, one that closes the connection mid-stream, and a
simulated engine process killed with SIGKILL (before a request and in the middle of a
stream). Each time the client must get the documented error promptly (docs/reliability.md:
502, 504, an SSE error event, or a transparent retry when nothing was sent yet), the replica
must leave rotation, and the next request for "k" must be served by e1.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import openai
import pytest
from aiohttp import web

from services.dispatcher.service import DispatcherConfig, serve
from services.dispatcher.http import HttpConfig
from services.model import parse_replicas
from services.engine.fleet import EngineFleet
from services.http.server import start_http
from services.rpc import ServerConfig
from services.local.launch import launcher
from tests.integration.test_dispatcher import hand_plan, wait_until

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}


def faulty_app(mode: str) -> web.Application:
    served = [0]

    async def health(request):
        return web.json_response({"status": "ok"})

    async def complete(request):
        await request.read()
        served[0] += 1
        if mode == "flaky" and served[0] % 2 == 0:     # every other request is answered
            return web.json_response({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                                   "finish_reason": "stop"}],
                                      "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
        if mode in ("500", "flaky"):
            return web.json_response({"error": {"message": "boom", "type": "server_error"}}, status=500)
        if mode == "hang":
            await asyncio.sleep(3600)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m",'
                         b'"choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":null}]}\n\n')
        await asyncio.sleep(0.2)
        request.transport.abort()            # mid-stream: the connection just goes away
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", complete)
    return app


async def dispatcher_for(e0: str, e1: str, poll_interval: float = 0.1, **http):
    config = DispatcherConfig(server=ServerConfig(name="dispatcher", port=0),
                              replicas=parse_replicas(f"e0={e0},e1={e1}"), poll_interval=poll_interval,
                              poll_timeout=0.5, seed=2, http=HttpConfig(port=0, **http))
    service = await serve(config)     # no planner, no store: the test installs the plan
    service.router.set_plan(hand_plan(1, ("e0", "e1"), {"k": (0,)}), flat=False, source="test")
    await wait_until(lambda: all(service.router.state.healthy), timeout=5)
    return service


async def post(session, url, body, key="k"):
    start = time.monotonic()
    async with session.post(url + "/v1/chat/completions", json=body, headers={"x-cacheroute-key": key}) as resp:
        data = await resp.read()
        return resp.status, dict(resp.headers), data, time.monotonic() - start


async def served_by_e1(service, session) -> None:
    status, headers, data, _ = await post(session, service.http_url, BODY)
    assert status == 200, data
    assert headers["x-cacheroute-replica"] == "e1"
    assert not service.router.state.healthy[0]


def test_a_5xx_before_any_byte_is_retried_once_on_another_replica():
    """Issue 20: an engine answering 500 before any byte was relayed got the client a 502 with
    healthy replicas to spare; now the request is retried once elsewhere (and e0 is ejected)."""
    async def main():
        fleet = await EngineFleet(1, prefix="e", time_scale=0.01, http=True).start()
        bad = await start_http(faulty_app("500"), "127.0.0.1", 0)
        service = await dispatcher_for(f"openai+{bad.url}", f"vllm+{fleet.http_url(0)}", eject_after=1)
        try:
            async with aiohttp.ClientSession() as session:
                got, headers, data, seconds = await post(session, service.http_url, BODY)
                assert got == 200 and headers["x-cacheroute-replica"] == "e1" and seconds < 1.0, (got, data)
                assert not service.router.state.healthy[0]
                await served_by_e1(service, session)
        finally:
            await service.stop(0)
            await bad.stop()
            await fleet.stop()

    asyncio.run(main())


@pytest.mark.parametrize("mode,status,code,within", [("hang", 504, "engine_timeout", 2.5)])
def test_an_engine_error_or_hang_is_answered_promptly_and_the_replica_leaves_rotation(mode, status, code, within):
    async def main():
        fleet = await EngineFleet(1, prefix="e", time_scale=0.01, http=True).start()
        bad = await start_http(faulty_app(mode), "127.0.0.1", 0)
        service = await dispatcher_for(f"openai+{bad.url}", f"vllm+{fleet.http_url(0)}", upstream_timeout=1.0,
                                       eject_after=1)
        try:
            async with aiohttp.ClientSession() as session:
                got, headers, data, seconds = await post(session, service.http_url, BODY)
                error = json.loads(data)["error"]
                assert (got, error["code"]) == (status, code) and seconds < within, (got, error, seconds)
                assert headers["x-cacheroute-replica"] == "e0"
                await served_by_e1(service, session)
        finally:
            await service.stop(0)
            await bad.stop()
            await fleet.stop()

    asyncio.run(main())


def test_a_connection_closed_mid_stream_ends_the_stream_with_an_error_event():
    async def main():
        fleet = await EngineFleet(1, time_scale=0.01, http=True).start()
        bad = await start_http(faulty_app("close"), "127.0.0.1", 0)
        service = await dispatcher_for(f"openai+{bad.url}", f"vllm+{fleet.http_url(0)}", eject_after=1)
        try:
            client = openai.AsyncOpenAI(base_url=service.http_url + "/v1", api_key="none", max_retries=0,
                                        default_headers={"x-cacheroute-key": "k"})
            seen = []
            start = time.monotonic()
            with pytest.raises(openai.APIError) as info:
                async for chunk in await client.chat.completions.create(stream=True, **BODY):
                    seen.append(chunk.choices[0].delta.content)
            assert seen == ["hi"] and time.monotonic() - start < 2.0
            assert "closed the stream" in str(info.value)
            await client.close()
            async with aiohttp.ClientSession() as session:
                await served_by_e1(service, session)
        finally:
            await service.stop(0)
            await bad.stop()
            await fleet.stop()

    asyncio.run(main())


def test_ejection_takes_failures_in_a_row_and_never_empties_the_rotation():
    """Defaults (eject_after 3, max_ejected_fraction 0.5): a replica failing every other
    request is never ejected (each answer resets its count; its failures are retried on e1);
    one failing three in a row is; with both replicas answering 500 only one of the two leaves
    rotation, so the dispatcher keeps answering 502 (the engine's failure), not 503 for
    everything."""
    async def main():
        bad = [await start_http(faulty_app("500"), "127.0.0.1", 0) for _ in range(2)]
        flaky = await start_http(faulty_app("flaky"), "127.0.0.1", 0)
        fleet = await EngineFleet(1, prefix="e", time_scale=0.01, http=True).start()
        mixed = await dispatcher_for(f"openai+{bad[0].url}", f"vllm+{fleet.http_url(0)}")
        wobbly = await dispatcher_for(f"openai+{flaky.url}", f"vllm+{fleet.http_url(0)}")
        both = await dispatcher_for(f"openai+{bad[0].url}", f"openai+{bad[1].url}")
        both.router.set_plan(hand_plan(2, ("e0", "e1"), {"k": (0,), "j": (1,)}), flat=False, source="test")
        try:
            async with aiohttp.ClientSession() as session:
                statuses = [(await post(session, wobbly.http_url, BODY))[0] for _ in range(6)]
                assert statuses == [200] * 6 and wobbly.router.state.healthy[0], statuses

                for n in range(3):
                    assert (await post(session, mixed.http_url, BODY))[0] == 200     # retried on e1
                    assert mixed.router.state.healthy[0] == (n < 2), f"after {n + 1} failure(s) in a row"
                await served_by_e1(mixed, session)

                statuses = [(await post(session, both.http_url, BODY, key=k))[0] for _ in range(4) for k in "kj"]
                assert statuses == [502] * 8, statuses
                assert sum(both.router.state.healthy) == 1, "passive ejection emptied half or more"
        finally:
            for service in (mixed, wobbly, both):
                await service.stop(0)
            for server in (*bad, flaky):
                await server.stop()
            await fleet.stop()

    asyncio.run(main())


def spawn_engine(tmp_path: Path, time_scale: float) -> tuple[subprocess.Popen, str]:
    log = tmp_path / "engine.log"
    proc = subprocess.Popen([*launcher(), sys.executable, "-m", "services.engine", "--host", "127.0.0.1", "--port", "0",
                             "--metrics-port", "-1", "--http-port", "0", "--replica-id", "e0",
                             "--time-scale", str(time_scale)],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)   # setpriv --pdeathsig: dies with this process
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in log.read_bytes().splitlines():
            if b'"http serving"' in line:
                return proc, json.loads(line)["url"]
        assert proc.poll() is None, log.read_text()
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("engine did not start")


def test_a_killed_engine_is_retried_elsewhere_or_ends_its_stream_with_an_error(tmp_path):
    async def main():
        fleet = await EngineFleet(1, prefix="e", time_scale=0.01, http=True).start()
        proc, url = spawn_engine(tmp_path, time_scale=1.0)
        service = await dispatcher_for(f"vllm+{url}", f"vllm+{fleet.http_url(0)}")
        try:
            client = openai.AsyncOpenAI(base_url=service.http_url + "/v1", api_key="none", max_retries=0,
                                        default_headers={"x-cacheroute-key": "k"})
            # killed mid-stream: a long stream from e0 (real-time engine), SIGKILL after its first tokens
            stream = await client.chat.completions.create(stream=True, **{**BODY, "max_tokens": 2000})
            seen = 0
            with pytest.raises(openai.APIError):
                async for _ in stream:
                    seen += 1
                    if seen == 2:
                        os.kill(proc.pid, signal.SIGKILL)
                        killed = time.monotonic()
            assert time.monotonic() - killed < 2.0 and 2 <= seen < 2000
            await wait_until(lambda: not service.router.state.healthy[0], timeout=10)
            # and while it is down, its key is served by e1
            raw = await client.chat.completions.with_raw_response.create(**BODY)
            assert raw.headers["x-cacheroute-replica"] == "e1"
            await client.close()
        finally:
            proc.kill()
            proc.wait()
            await service.stop(0)
            await fleet.stop()

    asyncio.run(main())


def test_an_engine_killed_between_polls_is_retried_on_another_replica(tmp_path):
    async def main():
        fleet = await EngineFleet(1, prefix="e", time_scale=0.01, http=True).start()
        proc, url = spawn_engine(tmp_path, time_scale=0.01)
        # no poll after the first: the request is what finds the engine gone
        service = await dispatcher_for(f"vllm+{url}", f"vllm+{fleet.http_url(0)}", poll_interval=3600.0)
        try:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            async with aiohttp.ClientSession() as session:
                status, headers, data, seconds = await post(session, service.http_url, BODY)
            assert status == 200 and headers["x-cacheroute-replica"] == "e1" and seconds < 2.0, data
            assert not service.router.state.healthy[0]
        finally:
            await service.stop(0)
            await fleet.stop()

    asyncio.run(main())
