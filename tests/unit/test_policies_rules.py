"""The property each policy's rule promises, table-driven where the rule allows."""

import math

import pytest

from services.core.plan import Plan
from services.core.policies import make_policy
from services.core.policies.affinity_replication import replicas_needed
from services.core.policies.cacheroute import DEFAULT_COLD_TAIL
from services.core.policy import ClusterState, Reason
from services.core.request import Request

R = 8


def make_plan(table, rates=None, q_cap=10.0):
    rates = rates or {k: 1.0 for k in table}
    return Plan(version=1, parent_version=0, created_at=0.0,
                replica_ids=tuple(f"r{i}" for i in range(R)), q_cap=q_cap, warm_slots=4,
                table=table, rates=rates, expected_load=(1.0,) * R, predicted_imbalance=1.0,
                total_keys=len(table), admitted_keys=len(table), admitted_rate_share=1.0)


def request(key, blocks=(), prompt=None):
    prompt = prompt if prompt is not None else 16 * len(blocks) + 32
    return Request(0, 0.0, key, prompt, 16, tuple(blocks))


def state_with(in_flight=None, **lists):
    s = ClusterState.empty(R)
    if in_flight is not None:
        s.in_flight[:] = in_flight
    for name, values in lists.items():
        getattr(s, name)[:] = values
    return s


# ---------------------------------------------------------------- flat / sticky / chwbl


def test_flat_avoids_the_overloaded_replica():
    p = make_policy("flat", R, seed=1)
    s = state_with([50, 0, 0, 0, 0, 0, 0, 0])
    picks = [p.pick(request(f"k{i}"), s) for i in range(400)]
    assert all(x.replica != 0 and x.reason is Reason.COLD for x in picks)
    assert len({x.replica for x in picks}) == R - 1


def test_sticky_keeps_a_key_on_one_replica_and_moves_it_only_when_down():
    p = make_policy("sticky", R)
    s = ClusterState.empty(R)
    owners = {f"k{i}": p.pick(request(f"k{i}"), s).replica for i in range(200)}
    assert len(set(owners.values())) == R
    s.in_flight[:] = [100] * R                      # load never matters
    assert all(p.pick(request(k), s).replica == o for k, o in owners.items())
    s.healthy[3] = False
    moved = {k: p.pick(request(k), s).replica for k in owners}
    assert all(moved[k] == o for k, o in owners.items() if o != 3)
    assert all(moved[k] != 3 for k in owners)


@pytest.mark.parametrize("c", [1.0, 1.25, 2.0])
def test_chwbl_respects_the_load_bound(c):
    p = make_policy("chwbl", R, c=c)
    s = ClusterState.empty(R)
    for i in range(600):
        pick = p.pick(request(f"k{i % 7}"), s)
        total = sum(s.in_flight)
        assert s.in_flight[pick.replica] + 1 <= math.ceil(c * (total + 1) / R)
        s.in_flight[pick.replica] += 1
        if i % 2:
            busiest = max(range(R), key=s.in_flight.__getitem__)
            s.in_flight[busiest] -= 1


def test_chwbl_is_sticky_below_the_bound():
    sticky, chwbl = make_policy("sticky", R), make_policy("chwbl", R)
    s = state_with([2] * R)
    for i in range(100):
        assert chwbl.pick(request(f"k{i}"), s).replica == sticky.pick(request(f"k{i}"), s).replica


def test_chwbl_rejects_c_below_one():
    with pytest.raises(ValueError):
        make_policy("chwbl", R, c=0.9)


# ---------------------------------------------------------------- cacheroute and ablations


@pytest.mark.parametrize(
    "in_flight, healthy, key, want_replica, want_reason",
    [
        ([0] * 8, [True] * 8, "a", 2, Reason.PLANNED),                    # first member on ties
        ([0, 0, 5, 0, 0, 1, 0, 0], [True] * 8, "a", 5, Reason.PLANNED),   # least-loaded member
        ([0] * 8, [True, True, False] + [True] * 5, "a", 5, Reason.PLANNED),
        ([0] * 8, [True] * 8, "b", 7, Reason.PLANNED),
        ([0] * 8, [True] * 7 + [False], "b", None, Reason.FALLBACK),     # no healthy member
        ([0] * 8, [True] * 8, "zzz", None, Reason.COLD),                 # cold tail
    ],
)
def test_cacheroute_dispatch(in_flight, healthy, key, want_replica, want_reason):
    p = make_policy("cacheroute", R)
    p.set_plan(make_plan({"a": (2, 5), "b": (7,)}))
    pick = p.pick(request(key), state_with(in_flight, healthy=healthy))
    assert pick.reason is want_reason
    if want_replica is not None:
        assert pick.replica == want_replica
    assert healthy[pick.replica]


def test_cacheroute_default_cold_tail_is_chwbl():
    # docs/experiments.md ("Session-aware cold tail") and the policy header name chwbl the default
    p = make_policy("cacheroute", R, seed=2, memory_keys=0)    # the ring rule alone (memory: test_cacheroute_guard)
    assert p.cold == DEFAULT_COLD_TAIL == "chwbl"
    p.set_plan(make_plan({"a": (2,)}))
    s = state_with([0, 9, 9, 9, 9, 9, 9, 9])
    ring = make_policy("chwbl", R, seed=5)
    for i in range(50):
        pick = p.pick(request(f"c{i}"), s)
        assert pick == (ring.pick(request(f"c{i}"), s).replica, Reason.COLD)


def test_ablations_keep_the_papers_p2c_cold_tail():
    assert make_policy("affinity", R).cold == make_policy("affinity-replication", R).cold == "p2c"


def test_cacheroute_fallback_and_cold_use_p2c():
    p = make_policy("cacheroute", R, seed=2, cold="p2c")
    p.set_plan(make_plan({"a": (2,)}))
    s = state_with([0, 9, 9, 9, 9, 9, 9, 9])
    cold = [p.pick(request(f"c{i}"), s) for i in range(200)]
    assert {x.reason for x in cold} == {Reason.COLD}
    assert sum(x.replica == 0 for x in cold) > 40            # the idle replica wins every pair it is in
    p.set_flat_fallback(True)
    picks = [p.pick(request("a"), s) for _ in range(200)]
    assert {x.reason for x in picks} == {Reason.FALLBACK}
    assert len({x.replica for x in picks}) > 1
    p.set_flat_fallback(False)
    assert p.pick(request("a"), s) == (2, Reason.PLANNED)


def test_cacheroute_flat_fallback_knob_and_cold_tail_knob():
    p = make_policy("cacheroute", R, flat_fallback=True)
    p.set_plan(make_plan({"a": (2,)}))
    assert p.pick(request("a"), ClusterState.empty(R)).reason is Reason.FALLBACK
    with pytest.raises(ValueError, match="p2c, chwbl"):
        make_policy("cacheroute", R, cold="ring")


def test_cacheroute_chwbl_cold_tail_is_session_sticky():
    p = make_policy("cacheroute", R, cold="chwbl")
    p.set_plan(make_plan({"a": (2,)}))
    s = ClusterState.empty(R)
    first = {f"c{i}": p.pick(request(f"c{i}"), s) for i in range(50)}
    assert all(x.reason is Reason.COLD for x in first.values())
    assert all(p.pick(request(k), s) == x for k, x in first.items())


def test_cacheroute_rejects_plans_outside_the_cluster_and_clears_on_none():
    p = make_policy("cacheroute", R)
    with pytest.raises(ValueError):
        p.set_plan(make_plan({"a": (2, 8)}))
    p.set_plan(make_plan({"a": (2,)}))
    p.set_plan(None)
    assert p.pick(request("a"), ClusterState.empty(R)).reason is Reason.COLD


def test_affinity_pins_each_admitted_key_to_one_hashed_replica():
    p = make_policy("affinity", R)
    keys = [f"k{i}" for i in range(64)]
    p.set_plan(make_plan({k: (0, 1, 2) for k in keys}))   # the plan's placement is ignored
    s = ClusterState.empty(R)
    owners = {}
    for _ in range(3):
        for k in keys:
            pick = p.pick(request(k), s)
            assert pick.reason is Reason.PLANNED
            assert owners.setdefault(k, pick.replica) == pick.replica
            s.in_flight[pick.replica] += 1
    assert len(set(owners.values())) > 3
    assert p.pick(request("cold"), s).reason is Reason.COLD


@pytest.mark.parametrize("rate, q_cap, want", [(0.1, 10, 1), (10, 10, 1), (10.5, 10, 2),
                                                 (35, 10, 4), (1e6, 10, R), (3, 0, 1)])
def test_replicas_needed(rate, q_cap, want):
    assert replicas_needed(rate, q_cap, R) == want


def test_affinity_replication_spreads_a_whale_over_k_b_members():
    p = make_policy("affinity-replication", R)
    p.set_plan(make_plan({"whale": (0,), "minnow": (0,)}, rates={"whale": 35.0, "minnow": 1.0},
                         q_cap=10.0))
    s = ClusterState.empty(R)
    whale = set()
    for _ in range(40):
        pick = p.pick(request("whale"), s)
        whale.add(pick.replica)
        s.in_flight[pick.replica] += 1
    assert len(whale) == 4
    minnow = {p.pick(request("minnow"), s).replica for _ in range(10)}
    assert len(minnow) == 1


# ---------------------------------------------------------------- prefix-aware peers

CHAIN = tuple(range(1000, 1040))          # a 40-block shared prefix (640 tokens)


def test_sglang_follows_its_tree_when_balanced():
    p = make_policy("sglang", R)
    s = ClusterState.empty(R)
    first = p.pick(request("a", blocks=CHAIN), s).replica
    s.in_flight[first] += 3                                   # busier, but balanced by SGLang's test
    assert p.pick(request("a", blocks=CHAIN), s).replica == first


def test_sglang_miss_goes_to_the_smallest_tree():
    p = make_policy("sglang", R)
    s = ClusterState.empty(R)
    used = [p.pick(request(f"k{i}", blocks=tuple(range(i * 100, i * 100 + 10 + i))), s).replica
            for i in range(R)]
    assert sorted(used) == list(range(R))                     # each miss fills an empty tree first
    low = tuple(range(5000, 5010)) + (1,)
    assert p.pick(request("x", blocks=low), s).replica == used[0]   # smallest tree = 10 blocks


def test_sglang_partial_match_below_threshold_is_a_miss():
    p = make_policy("sglang", R)
    s = ClusterState.empty(R)
    warm = p.pick(request("a", blocks=CHAIN), s).replica
    # 10 of 40 blocks shared = 25% of the prompt < 0.3
    probe = CHAIN[:10] + tuple(range(9000, 9030))
    assert p.pick(request("b", blocks=probe, prompt=640), s).replica != warm


def test_sglang_imbalance_switches_to_shortest_queue():
    p = make_policy("sglang", R)
    s = ClusterState.empty(R)
    warm = p.pick(request("a", blocks=CHAIN), s).replica
    s.in_flight[:] = [70] * R
    s.in_flight[warm] = 200
    s.in_flight[(warm + 3) % R] = 60            # max - min = 140 > 64 and 200 > 1.5 * 60
    assert p.pick(request("a", blocks=CHAIN), s).replica == (warm + 3) % R
    # that pick warmed (warm + 3) too; now balanced (max - min = 60): cache routing picks
    # the less-loaded warm tree, not the globally shortest queue (warm + 5, cold)
    s.in_flight[:] = [150] * R
    s.in_flight[warm] = 200
    s.in_flight[(warm + 5) % R] = 140
    assert p.pick(request("a", blocks=CHAIN), s).replica == (warm + 3) % R


@pytest.mark.parametrize(
    "kv_warm, load_warm, expect_warm",
    [(0.0, 0, True),      # 3 + 2 + 2 vs 0 + 2 + 2
     (0.0, 4, True),      # 3 + 0 + 2 vs 0 + 2 + 2
     (0.8, 4, False),     # 3 + 0 + 0.4 vs 4
     (0.6, 0, True)],     # 3 + 2 + 0.8 vs 4
)
def test_llmd_weighted_score(kv_warm, load_warm, expect_warm):
    p = make_policy("llmd", R, seed=1)
    s = ClusterState.empty(R)
    warm = p.pick(request("a", blocks=CHAIN), s).replica
    s.kv_usage[warm] = kv_warm
    s.in_flight[warm] = load_warm
    assert (p.pick(request("a", blocks=CHAIN), s).replica == warm) is expect_warm


def test_dynamo_uses_the_oracle_and_minimises_cost():
    p = make_policy("dynamo", R)
    cached = {3: 40, 5: 20}
    s = ClusterState.empty(R)
    s.prefix_match = lambda r, blocks: cached.get(r, 0)
    req = request("a", blocks=CHAIN, prompt=41 * 16)         # 41 blocks in all
    assert p.pick(req, s).replica == 3                        # cost 1 vs 21 vs 41
    s.active_blocks[3] = 25                                   # 1 + 25 > 21 + 0
    assert p.pick(req, s).replica == 5
    p2 = make_policy("dynamo", R, overlap_weight=0.1)         # decode load dominates
    s.active_blocks[:] = [0, 0, 0, 25, 0, 3, 0, 0]
    assert p2.pick(req, s).replica not in (3, 5)


def test_dynamo_without_oracle_learns_from_routing():
    p = make_policy("dynamo", R)
    s = ClusterState.empty(R)
    first = p.pick(request("a", blocks=CHAIN), s).replica
    assert p.pick(request("a", blocks=CHAIN), s).replica == first


@pytest.mark.parametrize("cached_blocks, exploit", [(40, True), (21, True), (19, False)])
def test_preble_exploits_only_long_matches(cached_blocks, exploit):
    p = make_policy("preble", R)
    s = ClusterState.empty(R)
    s.prefix_match = lambda r, blocks: cached_blocks if r == 6 else 0
    s.prefill_tokens[:] = [100, 50, 300, 300, 300, 300, 900, 300]
    pick = p.pick(request("a", blocks=CHAIN, prompt=42 * 16), s)   # 50% = 21 blocks
    assert pick.replica == (6 if exploit else 1)


def test_dualmap_stays_within_its_two_candidates():
    p = make_policy("dualmap", R)
    s = ClusterState.empty(R)
    cands = p.candidates("a", s)
    assert len(cands) == 2 and cands[0] != cands[1]
    picks = []
    for _ in range(50):
        pick = p.pick(request("a", blocks=CHAIN), s)
        picks.append(pick.replica)
        s.in_flight[pick.replica] += 1
    assert set(picks) == set(cands)              # the overload guard spills to the other one
    assert picks[1] == picks[0]                  # but the second request follows the cache
    other_keys = {p.candidates(f"k{i}", s) for i in range(100)}
    assert len({c for pair in other_keys for c in pair}) == R


def test_dualmap_overload_guard():
    p = make_policy("dualmap", R)
    s = ClusterState.empty(R)
    a, b = p.candidates("a", s)
    p.index.insert(a, CHAIN)
    s.in_flight[a], s.in_flight[b] = 4, 0
    assert p.pick(request("a", blocks=CHAIN), s).replica == a     # 4 <= 2*0 + 4
    s.in_flight[a] = 5
    assert p.pick(request("a", blocks=CHAIN), s).replica == b     # 5 > 4
