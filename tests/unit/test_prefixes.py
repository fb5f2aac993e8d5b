"""Prefix nodes: chains, bounded counting, candidates, available hit rate, the prefix plan, the
policy's node routing and token balance, codec and diff (services.core.prefixes, issue 14)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.wire.codec import check_plan, plan_from_json, plan_to_json
from services.core.planning import plan_diff
from services.core.policies import make_policy
from services.core.policies._common import Ring
from services.core.policy import ClusterState, Reason
from services.core.prefixes import (NODE_DEPTHS, NodeSample, PrefixCounter, available_hit_rate, build_prefix_plan,
                                    candidates, chain, chain_ids, key_hash, node_name, parse_node_name)
from services.core.replan import repair_plan
from services.core.request import Request
from services.core.traces import ideal_hit_rate
from services.core.workloads import block_hashes

IDS = [f"r{i}" for i in range(4)]


def doc_requests(n_keys=12, doc_blocks=256, own_blocks=40, repeats=2):
    """Every key's prompt starts with one shared document (doc_blocks blocks), then its own blocks."""
    doc = block_hashes("doc", "d", doc_blocks)
    out, rid = [], 0
    for rep in range(repeats):
        for i in range(n_keys):
            own = block_hashes("own", f"k{i}", own_blocks)
            blocks = doc + tuple(h ^ doc[-1] for h in own)   # chained after the document
            out.append(Request(rid, float(rid), f"k{i}", 16 * len(blocks) + 50, 10, blocks))
            rid += 1
    return out, doc


def count(requests):
    c = PrefixCounter()
    for q in requests:
        c.observe(q.key, chain_ids(q.blocks), q.prompt_tokens)
    return c


def test_chain_depths_and_names():
    blocks = tuple(range(1, 301))
    assert chain(blocks) == ((32, 32), (64, 64), (128, 128), (256, 256))
    assert chain_ids(blocks[:31]) == ()
    assert parse_node_name(node_name(2**64 - 1)) == 2**64 - 1
    with pytest.raises(ValueError):
        parse_node_name("xyz")
    assert key_hash("a") == key_hash("a") != key_hash("b")


def test_counter_is_bounded():
    c = PrefixCounter(max_nodes=3, max_keys=2)
    for i in range(10):
        c.observe(f"k{i}", [1, 2, 3, 4 + i])
    assert len(c) == 3 and c.dropped > 0
    assert all(len(s.keys) <= 2 for s in c.samples())


def test_candidates_need_two_keys_and_drop_redundant_parents():
    reqs, doc = doc_requests()
    samples = count(reqs).samples()
    names = {s.node for s in candidates(samples)}
    # the document's deepest node (256 blocks) is shared by every key; its shallower nodes carry the
    # same arrivals, so they are redundant; each key's own deeper node is reached by one key only
    assert names == {doc[255]}


def test_available_hit_rate_by_hand():
    a = NodeSample(1, 32, 0, {1: 3})           # 3 arrivals through 512 tokens
    b = NodeSample(2, 64, 1, {1: 2})           # 2 of them continue to 1,024
    # hits: (3-1)*512 + (2-1)*512 = 1,536 of 3 x 2,000 prompt tokens
    assert available_hit_rate([a, b], 6000) == pytest.approx(1536 / 6000)
    assert available_hit_rate([a, b], 0) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(1, 300)), min_size=1, max_size=40))
def test_available_never_exceeds_the_infinite_cache(spec):
    """Node granularity is coarser than blocks, so it can only undercount the exact bound."""
    reqs = []
    for rid, (doc, own, n) in enumerate(spec):
        base = block_hashes("d", str(doc), 300)[:n]
        reqs.append(Request(rid, float(rid), f"k{own}", 16 * n + 7, 1, base))
    c = count(reqs)
    assert available_hit_rate(c.samples(), c.prompt_tokens) <= ideal_hit_rate(reqs) + 1e-12


def plan_for(reqs, active=None, warm=8, version=1, q_cap=1.0):
    c = count(reqs)
    keys = sorted({q.key for q in reqs})
    per = {k: sum(1 for q in reqs if q.key == k) for k in keys}
    return build_prefix_plan(keys, [per[k] / 30 for k in keys], IDS, q_cap, warm,
                             prefix_tokens=[640.0] * len(keys), nodes=c.samples(), window_seconds=30.0,
                             active=active, version=version, prompt_tokens=c.prompt_tokens)


def test_shared_document_is_planned_and_keys_sit_on_its_members():
    reqs, doc = doc_requests()
    plan = plan_for(reqs)
    check_plan(plan)
    name = node_name(doc[255])
    assert set(plan.prefixes) == {name}
    members = set(plan.prefixes[name].replicas)
    assert plan.prefixes[name].keys == 12 and plan.prefixes[name].tokens == 256 * 16
    assert all(set(row) <= members for row in plan.table.values())
    assert 0 < plan.extra["available_hit_rate"] <= 1


def test_plan_is_sticky_and_diffable():
    reqs, _ = doc_requests()
    first = plan_for(reqs)
    again = plan_for(reqs, active=first, version=2)
    assert again.churn == 0.0 and again.table == first.table
    diff = plan_diff(first, again)
    assert diff.prefixes_kept == 1 and not diff.prefix_moves
    s = diff.summary()
    assert s["prefixes_kept"] == 1 and s["prefixes_added"] == 0


def test_new_key_starts_on_its_ring_owner_within_the_balance_limit():
    keys = [f"s{i}" for i in range(20)]
    ring = Ring(len(IDS))
    loose = build_prefix_plan(keys, [1 / 30] * 20, IDS, 1.0, 8, window_seconds=30.0, tolerance=2.0)
    assert all(loose.table[k] == (ring.first(k),) for k in keys)
    tight = build_prefix_plan(keys, [1 / 30] * 20, IDS, 1.0, 8, window_seconds=30.0, tolerance=0.0)
    assert max(tight.expected_load) <= 5 / 30 + 1e-12          # the LPT peak: 20 equal keys on 4 replicas
    assert sum(tight.table[k] == (ring.first(k),) for k in keys) >= 10    # most still start at home


def test_budget_covers_keys_and_nodes():
    reqs, doc = doc_requests()
    plan = plan_for(reqs, warm=3)          # C = 12 slots: the 12 keys take all, no room for the node
    assert plan.admitted_keys == 12 and not plan.prefixes


def test_codec_round_trip_and_repair():
    reqs, doc = doc_requests()
    plan = plan_for(reqs)
    back = plan_from_json(plan_to_json(plan))
    assert back.prefixes == plan.prefixes and back == plan
    dead = plan.replica_ids[plan.prefixes[node_name(doc[255])].replicas[0]]
    fixed = repair_plan(plan, [dead], version=2)
    check_plan(fixed)
    assert all(len(e.replicas) >= 1 for e in fixed.prefixes.values())
    bad = plan_to_json(plan).replace(node_name(doc[255]).encode(), b"nothex")
    with pytest.raises(ValueError):
        plan_from_json(bad)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.integers(32, 300)), min_size=1, max_size=60),
       st.integers(1, 6), st.floats(0.05, 5.0))
def test_prefix_plan_is_valid(spec, warm, q_cap):
    reqs = []
    for rid, (doc, key, n) in enumerate(spec):
        reqs.append(Request(rid, float(rid), f"k{key}", 16 * n + 1, 1, block_hashes("d", str(doc), 300)[:n]))
    plan = plan_for(reqs, warm=warm, q_cap=q_cap)
    check_plan(plan)
    used = sum(len(r) for r in plan.table.values()) + sum(len(e.replicas) for e in plan.prefixes.values())
    assert used <= len(IDS) * warm
    again = plan_for(reqs, warm=warm, q_cap=q_cap, active=plan, version=2)
    assert again.table == plan.table and again.prefixes == plan.prefixes   # same input: nothing moves


def state(n=4):
    return ClusterState.empty(n)


def test_policy_routes_cold_keys_by_their_document():
    reqs, doc = doc_requests()
    plan = plan_for(reqs[:6])               # only k0..k5 seen: k6..k11 are cold
    members = plan.prefixes[node_name(doc[255])].replicas
    for mode in ("requests", "tokens"):
        policy = make_policy("cacheroute-prefix", len(IDS), balance=mode)
        policy.set_plan(plan)
        for q in reqs[6:12]:
            pick = policy.pick(q, state())
            assert pick.reason == Reason.PLANNED and pick.replica in members


def test_node_covering_little_of_the_prompt_does_not_route():
    reqs, doc = doc_requests()
    plan = plan_for(reqs[:6])
    policy = make_policy("cacheroute-prefix", len(IDS))
    policy.set_plan(plan)
    long = Request(99, 0.0, "new", 16 * 1000, 1, doc + block_hashes("x", "y", 700))
    assert policy.pick(long, state()).reason == Reason.COLD


def test_token_balance_leaves_home_only_when_the_queue_costs_more_than_the_cache_saves():
    policy = make_policy("cacheroute-prefix", 4, reuse_weight=1.0)
    q = Request(1, 0.0, "s", 4000, 1, block_hashes("a", "b", 200))     # 3,200 reusable tokens
    home = Ring(4).first("s")
    st_ = state()
    st_.prefill_tokens[home] = 3000
    assert policy.pick(q, st_) == (home, Reason.COLD)
    st_.prefill_tokens[home] = 3300
    pick = policy.pick(q, st_)
    assert pick.replica != home and pick.reason == Reason.FALLBACK
    st_.healthy[:] = [r == home for r in range(4)]
    assert policy.pick(q, st_).replica == home


def test_two_dispatchers_agree():
    """No learned state: two policy instances given one plan pick the same for the same state."""
    reqs, _ = doc_requests()
    plan = plan_for(reqs[:6])
    a, b = (make_policy("cacheroute-prefix", 4, seed=s) for s in (1, 2))
    a.set_plan(plan)
    b.set_plan(plan)
    rng = random.Random(0)
    for q in reqs:
        st_ = state()
        st_.prefill_tokens[:] = [rng.randrange(5000) for _ in range(4)]
        assert a.pick(q, st_) == b.pick(q, st_)


def test_depths_constant():
    assert NODE_DEPTHS[0] == 32 and all(b == 2 * a for a, b in zip(NODE_DEPTHS, NODE_DEPTHS[1:]))


def test_proto_round_trip():
    from services.wire.codec import plan_from_proto, plan_to_proto
    from services.wire.planwire import SliceAssembler, plan_chunks

    reqs, _ = doc_requests()
    plan = plan_for(reqs)
    assert plan_from_proto(plan_to_proto(plan)).prefixes == plan.prefixes
    asm, whole = SliceAssembler(), None
    for msg in plan_chunks(plan, 200):             # a tiny budget: the table goes in slices
        whole = asm.add(msg) or whole
    assert plan_from_proto(whole).prefixes == plan.prefixes


def test_plan_show_and_diff_cover_prefix_nodes(tmp_path, capsys):
    import json

    from clients.cli import main
    from services.wire.codec import write_plan_file

    reqs, doc = doc_requests()
    first = plan_for(reqs)
    moved = build_prefix_plan(["k0"], [1.0], IDS, 1.0, 8, window_seconds=30.0, active=first, version=2,
                              nodes=count(reqs[:3] + reqs[12:15]).samples())
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_plan_file(a, first)
    write_plan_file(b, moved)
    assert main(["plan", "show", str(a)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["prefix_nodes"] == 1 and shown["top_prefixes"][0]["prefix"] == node_name(doc[255])
    assert shown["top_prefixes"][0]["keys"] == 12 and "available_hit_rate" in shown
    assert main(["plan", "diff", str(a), str(b)]) == 0
    diff = json.loads(capsys.readouterr().out)
    assert diff["prefixes_kept"] + diff["prefixes_moved"] + diff["prefixes_added"] == len(moved.prefixes)


def test_hit_rates_travel_on_the_wire():
    import dataclasses

    from services.wire.codec import plan_from_proto, plan_to_proto

    reqs, _ = doc_requests()
    plan = plan_for(reqs)
    plan = dataclasses.replace(plan, extra={**plan.extra, "achieved_hit_rate": 0.25})
    back = plan_from_proto(plan_to_proto(plan))
    assert back.extra == {"available_hit_rate": plan.extra["available_hit_rate"], "achieved_hit_rate": 0.25}
    assert not plan_from_proto(plan_to_proto(dataclasses.replace(plan, extra={}))).extra


@settings(max_examples=80, deadline=None)
@given(st.lists(st.booleans(), min_size=4, max_size=4), st.lists(st.integers(0, 20_000), min_size=4, max_size=4),
       st.integers(0, 11), st.sampled_from(["requests", "tokens"]), st.booleans())
def test_pick_is_healthy_or_raises(healthy, backlog, which, balance, guard):
    from services.core.policy import NoHealthyReplica

    reqs, _ = doc_requests()
    policy = make_policy("cacheroute-prefix", 4, balance=balance, balance_factor=1.25 if guard else None)
    policy.set_plan(plan_for(reqs[:6]))
    st_ = state()
    st_.healthy[:] = healthy
    st_.prefill_tokens[:] = backlog
    st_.in_flight[:] = [b // 1000 for b in backlog]
    q = reqs[which]
    if not any(healthy):
        with pytest.raises(NoHealthyReplica):
            policy.pick(q, st_)
        return
    assert healthy[policy.pick(q, st_).replica]
