"""Simulator: single-request timing, fast-forward vs plain stepping, routing bookkeeping,
in-run re-planning, failure injection, calibration."""

from __future__ import annotations

import math

import pytest

from services.core.engine import PROFILES, EngineModel
from services.core.policies import make_policy
from services.core.policy import NoHealthyReplica, Pick, Reason
from services.core.request import Request
from services.sim import calibrate
from services.sim.simulator import Failure, SimConfig, Simulator

P8 = PROFILES["llama3-8b-h100"]


class RoundRobin:
    name = "round-robin"

    def __init__(self):
        self.n = 0

    def pick(self, request, state):
        healthy = state.healthy_indices()
        if not healthy:
            raise NoHealthyReplica()
        self.n += 1
        return Pick(healthy[self.n % len(healthy)], Reason.COLD)

    def set_plan(self, plan):
        pass


def reqs(n, gap=0.05, prompt=600, output=40, keys=4):
    out = []
    for i in range(n):
        key = i % keys
        blocks = tuple(range(key * 1000, key * 1000 + 20))
        out.append(Request(i, i * gap, f"k{key}", prompt + (i * 37) % 200, output + (i * 13) % 60, blocks))
    return out


def test_single_request_ttft_is_one_prefill_step():
    q = [Request(0, 1.0, "k", 2048, 10)]
    res = Simulator(SimConfig(P8, 1, warmup=0.0), RoundRobin(), q).run()
    assert res.ttft[0] == pytest.approx(P8.prefill_time(2048))
    assert res.metrics.hit_rate == 0.0 and res.metrics.served == 1


def plain_ttfts(requests, kv_blocks=None):
    """One replica stepped one step at a time, no fast-forward."""
    e = EngineModel(P8, kv_blocks)
    ttft, now, i = {}, 0.0, 0
    while i < len(requests) or not e.idle:
        while i < len(requests) and requests[i].arrival <= now:
            e.add(requests[i], requests[i].arrival)
            i += 1
        if e.idle:
            now = requests[i].arrival
            continue
        r = e.step(now)
        now += r.duration
        for rid, _ in r.first_tokens:
            ttft[rid] = now - requests[rid].arrival
    return ttft


@pytest.mark.parametrize("kv_blocks", [None, 120])
def test_simulator_with_fast_forward_matches_plain_stepping(kv_blocks):
    q = reqs(150, gap=0.03)
    res = Simulator(SimConfig(P8, 1, kv_blocks=kv_blocks, warmup=0.0), RoundRobin(), q).run()
    expected = plain_ttfts(q, kv_blocks)
    assert res.ttft.tolist() == pytest.approx([expected[i] for i in range(len(q))], rel=1e-9, abs=1e-12)
    if kv_blocks is None:   # no queueing: decode stretches are collapsed into single events
        assert res.events < 6 * len(q)


def test_routing_bookkeeping_and_metrics():
    q = reqs(200, gap=0.01)
    sim = Simulator(SimConfig(P8, 4, warmup=0.5), RoundRobin(), q)
    res = sim.run()
    assert res.metrics.served_per_replica == tuple(sum(1 for i, r in enumerate(res.replica) if r == j and q[i].arrival >= 0.5) for j in range(4))
    assert res.metrics.imbalance == pytest.approx(1.0, abs=0.05)
    assert sim.state.in_flight == [0, 0, 0, 0]
    assert all(e.idle for e in sim.engines)
    # 4 keys of 20 shared blocks (320 of ~700 prompt tokens), all cached after the first
    assert 0.4 < res.metrics.hit_rate < 0.47
    assert not math.isnan(res.metrics.ttft_p99)


def test_failure_loses_in_flight_requests_and_replica_returns():
    q = reqs(300, gap=0.01, output=200)
    cfg = SimConfig(P8, 2, warmup=0.0, failures=(Failure(1, at=1.0, back=2.0),))
    sim = Simulator(cfg, RoundRobin(), q)
    res = sim.run()
    assert res.metrics.failed > 0
    lost = [i for i in range(len(q)) if res.failed[i]]
    assert all(res.replica[i] == 1 and q[i].arrival < 1.0 for i in lost)
    # while down nothing is routed to replica 1; after it returns it serves again
    assert all(res.replica[i] == 0 for i in range(len(q)) if 1.0 <= q[i].arrival < 2.0)
    assert any(res.replica[i] == 1 for i in range(len(q)) if q[i].arrival >= 2.0)
    assert sim.state.in_flight == [0, 0]


def test_planned_policy_is_replanned_from_measured_rates():
    q = reqs(1500, gap=0.02, keys=12)
    # a replica caches 400 blocks: not the 12 x 20 prefix blocks plus running requests
    # (Flat-LB), but easily a plan's 3 keys
    cfg = SimConfig(P8, 4, kv_blocks=400, q_cap=5.0, control_interval=5.0, warmup=5.0)
    res = Simulator(cfg, make_policy("cacheroute", 4, seed=1), q).run()
    assert [p.version for p in res.plans] == list(range(1, len(res.plans) + 1))
    assert len(res.plans) == 5                     # t = 5, 10, ..., 25 within 30 s of arrivals
    assert res.plans[0].total_keys == 12 and res.plans[0].q_cap == 5.0
    flat = Simulator(SimConfig(P8, 4, kv_blocks=400, warmup=5.0), make_policy("flat", 4, seed=1), q).run()
    assert res.metrics.hit_rate > flat.metrics.hit_rate + 0.05


def test_warm_slots_arithmetic():
    # 70B: 14,100 blocks x 16 tokens x 0.5 / 3,480 tokens = 32 prefixes
    assert calibrate.warm_slots(PROFILES["llama3-70b-fp8-h100x2"], 3480, 0.5) == 32
    assert calibrate.warm_slots(P8, 1e9) == 1


def test_replica_slice_deals_ranked_keys_round_robin():
    q = [Request(i, i, f"k{k}", 100, 1) for i, k in enumerate([0] * 5 + [1] * 4 + [2] * 3 + [3] * 2)]
    assert {r.key for r in calibrate.replica_slice(q, 2)} == {"k0", "k2"}


def test_q_cap_calibration_finds_a_knee():
    q = reqs(400, gap=0.1, prompt=1500, output=100, keys=3)
    cap = calibrate.calibrate_q_cap(P8, q, 1, samples=300, iterations=3)
    assert 0.5 < cap < 1e3
    low = calibrate.p99_at(P8, q[:300], 0.25)
    assert calibrate.p99_at(P8, q[:300], cap) <= 3 * low
    assert calibrate.p99_at(P8, q[:300], cap * 4) > 3 * low
