"""Shadow gate: records -> requests, the verdict rule, replays that pass and fail, the fallback rule."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from services.core.engine import PROFILES
from services.core.plan import Plan, ShadowReport
from services.core.planning import build_plan
from services.core.request import BLOCK_TOKENS
from services.core.shadow import (ReplayRecord, FallbackConfig, Observed, Replay, ShadowConfig, fallback_check,
                                  latest, records_to_requests, requests_to_records, scaled, validated_range, verdict)
from services.core.workloads import make_workload
from services.sim.replay import shadow_replay

P8 = PROFILES["llama3-8b-h100"]


def test_records_share_prefix_blocks_per_key_and_suffix_never_shared():
    recs = [ReplayRecord("b", 5.0, 900, 512, 10), ReplayRecord("a", 2.0, 1000, 640, 0),
            ReplayRecord("a", 3.0, 700, 320, 7), ReplayRecord("b", 4.0, 300, 512, 1)]
    reqs = records_to_requests(recs, default_output_tokens=99)
    assert [q.arrival for q in reqs] == [0.0, 1.0, 2.0, 3.0]
    assert [q.rid for q in reqs] == [0, 1, 2, 3]
    a1, a2, b1, b2 = reqs
    assert len(a1.blocks) == 640 // BLOCK_TOKENS and a1.output_tokens == 99
    assert a2.blocks == a1.blocks[: 320 // BLOCK_TOKENS] and a2.output_tokens == 7
    # the prefix is capped below the prompt: at least one token is always computed
    assert len(b1.blocks) == (300 - 1) // BLOCK_TOKENS
    assert b2.blocks[: len(b1.blocks)] == b1.blocks and len(b2.blocks) == 512 // BLOCK_TOKENS
    assert not set(a1.blocks) & set(b2.blocks)


def test_round_trip_through_records_keeps_the_prefix_structure():
    wl = make_workload("paper", qps=20, duration=10, seed=1, active_set=8)
    back = records_to_requests(requests_to_records(wl.requests))
    assert len(back) == len(wl.requests)
    for q, r in zip(wl.requests, back):
        assert (r.key, r.prompt_tokens, r.output_tokens, len(r.blocks)) == \
               (q.key, q.prompt_tokens, q.output_tokens, len(q.blocks))
        assert r.arrival == pytest.approx(q.arrival - wl.requests[0].arrival)


@pytest.mark.parametrize("bad", [ReplayRecord("", 0.0, 10, 0), ReplayRecord("k", math.nan, 10, 0),
                                 ReplayRecord("k", 0.0, 0, 0), ReplayRecord("k", 0.0, 10, -1)])
def test_bad_records_are_rejected(bad):
    with pytest.raises(ValueError):
        records_to_requests([bad])


def test_latest_and_scaled():
    recs = [ReplayRecord("k", float(t), 10, 0) for t in (3, 1, 2, 0)]
    assert [r.time for r in latest(recs, 2)] == [2.0, 3.0]
    reqs = records_to_requests(recs)
    assert [q.arrival for q in scaled(reqs, 2.0)] == [0.0, 0.5, 1.0, 1.5]


CFG = ShadowConfig(P8, 4, slo_p99=1.0, margin=0.1)


def side(hit, p99, cap, censored="none"):
    return Replay(hit, p99, cap, censored, ())


@pytest.mark.parametrize("cand, flat, passed", [
    (side(0.9, 0.5, 100), side(0.3, 1.0, 100), True),           # p99 better
    (side(0.9, 1.0, 120), side(0.3, 1.0, 100), True),           # capacity better
    (side(0.9, 0.95, 105), side(0.3, 1.0, 100), False),         # both better, but within the margin
    (side(0.95, 1.2, 80), side(0.01, 1.0, 100), False),         # hit rate alone never passes
    (side(0.9, math.inf, 0, "left"), side(0.3, math.inf, 0, "left"), False),   # unbounded p99
    (side(0.9, 1.0, 400, "right"), side(0.3, 1.0, 200, "right"), False),       # both off the grid
    (side(0.9, 1.0, 50), side(0.3, 1.0, 0, "left"), True),      # flat fails everywhere, candidate does not
])
def test_verdict(cand, flat, passed):
    ok, reason = verdict(cand, flat, CFG)
    assert ok is passed and reason


def small_stream(seed=0):
    # 24 keys with ~3.5k-token prefixes on 4 replicas of 40k cached tokens: Flat-LB cannot keep
    # every prefix everywhere (84k tokens), a plan can (6 keys a replica, 21k)
    wl = make_workload("paper", qps=24, duration=60, seed=seed, active_set=24)
    return requests_to_records(wl.requests)


def plan_for(records, table=None, replicas=4):
    counts: dict[str, int] = {}
    for r in records:
        counts[r.key] = counts.get(r.key, 0) + 1
    span = max(r.time for r in records) - min(r.time for r in records)
    keys = sorted(counts)
    plan = build_plan(keys, [counts[k] / span for k in keys], [f"r{i}" for i in range(replicas)], q_cap=4.0,
                      warm_slots=8)
    if table is None:
        return plan
    return Plan(**{**{f: getattr(plan, f) for f in plan.__dataclass_fields__}, "table": table})


SMALL = ShadowConfig(P8, 4, kv_blocks=2500, slo_p99=1.5, max_requests=800, load_scales=(1.0, 2.0, 3.0))


def test_replay_of_a_good_plan_passes_on_p99_or_capacity():
    recs = small_stream()
    report = shadow_replay(recs, plan_for(recs), SMALL)
    assert report.ran and report.requests == 800 and report.active_keys == 24
    assert report.candidate_hit_rate > report.flat_hit_rate
    assert report.passed, report.reason


def test_replay_of_a_plan_that_pins_everything_on_one_replica_fails():
    recs = small_stream()
    keys = {r.key for r in recs}
    # unguarded: the dispatcher's overload guard would spill this plan's excess (tested below)
    report = shadow_replay(recs, plan_for(recs, table={k: (0,) for k in keys}), replace(SMALL, balance_factor=None))
    assert report.ran and not report.passed
    assert report.candidate_ttft_p99 > report.flat_ttft_p99


def test_replay_needs_enough_records_and_matching_replicas():
    recs = small_stream()
    assert not shadow_replay(recs[:5], plan_for(recs), SMALL).ran
    with pytest.raises(ValueError):
        shadow_replay(recs, plan_for(recs, replicas=3), SMALL)


PASSED = ShadowReport(ran=True, passed=True, reason="ok", active_keys=100, candidate_ttft_p99=1.0,
                      flat_ttft_p99=1.2)


@pytest.mark.parametrize("validated, observed, mode", [
    (None, Observed(100, 1.0), "flat"),
    (ShadowReport(ran=True, passed=False, reason="worse"), Observed(100, 1.0), "flat"),
    (PASSED, Observed(100, 1.0), "planned"),
    (PASSED, Observed(100, math.nan), "planned"),
    (PASSED, Observed(149, 1.7), "planned"),              # inside: keys <= 150, p99 <= 1.75
    (PASSED, Observed(160, 1.0), "flat"),                 # too many active keys
    (PASSED, Observed(60, 1.0), "flat"),                  # too few (< 100 / 1.5)
    (PASSED, Observed(100, 1.8), "flat"),                 # p99 left the range under the plan
    (PASSED, Observed(100, 9.0, mode="flat"), "planned"),  # flat's p99 says nothing about the plan
    (ShadowReport(ran=True, passed=True, active_keys=100, candidate_ttft_p99=1.0, flat_ttft_p99=4.0),
     Observed(100, 3.9), "planned"),                    # still better than flat was on this traffic
    (ShadowReport(ran=True, passed=True, active_keys=100, candidate_ttft_p99=1.0, flat_ttft_p99=4.0),
     Observed(100, 4.1), "flat"),
])
def test_fallback_check(validated, observed, mode):
    got, reason = fallback_check(validated, observed, FallbackConfig(key_tolerance=0.5, p99_tolerance=0.5,
                                                                      p99_slack=0.25))
    assert got == mode and reason


def test_validated_range():
    (lo, hi), p99 = validated_range(PASSED, FallbackConfig(0.5, 0.5, 0.25))
    assert (lo, hi, p99) == pytest.approx((100 / 1.5, 150, 1.75))


def test_replay_dispatches_like_the_live_policy_with_the_overload_guard():
    recs = small_stream()
    keys = {r.key for r in recs}
    pinned = plan_for(recs, table={k: (0,) for k in keys})
    guarded = shadow_replay(recs, pinned, SMALL)
    unguarded = shadow_replay(recs, pinned, replace(SMALL, balance_factor=None))
    assert guarded.candidate_ttft_p99 < unguarded.candidate_ttft_p99
