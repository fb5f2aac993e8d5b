"""place_lpt with equal-rate runs placed by one merge (services.core.lpt._equal_run) places
every key where the one-by-one heap did (tests/reference/lpt_v1.py), with bit-identical loads:
windowed counts (long ties), continuous rates (no ties), k_b > 1 between runs, zero rates,
loads spread far wider than a run fills, one replica."""

from __future__ import annotations

import heapq
import math
import struct

import numpy as np
import pytest

from services.core import lpt as planning
from services.core.planning import admit, place_lpt, size_keys
from tests.reference import lpt_v1


def bits(xs):
    return [struct.pack("<d", x) for x in xs]


def admission(counts: np.ndarray, window: float, q_cap: float, R: int, W: int):
    rates = counts / window
    keys = [f"k{i}" for i in range(len(rates))]
    sizes = size_keys(rates, q_cap, R)
    chosen = admit(keys, rates, sizes, R * W)
    return rates[chosen].tolist(), sizes[chosen].tolist()


CASES = [
    # (keys, sigma, window, replicas, q_cap share, warm slots per replica or None = all)
    (20_000, 1.65, 300.0, 32, 1.2, None),
    (50_000, 1.65, 300.0, 32, 1.2, None),
    (20_000, 0.5, 300.0, 7, 1.0, None),
    (30_000, 2.5, 60.0, 16, 0.3, None),      # hot keys of k_b > 1 at the head
    (20_000, 1.65, 300.0, 32, 1.2, 200),     # the budget binds
    (5_000, 1.65, 300.0, 1, 1.2, None),
]


@pytest.mark.parametrize("n,sigma,window,R,q_share,W", CASES)
@pytest.mark.parametrize("seed", [1, 2])
def test_place_lpt_equals_the_heap_on_windowed_counts(n, sigma, window, R, q_share, W, seed):
    rng = np.random.default_rng(seed)
    counts = 1 + np.floor(rng.lognormal(0.0, sigma, n))
    q_cap = q_share * float(counts.sum()) / window / R
    lam, k = admission(counts, window, q_cap, R, W if W is not None else math.ceil(n / R))
    cold = float(rng.uniform(0, 2))
    assert planning._equal_runs(np.array(lam), np.array(k, dtype=np.int64))   # the merge path runs
    for rows in (True, False):
        got_rows, got_loads = place_lpt(lam, k, R, cold, rows=rows)
        want_rows, want_loads = lpt_v1.place_lpt(lam, k, R, cold, rows=rows)
        assert got_rows == want_rows
        assert bits(got_loads) == bits(want_loads)


def test_place_lpt_equals_the_heap_without_ties_and_with_mixed_runs():
    rng = np.random.default_rng(5)
    lam = sorted(rng.lognormal(0, 1.65, 5_000).tolist(), reverse=True)            # no ties
    mixed = [50.0] * 3 + [3.0] * 600 + [2.5] * 100 + [2.0] * 1_000 + [0.0] * 400   # k 2 head, zeros tail
    sizes = [2, 2, 2] + [1] * (len(mixed) - 3)
    for rates, k, R in ((lam, [1] * len(lam), 32), (mixed, sizes, 5), (mixed[::-1], sizes[::-1], 5)):
        for rows in (True, False):
            got = place_lpt(rates, k, R, 0.25, rows=rows)
            want = lpt_v1.place_lpt(rates, k, R, 0.25, rows=rows)
            assert got[0] == want[0] and bits(got[1]) == bits(want[1])


def test_equal_run_merges_and_hands_wide_spreads_to_the_heap():
    loads = [0.1, 0.7, 0.3, 0.3, 5.0]
    got = planning._equal_run(loads, 0.01, 1_000)
    assert got is not None
    heap = [(x, i) for i, x in enumerate(loads)]       # the heap's steps from `loads`, by hand
    heapq.heapify(heap)
    reps = []
    for _ in range(1_000):
        x, i = heap[0]
        heapq.heapreplace(heap, (x + 0.01, i))
        reps.append(i)
    final = [0.0] * 5
    for x, i in heap:
        final[i] = x
    assert got[1].tolist() == reps and bits(got[0]) == bits(final)
    assert 4 not in reps                                  # 5.0 is above the level 1,000 keys fill to
    assert planning._equal_run([0.0, 1e6], 1.0, 300) is None     # the spread dwarfs the run: the heap
