"""Byte-aware (density) admission in build_plan, against the default top-rate admission."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.core.planning import admit_by_density, build_plan, size_keys


def ids(n):
    return [f"r{i}" for i in range(n)]


def test_density_prefers_long_prefix_over_a_hotter_short_one():
    keys = ["short-hot", "long-warm", "mid"]
    rates = [10.0, 6.0, 1.0]
    prefix = [128, 4096, 2048]
    by_rate = build_plan(keys, rates, ids(2), q_cap=100.0, warm_slots=1)
    by_density = build_plan(keys, rates, ids(2), q_cap=100.0, warm_slots=1, admission="density",
                            prefix_tokens=prefix)
    assert set(by_rate.table) == {"short-hot", "long-warm"}
    assert set(by_density.table) == {"long-warm", "mid"}          # 24,576 and 2,048 > 1,280 tokens/s
    assert by_density.extra["admission"] == "density" and "admission" not in by_rate.extra
    assert sum(by_density.expected_load) == pytest.approx(sum(rates))


def test_density_counts_slots_per_replica_share():
    # k = 3 for the hot key: its 3 slots save 30*1000/3 = 10,000 tokens/s each, less than the
    # two single-slot keys, so with a budget of 3 those two go first and the hot key cannot fit
    keys, rates, prefix = ["hot", "a", "b"], [30.0, 8.0, 7.0], [1000, 2000, 2000]
    plan = build_plan(keys, rates, ids(3), q_cap=10.0, warm_slots=1, admission="density", prefix_tokens=prefix)
    assert set(plan.table) == {"a", "b"}


def test_zero_prefix_or_zero_rate_keys_are_never_admitted_by_density():
    plan = build_plan(["a", "b", "c"], [5.0, 0.0, 1.0], ids(4), q_cap=10.0, warm_slots=4, admission="density",
                      prefix_tokens=[0, 512, 512])
    assert set(plan.table) == {"c"}


def test_placement_runs_in_rate_order():
    keys, rates, prefix = ["a", "b", "c", "d"], [1.0, 4.0, 3.0, 2.0], [4000, 100, 200, 300]
    plan = build_plan(keys, rates, ids(2), q_cap=10.0, warm_slots=10, admission="density", prefix_tokens=prefix)
    same = build_plan(keys, rates, ids(2), q_cap=10.0, warm_slots=10)   # everything fits: same table
    assert dict(plan.table) == dict(same.table) and plan.expected_load == same.expected_load


@pytest.mark.parametrize("kwargs, message", [
    ({"admission": "density"}, "needs prefix_tokens"),
    ({"admission": "density", "prefix_tokens": [1.0]}, "prefix token counts"),
    ({"admission": "density", "prefix_tokens": [1.0, -1.0]}, "finite and >= 0"),
    ({"admission": "bytes"}, "unknown admission"),
])
def test_bad_admission_inputs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_plan(["a", "b"], [1.0, 2.0], ids(2), q_cap=1.0, warm_slots=1, **kwargs)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 50.0), st.integers(16, 8192)), min_size=1, max_size=40),
       st.integers(1, 4), st.integers(1, 5))
def test_with_single_slot_keys_density_maximises_saved_prefill(items, replicas, w):
    # every k_b = 1 (q_cap above all rates): top-C by lambda * P is the optimum of sum lambda * P
    keys = [f"k{i}" for i in range(len(items))]
    rates = np.array([r for r, _ in items])
    prefix = np.array([p for _, p in items], dtype=float)
    saved = lambda plan: sum(rates[keys.index(k)] * prefix[keys.index(k)] for k in plan.table)  # noqa: E731
    dense = build_plan(keys, rates, ids(replicas), q_cap=100.0, warm_slots=w, admission="density",
                       prefix_tokens=prefix)
    top = build_plan(keys, rates, ids(replicas), q_cap=100.0, warm_slots=w)
    assert dense.admitted_keys == top.admitted_keys == min(len(keys), replicas * w)
    assert saved(dense) >= saved(top) * (1 - 1e-12)
    best = np.sort(rates * prefix)[::-1][: replicas * w].sum()
    assert saved(dense) == pytest.approx(best)


def test_admit_by_density_respects_the_budget():
    rng = np.random.default_rng(3)
    rates = rng.lognormal(0, 1.5, 500)
    sizes = size_keys(rates, 2.0, 10)
    prefix = rng.integers(16, 4096, 500).astype(float)
    keys = [f"k{i}" for i in range(500)]
    chosen = admit_by_density(keys, rates, sizes, prefix, 120)
    assert sizes[chosen].sum() <= 120 and len(set(chosen.tolist())) == len(chosen)
    assert list(rates[chosen]) == sorted(rates[chosen], reverse=True)
