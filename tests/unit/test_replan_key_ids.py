"""The re-planner finds the active plan's keys by store id (RatesSnapshot.key_ids) with the same
result as by the dict over the window: same plan key for key, bit-identical loads, same layout
(positions and parent positions) over three intervals; a foreign id space falls back to the
dict; bad ids are refused. The window cache's ids are stable between reads and renamed when
compacted."""

from __future__ import annotations

import numpy as np
import pytest

from services.core import replan
from services.core.planning import build_plan
from services.store.buckets import snapshot_columns
from services.store.window_cache import BucketCache
from tests.unit.test_replan_equivalence import IDS, drift, same_plan, workload


class Registry:
    """key -> id as the window cache hands them out (a growing index)."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def ids(self, keys) -> np.ndarray:
        for k in keys:
            self.index.setdefault(k, len(self.index))
        return np.array([self.index[k] for k in keys], dtype=np.int64)


def same_layout(a, b) -> None:
    la, lb = a.layout_of(), b.layout_of()
    assert (la is None) == (lb is None)
    if la is not None:
        assert np.array_equal(la.positions, lb.positions) and np.array_equal(la.one, lb.one)
        assert dict(la.multi) == dict(lb.multi) and np.array_equal(la.parent_positions, lb.parent_positions)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("q_cap,warm", [(4.0, 100), (0.4, 60), (1e9, 1000)])
def test_by_id_equals_by_dict_over_three_intervals(seed, q_cap, warm):
    keys, rates, rng = workload(3000, seed)
    reg = Registry()
    by_dict = by_id = build_plan(keys, rates, IDS, q_cap, warm)
    used_ids = 0
    for step in range(3):
        keys, rates = drift(keys, rates, rng, sigma=0.5, tag=f"s{step}")
        kw = dict(version=2 + step, created_at=float(step), window_seconds=300.0)
        lay = by_id.layout_of()
        used_ids += lay is not None and lay.ids is not None
        new_dict = replan.replan_incremental(by_dict, keys, rates, IDS, q_cap, warm, **kw)
        new_id = replan.replan_incremental(by_id, keys, rates, IDS, q_cap, warm, key_ids=reg.ids(keys),
                                           key_space="s1", **kw)
        same_plan(new_id, new_dict)
        same_layout(new_id, new_dict)
        by_dict, by_id = new_dict, new_id
        assert by_id.layout_of().ids is not None and by_id.layout_of().key_space == "s1"
    assert used_ids == 2              # the first re-plan had no ids to match (build_plan's parent)


def test_another_id_space_falls_back_to_the_dict():
    keys, rates, rng = workload(2000, 4)
    reg = Registry()
    base = build_plan(keys, rates, IDS, 4.0, 100)
    first = replan.replan_incremental(base, keys, rates, IDS, 4.0, 100, version=2, key_ids=reg.ids(keys),
                                      key_space="old")
    keys2, rates2 = drift(keys, rates, rng)
    other = Registry()                 # renumbered ids (a compacted cache): must not be matched by id
    got = replan.replan_incremental(first, keys2, rates2, IDS, 4.0, 100, version=3, key_ids=other.ids(keys2[::-1])[::-1],
                                    key_space="new")
    want = replan.replan_incremental(first, keys2, rates2, IDS, 4.0, 100, version=3)
    same_plan(got, want)


def test_bad_ids_are_refused():
    keys, rates, _ = workload(100, 5)
    base = build_plan(keys, rates, IDS, 4.0, 100)
    kw = dict(version=2, key_space="s")
    with pytest.raises(ValueError, match="one id per key"):
        replan.replan_incremental(base, keys, rates, IDS, 4.0, 100, key_ids=np.arange(99), **kw)
    with pytest.raises(ValueError, match="repeat an id"):
        replan.replan_incremental(base, keys, rates, IDS, 4.0, 100, key_ids=np.zeros(100, dtype=np.int64), **kw)
    with pytest.raises(ValueError, match=">= 0"):
        replan.replan_incremental(base, keys, rates, IDS, 4.0, 100, key_ids=np.arange(100) - 1, **kw)
    with pytest.raises(ValueError, match="empty key"):
        replan.replan_incremental(base, [*keys[:-1], ""], rates, IDS, 4.0, 100, key_ids=np.arange(100), **kw)


def test_window_cache_ids_are_stable_between_reads_and_renamed_by_compaction():
    cache = BucketCache()
    cache.put(1, b"t1", {b"a": b"3", b"b": b"1"}, {b"a": b"30", b"b": b"10"}, {b"a": b"0", b"b": b"0"})
    keys, acc = cache.columns(range(1, 3))
    snap = snapshot_columns(1, 2, 0.0, 20.0, keys, acc, 0, cache.key_rank(keys), key_space=cache.space)
    assert snap.keys == ("a", "b") and snap.key_space == cache.space
    first = dict(zip(snap.keys, snap.key_ids.tolist()))
    cache.put(2, b"t2", {b"c": b"5", b"a": b"1"}, {b"c": b"50", b"a": b"1"}, {b"c": b"0", b"a": b"0"})
    keys, acc = cache.columns(range(1, 3))
    snap2 = snapshot_columns(1, 2, 0.0, 20.0, keys, acc, 0, cache.key_rank(keys), key_space=cache.space)
    assert snap2.keys == ("c", "a", "b")
    again = dict(zip(snap2.keys, snap2.key_ids.tolist()))
    assert {k: again[k] for k in first} == first and len(set(again.values())) == 3
    space = cache.space
    cache._compact()
    assert cache.space != space
    assert snapshot_columns(1, 2, 0.0, 20.0, keys, acc).key_ids is None     # no space: no ids


def snapshot_order(keys, rates):
    """keys and rates as a RatesSnapshot lists them: rate desc, ties key asc (windowed counts)."""
    counts = np.maximum(1, np.round(np.asarray(rates) * 3)).astype(np.int64)   # many ties
    order = sorted(range(len(keys)), key=lambda i: (-counts[i], keys[i]))
    return [keys[i] for i in order], counts[order] / 300.0


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("q_cap,warm", [(4.0, 100), (0.01, 60), (1e9, 1000), (0.05, 20)])
def test_ordered_admission_equals_the_sorted_one(seed, q_cap, warm):
    from services.core.planning import admit, size_keys
    keys, rates, rng = workload(3000, seed)
    keys, rates = snapshot_order(keys, rates)
    for R in (1, 8):
        sizes = size_keys(rates, q_cap, R)
        want = admit(keys, rates, sizes, R * warm)
        got = admit(keys, rates, sizes, R * warm, ordered=True)
        assert got.tolist() == want.tolist()
    active = build_plan(keys, rates, IDS, q_cap, warm)
    keys2, rates2 = snapshot_order(*drift(keys, rates, rng))
    kw = dict(version=2, window_seconds=300.0)
    same_plan(replan.replan_incremental(active, keys2, rates2, IDS, q_cap, warm, ordered=True, **kw),
              replan.replan_incremental(active, keys2, rates2, IDS, q_cap, warm, **kw))


def test_ordered_with_rates_out_of_order_takes_the_sorting_path():
    from services.core.planning import admit, size_keys
    keys, rates, _ = workload(500, 3)            # not in snapshot order
    sizes = size_keys(rates, 1.0, 4)
    assert admit(keys, rates, sizes, 4 * 50, ordered=True).tolist() == admit(keys, rates, sizes, 4 * 50).tolist()
    active = build_plan(keys, rates, IDS, 1.0, 50)
    same_plan(replan.replan_incremental(active, keys, rates, IDS, 1.0, 50, version=2, ordered=True),
              replan.replan_incremental(active, keys, rates, IDS, 1.0, 50, version=2))


@pytest.mark.parametrize("q_cap,warm", [(4.0, 100), (0.4, 60)])
def test_build_plan_with_ids_records_its_rows_and_the_next_replan_matches_by_id(q_cap, warm):
    from services.core.planning import RowColumns
    keys, rates, rng = workload(3000, 6)
    reg = Registry()
    ids = reg.ids(keys)
    plain = build_plan(keys, rates, IDS, q_cap, warm)
    first = build_plan(keys, rates, IDS, q_cap, warm, key_ids=ids, key_space="s")
    same_plan(first, plain)
    lay = first.layout_of()
    assert lay is not None and lay.key_space == "s" and lay.parent_positions is None
    assert [keys[i] for i in lay.positions.tolist()] == list(first.table)
    assert np.array_equal(lay.ids, ids[lay.positions])
    got, want = RowColumns.of(first), RowColumns.of(plain)          # by the record, by one pass
    assert np.array_equal(got.lens, want.lens) and np.array_equal(got.one, want.one)
    assert dict(got.multi) == dict(want.multi)
    assert len(got.multi) > 0                               # rows of several replicas recorded too
    keys2, rates2 = drift(keys, rates, rng)
    by_id = replan.replan_incremental(first, keys2, rates2, IDS, q_cap, warm, version=2, key_ids=reg.ids(keys2),
                                      key_space="s")
    by_dict = replan.replan_incremental(plain, keys2, rates2, IDS, q_cap, warm, version=2)
    same_plan(by_id, by_dict)
    same_layout(by_id, by_dict)
