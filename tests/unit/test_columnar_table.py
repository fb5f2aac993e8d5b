"""ColumnarTable / ColumnarRates: the same Mapping as a dict of tuples, in bytes per key."""

from __future__ import annotations

import random

import numpy as np
import pytest

from services.core.table import ColumnarRates, ColumnarTable


def sample(n: int = 5000, replicas: int = 7, seed: int = 3) -> dict[str, tuple[int, ...]]:
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        key = f"k{i}-" + "é" * (i % 3) + "x" * rng.randrange(0, 40)
        out[key] = tuple(rng.sample(range(replicas), rng.randrange(1, 4)))
    return out


def test_it_is_the_same_mapping_as_the_dict():
    d = sample()
    t = ColumnarTable.from_mapping(d, 7)
    assert len(t) == len(d) and list(t) == list(d) and dict(t.items()) == d and t == d
    assert list(t.values()) == list(d.values())
    for k, row in d.items():
        assert t.get(k) == row and t[k] == row and k in t
    for miss in ("", "nope", "k1", "k1-x" * 50, "\ud800", 7, None, b"k0-"):
        assert t.get(miss) is None and miss not in t
    with pytest.raises(KeyError):
        t["nope"]
    assert t.nbytes() < 40 * len(d) + sum(len(k.encode()) for k in d)


def test_rates_share_the_index():
    d = sample(300)
    t = ColumnarTable.from_mapping(d, 7)
    values = np.arange(len(d), dtype=np.float64) / 7
    r = ColumnarRates(t, values)
    assert dict(r) == dict(zip(d, values.tolist())) and r.get("nope", 0.0) == 0.0 and len(r) == len(d)


def test_a_hash_collision_never_returns_another_keys_row():
    """Force every key onto one hash: lookups must still find exactly their own row."""
    d = sample(200)
    t = ColumnarTable.from_mapping(d, 7)
    forced = ColumnarTable._indexed(t.keys_blob, t._koffs, t._roffs, t.members, np.zeros(len(d), np.int64))
    real_hash = hash

    class Same(str):           # a str whose hash collides with every stored key
        def __hash__(self):
            return 0
    for k, row in list(d.items())[:50]:
        assert forced.get(Same(k)) == row
    assert forced.get(Same("absent")) is None
    assert real_hash("a") == hash("a")


@pytest.mark.parametrize("build, message", [
    (lambda: ColumnarTable.from_mapping({"a": (0,), "b": ()}, 2), "no replicas"),
    (lambda: ColumnarTable.from_mapping({"a": (0, 0)}, 2), "repeats a replica"),
    (lambda: ColumnarTable.from_mapping({"a": (2,)}, 2), "outside"),
    (lambda: ColumnarTable.from_columns(b"aa", np.array([1, 1], np.uint32), np.array([1, 1]),
                                        np.array([0, 1], np.uint16), 2), "repeats the key 'a'"),
    (lambda: ColumnarTable.from_columns(b"\xff", np.array([1], np.uint32), np.array([1]),
                                        np.array([0], np.uint16), 2), "not UTF-8"),
    (lambda: ColumnarTable.from_columns(b"abc", np.array([1], np.uint32), np.array([1]),
                                        np.array([0], np.uint16), 2), "key lengths"),
    (lambda: ColumnarTable.from_columns(b"a", np.array([1], np.uint32), np.array([2]),
                                        np.array([0], np.uint16), 2), "replica counts"),
])
def test_bad_columns_are_refused_in_one_line(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_remap_drops_unknown_members_and_empty_rows():
    d = {"a": (0, 1), "b": (1,), "c": (2, 0), "d": (2,)}
    t = ColumnarTable.from_mapping(d, 3)
    assert dict(t.remap(np.array([2, 1, 0])).items()) == {"a": (2, 1), "b": (1,), "c": (0, 2), "d": (0,)}
    assert dict(t.remap(np.array([0, -1, 1])).items()) == {"a": (0,), "c": (1, 0), "d": (1,)}
    gone = t.remap(np.array([-1, -1, 0]))
    assert dict(gone.items()) == {"c": (0,), "d": (0,)} and gone.get("a") is None and gone.get("d") == (0,)


def test_empty_table():
    t = ColumnarTable.from_mapping({}, 1)
    assert len(t) == 0 and not t and t.get("a") is None and dict(t.items()) == {}


def test_the_router_installs_a_columnar_plan_reindexed_in_one_swap():
    from services.wire import codec
    from services.core.planning import build_plan
    from services.core.policy import Reason
    from services.dispatcher.router import Router
    from services.model import Replica

    keys = [f"key-{i}" for i in range(400)]
    plan = build_plan(keys, [1.0 + i % 5 for i in range(400)], ("b", "gone", "a"), q_cap=1e6, warm_slots=400)
    router = Router([Replica("a", "127.0.0.1:1"), Replica("b", "127.0.0.1:2")], seed=1)
    for i in range(2):
        router.set_healthy(i, True)
    old = router.policy
    prepared = router.prepare(plan)
    assert router.policy is old and router.plan is None          # preparing changes nothing routed
    router.install(prepared, flat=False, source="test")
    assert router.policy is prepared.policy and router.plan_version == plan.version
    assert isinstance(router.plan.table, ColumnarTable) and router.plan.table == plan.table
    ids = plan.replica_ids
    for k in keys:
        local = {("a", "b").index(ids[m]) for m in plan.table[k] if ids[m] != "gone"}
        pick = router.route(k, 0.0)
        assert (pick.reason == Reason.PLANNED and pick.replica in local) if local else pick.reason == Reason.COLD
    same = router.policy
    router.set_plan(router.plan, flat=True, source="redis")     # a mode change swaps nothing
    assert router.policy is same and router.flat and router.route("key-1", 0.0).reason == Reason.FALLBACK
    msg = codec.plan_to_proto(router.plan, columnar=True)
    assert codec.plan_from_proto(msg).table == plan.table


def test_the_range_index_and_hashes_match_their_definitions():
    """Hashes are Python's hash() of each key (NUL-free keys go through the joined split,
    a key with a NUL byte through per-key slicing), and buckets[k] counts the sorted hashes
    below range k of the hash space, for tables of every size class."""
    for n, nul in ((1, False), (3, True), (1000, False), (70_000, False), (70_000, True)):
        d = sample(n, seed=n)
        if nul:
            d["with\0nul"] = (0,)
        t = ColumnarTable.from_mapping(d, 7)
        assert sorted(t.row_hashes().tolist()) == sorted(hash(k) for k in d)
        assert t.row_hashes().tolist() == [hash(k) for k in d]
        bits = 64 - t._shift
        edges = ((np.arange(1 << bits, dtype=np.uint64) << np.uint64(t._shift)) ^ np.uint64(1 << 63)).view(np.int64)
        assert t._buckets.tolist() == np.append(np.searchsorted(t._hashes, edges), len(d)).tolist()
        for k in list(d)[:: max(1, n // 500)]:
            assert t.get(k) == d[k]


def _python_calls(fn, *args) -> tuple[int, object]:
    """Python-level calls (functions, generator steps) made while running fn(*args)."""
    import sys
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        if event == "call":
            calls += 1
    sys.setprofile(count)
    try:
        out = fn(*args)
    finally:
        sys.setprofile(None)
    return calls, out


def test_installing_a_columnar_plan_runs_no_python_per_key():
    """Decoding a plan's columns and preparing it for routing cost as many Python calls at
    50,000 keys as at 5,000 (the policy's ring and per-chunk steps are fixed costs), not one
    or more per key: the policy's row check used to walk every row as a tuple (a generator
    step per key, ~0.6 CPU s at a million keys)."""
    from services.wire import codec
    from services.core.plan import Plan
    from services.dispatcher.router import Router
    from services.model import Replica

    ids = tuple(f"r{i}" for i in range(8))
    calls = {}
    for n in (5_000, 50_000):
        table = {f"tenant-{i}": (i % 8, (i + 3) % 8) if i % 7 == 0 else (i % 8,) for i in range(n)}
        plan = Plan(version=3, parent_version=0, created_at=1.0, replica_ids=ids, q_cap=10.0, warm_slots=n,
                    table=table, rates={k: 1.0 for k in table}, expected_load=(1.0,) * 8, predicted_imbalance=1.0,
                    total_keys=n, admitted_keys=n, admitted_rate_share=1.0)
        msg = codec.plan_to_proto(plan, columnar=True)
        decode_calls, got = _python_calls(codec.plan_from_slices, [msg], True)
        router = Router([Replica(r, f"127.0.0.1:{i + 1}") for i, r in enumerate(ids)], seed=1)
        prepare_calls, prepared = _python_calls(router.prepare, got)
        router.install(prepared, flat=False, source="test")
        assert router.plan.table == table
        calls[n] = (decode_calls, prepare_calls)
    (d5, p5), (d50, p50) = calls[5_000], calls[50_000]
    assert d50 - d5 < 200 and p50 - p5 < 200, calls


def test_the_policy_check_names_a_key_outside_the_replicas():
    from services.core.policies.cacheroute import CacheRoutePolicy
    from services.core.plan import Plan

    t = ColumnarTable.from_mapping({"a": (0,), "b": (1, 4), "c": (2,)}, 5)
    plan = Plan(version=1, parent_version=0, created_at=0.0, replica_ids=tuple("vwxyz"), q_cap=1.0, warm_slots=3,
                table=t, rates={}, expected_load=(0.0,) * 5, predicted_imbalance=1.0, total_keys=3, admitted_keys=3,
                admitted_rate_share=1.0)
    policy = CacheRoutePolicy(4, rng=random.Random(0))
    with pytest.raises(ValueError, match=r"plan maps key 'b' to \[1, 4\], outside 0..3"):
        policy.set_plan(plan)
    CacheRoutePolicy(5, rng=random.Random(0)).set_plan(plan)
