"""Simulator `first_plan_at`: a bootstrap plan from the arrivals so far, and rates over the
time the counts actually cover."""

from __future__ import annotations

import pytest

from services.core.engine import PROFILES
from services.core.policies import make_policy
from services.core.request import Request
from services.sim.simulator import SimConfig, Simulator

P8 = PROFILES["llama3-8b-h100"]


def steady(n, gap, keys, prompt=600, output=40):
    out = []
    for i in range(n):
        key = i % keys
        blocks = tuple(1000 * (key + 1) + b for b in range(20))
        out.append(Request(i, i * gap, f"k{key}", prompt, output, blocks))
    return out


def plans(first_plan_at, q, interval=10.0):
    cfg = SimConfig(P8, 4, kv_blocks=400, q_cap=5.0, control_interval=interval, warmup=5.0,
                    first_plan_at=first_plan_at)
    return Simulator(cfg, make_policy("cacheroute", 4, seed=1), q).run().plans


def test_no_bootstrap_by_default():
    q = steady(1500, 0.02, 12)                       # 30 s at 50 req/s
    assert [p.at for p in plans(None, q)] == [10.0, 20.0]


def test_bootstrap_plan_and_rates_over_the_covered_time():
    q = steady(1500, 0.02, 12)
    got = plans(2.0, q)
    assert [p.at for p in got] == [2.0, 10.0, 20.0]
    assert [p.version for p in got] == [1, 2, 3]
    cfg = SimConfig(P8, 4, kv_blocks=400, q_cap=5.0, control_interval=10.0, first_plan_at=2.0)
    sim = Simulator(cfg, make_policy("cacheroute", 4, seed=1), q)
    seen = []
    sim.policy.set_plan = lambda plan, orig=sim.policy.set_plan: (seen.append(plan), orig(plan))
    sim.run()
    # 50 req/s in every window: the bootstrap divides by 2 s, the next plan by the 8 s since
    for plan in seen:
        assert sum(plan.rates.values()) == pytest.approx(50.0, rel=0.03)


@pytest.mark.parametrize("at", [0.0, 10.0, 15.0])
def test_bootstrap_outside_the_first_interval_is_ignored(at):
    q = steady(1500, 0.02, 12)
    assert [p.at for p in plans(at, q)] == [10.0, 20.0]

