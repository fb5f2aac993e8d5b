"""The cold-home rule's two gates (services/core/policies/cacheroute.py, module header): the share
gate (the rule acts only when this router routes most of the cluster's requests in
flight, ClusterState.share >= SHARE_MIN (0.75), else its record cannot tell evicted from never-seen) and
the backlog gate (an evicted home is left only when its queued prefill exceeds one engine step,
`spill_backlog`, the spill rule's own threshold)."""

from __future__ import annotations

import pytest

from services.core.policies import make_policy
from services.core.policies._common import Ring
from services.core.policies.cacheroute import COLD_BACKLOG, COLD_SHARE, SHARE_MIN
from services.core.policy import Reason
from tests.unit.test_cacheroute_cold_home import blocks, cluster, evict_a_from_home
from tests.unit.test_policies_rules import R, make_plan, request


def evicted_home(backlog_home: int, share: float = 1.0, **knobs):
    """Key "a" evicted from its home 2, home's queue `backlog_home`, the ring's next two lighter."""
    p = make_policy("cacheroute", R, **knobs)
    p.set_plan(make_plan({"a": (2,), "b": (2,), "c": (2,)}))
    s = cluster()
    evict_a_from_home(p, s)
    backlog = [0] * R
    backlog[2] = backlog_home
    ring = [r for r in Ring(R).walk("a") if r != 2][:2]
    backlog[ring[0]], backlog[ring[1]] = 3000, 500
    s.prefill_tokens[:] = backlog
    s.share = share
    return p.pick(request("a", blocks(1)), s), ring


def test_defaults_share_gate_on_backlog_gate_off():
    """Adopted by docs/experiments.md "Cold-home rule in a tier": A (share gate) alone."""
    assert SHARE_MIN == 0.75 and COLD_SHARE is True and COLD_BACKLOG is False
    p = make_policy("cacheroute", R)
    assert p.cold_share is True and p.cold_backlog is False


def test_by_default_a_quarter_share_keeps_an_evicted_home():
    assert evicted_home(6000, 0.25)[0] == (2, Reason.PLANNED)


@pytest.mark.parametrize("share, moves", [(1.0, True), (0.75, True), (0.74, False), (0.5, False), (0.25, False)])
def test_share_gate(share, moves):
    pick, ring = evicted_home(6000, share, cold_share=True, cold_backlog=False)
    assert pick == ((ring[1], Reason.FALLBACK) if moves else (2, Reason.PLANNED))


def test_without_the_share_gate_a_quarter_share_still_moves():
    pick, ring = evicted_home(6000, 0.25, cold_share=False, cold_backlog=False)
    assert pick == (ring[1], Reason.FALLBACK)


@pytest.mark.parametrize("backlog, moves", [(0, False), (6000, False), (8192, False), (8193, True), (20000, True)])
def test_backlog_gate(backlog, moves):
    pick, ring = evicted_home(backlog, cold_share=False, cold_backlog=True)
    if moves:
        assert pick == (ring[1], Reason.FALLBACK)
    else:
        assert pick == (2, Reason.PLANNED)


def test_both_gates_must_pass():
    assert evicted_home(9000, 0.25, cold_share=True, cold_backlog=True)[0] == (2, Reason.PLANNED)
    assert evicted_home(6000, 1.0, cold_share=True, cold_backlog=True)[0] == (2, Reason.PLANNED)
    pick, ring = evicted_home(9000, 1.0, cold_share=True, cold_backlog=True)
    assert pick == (ring[1], Reason.FALLBACK)
