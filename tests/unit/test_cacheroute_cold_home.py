"""The cacheroute policy's cold-home rule (issue 24 (d)): a planned key whose home no longer holds
its prefix (evicted: the policy's LRU of the blocks it routed there says so) is a cold prefill
anywhere, so it goes where the prefix is, else to the least-backlogged of its members and first
two ring replicas, instead of queueing at home; and the LRU itself."""

from __future__ import annotations

import pytest

from services.core.policies import make_policy
from services.core.policies._common import Ring
from services.core.policies.cacheroute import COLD_HOME, BlockLRU, KeyLRU
from services.core.policy import Reason
from tests.unit.test_policies_rules import R, make_plan, request, state_with

POOL = 64                                  # KV blocks per replica in these tests


def blocks(tag: int, n: int = 40) -> tuple[int, ...]:
    return tuple(tag * 1000 + i for i in range(n))


def cluster(backlog=None):
    s = state_with([0] * R, kv_blocks=[POOL] * R)
    if backlog is not None:
        s.prefill_tokens[:] = backlog
    return s


def evict_a_from_home(p, s, home=2):
    """Route key "a" home once, then two other planned keys' prompts there: 80 blocks > the pool."""
    assert p.pick(request("a", blocks(1)), s) == (home, Reason.PLANNED)
    for tag, key in ((2, "b"), (3, "c")):
        assert p.pick(request(key, blocks(tag)), s) == (home, Reason.PLANNED)


def test_default_is_the_index():
    assert COLD_HOME == "index"
    assert make_policy("cacheroute", R).cold_home == "index"
    with pytest.raises(ValueError, match="cold_home"):
        make_policy("cacheroute", R, cold_home="guess")


@pytest.mark.parametrize("rule", ["index", None])
def test_an_evicted_home_with_a_queue_is_left_for_the_least_backlogged_candidate(rule):
    p = make_policy("cacheroute", R, cold_home=rule)
    p.set_plan(make_plan({"a": (2,), "b": (2,), "c": (2,)}))
    s = cluster()
    evict_a_from_home(p, s)
    ring = [r for r in Ring(R).walk("a") if r != 2][:2]
    backlog = [0] * R
    backlog[2] = 6000                       # under the spill rule's one-step threshold (8,192)
    backlog[ring[0]] = 3000
    backlog[ring[1]] = 500
    s.prefill_tokens[:] = backlog
    pick = p.pick(request("a", blocks(1)), s)
    if rule is None:                        # without the rule: the plan's home, queue and all
        assert pick == (2, Reason.PLANNED)
    else:
        assert pick == (ring[1], Reason.FALLBACK)
        # the prefix is now cached there: the key's next request follows it, whatever the backlog
        s.prefill_tokens[ring[1]] = 9000
        assert p.pick(request("a", blocks(1)), s) == (ring[1], Reason.FALLBACK)


def test_a_home_that_holds_the_prefix_keeps_it_whatever_its_queue():
    p = make_policy("cacheroute", R)
    p.set_plan(make_plan({"a": (2,), "b": (2,)}))
    s = cluster()
    assert p.pick(request("a", blocks(1)), s) == (2, Reason.PLANNED)
    assert p.pick(request("b", blocks(2, 20)), s) == (2, Reason.PLANNED)   # 60 blocks: "a" still held
    s.prefill_tokens[:] = [0] * R
    s.prefill_tokens[2] = 6000
    assert p.pick(request("a", blocks(1)), s) == (2, Reason.PLANNED)


def test_an_evicted_home_that_is_the_least_backlogged_stays_planned():
    p = make_policy("cacheroute", R)
    p.set_plan(make_plan({"a": (2,), "b": (2,), "c": (2,)}))
    s = cluster()
    evict_a_from_home(p, s)
    s.prefill_tokens[:] = [100] * R
    s.prefill_tokens[2] = 0
    assert p.pick(request("a", blocks(1)), s) == (2, Reason.PLANNED)


def test_no_pool_size_no_rule():
    p = make_policy("cacheroute", R)
    p.set_plan(make_plan({"a": (2,), "b": (2,), "c": (2,)}))
    s = state_with([0] * R)                 # kv_blocks 0: not reported
    for tag, key in ((1, "a"), (2, "b"), (3, "c")):
        p.pick(request(key, blocks(tag)), s)
    s.prefill_tokens[:] = [0] * R
    s.prefill_tokens[2] = 6000
    assert p.pick(request("a", blocks(1)), s) == (2, Reason.PLANNED)


def test_block_lru_evicts_the_least_recently_routed_and_a_chain_loses_its_tail_first():
    lru = BlockLRU(2, 10)
    lru.insert(0, (1, 2, 3, 4, 5, 6))
    lru.insert(0, (11, 12))
    assert lru.match(0, (1, 2, 3, 4, 5, 6)) == 6
    lru.insert(0, (21, 22, 23))             # 11 blocks: one goes, the chain's tail (6)
    assert lru.match(0, (1, 2, 3, 4, 5, 6)) == 5
    lru.insert(0, (1, 2, 3))                # touched again: now the most recent
    lru.insert(0, (31, 32, 33, 34))
    assert lru.match(0, (1, 2, 3)) == 3
    assert lru.match(0, (11, 12)) == 0      # the oldest went first
    assert lru.match(1, (1,)) == 0          # per replica
    with pytest.raises(ValueError):
        BlockLRU(2, 0)


@pytest.mark.parametrize("rule", ["index", "keys"])
def test_without_block_hashes_the_rule_keeps_keys(rule):
    """The HTTP API sends no block hashes: "index" then records keys by their prompt tokens."""
    p = make_policy("cacheroute", R, cold_home=rule)
    p.set_plan(make_plan({"a": (2,), "b": (2,), "c": (2,)}))
    s = cluster()
    for key in ("a", "b", "c"):                  # 3 x 400 tokens = 75 blocks > the pool of 64
        assert p.pick(request(key, prompt=400), s) == (2, Reason.PLANNED)
    assert isinstance(p._index, KeyLRU)
    s.prefill_tokens[:] = [0] * R
    s.prefill_tokens[2] = 6000
    pick = p.pick(request("a", prompt=400), s)
    assert pick.reason is Reason.FALLBACK and pick.replica != 2
    assert p.pick(request("c", prompt=400), s) == (2, Reason.PLANNED)     # still held at home


def test_key_lru_weighs_keys_by_their_tokens():
    lru = KeyLRU(1, 10)                          # 160 tokens
    lru.insert(0, "a", 100)
    lru.insert(0, "b", 50)
    lru.insert(0, "a", 100)                      # touched: "b" is now the oldest
    lru.insert(0, "c", 20)                       # 170 tokens: the oldest, "b", goes
    assert [lru.holds(0, k) for k in "abc"] == [True, False, True]
    lru.insert(0, "d", 500)                      # larger than the pool: kept alone
    assert [lru.holds(0, k) for k in "abcd"] == [False, False, False, True]


def test_the_record_outlives_a_plan_install():
    """A dispatcher builds a policy per plan (carry_memory): what it routed stays known, so a key
    still cached at home stays there; a fresh record (a restarted dispatcher) knows nothing and
    leaves planned keys home until it has evicted something there."""
    p = make_policy("cacheroute", R)
    p.set_plan(make_plan({"a": (2,), "b": (2,), "c": (2,), "d": (2,)}))
    s = cluster()
    evict_a_from_home(p, s)                                  # home's record is full: "a" went
    assert p.pick(request("d", blocks(4, 10)), s) == (2, Reason.PLANNED)
    s.prefill_tokens[:] = [0] * R
    s.prefill_tokens[2] = 6000
    for carried in (True, False):
        q = make_policy("cacheroute", R)
        q.set_plan(make_plan({"a": (2,), "d": (2,)}))
        if carried:
            q.carry_memory(p)
            assert q.pick(request("d", blocks(4, 10)), s) == (2, Reason.PLANNED)   # recorded there
            assert q.pick(request("a", blocks(1)), s).replica != 2                  # evicted there
        else:
            assert q.pick(request("a", blocks(1)), s) == (2, Reason.PLANNED)        # nothing known


@pytest.mark.parametrize("fresh", ["home", "move"])
def test_a_never_seen_key_held_nowhere_stays_at_its_planned_home(fresh):
    """A key a new plan admits (never routed, no replica holds it) meets a full record at its
    home: with `cold_fresh` "home" (the default) it stays PLANNED and then lives there; "move"
    (the rule before) read it as evicted and sent it to the least-backlogged candidate for good."""
    p = make_policy("cacheroute", R, cold_fresh=fresh)
    p.set_plan(make_plan({"a": (2,), "b": (2,), "c": (2,), "new": (2,)}))
    s = cluster()
    evict_a_from_home(p, s)                 # the record at replica 2 is full
    backlog = [100] * R
    backlog[2] = 6000
    s.prefill_tokens[:] = backlog
    first = p.pick(request("new", blocks(9)), s)
    if fresh == "home":
        assert first == (2, Reason.PLANNED)
        assert p.pick(request("new", blocks(9)), s) == (2, Reason.PLANNED)   # held there now
    else:
        assert first.replica != 2 and first.reason == Reason.FALLBACK
    # a key the memory has seen keeps the rule: "a" was evicted at home and is moved either way
    assert p.pick(request("a", blocks(1)), s).reason == Reason.FALLBACK


def test_cold_fresh_is_checked():
    assert make_policy("cacheroute", R).cold_fresh == "home"
    with pytest.raises(ValueError, match="cold_fresh"):
        make_policy("cacheroute", R, cold_fresh="stay")
