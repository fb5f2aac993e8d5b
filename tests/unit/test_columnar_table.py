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
