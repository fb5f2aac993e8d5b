"""services.sim.tier's restarts: at the first pick at or past its time a member is replaced by a
fresh one that has the tier's current plan and, with `keep`, the old member's key memory and/or
cold-home record (issue 24 (e))."""

from __future__ import annotations

import pytest

from services.core.policies import make_policy
from services.core.policy import ClusterState, Pick, Reason
from services.core.request import Request
from services.sim.tier import Tier


class _Member:
    made = 0

    def __init__(self, i):
        _Member.made += 1
        self.i, self.plans, self.picks = i, [], 0

    def pick(self, request, state):
        self.picks += 1
        return Pick(self.i, Reason.COLD)

    def set_plan(self, plan):
        self.plans.append(plan)


def req(rid, at, key="k"):
    return Request(rid, at, key, 64, 16, ())


def test_a_member_is_replaced_at_its_time_with_the_current_plan():
    tier = Tier(_Member, 2, restarts=[(1.0, 1)])
    tier.set_plan("p1")
    s = ClusterState.empty(2)
    old = tier.members[1]
    tier.pick(req(0, 0.0), s)
    tier.pick(req(1, 0.5), s)          # member 1, before its restart
    assert tier.members[1] is old and tier.restarted == 0
    tier.pick(req(2, 1.0), s)          # member 0; the restart is due: made before this pick
    new = tier.members[1]
    assert new is not old and tier.restarted == 1
    assert new.plans == ["p1"] and new.picks == 0
    tier.pick(req(3, 1.5), s)
    assert new.picks == 1 and old.picks == 1


def test_bad_restarts_and_keeps_are_refused():
    with pytest.raises(ValueError, match="members 0..1"):
        Tier(_Member, 2, restarts=[(1.0, 2)])
    with pytest.raises(ValueError, match="unknown state"):
        Tier(_Member, 2, keep=("plan",))
    with pytest.raises(ValueError, match="needs CacheRoute members"):
        Tier(_Member, 2, keep=("memory",))


def _state():
    s = ClusterState.empty(2)
    s.kv_blocks = [64, 64]
    return s


def test_keep_carries_the_key_memory_and_the_record_and_fresh_carries_neither():
    def make(i):
        return make_policy("cacheroute", 2, seed=i)

    reqs = [Request(i, 0.1 * i, f"t{i % 3}", 64, 16, tuple(range(i % 3 * 10, i % 3 * 10 + 4))) for i in range(6)]
    for keep, memory, record in (((), False, False), (("memory",), True, False), (("record",), False, True),
                                 (("memory", "record"), True, True)):
        tier = Tier(make, 2, record_delay=0.0, restarts=[(0.45, 0)], keep=keep)
        tier.set_plan(None)
        s = _state()
        for r in reqs[:5]:
            tier.pick(r, s)
        old = tier.members[0]
        assert old._seen and old._index is not None
        tier.pick(reqs[5], s)              # at 0.5, past 0.45: the restart is made first
        new = tier.members[0]
        assert new is not old
        assert (new._seen is old._seen) == memory and (new._index is old._index) == record
        if not memory:
            assert new.remembered("t0") is None


def test_keep_peer_copies_the_next_members_state():
    def make(i):
        return make_policy("cacheroute", 2, seed=i)

    reqs = [Request(i, 0.1 * i, f"t{i % 3}", 64, 16, tuple(range(i % 3 * 10, i % 3 * 10 + 4))) for i in range(6)]
    tier = Tier(make, 2, record_delay=0.0, restarts=[(0.45, 0)], keep=("peer", "memory", "record"))
    tier.set_plan(None)
    s = _state()
    for r in reqs[:5]:
        tier.pick(r, s)
    peer = tier.members[1]
    tier.pick(reqs[5], s)
    new = tier.members[0]
    assert new._seen == peer._seen and new._seen is not peer._seen          # a copy, not shared
    assert new._index is not None and new._index is not peer._index
