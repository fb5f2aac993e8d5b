"""The simulator's rate-history knob: EWMA per-key rates over a horizon, seeded by a prior."""

from __future__ import annotations

import math

import pytest

from services.core.engine import PROFILES
from services.core.policies import make_policy
from services.core.request import Request
from services.core.workloads import history_rates, make_workload
from services.sim.runs import RunSpec, config_for
from services.sim.simulator import SimConfig, Simulator, default_plan_fn

P8 = PROFILES["llama3-8b-h100"]


def spy():
    seen = []

    def plan_fn(**kw):
        seen.append((kw["now"], dict(zip(kw["keys"], kw["rates"])), kw["window"]))
        return default_plan_fn(**kw)
    return seen, plan_fn


def stream(key_of, n, gap):
    base = {}
    out = []
    for i in range(n):
        k = key_of(i)
        b = base.setdefault(k, 1000 * (len(base) + 1))
        out.append(Request(i, i * gap, k, 200, 4, tuple(range(b, b + 8))))
    return out


def test_without_horizon_rates_are_the_last_window():
    q = stream(lambda i: "a" if i < 100 else "b", 201, 0.1)     # a for 10 s, then b for 10 s
    seen, fn = spy()
    Simulator(SimConfig(P8, 2, q_cap=5.0, warm_slots=4, control_interval=10.0, plan_fn=fn, warmup=0.0),
              make_policy("cacheroute", 2), q).run()
    (t1, r1, w1), (t2, r2, w2) = seen
    assert (t1, w1, t2, w2) == (10.0, 10.0, 20.0, 10.0)
    assert r1 == pytest.approx({"a": 10.0}) and r2 == pytest.approx({"b": 10.0})


def test_ewma_rates_are_bias_corrected_and_remember_the_past():
    q = stream(lambda i: "a" if i < 100 else "b", 201, 0.1)
    seen, fn = spy()
    H = 20.0
    Simulator(SimConfig(P8, 2, q_cap=5.0, warm_slots=4, control_interval=10.0, plan_fn=fn, warmup=0.0,
                        rate_horizon=H), make_policy("cacheroute", 2), q).run()
    (_, r1, w1), (_, r2, w2) = seen
    d = math.exp(-10.0 / H)
    assert w1 == pytest.approx(10.0) and r1 == pytest.approx({"a": 10.0})   # first window: unbiased
    assert w2 == pytest.approx(10.0 * d + 10.0)
    assert r2["a"] == pytest.approx(100 * d / w2) and r2["b"] == pytest.approx(100 / w2)


def test_prior_seeds_the_first_plan_with_keys_not_yet_seen():
    q = stream(lambda i: "a", 51, 0.1)
    seen, fn = spy()
    prior = (("a", 1.0, 128), ("z", 4.0, 128))
    Simulator(SimConfig(P8, 2, q_cap=5.0, warm_slots=4, control_interval=5.0, plan_fn=fn, warmup=0.0,
                        rate_horizon=100.0, rate_prior=prior, rate_prior_seconds=100.0),
              make_policy("cacheroute", 2), q).run()
    _, r1, w1 = seen[0]
    d = math.exp(-5.0 / 100.0)
    assert w1 == pytest.approx(100.0 * d + 5.0)
    assert r1["z"] == pytest.approx(400.0 * d / w1)                 # never arrived, still planned
    assert r1["a"] == pytest.approx((100.0 * d + 50) / w1)


def test_history_rates_match_the_workload_keys_and_prefixes():
    w = make_workload("flagship", qps=20.0, duration=20.0, seed=3)
    hist = history_rates("flagship", qps=20.0, seconds=300.0, seed=3, history_seed=9)
    prefix = {k: p for k, _, p in hist}
    assert sum(r for _, r, _ in hist) == pytest.approx(20.0, rel=0.05)
    common = set(prefix) & set(w.prefix_tokens)
    assert len(common) > 50 and all(prefix[k] == w.prefix_tokens[k] for k in common)
    assert history_rates("flagship", qps=20.0, seconds=300.0, seed=3, history_seed=9) == hist
    with pytest.raises(ValueError):
        history_rates("whale", qps=1.0, seconds=1.0, seed=0, history_seed=1)


def test_run_spec_wires_history_into_the_config():
    spec = RunSpec(policy="cacheroute", qps=10.0, duration=10.0, workload="paper",
                   workload_knobs={"active_set": 16}, rate_history=600.0)
    cfg = config_for(spec)
    assert cfg.rate_horizon == 600.0 and cfg.rate_prior_seconds == 600.0 and len(cfg.rate_prior) == 16
    assert config_for(RunSpec(policy="flat", qps=1.0)).rate_prior == ()


def test_flagship_history_respects_the_active_set():
    hist = history_rates("flagship", qps=50.0, seconds=300.0, seed=3, history_seed=9, active_set=256)
    assert hist and max(int(k[1:]) for k, _, _ in hist) < 256
    assert sum(r for _, r, _ in hist) == pytest.approx(50.0, rel=0.05)
