"""The open-loop client (clients.openloop) against a real simulated engine's OpenAI HTTP API on
127.0.0.1: TTFT from the stream, usage with cached tokens, open-loop timing, errors recorded
with their status instead of raised."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from clients import textload as tl
from clients.openloop import replay
from services.engine.fleet import EngineFleet


def test_replay_reads_ttft_usage_and_keeps_the_schedule():
    async def main():
        fleet = await EngineFleet(1, time_scale=0.05, http=True).start()
        try:
            url = fleet.services[0].http_url + "/v1/chat/completions"
            wl = tl.tenants(qps=20, duration=1.0, seed=0, tenants=2, system_words=tl.WordRange(256, 512),
                            max_tokens=3)
            schedule = [(q.rid, q.at, q.body("m")) for q in wl.requests]
            t0 = time.perf_counter()
            seen = []
            outcomes = await replay(url, schedule, timeout=20, progress=lambda s, d: seen.append((s, d)))
            return outcomes, time.perf_counter() - t0, wl, seen
        finally:
            await fleet.stop()

    outcomes, wall, wl, _ = asyncio.run(main())
    assert len(outcomes) == len(wl.requests) >= 10
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    assert wall >= wl.requests[-1].at                                  # sent on schedule, not faster
    assert all(o.lag < 0.5 for o in outcomes)
    assert all(0 < o.ttft <= o.latency for o in outcomes)
    assert all(o.completion_tokens == 3 for o in outcomes)
    for o, q in zip(outcomes, wl.requests):
        text = "\n".join(f"{m['role']}: {m['content']}" for m in q.messages())
        assert o.prompt_tokens == len(text.split())
    # a tenant's later requests find its system prompt cached
    by_group: dict[str, list] = {}
    for o, q in zip(outcomes, wl.requests):
        by_group.setdefault(q.group, []).append(o)
    repeats = [o for group in by_group.values() for o in group[1:]]
    assert repeats and sum(o.cached_tokens for o in repeats) > 0.5 * sum(o.prompt_tokens for o in repeats)


def test_replay_records_http_errors_and_refused_connections():
    async def main():
        fleet = await EngineFleet(1, time_scale=0.05, http=True).start()
        try:
            base = fleet.services[0].http_url
            bad = [(0, 0.0, b"{not json"), (1, 0.0, orjson.dumps({"model": "m", "messages": [], "stream": True}))]
            errors = await replay(base + "/v1/chat/completions", bad, timeout=5)
            missing = await replay(base + "/v1/nowhere", [(0, 0.0, b"{}")], timeout=5)
        finally:
            await fleet.stop()
        refused = await replay(base + "/v1/chat/completions", [(0, 0.0, b"{}")], timeout=5)
        return errors, missing, refused

    errors, missing, refused = asyncio.run(main())
    assert [o.status for o in errors] == [400, 400] and all(not o.ok and o.error for o in errors)
    assert "\n" not in errors[0].error
    assert missing[0].status == 404 and not missing[0].ok
    assert refused[0].status == 0 and "Connect" in refused[0].error and not refused[0].ok


def test_engine_tokenize_answers_like_vllm():
    """vllm-router asks workers for `POST /tokenize`; the simulated engine answers with the ids it caches by."""
    import aiohttp

    from services.core import routing
    from services.http.oai import chat_text

    async def main():
        fleet = await EngineFleet(1, time_scale=0.05, http=True).start()
        try:
            base = fleet.services[0].http_url
            msgs = [{"role": "system", "content": "alpha beta gamma"}, {"role": "user", "content": "delta"}]
            async with aiohttp.ClientSession() as s:
                async with s.post(base + "/tokenize", json={"model": "m", "messages": msgs}) as r:
                    chat = (r.status, await r.json())
                async with s.post(base + "/tokenize", json={"prompt": "one two three"}) as r:
                    prompt = (r.status, await r.json())
                async with s.post(base + "/tokenize", json={"model": "m"}) as r:
                    bad = (r.status, await r.json())
            return msgs, chat, prompt, bad
        finally:
            await fleet.stop()

    msgs, chat, prompt, bad = asyncio.run(main())
    assert chat[0] == 200 and chat[1]["tokens"] == routing.tokenize(chat_text(msgs)) and chat[1]["count"] == 6
    assert prompt[0] == 200 and prompt[1]["count"] == 3
    assert bad[0] == 400 and set(bad[1]["error"]) >= {"message", "type", "code"}


def test_rotation_round_robin_over_the_live_instances():
    from clients.openloop import Rotation

    rot = Rotation(["http://a", "http://b", "http://c"])
    assert [rot.pick()[0] for _ in range(4)] == [0, 1, 2, 0]
    rot.remove(1)
    assert {rot.pick()[0] for _ in range(4)} == {0, 2}
    rot.restore(1, "http://b2")
    assert rot.urls[1] == "http://b2" and {rot.pick()[0] for _ in range(6)} == {0, 1, 2}
    for i in range(3):
        rot.remove(i)
    assert rot.pick() == (-1, "")
    with pytest.raises(ValueError):
        Rotation([])
