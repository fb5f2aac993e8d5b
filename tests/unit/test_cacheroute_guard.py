"""The cacheroute policy's overload guard: bounded loads on planned keys, spill along the key's ring,
only when the spill pays for its prefill; and the cold tail with memory and two choices at first sight.
Tests of the bound alone set spill_cost=None and memory_keys=0 (the rule before issue 23's third pass)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.core.policies import make_policy
from services.core.policies._common import Ring
from services.core.policies.cacheroute import BALANCE_FACTOR
from services.core.policy import Reason
from tests.unit.test_policies_rules import R, make_plan, request, state_with


def bound(c, in_flight, healthy=None, floor=0):
    healthy = healthy or [True] * len(in_flight)
    live = sum(healthy)
    return max(floor, math.ceil(c * (sum(l for l, ok in zip(in_flight, healthy) if ok) + 1) / live))


def test_member_within_the_bound_is_planned():
    p = make_policy("cacheroute", R, balance_factor=1.25, spill_floor=0)
    p.set_plan(make_plan({"a": (2, 5)}))
    s = state_with([4, 4, 5, 4, 4, 5, 4, 4])        # bound ceil(1.25 * 35 / 8) = 6: 5 + 1 fits
    assert p.pick(request("a"), s) == (2, Reason.PLANNED)


def test_overloaded_members_spill_to_the_keys_ring_successor():
    p = make_policy("cacheroute", R, balance_factor=1.25, spill_floor=0, spill_cost=None, memory_keys=0)
    p.set_plan(make_plan({"a": (2, 5)}))
    s = state_with([1, 1, 9, 1, 1, 8, 1, 1])        # bound ceil(1.25 * 24 / 8) = 4
    pick = p.pick(request("a"), s)
    assert pick.reason is Reason.FALLBACK
    successor = next(r for r in Ring(R).walk("a") if r not in (2, 5))
    assert pick.replica == successor
    # repeated spills of one key stay on that replica while it is within the bound
    assert {p.pick(request("a"), s).replica for _ in range(20)} == {successor}


def test_spill_skips_unhealthy_and_full_successors():
    p = make_policy("cacheroute", R, balance_factor=1.0, spill_floor=0, spill_cost=None)
    p.set_plan(make_plan({"a": (2,)}))
    walk = [r for r in Ring(R).walk("a") if r != 2]
    load = [2] * R
    load[2] = 9
    load[walk[0]] = 6                               # over the bound
    healthy = [True] * R
    healthy[walk[1]] = False
    s = state_with(load, healthy=healthy)
    assert p.pick(request("a"), s) == (walk[2], Reason.FALLBACK)


def test_no_spill_below_the_floor():
    p = make_policy("cacheroute", R, spill_cost=None)   # defaults: c = 1.25, floor 8
    p.set_plan(make_plan({"a": (2,)}))
    s = state_with([0] * R)
    picks = []
    for _ in range(9):                              # a burst of one key on an idle cluster
        picks.append(p.pick(request("a"), s))
        s.in_flight[picks[-1].replica] += 1
    assert picks[:8] == [(2, Reason.PLANNED)] * 8
    assert picks[8].reason is Reason.FALLBACK and picks[8].replica != 2


def test_guard_off_and_ablations_keep_the_plain_rule():
    s = state_with([0, 0, 50, 0, 0, 0, 0, 0])
    off = make_policy("cacheroute", R, balance_factor=None)
    off.set_plan(make_plan({"a": (2,)}))
    assert off.pick(request("a"), s) == (2, Reason.PLANNED)
    for name in ("affinity", "affinity-replication"):
        p = make_policy(name, R)
        assert p.balance_factor is None
    assert make_policy("cacheroute", R).balance_factor == BALANCE_FACTOR
    for bad in (0.9, math.inf, math.nan):
        with pytest.raises(ValueError, match="balance_factor"):
            make_policy("cacheroute", R, balance_factor=bad)
    with pytest.raises(ValueError, match="spill_floor"):
        make_policy("cacheroute", R, spill_floor=-1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=R, max_size=R),
       st.lists(st.booleans(), min_size=R, max_size=R),
       st.sampled_from([1.0, 1.1, 1.25, 1.5, 2.0]),
       st.sampled_from(["a", "b", "cold"]),
       st.sampled_from([0, 8]))
def test_every_pick_is_healthy_and_planned_picks_respect_the_bound(load, healthy, c, key, floor):
    if not any(healthy):
        healthy[0] = True
    p = make_policy("cacheroute", R, balance_factor=c, spill_floor=floor, spill_cost=None, memory_keys=0)
    p.set_plan(make_plan({"a": (1, 4, 6), "b": (3,)}))
    s = state_with(load, healthy=healthy)
    pick = p.pick(request(key), s)
    assert healthy[pick.replica]
    members = {"a": (1, 4, 6), "b": (3,)}.get(key, ())
    if any(healthy[m] for m in members):           # (no healthy member: P2C fallback, unbounded)
        assert load[pick.replica] + 1 <= bound(c, load, healthy, floor)
        assert (pick.reason is Reason.PLANNED) == (pick.replica in members)


def test_cold_tail_keeps_a_key_at_home_below_the_floor():
    """The cold tail's bound has the planned path's floor: at low load a cold key stays on its ring
    home even while a few of its own requests are in flight there (without the floor the bound is
    ceil(1.25 x 2 / 8) = 1 here and the second request would go elsewhere)."""
    p = make_policy("cacheroute", R, memory_keys=0)   # no plan: every key is cold
    home = next(Ring(R).walk("tenant-0"))
    load = [0] * R
    load[home] = 1
    assert p.pick(request("tenant-0"), state_with(load)) == (home, Reason.COLD)
    load[home] = 7                                    # 7 + 1 <= floor 8
    assert p.pick(request("tenant-0"), state_with(load)).replica == home
    load[home] = 8                                    # past the floor: the next replica on the ring
    nxt = [r for r in Ring(R).walk("tenant-0")][1]
    assert p.pick(request("tenant-0"), state_with(load)) == (nxt, Reason.COLD)


def test_cold_tail_is_chwbl_above_the_floor():
    p = make_policy("cacheroute", R, spill_floor=0, memory_keys=0)
    for key in ("a", "b", "tenant-3"):
        walk = list(Ring(R).walk(key))
        load = [10] * R
        load[walk[0]] = 14                                  # bound ceil(1.25 x 85 / 8) = 14: 14 + 1 > 14
        assert p.pick(request(key), state_with(load)) == (walk[1], Reason.COLD)
        load[walk[0]] = 13
        assert p.pick(request(key), state_with(load)) == (walk[0], Reason.COLD)


def test_a_spill_must_pay_for_its_prefill():
    """Over the in-flight bound the member is left only when its queued prefill exceeds one engine
    step (spill_backlog) and the target's by more than spill_cost x the request's prefix."""
    p = make_policy("cacheroute", R, balance_factor=1.25, spill_floor=0)     # spill_cost 2, backlog 8192
    p.set_plan(make_plan({"a": (2,)}))
    load = [1, 1, 9, 1, 1, 1, 1, 1]                  # bound ceil(1.25 x 17 / 8) = 3: member 2 is over it
    successor = next(r for r in Ring(R).walk("a") if r != 2)
    q = request("a", blocks=range(100))              # 1,600 prefix tokens
    assert p.pick(q, state_with(load)) == (2, Reason.PLANNED)            # no backlog anywhere: stays
    backlog = [0] * R
    backlog[2] = 8000                                 # under one step: home starts it next step
    assert p.pick(q, state_with(load, prefill_tokens=backlog)) == (2, Reason.PLANNED)
    backlog[2] = 9000
    backlog[successor] = 6000                         # 3,000 less than home, under 2 x 1,600
    assert p.pick(q, state_with(load, prefill_tokens=backlog)) == (2, Reason.PLANNED)
    backlog[successor] = 5000                         # 4,000 less: pays
    assert p.pick(q, state_with(load, prefill_tokens=backlog)) == (successor, Reason.FALLBACK)
    with pytest.raises(ValueError, match="spill_cost"):
        make_policy("cacheroute", R, spill_cost=-1.0)


def test_cold_keys_return_to_their_replica_and_first_sight_takes_the_lighter_of_two():
    p = make_policy("cacheroute", R)                 # no plan: every key is cold
    walk = list(Ring(R).walk("t"))
    load = [4] * R
    assert p.pick(request("t"), state_with(load)) == (walk[0], Reason.COLD)   # owner at the mean: owner
    load[walk[0]] = 6                                 # one over the mean (ceil(34 / 8) = 5): still the owner
    assert make_policy("cacheroute", R).pick(request("t"), state_with(load)).replica == walk[0]
    load[walk[0]] = 7                                 # two over the mean (ceil(35 / 8) = 5)
    fresh = make_policy("cacheroute", R)
    assert fresh.pick(request("t"), state_with(load)).replica == walk[1]      # first sight: the lighter
    assert fresh.remembered("t") == walk[1]
    load[walk[1]] = 7                                 # still within the bound (max(8, ...)): it returns
    assert fresh.pick(request("t"), state_with(load)).replica == walk[1]
    # a key remembered by one instance survives a plan install (a dispatcher builds a new policy)
    nxt = make_policy("cacheroute", R)
    nxt.carry_memory(fresh)
    assert nxt.remembered("t") == walk[1]
    assert nxt.pick(request("t"), state_with(load)).replica == walk[1]


def test_first_sight_least_takes_the_least_loaded_replica_when_the_owner_is_over_the_mean():
    walk = list(Ring(R).walk("t"))
    load = [4] * R
    load[walk[0]] = 7                                 # owner two over the mean
    light = next(r for r in range(R) if r not in walk[:2])
    load[light] = 1                                   # the least loaded is not among the first two
    assert make_policy("cacheroute", R).pick(request("t"), state_with(load)).replica == walk[1]
    least = make_policy("cacheroute", R, first_sight="least")
    assert least.pick(request("t"), state_with(load)).replica == light
    load[walk[0]] = 5                                 # owner within one of the mean: the owner either way
    assert make_policy("cacheroute", R, first_sight="least").pick(request("t"), state_with(load)).replica == walk[0]
    with pytest.raises(ValueError, match="first_sight"):
        make_policy("cacheroute", R, first_sight="all")


def test_planned_picks_are_remembered_for_when_the_key_turns_cold():
    p = make_policy("cacheroute", R)
    p.set_plan(make_plan({"a": (5,)}))
    assert p.pick(request("a"), state_with([0] * R)) == (5, Reason.PLANNED)
    p.set_plan(make_plan({}))                          # "a" left the plan
    assert p.pick(request("a"), state_with([0] * R)) == (5, Reason.COLD)


def test_key_memory_is_bounded():
    p = make_policy("cacheroute", R, memory_keys=4)
    for i in range(20):
        p.pick(request(f"k{i}"), state_with([0] * R))
    assert len(p._seen) + len(p._seen_old) <= 8
    assert p.remembered("k19") is not None and p.remembered("k0") is None
    with pytest.raises(ValueError, match="memory_keys"):
        make_policy("cacheroute", R, memory_keys=-1)
