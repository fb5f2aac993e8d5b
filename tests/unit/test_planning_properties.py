"""Planner invariants (hypothesis) and equality with the plain heapq reference in
bench/plan_build.py, on random instances with ties, whales, zero rates, binding or not."""

from __future__ import annotations

import importlib.util
import itertools
import math
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from services.core.planning import build_plan, size_keys

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("plan_build_bench", ROOT / "bench" / "plan_build.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

rate_values = st.one_of(
    st.floats(min_value=0.0, max_value=50.0, allow_nan=False, allow_infinity=False, allow_subnormal=False),
    st.sampled_from([0.0, 1.0, 2.0, 3.0, 7.5]),  # frequent exact ties
)


@st.composite
def instances(draw, max_keys=60):
    n = draw(st.integers(1, max_keys))
    keys = draw(st.lists(st.text("abcxyz", min_size=1, max_size=4), min_size=n, max_size=n, unique=True))
    rates = draw(st.lists(rate_values, min_size=n, max_size=n))
    replicas = draw(st.integers(1, 8))
    q_cap = draw(st.sampled_from([0.5, 1.0, 2.5, 10.0, 100.0]))
    warm = draw(st.integers(1, 12))
    return keys, rates, [f"r{i}" for i in range(replicas)], q_cap, warm


@settings(max_examples=300, deadline=None)
@given(instances())
def test_invariants(inst):
    keys, rates, replica_ids, q_cap, warm = inst
    plan = build_plan(keys, rates, replica_ids, q_cap, warm)
    R = len(replica_ids)
    sizes = dict(zip(keys, size_keys(np.array(rates), q_cap, R).tolist()))
    rate = dict(zip(keys, rates))
    # each admitted key has min(ceil(rate/q_cap), R) distinct, valid replicas
    for key, row in plan.table.items():
        assert len(row) == len(set(row)) == min(R, max(1, math.ceil(rate[key] / q_cap)))
        assert all(0 <= i < R for i in row)
        assert rate[key] > 0
    # the slot budget holds
    assert sum(len(row) for row in plan.table.values()) <= R * warm
    # greedy with skip-and-continue, stated on the admission order (rate desc, key asc):
    # an admitted key fits on top of all admitted keys before it; a positive key left out did not
    order = sorted(keys, key=lambda k: (-rate[k], k))
    used = 0
    for key in order:
        if key in plan.table:
            assert used + sizes[key] <= R * warm
            used += sizes[key]
        elif rate[key] > 0:
            assert used + sizes[key] > R * warm
    # hence: a left-out key that outranks an admitted key needs strictly more slots than it
    for hi, lo in itertools.combinations(order, 2):
        if hi not in plan.table and lo in plan.table and rate[hi] > 0:
            assert sizes[hi] > sizes[lo]
    # expected loads account for every request
    assert math.isclose(sum(plan.expected_load), sum(rates), rel_tol=1e-9, abs_tol=1e-9)
    mean = sum(plan.expected_load) / R
    if mean > 0:
        assert math.isclose(plan.predicted_imbalance, max(plan.expected_load) / mean, rel_tol=1e-12)


@settings(max_examples=300, deadline=None)
@given(instances())
def test_fast_build_equals_heapq_reference(inst):
    keys, rates, replica_ids, q_cap, warm = inst
    plan = build_plan(keys, rates, replica_ids, q_cap, warm)
    table, loads = bench.reference_build(keys, rates, replica_ids, q_cap, warm)
    assert dict(plan.table) == table
    assert list(plan.table) == list(table)  # same placement order
    assert list(plan.expected_load) == loads


def test_fast_build_equals_reference_on_larger_random_instances():
    rng = np.random.default_rng(11)
    for trial in range(12):
        n = int(rng.integers(500, 6000))
        rates = rng.lognormal(0.0, 1.65, n)
        if trial % 3 == 0:
            rates = np.round(rates, 1)  # many ties, some zeros
        rates[: int(rng.integers(0, 6))] *= 200  # whales
        keys = [f"key{int(i)}" for i in rng.permutation(n)]
        replica_ids = [f"r{i}" for i in range(int(rng.integers(1, 40)))]
        q_cap = float(rng.choice([0.5, 5.0, 50.0]))
        warm = int(rng.integers(1, 3 * n // len(replica_ids) + 2))
        plan = build_plan(keys, rates, replica_ids, q_cap, warm)
        table, loads = bench.reference_build(keys, rates.tolist(), replica_ids, q_cap, warm)
        assert dict(plan.table) == table and list(plan.table) == list(table)
        assert list(plan.expected_load) == loads


def brute_force_makespan(weights, replicas):
    best = math.inf
    for assignment in itertools.product(range(replicas), repeat=len(weights)):
        loads = [0.0] * replicas
        for w, r in zip(weights, assignment):
            loads[r] += w
        best = min(best, max(loads))
    return best


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0.01, 10.0), min_size=1, max_size=7), st.integers(2, 3))
def test_lpt_within_four_thirds_of_optimum(weights, replicas):
    keys = [f"k{i}" for i in range(len(weights))]
    # q_cap above every rate: k_b = 1; W large enough to admit all: no cold tail
    plan = build_plan(keys, weights, [f"r{i}" for i in range(replicas)], q_cap=100.0, warm_slots=len(weights))
    assert plan.admitted_keys == len(weights)
    optimum = brute_force_makespan(weights, replicas)
    assert max(plan.expected_load) <= (4 / 3 - 1 / (3 * replicas)) * optimum + 1e-9
