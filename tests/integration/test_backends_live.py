"""services.backends against live servers on loopback: the simulated engine over gRPC (kind
cacheroute) and over its HTTP API (kind vllm: vLLM's metric names), a bare OpenAI-style server
(kind openai: /health only), and the planner's health checks over HTTP. The llamacpp kind is
exercised against real llama.cpp replicas in tests/e2e/test_llamacpp.py."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from services.backends import BackendDown, make_backend
from services.engine.fleet import EngineFleet
from services.http.server import start_http
from services.planner.repair import ReplicaHealth
from tests.integration.test_dispatcher import wait_until


def test_the_simulated_engine_over_grpc_and_over_http_report_the_same_counters():
    async def main():
        fleet = await EngineFleet(1, time_scale=0.01, http=True).start()
        grpc_backend = make_backend("e0", fleet.address(0))
        http_backend = make_backend("e0", f"vllm+{fleet.http_url(0)}")
        try:
            async with aiohttp.ClientSession() as http:
                for i in range(3):
                    async with http.post(fleet.http_url(0) + "/v1/completions",
                                         json={"prompt": " ".join(f"w{j}" for j in range(40)), "max_tokens": 2}) as r:
                        assert r.status == 200
            a, b = await grpc_backend.poll(1.0), await http_backend.poll(1.0)
            assert (grpc_backend.kind, grpc_backend.http, http_backend.kind, http_backend.http) == \
                ("cacheroute", False, "vllm", True)
            assert a.has_counters and b.has_counters and b.has_load
            assert (a.prompt_tokens, a.cached_tokens) == (b.prompt_tokens, b.cached_tokens) == (120, 64)
            await grpc_backend.check(1.0)
            await http_backend.check(1.0)
            await fleet.stop_one(0)
            for backend in (grpc_backend, http_backend):
                with pytest.raises(BackendDown):
                    await backend.poll(1.0)
        finally:
            await grpc_backend.close()
            await http_backend.close()
            await fleet.stop()

    asyncio.run(main())


def test_kind_openai_needs_only_health_and_a_failing_health_is_down():
    async def main():
        status = {"code": 200}

        async def health(request):
            return web.Response(status=status["code"], text="ok")

        app = web.Application()
        app.router.add_get("/health", health)
        server = await start_http(app, "127.0.0.1", 0)
        backend = make_backend("x", f"openai+{server.url}")
        try:
            stats = await backend.poll(1.0)
            assert not stats.has_load and not stats.has_counters
            status["code"] = 503
            with pytest.raises(BackendDown) as info:
                await backend.poll(1.0)
            assert "503" in str(info.value) and not info.value.timeout
        finally:
            await backend.close()
            await server.stop()

    asyncio.run(main())


def test_health_every_reads_metrics_alone_between_health_checks_and_never_trusts_a_missing_page():
    """With health_every, a vllm replica's polls inside the window GET /metrics only; once the
    window passes /health is asked again; a 503 /health is down and asked again at the next poll;
    a /metrics that stops answering 200 inside the window is followed by /health at once."""
    async def main():
        hits = {"/health": 0, "/metrics": 0}
        state = {"health": 200, "metrics": 200}
        page = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.5\n"

        async def health(request):
            hits["/health"] += 1
            return web.Response(status=state["health"], text="ok")

        async def metrics(request):
            hits["/metrics"] += 1
            return web.Response(status=state["metrics"], text=page)

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/metrics", metrics)
        server = await start_http(app, "127.0.0.1", 0)
        backend = make_backend("x", f"vllm+{server.url}", health_every=0.3)
        try:
            for _ in range(4):
                assert (await backend.poll(1.0)).has_load
            assert hits == {"/health": 1, "/metrics": 4}
            await asyncio.sleep(0.35)
            await backend.poll(1.0)
            assert hits == {"/health": 2, "/metrics": 5}
            state["health"] = 503
            await asyncio.sleep(0.35)
            for _ in range(2):                     # down, and asked again at the next poll
                with pytest.raises(BackendDown):
                    await backend.poll(1.0)
            assert hits == {"/health": 4, "/metrics": 7}
            state["health"] = 200
            await backend.poll(1.0)                # back: the window starts again
            state["metrics"] = 404
            state["health"] = 503
            with pytest.raises(BackendDown):       # no page inside the window: /health decides at once
                await backend.poll(1.0)
            assert hits == {"/health": 6, "/metrics": 9}
        finally:
            await backend.close()
            await server.stop()

    asyncio.run(main())


def test_the_planners_health_checks_use_the_http_backends():
    async def main():
        fleet = await EngineFleet(2, time_scale=0.01, http=True).start()
        changes = []
        health = ReplicaHealth({"e0": f"vllm+{fleet.http_url(0)}", "e1": fleet.http_url(1)}, interval=0.1, timeout=0.5,
                               default_kind="sglang", on_change=lambda rid, ok: changes.append((rid, ok)))
        await health.start()
        try:
            assert health.down_for() == {}
            await fleet.stop_one(1)
            await wait_until(lambda: "e1" in health.down_for(), timeout=3)
            assert changes == [("e1", False)] and health.usable(("e0", "e1"), grace=0.0) == ("e0",)
        finally:
            await health.stop()
            await fleet.stop()

    asyncio.run(main())
