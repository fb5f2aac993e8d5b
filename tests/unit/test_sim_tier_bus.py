"""services.sim.tier's record bus: every member's pick reaches every other member's `observe` once
the simulated clock (the arrival of the request being picked) has reached pick time + record_delay,
oldest pick first; members pick with share 1.0 while it is on."""

from __future__ import annotations

import math

import pytest

from services.core.policies import make_policy
from services.core.policy import ClusterState, Pick, Reason
from services.core.request import Request
from services.sim.tier import Tier
from tests.unit.test_cacheroute_cold_home import blocks, cluster
from tests.unit.test_policies_rules import make_plan


class _Observer:
    """Picks its own index; logs what it observes and how much it had observed at each pick."""

    name = "cacheroute"

    def __init__(self, i):
        self.i, self.seen, self.at_pick, self.shares, self.memory = i, [], [], [], []

    def pick(self, request, state):
        self.at_pick.append(len(self.seen))
        self.shares.append(state.share)
        return Pick(self.i, Reason.COLD)

    def observe(self, replica, request, state=None, *, memory=True):
        self.seen.append((replica, request.rid))
        self.memory.append(memory)

    def set_plan(self, plan):
        pass


class _Deaf(_Observer):
    observe = None       # a policy without observe(): the bus skips it


def req(rid, at, key="k", blk=()):
    return Request(rid, at, key, 16 * len(blk) + 32, 16, tuple(blk))


def test_each_pick_reaches_every_other_member_after_the_delay_in_pick_order():
    tier = Tier(_Observer, 3, record_delay=0.125)         # binary fractions: exact sums
    s = ClusterState.empty(3)
    for rid, at in enumerate((0.0, 0.0625, 0.125, 0.1875, 0.5)):
        tier.pick(req(rid, at), s)
    m0, m1, m2 = tier.members
    # pick 0 (due 0.125) is delivered before pick 2 at 0.125; pick 1 (due 0.1875) before pick 3;
    # picks 2 and 3 (due 0.25, 0.3125) before pick 4 at 0.5; pick 4 (due 0.625) is still queued
    assert m0.seen == [(1, 1), (2, 2)]
    assert m1.seen == [(0, 0), (2, 2), (0, 3)]
    assert m2.seen == [(0, 0), (1, 1), (0, 3)]
    assert m0.at_pick == [0, 1] and m1.at_pick == [0, 3] and m2.at_pick == [1]
    assert [x for m in tier.members for x in m.shares] == [1.0] * 5
    assert tier.delivered == 8 and all(all(m.memory) for m in tier.members)


def test_members_without_observe_get_nothing_and_memory_is_passed_through():
    tier = Tier(lambda i: (_Deaf if i == 1 else _Observer)(i), 2, record_delay=0.0, record_memory=False)
    s = ClusterState.empty(2)
    for rid, at in enumerate((0.0, 1.0, 2.0)):
        tier.pick(req(rid, at), s)
    assert tier.members[0].seen == [(1, 1)] and tier.members[0].memory == [False]
    assert tier.members[1].seen == []
    assert tier.delivered == 1


def test_without_the_bus_nothing_is_delivered_and_the_share_is_one_over_n():
    tier = Tier(_Observer, 2)
    s = ClusterState.empty(2)
    for rid, at in enumerate((0.0, 1.0, 2.0, 3.0)):
        tier.pick(req(rid, at), s)
    assert tier.delivered == 0 and [m.seen for m in tier.members] == [[], []]
    assert [m.shares for m in tier.members] == [[0.5, 0.5]] * 2 and s.share == 1.0


@pytest.mark.parametrize("delay", [-0.1, math.nan])
def test_a_bad_delay_is_refused(delay):
    with pytest.raises(ValueError, match="record_delay"):
        Tier(_Observer, 2, record_delay=delay)


def planned_tier(delay):
    def make(i):
        p = make_policy("cacheroute", 8, seed=i)
        p.set_plan(make_plan({"a": (2,), "b": (2,), "c": (2,), "d": (5,)}))
        return p
    return Tier(make, 2, record_delay=delay)


def run_until(tier, s, last_at):
    """m0 routes "a" home at 0; m1 routes "b" and "c" home (0.01, 0.03: 80 blocks, more than the
    pool, so home evicts "a"); m0 routes "d" elsewhere at 0.02; then m0 picks "a" at `last_at`."""
    for rid, (at, key, tag) in enumerate(((0.0, "a", 1), (0.01, "b", 2), (0.02, "d", 4), (0.03, "c", 3))):
        pick = tier.pick(req(rid, at, key, blocks(tag)), s)
        assert pick == ((5 if key == "d" else 2), Reason.PLANNED)
    s.prefill_tokens[2] = 6000          # home has a backlog: a cold prefill goes elsewhere
    return tier.pick(req(9, last_at, "a", blocks(1)), s)


@pytest.mark.parametrize("last_at", [0.05, 0.1299])
def test_a_peers_eviction_is_not_seen_before_the_delay(last_at):
    tier, s = planned_tier(0.1), cluster()
    assert run_until(tier, s, last_at) == (2, Reason.PLANNED)       # m0's record still holds "a"


@pytest.mark.parametrize("last_at", [0.13, 0.5])
def test_a_peers_eviction_is_seen_after_the_delay(last_at):
    tier, s = planned_tier(0.1), cluster()
    m0 = tier.members[0]
    moved = run_until(tier, s, last_at)
    assert moved.reason == Reason.FALLBACK and moved.replica != 2
    assert m0._index.match(2, blocks(1)) < len(blocks(1)) // 2


def test_without_the_bus_the_tier_keeps_the_evicted_home():
    """Control: no bus, m0's record never hears of "b" and "c" (and share 1/2 gates the rule)."""
    tier, s = planned_tier(None), cluster()
    assert run_until(tier, s, 0.5) == (2, Reason.PLANNED)


def test_run_spec_runs_a_tier_with_the_bus_and_refuses_an_empty_tier():
    """services.sim.runs.RunSpec.tier / record_delay (experiments/bus_mooncake.py uses them)."""
    from services.sim.runs import RunSpec, run_spec

    spec = RunSpec(policy="cacheroute", qps=6.0, replicas=3, profile="llama3-8b-h100", duration=20.0, seed=1,
                   q_cap=2.0, control_interval=5.0, tier=2, record_delay=0.1)
    out = run_spec(spec)
    assert out["requests"] > 0 and 0.0 <= out["hit_rate"] <= 1.0
    with pytest.raises(ValueError, match="at least one instance"):
        run_spec(RunSpec(policy="cacheroute", qps=6.0, replicas=3, profile="llama3-8b-h100", duration=20.0,
                         tier=0))
