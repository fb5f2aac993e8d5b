"""Planning core, table-driven: sizing, admission, LPT placement, validation, plan_diff."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.core.planning import admit, build_plan, exact_sum, imbalance, place_lpt, plan_diff, size_keys


def ids(n: int) -> list[str]:
    return [f"r{i}" for i in range(n)]


@pytest.mark.parametrize("rates, q_cap, replicas, expected", [
    ([0.0, 0.5, 1.0, 1.0000001, 2.0, 2.5], 1.0, 8, [1, 1, 1, 2, 2, 3]),
    ([10.0, 100.0], 1.0, 4, [4, 4]),                 # capped at R
    ([3.0], 1.5, 30, [2]),                           # exact multiple: no extra replica
    ([1e300], 1e-300, 5, [5]),                       # overflowing ratio still caps at R
])
def test_size_keys(rates, q_cap, replicas, expected):
    assert size_keys(np.array(rates), q_cap, replicas).tolist() == expected


@pytest.mark.parametrize("keys, rates, q_cap, budget, admitted", [
    # plain prefix: budget 3, all k=1
    (["a", "b", "c", "d"], [4.0, 3.0, 2.0, 1.0], 10.0, 3, ["a", "b", "c"]),
    # skip and continue: b needs 3 slots with 1 left, c (k=1) still fits
    (["a", "b", "c", "d"], [25.0, 21.0, 5.0, 1.0], 10.0, 4, ["a", "c"]),
    # after the skip only smaller keys fit, and they fill the rest
    (["a", "b", "c", "d", "e"], [19.0, 15.0, 9.0, 8.0, 7.0], 10.0, 4, ["a", "b"]),
    (["a", "b", "c", "d", "e"], [25.0, 15.0, 9.0, 8.0, 7.0], 10.0, 5, ["a", "b"]),
    (["a", "b", "c", "d", "e"], [25.0, 15.0, 9.0, 8.0, 7.0], 10.0, 4, ["a", "c"]),
    # ties broken by key, whatever the input order
    (["z", "y", "x", "w"], [1.0, 1.0, 1.0, 1.0], 10.0, 2, ["w", "x"]),
    (["b", "a", "c"], [2.0, 1.0, 2.0], 10.0, 2, ["b", "c"]),
    # zero-rate keys are never admitted, even with room to spare
    (["a", "b", "c"], [0.0, 1.0, 0.0], 10.0, 10, ["b"]),
    (["a"], [0.0], 10.0, 10, []),
])
def test_admit(keys, rates, q_cap, budget, admitted):
    arr = np.array(rates)
    chosen = admit(keys, arr, size_keys(arr, q_cap, 30), budget)
    assert [keys[i] for i in chosen] == admitted


def test_admit_tie_group_straddling_a_partial_sort_head():
    # 5,000 equal rates and a budget of 10: the head cut falls inside the tie group
    keys = [f"k{i:05d}" for i in range(5000)][::-1]
    rates = np.ones(5000)
    chosen = admit(keys, rates, size_keys(rates, 2.0, 4), 10)
    assert [keys[i] for i in chosen] == [f"k{i:05d}" for i in range(10)]


def test_place_lpt_by_hand():
    # cold load 1 on each of 3 replicas; a(6,k=2) -> r0,r1 (+3 each); b(2) -> r2; c(1) -> r2
    rows, loads = place_lpt([6.0, 2.0, 1.0], [2, 1, 1], 3, 1.0)
    assert rows == [(0, 1), (2,), (2,)]
    assert loads == [4.0, 4.0, 4.0]


def test_place_lpt_ties_go_to_lowest_index():
    rows, _ = place_lpt([1.0, 1.0, 1.0, 1.0], [1, 1, 1, 1], 2, 0.0)
    assert rows == [(0,), (1,), (0,), (1,)]


def test_build_plan_fields():
    plan = build_plan(["a", "b", "c", "d"], [6.0, 2.0, 1.0, 3.0], ids(3), q_cap=4.0, warm_slots=1,
                      version=7, created_at=12.5, rates_snapshot_id="w1", window_seconds=60.0)
    # C = 3: a (k=2), d (k=1); cold tail b + c = 3 req/s -> 1 per replica
    assert dict(plan.table) == {"a": (0, 1), "d": (2,)}
    assert dict(plan.rates) == {"a": 6.0, "d": 3.0}
    assert plan.expected_load == (4.0, 4.0, 4.0)
    assert plan.predicted_imbalance == 1.0
    assert plan.admitted_keys == 2 and plan.total_keys == 4
    assert plan.admitted_rate_share == pytest.approx(9 / 12)
    assert (plan.version, plan.parent_version, plan.created_at, plan.churn) == (7, 0, 12.5, None)
    assert (plan.rates_snapshot_id, plan.window_seconds, plan.builder) == ("w1", 60.0, "lpt")
    assert list(plan.table) == ["a", "d"]  # placement order


def test_build_plan_whale_hotter_than_cluster_gets_every_replica():
    plan = build_plan(["w", "x"], [100.0, 1.0], ids(3), q_cap=1.0, warm_slots=2)
    assert plan.table["w"] == (0, 1, 2)
    assert math.isclose(sum(plan.expected_load), 101.0)


def test_build_plan_all_zero_rates():
    plan = build_plan(["a", "b"], [0.0, 0.0], ids(2), q_cap=1.0, warm_slots=1)
    assert plan.admitted_keys == 0 and plan.expected_load == (0.0, 0.0)
    assert plan.predicted_imbalance == 1.0 and plan.admitted_rate_share == 0.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(replica_ids=[]), "at least one replica"),
    (dict(replica_ids=["r0", "r0"]), "duplicate replica id 'r0'"),
    (dict(q_cap=0.0), "q_cap"),
    (dict(q_cap=-1.0), "q_cap"),
    (dict(q_cap=math.inf), "q_cap"),
    (dict(q_cap=math.nan), "q_cap"),
    (dict(warm_slots=0), "warm_slots"),
    (dict(warm_slots=1.5), "warm_slots"),
    (dict(rates=[1.0, -2.0]), "rate of key 'b'"),
    (dict(rates=[1.0, math.nan]), "rate of key 'b'"),
    (dict(rates=[math.inf, 1.0]), "rate of key 'a'"),
    (dict(rates=[1.0]), "2 keys but 1 rates"),
    (dict(keys=["a", "a"]), "duplicate key 'a'"),
    (dict(keys=["a", ""]), "empty key"),
])
def test_build_plan_rejects(kwargs, message):
    args = dict(keys=["a", "b"], rates=[1.0, 2.0], replica_ids=["r0", "r1"], q_cap=1.0, warm_slots=1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        build_plan(**args)


def test_imbalance():
    assert imbalance([1.0, 1.0, 4.0]) == 2.0
    assert imbalance([0.0, 0.0]) == 1.0


def test_plan_diff_compares_replica_ids_not_indices():
    old = build_plan(["a", "b", "c"], [3.0, 2.0, 1.0], ["x", "y", "z"], q_cap=10.0, warm_slots=1)
    # same ids, listed in another order: a->x, b->y, c->z in both
    new = build_plan(["a", "b", "c"], [3.0, 2.0, 1.0], ["x", "y", "z"], q_cap=10.0, warm_slots=1)
    assert plan_diff(old, new).churn == 0.0
    shuffled = build_plan(["a", "b", "c"], [3.0, 2.0, 1.0], ["z", "y", "x"], q_cap=10.0, warm_slots=1)
    diff = plan_diff(old, shuffled)
    # a -> z, b -> y, c -> x: a and c moved (4 of 6 req/s)
    assert diff.churn == pytest.approx(4 / 6)
    assert (diff.keys_moved, diff.keys_kept, diff.keys_added, diff.keys_removed) == (2, 1, 0, 0)
    assert [m.key for m in diff.moves] == ["a", "c"]
    assert diff.moves[0].old == ("x",) and diff.moves[0].new == ("z",)


def test_plan_diff_added_and_removed_keys():
    old = build_plan(["a", "b", "c"], [3.0, 2.0, 1.0], ids(2), q_cap=10.0, warm_slots=1)
    new = build_plan(["a", "b", "c"], [3.0, 1.0, 2.0], ids(2), q_cap=10.0, warm_slots=1)
    diff = plan_diff(old, new)
    # old: a->r0, b->r1 ; new: a->r0, c->r1 (c newly admitted, b dropped)
    assert (diff.keys_kept, diff.keys_added, diff.keys_removed, diff.removed) == (1, 1, 1, ("b",))
    assert diff.churn == pytest.approx(2 / 5)
    assert diff.summary()["top_moves"] == [{"key": "c", "rate": 2.0, "old": [], "new": ["r1"]}]


def test_build_plan_with_parent_sets_churn():
    parent = build_plan(["a", "b", "c"], [3.0, 2.0, 1.0], ids(2), q_cap=10.0, warm_slots=1, version=4)
    child = build_plan(["a", "b", "c"], [3.0, 1.0, 2.0], ids(2), q_cap=10.0, warm_slots=1, version=5,
                       parent=parent)
    assert child.parent_version == 4
    assert child.churn == pytest.approx(plan_diff(parent, child).churn)


def test_exact_sum_matches_fsum():
    rng = np.random.default_rng(3)
    for _ in range(200):
        x = rng.lognormal(0.0, rng.uniform(0, 40), rng.integers(0, 300))
        x[rng.random(len(x)) < 0.1] = 0.0
        assert exact_sum(x) == math.fsum(x.tolist())
    assert exact_sum(np.array([1e16, 1.0, 1.0])) == math.fsum([1e16, 1.0, 1.0])
    assert exact_sum(np.array([5e-324, 5e-324])) == 1e-323
