"""Contract tests every policy must pass, plus the shared helpers."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.core.plan import Plan
from services.core.policies import PLANNED_POLICIES, POLICIES, make_policy
from services.core.policies._common import PrefixIndex, Ring, p2c
from services.core.policy import ClusterState, NoHealthyReplica, Reason
from services.core.request import Request
from services.core.workloads import make_workload

R = 8


def make_plan(table, rates=None, q_cap=10.0, replicas=R):
    rates = rates or {k: 1.0 for k in table}
    return Plan(version=1, parent_version=0, created_at=0.0,
                replica_ids=tuple(f"r{i}" for i in range(replicas)), q_cap=q_cap, warm_slots=4,
                table=table, rates=rates, expected_load=(1.0,) * replicas, predicted_imbalance=1.0,
                total_keys=len(table), admitted_keys=len(table), admitted_rate_share=1.0)


def request(key, rid=0, blocks=(), prompt=None, output=16):
    prompt = prompt if prompt is not None else 16 * len(blocks) + 32
    return Request(rid, float(rid), key, prompt, output, tuple(blocks))


def small_workload():
    return make_workload("paper", qps=200, duration=3, seed=4, active_set=32)


def drive(policy, requests, state, *, finish_every=3):
    """Route requests, mimicking an owner that updates load signals."""
    picks = []
    for i, r in enumerate(requests):
        pick = policy.pick(r, state)
        picks.append(pick)
        state.in_flight[pick.replica] += 1
        state.prefill_tokens[pick.replica] += r.prompt_tokens
        state.active_blocks[pick.replica] += len(r.blocks)
        if i % finish_every == 0:
            j = picks[i // 2].replica
            state.in_flight[j] = max(0, state.in_flight[j] - 1)
    return picks


def planned(name, seed=0, **knobs):
    p = make_policy(name, R, seed=seed, **knobs)
    w = small_workload()
    p.set_plan(make_plan({k: (i % R, (i + 3) % R) for i, k in enumerate(w.keys[:16])}))
    return p, w


@pytest.mark.parametrize("name", POLICIES)
def test_never_picks_an_unhealthy_replica(name):
    p, w = planned(name)
    state = ClusterState.empty(R)
    for r in (1, 4, 5):
        state.healthy[r] = False
    picks = drive(p, w.requests, state)
    assert {x.replica for x in picks} <= {0, 2, 3, 6, 7}
    assert all(isinstance(x.reason, Reason) for x in picks)


@pytest.mark.parametrize("name", POLICIES)
def test_raises_when_no_replica_is_healthy(name):
    p, w = planned(name)
    state = ClusterState.empty(R)
    state.healthy[:] = [False] * R
    with pytest.raises(NoHealthyReplica):
        p.pick(w.requests[0], state)


@pytest.mark.parametrize("name", POLICIES)
def test_single_healthy_replica_gets_everything(name):
    p, w = planned(name)
    state = ClusterState.empty(R)
    state.healthy[:] = [i == 6 for i in range(R)]
    assert {x.replica for x in drive(p, w.requests[:200], state)} == {6}


@pytest.mark.parametrize("name", POLICIES)
def test_same_seed_same_picks(name):
    runs = []
    for seed in (3, 3, 4):
        p, w = planned(name, seed=seed)
        runs.append([x.replica for x in drive(p, w.requests, ClusterState.empty(R))])
    assert runs[0] == runs[1]
    if name in ("flat",):
        assert runs[0] != runs[2]


@pytest.mark.parametrize("name", POLICIES)
def test_set_plan_none_is_accepted(name):
    p = make_policy(name, R)
    p.set_plan(None)
    pick = p.pick(request("x", blocks=(1, 2)), ClusterState.empty(R))
    assert 0 <= pick.replica < R
    if name not in PLANNED_POLICIES:
        assert pick.reason is Reason.COLD


def test_unknown_policy_lists_valid_names():
    with pytest.raises(ValueError, match="flat, sticky, chwbl, cacheroute"):
        make_policy("round-robin", R)
    with pytest.raises(ValueError):
        make_policy("flat", 0)
    with pytest.raises(TypeError):
        make_policy("flat", R, bogus=1)


# ---------------------------------------------------------------- helpers


def test_p2c_picks_the_less_loaded_of_two_distinct():
    state = ClusterState.empty(4)
    state.in_flight[:] = [9, 0, 0, 0]
    rng = random.Random(0)
    assert all(p2c(rng, state) != 0 for _ in range(500))   # replica 0 always loses its pair
    state.in_flight[:] = [0, 5, 5, 5]
    share = sum(p2c(rng, state) == 0 for _ in range(3000)) / 3000
    assert share == pytest.approx(0.5, abs=0.05)           # 0 wins iff drawn: P = 1 - 3/4 * 2/3


def test_ring_is_consistent_and_balanced():
    ring = Ring(30, 160)
    keys = [f"key{i}" for i in range(30_000)]
    owners = [ring.first(k) for k in keys]
    counts = [owners.count(r) for r in range(30)]
    assert max(counts) / (len(keys) / 30) < 1.35 and min(counts) / (len(keys) / 30) > 0.65
    assert Ring(30, 160).first("key7") == ring.first("key7")       # no per-process salt
    walk = list(ring.walk("key7"))
    assert sorted(walk) == list(range(30)) and walk[0] == ring.first("key7")
    assert ring.distinct("key7", 3) == tuple(walk[:3])
    # removing a replica only moves the keys it owned
    smaller = {k: next(r for r in ring.walk(k) if r != 5) for k in keys}
    assert all(smaller[k] == o for k, o in zip(keys, owners) if o != 5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=8),
       st.lists(st.integers(0, 3), min_size=1, max_size=12))
def test_prefix_index_match_is_the_longest_common_prefix(chains, probe):
    """Tokens are turned into chained hashes, so chains share exactly their common prefixes."""
    def hashes(tokens):
        return tuple(hash(tuple(tokens[: i + 1])) for i in range(len(tokens)))

    index = PrefixIndex(1, 10_000)
    for c in chains:
        index.insert(0, hashes(c))
    expected = 0
    for c in chains:
        n = 0
        while n < min(len(c), len(probe)) and c[n] == probe[n]:
            n += 1
        expected = max(expected, n)
    assert index.match(0, hashes(probe)) == expected


def test_prefix_index_is_bounded_and_forgets_old_chains():
    index = PrefixIndex(2, 100)
    chains = [tuple(range(k * 1000, k * 1000 + 30)) for k in range(10)]
    for c in chains:
        index.insert(0, c)
    assert index.size(0) <= 100 and index.size(1) == 0
    assert index.match(0, chains[-1]) == 30
    assert index.match(0, chains[0]) == 0
    assert index.match(1, chains[-1]) == 0
    assert index.match(0, chains[-1][:10] + (7, 8)) == 10
