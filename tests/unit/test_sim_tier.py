"""services.sim.tier: N policy instances behind one Service, requests round-robin over them."""

import pytest

from services.core.policy import ClusterState, Pick, Reason
from services.sim.tier import Tier


class _Recorder:
    name = "cacheroute"

    def __init__(self, i):
        self.i, self.picked, self.plans = i, 0, []

    def pick(self, request, state):
        self.picked += 1
        return Pick(self.i, Reason.COLD)

    def set_plan(self, plan):
        self.plans.append(plan)


def test_round_robin_and_every_member_gets_every_plan():
    tier = Tier(_Recorder, 4)
    state = ClusterState.empty(4)
    assert [tier.pick(None, state).replica for _ in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    tier.set_plan("p1")
    assert [m.plans for m in tier.members] == [["p1"]] * 4
    assert tier.name == "cacheroute" and [m.picked for m in tier.members] == [2, 2, 2, 2]


def test_needs_an_instance():
    with pytest.raises(ValueError):
        Tier(_Recorder, 0)


class _ShareReader(_Recorder):
    def pick(self, request, state):
        self.seen = state.share
        return super().pick(request, state)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_each_member_picks_with_a_share_of_one_over_n_and_the_state_is_restored(n):
    tier = Tier(_ShareReader, n)
    state = ClusterState.empty(4)
    assert state.share == 1.0
    for _ in range(n):
        tier.pick(None, state)
        assert state.share == 1.0
    assert [m.seen for m in tier.members] == [1.0 / n] * n
