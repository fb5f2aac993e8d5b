"""The cacheroute policy's warm spill (issue 23): a planned request over the in-flight bound goes to
the least-loaded replica whose record holds its whole reusable prefix, when that replica is less
loaded than the planned member and within the bound; such a spill re-prefills nothing, so it needs
no `_pays` test. A replica holding only part of the prefix (a shared system prompt) is not warm."""

from __future__ import annotations

import pytest

from services.core.policies import make_policy
from services.core.policies.cacheroute import WARM_SPILL, WARM_SPILLS
from services.core.policy import Reason
from tests.unit.test_policies_rules import R, make_plan, request, state_with

POOL = 1000                                 # KV blocks per replica: nothing is evicted here
HOME, WARM, PART = 2, 5, 6


def blocks(tag: int, n: int = 40) -> tuple[int, ...]:
    return tuple(tag * 1000 + i for i in range(n))


def setup(warm_spill=WARM_SPILL, *, partial_only: bool = False):
    """Key "a" planned on HOME and routed there; a peer's route put all of "a"'s prefix on WARM
    (or, with `partial_only`, only its first half on PART, as a shared system prompt would)."""
    p = make_policy("cacheroute", R, warm_spill=warm_spill)
    p.set_plan(make_plan({"a": (HOME,)}))
    s = state_with([0] * R, kv_blocks=[POOL] * R)
    assert p.pick(request("a", blocks(1)), s) == (HOME, Reason.PLANNED)
    if partial_only:
        p.observe(PART, request("x", blocks(1, 20)), state=s)
    else:
        p.observe(WARM, request("a", blocks(1)), state=s)
    return p, s


def test_default_and_choices():
    assert WARM_SPILL == "over"
    assert make_policy("cacheroute", R).warm_spill == "over"
    assert set(WARM_SPILLS) == {None, "over", "always"}
    with pytest.raises(ValueError, match="warm_spill"):
        make_policy("cacheroute", R, warm_spill="sometimes")


@pytest.mark.parametrize("rule", ["over", "always", None])
def test_over_the_bound_the_request_goes_where_its_prefix_is(rule):
    p, s = setup(rule)
    s.in_flight[HOME] = 20                  # bound max(8, ceil(1.25 x 21 / 8)) = 8: HOME is over it
    pick = p.pick(request("a", blocks(1)), s)
    if rule is None:                        # the spill rule alone: no queued prefill, so no spill pays
        assert pick == (HOME, Reason.PLANNED)
    else:
        assert pick == (WARM, Reason.FALLBACK)


def test_a_replica_holding_part_of_the_prefix_is_not_warm():
    p, s = setup(partial_only=True)
    s.in_flight[HOME] = 20
    assert p.pick(request("a", blocks(1)), s) == (HOME, Reason.PLANNED)


def test_a_warm_replica_over_the_bound_or_as_loaded_is_not_taken():
    p, s = setup()
    s.in_flight[HOME] = 20
    s.in_flight[WARM] = 20                  # within neither the bound nor below HOME's load
    assert p.pick(request("a", blocks(1)), s) == (HOME, Reason.PLANNED)


@pytest.mark.parametrize("rule,moves", [("over", False), ("always", True)])
def test_within_the_bound_only_always_moves(rule, moves):
    p, s = setup(rule)
    s.in_flight[HOME] = 5                   # 6 <= bound 8: not over
    pick = p.pick(request("a", blocks(1)), s)
    assert pick == ((WARM, Reason.FALLBACK) if moves else (HOME, Reason.PLANNED))


def test_off_in_a_tier_without_the_bus():
    p, s = setup()
    s.in_flight[HOME] = 20
    s.share = 0.25                          # one of four routers: the record is a quarter of the truth
    assert p.pick(request("a", blocks(1)), s) == (HOME, Reason.PLANNED)


def test_key_records_hold_by_key():
    """Requests without block hashes (the HTTP API) are recorded by key: a peer's route of the key
    to WARM makes WARM warm for it."""
    p = make_policy("cacheroute", R)
    p.set_plan(make_plan({"a": (HOME,)}))
    s = state_with([0] * R, kv_blocks=[POOL] * R)
    assert p.pick(request("a", prompt=4000), s) == (HOME, Reason.PLANNED)
    p.observe(WARM, request("a", prompt=4000), state=s)
    s.in_flight[HOME] = 20
    assert p.pick(request("a", prompt=4000), s) == (WARM, Reason.FALLBACK)
