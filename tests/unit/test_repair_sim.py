"""Failure repair in the simulator: repair moves only orphaned keys, beats doing nothing and a full
re-plan on the hit rate after the failure, and bounded moves bring a returning replica back slowly."""

from __future__ import annotations

import pytest

from experiments.harness.repair import RepairSimulator, cluster_plan, incremental_plan_fn, timeline, window_summary
from services.core.engine import PROFILES
from services.core.planning import build_plan
from services.core.policies import make_policy
from services.core.workloads import make_workload
from services.sim.simulator import Failure, SimConfig

P8 = PROFILES["llama3-8b-h100"]
R = 4
DOWN, BACK = 30.0, 70.0
WL = make_workload("paper", qps=24, duration=100, seed=2, active_set=24)


def run(on_failure, max_moves=None):
    cfg = SimConfig(P8, R, kv_blocks=2500, control_interval=20.0, q_cap=4.0, warm_slots=8,
                    plan_fn=incremental_plan_fn(max_moves), failures=(Failure(1, DOWN, BACK),))
    # guard off: these tests compare what the plans do; on this 4-replica cluster the overload guard's
    # spill blurs the 10 s window after the failure (docs/experiments.md, "Overload guard")
    policy = make_policy("cacheroute", R, seed=1, balance_factor=None)
    return RepairSimulator(cfg, policy, WL.requests, on_failure=on_failure).run()


@pytest.fixture(scope="module")
def runs():
    return {mode: run(mode) for mode in ("none", "replan", "repair")}


def test_cluster_plan_reindexes_a_survivor_plan():
    plan = build_plan(["a", "b", "c"], [3.0, 2.0, 1.0], ["r0", "r2", "r3"], q_cap=10.0, warm_slots=2)
    full = cluster_plan(plan, 4)
    assert full.replica_ids == ("r0", "r1", "r2", "r3")
    for key, row in plan.table.items():
        assert [full.replica_ids[i] for i in full.table[key]] == sorted(plan.replica_ids[i] for i in row)
    assert full.expected_load[1] == 0.0 and sum(full.expected_load) == pytest.approx(sum(plan.expected_load))
    with pytest.raises(ValueError):
        cluster_plan(plan, 2)


def test_failure_plans_avoid_the_dead_replica_and_repair_churns_least(runs):
    assert runs["none"].extra["failure_plans"] == []
    rep, full = runs["repair"].extra["failure_plans"], runs["replan"].extra["failure_plans"]
    assert [p["t"] for p in rep] == [p["t"] for p in full] == [DOWN]
    assert rep[0]["builder"] == "repair" and full[0]["builder"] == "lpt"
    assert 0 < rep[0]["churn"] < full[0]["churn"]
    # nothing is routed to the dead replica while it is down, in any mode
    for res in runs.values():
        down = (res.arrival >= DOWN) & (res.arrival < BACK)
        assert not (res.replica[down] == 1).any()


def test_repair_keeps_the_most_hits_after_the_failure(runs):
    hit = {mode: window_summary(res, DOWN, DOWN + 10)["hit_rate"] for mode, res in runs.items()}
    assert hit["repair"] > hit["none"] + 0.02 and hit["repair"] > hit["replan"] + 0.02


def test_bounded_moves_bring_a_returning_replica_back_gradually(runs):
    slow = run("repair", max_moves=1)
    first = lambda res: next(p.churn for p in res.plans if p.at > BACK)        # noqa: E731
    on_returned = lambda res: int(((res.arrival >= BACK) & (res.arrival < BACK + 20) & (res.replica == 1)).sum())  # noqa: E731
    assert first(slow) < first(runs["repair"])
    assert 0 < on_returned(slow) < on_returned(runs["repair"])


def test_timeline_bins_cover_the_run(runs):
    bins = timeline(runs["repair"], 10.0, 0.0, 100.0)
    assert len(bins) == 10 and sum(b["requests"] for b in bins) == len(WL.requests)
    assert sum(b["failed"] for b in bins) == int(runs["repair"].failed.sum())
