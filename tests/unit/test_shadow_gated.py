"""Gated simulator: a candidate that beats Flat-LB goes live, one that does not leaves the run flat."""

from __future__ import annotations

from dataclasses import replace

from experiments.harness.gated import GatedSimulator
from services.core.engine import PROFILES
from services.core.planning import build_plan
from services.core.policies import make_policy
from services.core.policies.cacheroute import BALANCE_FACTOR
from services.core.shadow import ShadowConfig
from services.core.workloads import make_workload
from services.sim.simulator import SimConfig, Simulator, default_plan_fn

P8 = PROFILES["llama3-8b-h100"]
R = 4


def pin_everything_on_replica_0(**kw):
    plan = default_plan_fn(**kw)
    return replace(plan, table={k: (0,) for k in plan.table})


def run(plan_fn, balance_factor=BALANCE_FACTOR):
    wl = make_workload("paper", qps=24, duration=90, seed=2, active_set=24)
    config = SimConfig(P8, R, kv_blocks=2500, control_interval=20.0, q_cap=4.0, warm_slots=8, plan_fn=plan_fn)
    shadow = ShadowConfig(P8, R, kv_blocks=2500, slo_p99=1.5, max_requests=400, load_scales=(1.0, 2.0),
                          balance_factor=balance_factor)
    policy = make_policy("cacheroute", R, seed=1)
    return GatedSimulator(config, policy, wl.requests, shadow=shadow).run(), wl


def test_a_candidate_that_beats_flat_goes_live_and_keeps_its_report():
    res, wl = run(None)
    gates = res.extra["gates"]
    assert len(gates) == 4 and all(g["gate_passed"] for g in gates)
    assert res.extra["planned_share"] == 1.0 and res.plans
    flat = Simulator(SimConfig(P8, R, kv_blocks=2500, control_interval=20.0), make_policy("flat", R, seed=1),
                     wl.requests).run()
    assert res.metrics.hit_rate > flat.metrics.hit_rate + 0.2


def test_a_candidate_worse_than_flat_is_never_installed():
    res, _ = run(pin_everything_on_replica_0, balance_factor=None)   # unguarded: the guard would spill it
    gates = res.extra["gates"]
    assert gates and not any(g["gate_passed"] for g in gates)
    assert res.extra["planned_share"] == 0.0 and not res.plans
    # flat fallback: the load stays spread although every candidate pins all keys on replica 0
    assert res.metrics.imbalance < 1.3
