"""Miss accounting: the gap to the infinite-cache bound split into first sight, spilled,
first-on-replica and evicted (services.core.metrics.miss_accounting), alone and in a simulator run."""

from __future__ import annotations

import random

import pytest

from services.core.engine import PROFILES
from services.core.metrics import MISS_KINDS, miss_accounting
from services.core.policies import make_policy
from services.core.request import Request
from services.sim.simulator import SimConfig, simulate


def test_each_request_gap_goes_to_one_kind():
    #          key  replica spilled cached bound prompt measured
    rows = [("a", 0, False, 0, 0, 100, True),       # first sight, bound 0: no gap
            ("b", 1, False, 10, 50, 100, True),     # first sight, shares a prefix with a: gap 40
            ("a", 1, False, 0, 80, 100, True),      # a's first time on replica 1: first_on_replica 80
            ("a", 1, False, 30, 80, 100, True),     # a was on 1 before: evicted 50
            ("a", 2, True, 0, 80, 100, True),       # spilled 80 (spill wins over first-on-replica)
            ("b", 1, False, 80, 80, 100, False)]    # not measured: history only
    out = miss_accounting(*zip(*rows))
    assert out["first_sight"] == pytest.approx(40 / 500)
    assert out["first_on_replica"] == pytest.approx(80 / 500)
    assert out["evicted"] == pytest.approx(50 / 500)
    assert out["spilled"] == pytest.approx(80 / 500)
    assert out["bound"] == pytest.approx(290 / 500)
    assert out["hit_rate"] == pytest.approx(40 / 500)
    assert out["bound"] - out["hit_rate"] == pytest.approx(sum(out[k] for k in MISS_KINDS))


def test_an_empty_window_is_zero():
    out = miss_accounting([], [], [], [], [], [], [])
    assert all(v == 0.0 for v in out.values())


def _requests(n: int, keys: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(20.0)
        k = min(int(rng.paretovariate(1.2)) - 1, keys - 1)
        prefix = tuple(1000 * (k + 1) + b for b in range(64))         # 1,024 shared tokens per key
        out.append(Request(i, t, f"k{k}", 16 * 72, 8, prefix))      # + 128 unique suffix tokens
    return out


@pytest.mark.parametrize("policy", ["flat", "cacheroute"])
def test_a_simulator_run_accounts_for_its_whole_gap(policy):
    reqs = _requests(1500, 40)
    config = SimConfig(PROFILES["llama3-8b-h100"], replicas=4, kv_blocks=600, control_interval=10.0,
                       first_plan_at=3.0)
    out = simulate(config, make_policy(policy, 4, seed=1), reqs)
    m = out.extra["misses"]
    assert m["hit_rate"] == pytest.approx(out.metrics.hit_rate)
    assert m["bound"] >= m["hit_rate"]
    assert m["bound"] - m["hit_rate"] == pytest.approx(sum(m[k] for k in MISS_KINDS))
    assert m["first_on_replica"] + m["evicted"] > 0          # 40 keys x 1,024 tokens do not fit 4 x 600 blocks
