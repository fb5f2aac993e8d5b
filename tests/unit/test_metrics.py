"""SPEC section 6 metrics: hit rate, percentiles, imbalance, SLO capacity with censoring."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.core.metrics import hit_rate, imbalance, percentile, slo_capacity, summarize


def test_hit_rate_is_token_weighted():
    assert hit_rate([100, 0], [100, 300]) == pytest.approx(0.25)
    assert hit_rate([], []) == 0.0


def test_percentile_interpolates_and_handles_empty():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert math.isnan(percentile([], 99))


def test_imbalance_counts_idle_replicas():
    assert imbalance([10, 10, 10]) == 1.0
    assert imbalance([30, 0, 0]) == 3.0
    assert math.isnan(imbalance([0, 0]))


@pytest.mark.parametrize("points, cap, censored, monotone", [
    ([(10, 1.0), (20, 2.0), (30, 5.0)], 20, "none", True),
    ([(10, 5.0), (20, 6.0)], 0.0, "left", True),
    ([(10, 1.0), (20, 2.0)], 20, "right", True),
    ([(10, 1.0), (20, 9.0), (30, 2.0), (40, 9.0)], 10, "none", False),   # a noisy pass above the knee
    ([(30, 5.0), (10, 1.0), (20, math.inf)], 10, "none", True),          # unsorted input, inf p99
])
def test_slo_capacity(points, cap, censored, monotone):
    c = slo_capacity(points, 3.5)
    assert (c.capacity, c.censored, c.monotone) == (cap, censored, monotone)


def test_summarize_window_failures_and_unfinished():
    arrival = np.array([0.0, 5.0, 6.0, 7.0, 8.0])
    replica = np.array([0, 0, 1, 1, -1])
    ttft = np.array([9.0, 0.1, 0.3, np.nan, np.nan])
    cached = np.array([0, 50, 0, 0, 0])
    prompt = np.array([100, 100, 100, 100, 100])
    failed = np.array([False, False, False, True, True])
    m = summarize(arrival, replica, ttft, cached, prompt, failed, replicas=2, warmup=1.0, end=10.0)
    assert m.requests == 4 and m.served == 2 and m.failed == 2 and m.unfinished == 0
    assert m.hit_rate == pytest.approx(0.25)
    assert m.served_per_replica == (1, 2) and m.imbalance == pytest.approx(2 / 1.5)
    assert m.ttft_p99 == pytest.approx(0.298)
    failed[3] = False   # now one request never got a first token: p99 cannot pass any SLO
    m = summarize(arrival, replica, ttft, cached, prompt, failed, replicas=2, warmup=1.0, end=10.0)
    assert m.unfinished == 1 and m.ttft_p99 == math.inf
