"""experiments/: plan-lifecycle modes, per-request time series, install dips, commands."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from experiments import drift, run
from services.core.planning import build_plan
from services.sim.simulator import PlanRecord

KEYS = [f"k{i}" for i in range(40)]
RATES = [40.0 / (i + 1) for i in range(40)]


def call(fn, active, rates, now=60.0, version=2, warm_slots=10):
    return fn(now=now, keys=KEYS, rates=rates, healthy=[True] * 6, active=active, q_cap=5.0,
              warm_slots=warm_slots, version=version, replicas=6, window=30.0)


def perturbed(seed):
    rng = np.random.default_rng(seed)
    return (np.asarray(RATES) * np.exp(rng.normal(0, 0.3, len(RATES)))).tolist()


def test_first_call_builds_a_plan_in_every_mode():
    for mode in drift.MODES:
        plan = call(drift.plan_fn_for(mode, 3000.0), None, RATES, version=1)
        assert plan.version == 1 and plan.admitted_keys > 0


def test_stale_keeps_the_active_plan_and_scratch_replaces_it():
    first = build_plan(KEYS, RATES, [f"r{j}" for j in range(6)], 5.0, 10, window_seconds=30.0)
    assert call(drift.plan_fn_for("stale", 3000.0), first, perturbed(1)) is first
    fresh = call(drift.plan_fn_for("scratch", 3000.0), first, perturbed(1))
    assert fresh is not first and fresh.version == 2 and fresh.churn is not None


def test_incremental_moves_less_than_scratch():
    first = build_plan(KEYS, RATES, [f"r{j}" for j in range(6)], 5.0, 10, window_seconds=30.0)
    rates = perturbed(2)
    inc = call(drift.plan_fn_for("incremental", 3000.0), first, rates)
    scratch = call(drift.plan_fn_for("scratch", 3000.0), first, rates)
    assert inc.builder == "incremental"
    assert inc.churn < scratch.churn


def test_planner_mode_respects_dwell():
    fn = drift.plan_fn_for("planner", 3000.0)
    first = call(fn, None, RATES, now=30.0, version=1, warm_slots=2)
    # 12 slots: only the hottest keys are admitted. Flip the hot set: within the default
    # 120 s dwell the active plan is kept; after it, staleness beats re-warm and it switches;
    # flipping back 30 s later is refused again
    shifted = list(reversed(RATES))
    assert call(fn, first, shifted, now=60.0, warm_slots=2) is first
    second = call(fn, first, shifted, now=200.0, warm_slots=2)
    assert second is not first and second.builder == "incremental"
    third = call(fn, second, RATES, now=230.0, version=3, warm_slots=2)
    assert third is second


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown mode"):
        drift.plan_fn_for("sometimes", 1.0)


def fake_result(arrival, ttft, cached, prompt, plans=(), end=None):
    a = np.asarray(arrival, dtype=float)
    return SimpleNamespace(arrival=a, replica=np.arange(len(a)) % 2, ttft=np.asarray(ttft, dtype=float), cached=np.asarray(cached),
                           prompt=np.asarray(prompt), failed=np.zeros(len(a), dtype=bool),
                           plans=list(plans), end=end if end is not None else float(a.max()) + 1)


def test_hit_series_is_token_weighted_per_bin_and_skips_unserved():
    res = fake_result([0.5, 1.0, 6.0, 7.0, 12.0], [0.1, 0.1, 0.1, math.nan, 0.1],
                      [100, 0, 50, 999, 0], [100, 300, 100, 1000, 100], end=15.0)
    t, rate = drift.hit_series(res, 5.0)
    assert t.tolist() == [0.0, 5.0, 10.0]
    assert rate[0] == pytest.approx(0.25) and rate[1] == pytest.approx(0.5) and rate[2] == 0.0


def test_window_stats_counts_unfinished_as_infinite_p99():
    res = fake_result([1.0, 2.0], [0.2, math.nan], [0, 0], [10, 10])
    assert math.isinf(drift.window_stats(res, 0.0, 3.0)["ttft_p99"])
    assert drift.window_stats(res, 0.0, 1.5)["ttft_p99"] == pytest.approx(0.2)


def test_install_dips_compare_after_with_before():
    rec = lambda v, at: PlanRecord(v, at, 1, 1, 1.0, 1.0, 0.9 if v > 1 else None, 1.0, 1)  # noqa: E731
    res = fake_result([5, 8, 12, 15], [0.1] * 4, [90, 90, 40, 40], [100] * 4, plans=[rec(1, 0.0), rec(2, 10.0)])
    dips = drift.install_dips(res, 10.0)
    assert len(dips) == 1 and dips[0]["dip_points"] == pytest.approx(-50.0)


def test_tiny_drift_run_stale_replaces_only_the_bootstrap_plan():
    setup = drift.DriftSetup(qps=20.0, interval=10.0, epochs=3, active_set=16, replicas=4,
                             profile="llama3-8b-h100", bin_seconds=5.0, probe=5.0)
    wl = drift.workload(setup)
    _, stale = drift.run_mode(setup, "stale", wl, q_cap=8.0)
    _, scratch = drift.run_mode(setup, "scratch", wl, q_cap=8.0)
    assert len(stale["installs"]) == 2 and len(scratch["installs"]) == 3
    assert len(scratch["dips"]) == 2 and len(stale["dips"]) == 1
    assert len(scratch["epochs"]) == 2 and 0.0 < scratch["hit_rate"] <= 1.0
    assert len(scratch["series"]["t"]) == 6


def test_commands_are_the_products_own(capsys):
    assert run.main(["flagship-k128", "--print"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("cacheroute sim compare ") and "--out" in line and "--slo-p99 3.5" in line
    for name in run.COMPARE:
        from clients.cli import build_parser

        args = build_parser().parse_args(run.command(name))   # every stored command parses
        assert args.sim_command == "compare"


def test_capacity_wording():
    pts = [{"offered_qps": 10}, {"offered_qps": 20}]
    assert run.capacity({"capacity": 20, "censored": "right", "points": pts}) == ">= 20 (right-censored)"
    assert run.capacity({"capacity": 0, "censored": "left", "points": pts}) == "< 10 (left-censored)"
    assert run.capacity({"capacity": 10, "censored": "none", "points": pts}) == "10"


def test_a_bootstrap_plan_is_replaced_in_every_mode():
    boot = build_plan(KEYS, RATES, [f"r{j}" for j in range(6)], 5.0, 10, window_seconds=5.0)
    for mode in drift.MODES:
        plan = call(drift.plan_fn_for(mode, 3000.0), boot, perturbed(3))
        assert plan is not boot and plan.builder == "lpt" and plan.window_seconds == 30.0


def test_ideal_window_hit_rate_counts_only_the_window():
    from experiments.ideal import ideal_window_hit_rate
    from services.core.request import Request

    a = (1, 2, 3, 4)
    reqs = [Request(0, 0.0, "s", 80, 1, a), Request(1, 1.0, "s", 80, 1, a), Request(2, 2.0, "t", 80, 1, (9, 8, 7, 6))]
    # window [1, 3): request 1 hits 4 blocks (capped at (80-1)//16 = 4) of 80 tokens, request 2 misses
    assert ideal_window_hit_rate(reqs, 1.0, 3.0) == pytest.approx(64 / 160)
    assert ideal_window_hit_rate(reqs, 0.0, 1.0) == 0.0


def test_trace_paths_come_from_cacheroute_data_only_when_a_command_runs(monkeypatch, capsys):
    from experiments import prefix_sharing
    from experiments.beyond import common

    monkeypatch.delenv("CACHEROUTE_DATA", raising=False)
    assert run.main(["mooncake-conversation", "--print"]) == 0       # printing needs no data folder
    assert "--trace $CACHEROUTE_DATA/mooncake/conversation_trace.first_half.jsonl" in capsys.readouterr().out
    assert run.resolve(["--qps", "4"]) == ["--qps", "4"]             # no trace: nothing to resolve
    for needs_trace in (lambda: run.resolve(run.command("mooncake-synthetic")),
                        lambda: run.data_path(run.AZURE_CONVERSATION), lambda: run.main(["ideal"]),
                        lambda: common.source("mooncake-conversation"), lambda: prefix_sharing.main([])):
        with pytest.raises(SystemExit, match="^a trace is needed: set CACHEROUTE_DATA to"):
            needs_trace()
    env = {"CACHEROUTE_DATA": "/data/x"}
    assert run.data_path(run.MOONCAKE_SYNTHETIC, env) == "/data/x/mooncake/synthetic_trace.jsonl"
    stored = [a for argv in run.COMPARE.values() for a in argv if a.endswith((".jsonl", ".csv"))]
    assert len(stored) == 3 and all(a.startswith("$CACHEROUTE_DATA/") for a in stored)
    resolved = [a for name in run.COMPARE for a in run.resolve(run.command(name), env) if a.endswith((".jsonl", ".csv"))]
    assert sorted(resolved) == sorted("/data/x/" + a[len("$CACHEROUTE_DATA/"):] for a in stored)
    assert all(p.startswith("$CACHEROUTE_DATA/mooncake/") for p in (*prefix_sharing.DEFAULT, *run.TRACES.values()))
    monkeypatch.setenv("CACHEROUTE_DATA", "/data/y")
    assert common.source("mooncake-synthetic")[0].trace == "/data/y/mooncake/synthetic_trace.jsonl"
    assert common.source("flagship-k128")[0] is common.SOURCES["flagship-k128"][0]


def test_the_flagship_runs_the_calibrated_knobs():
    """`flagship` is the workload calibrated on both anchors (experiments.flagship calibrate-anchors):
    the stored chosen cell's active set and KV, the fixed prompt shape; the old flagship is `flagship-full`."""
    from clients.cli import build_parser
    from clients.cli.sim import _spec
    from experiments import flagship

    stored = run.load("flagship-anchors")
    assert stored is not None, "experiments/results/flagship-anchors/results.json is missing"
    chosen = stored["chosen"]
    assert chosen == flagship.best_cell(stored["cells"])
    assert run.FLAGSHIP_ANCHORS == {"active_set": chosen["active_set"], **flagship.ANCHOR_SHAPE}
    assert run.FLAGSHIP_KV_BLOCKS == chosen["kv_blocks"] == flagship.kv_blocks(chosen["kv_factor"])
    spec = _spec(build_parser().parse_args(run.command("flagship")), "sticky", 100.0)
    assert spec.workload == "flagship" and spec.kv_blocks == run.FLAGSHIP_KV_BLOCKS
    assert spec.workload_knobs == run.FLAGSHIP_ANCHORS
    assert (spec.profile, spec.replicas, spec.duration, spec.warmup, spec.seed) == \
        (flagship.PROFILE, 30, 150.0, 60.0, 0)
    full = _spec(build_parser().parse_args(run.command("flagship-full")), "sticky", 100.0)
    assert full.workload == "flagship" and full.workload_knobs == {} and full.kv_blocks is None
    assert "--active-set" in run.COMPARE["flagship-k128"]


def test_anchor_objective_and_refinement_cells():
    from experiments import flagship

    assert flagship.objective(0.641, 0.873) == 0.0
    assert flagship.objective(0.631, 0.883) == pytest.approx(0.02)
    cells = flagship.stage2_cells(4096, 1.0)
    assert (4096, 1.0) not in cells and len(cells) == 8
    assert {k for k, _ in cells} == {3456, 4096, 4864} and {f for _, f in cells} == {0.875, 1.0, 1.125}
    rows = [{"objective": 0.01, "kv_factor": 1.5, "active_set": 1024},
            {"objective": 0.01, "kv_factor": 1.0, "active_set": 2048},
            {"objective": 0.02, "kv_factor": 1.0, "active_set": 512}]
    assert flagship.best_cell(rows)["active_set"] == 2048          # tie: KV nearer the profile's
