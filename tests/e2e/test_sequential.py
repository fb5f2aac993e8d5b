"""One user's sequential requests on a fresh stack stay on one replica (issue 23).

A fresh `cacheroute up`-like stack (4 simulated engines, the planner's loop on, no plan yet):
3 tenants x 4 sequential chat requests through the official `openai` SDK, each tenant with its
own ~700-word system prompt. Every request rides the cold tail (no plan exists within the
run's first seconds), so this checks the cold tail's rule: a key stays on its ring home at low
load, and every dispatcher picks the same home without talking to the others. Before the cold
tail's bound had a floor, tenant 0 landed on engines 1, 3, 4, 1 and the repeat hit was 33%:
the bound was ceil(1.25 x (in_flight + 1) / replicas) = 1 when the cluster is idle, so one
request still counted in flight at home sent the next one elsewhere.

With 4 dispatchers the requests go round-robin over them (a Kubernetes Service in front of the
tier). Goal: repeat hit (cached / prompt tokens over each tenant's 2nd-4th request) >= 90%,
and each tenant on one replica.
"""

from __future__ import annotations

import random

import openai
import pytest

from services.local.stack import Stack, StackConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TENANTS, REQUESTS = 3, 4
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def system_prompt(tenant: int) -> str:
    rng = random.Random(tenant)
    return f"You are tenant {tenant}'s assistant. " + " ".join(rng.choice(WORDS) for _ in range(700))


def run_tenants(stack: Stack) -> dict[int, list[tuple[str, str, int, int]]]:
    """(replica, reason, cached, prompt) of each tenant's requests, tenants interleaved."""
    clients = [openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
               for url in stack.http]
    out: dict[int, list[tuple[str, str, int, int]]] = {t: [] for t in range(TENANTS)}
    n = 0
    for turn in range(REQUESTS):
        for tenant in range(TENANTS):
            client = clients[n % len(clients)]
            n += 1
            raw = client.chat.completions.with_raw_response.create(
                model="default", max_tokens=4,
                messages=[{"role": "system", "content": system_prompt(tenant)},
                          {"role": "user", "content": f"question {turn}"}])
            done = raw.parse()
            usage = done.usage
            out[tenant].append((raw.headers["x-cacheroute-replica"], raw.headers["x-cacheroute-reason"],
                                usage.prompt_tokens_details.cached_tokens, usage.prompt_tokens))
    for client in clients:
        client.close()
    return out


@pytest.mark.parametrize("dispatchers", [1, 4])
def test_a_fresh_stack_keeps_each_sequential_user_on_one_replica(dispatchers):
    config = StackConfig(engines=4, dispatchers=dispatchers, metrics=False, seed=3)
    stack = Stack(config).start()
    try:
        out = run_tenants(stack)
    finally:
        stack.stop()
    repeats = [r for rows in out.values() for r in rows[1:]]
    cached = sum(r[2] for r in repeats)
    prompt = sum(r[3] for r in repeats)
    assert prompt > 0
    assert cached / prompt >= 0.90, out
    for tenant, rows in out.items():
        assert len({r[0] for r in rows}) == 1, (tenant, rows)       # one replica per user
