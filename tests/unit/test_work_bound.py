"""services/sim/bound.py: the per-request work by hand, and the bound against the engine model's
own step times (equal when steps have no fixed cost and the cache hits what an infinite one would,
below them otherwise)."""

from __future__ import annotations

import dataclasses

import pytest

from services.core.engine import PROFILES, EngineModel
from services.core.request import Request
from services.core.traces import ideal_hits
from services.sim.bound import request_work, utilization_bound

P70 = PROFILES["llama3-70b-fp8-h100x2"]
LINEAR = dataclasses.replace(P70, name="linear", t0=0.0, t_w=0.0)   # no fixed step cost


def test_request_work_by_hand():
    prof = dataclasses.replace(P70, a=1.0, b=2.0, d=3.0)
    # P 10, O 3, 4 cached: u 6, 2 decode tokens: a*8 + b*(6*4 + 36/2) + d*(2*10 + 1)
    assert request_work(prof, 10, 3, 4) == pytest.approx(8 + 2 * 42 + 3 * 21)
    assert request_work(prof, 10, 1, 0) == pytest.approx(10 + 2 * 50)       # no decode step


def test_more_cached_is_less_work():
    assert request_work(P70, 6000, 200, 5000) < request_work(P70, 6000, 200, 0)


@pytest.mark.parametrize("prompt,cached", [(0, 0), (10, 10), (10, -1)])
def test_bad_request_is_refused(prompt, cached):
    with pytest.raises(ValueError):
        request_work(P70, prompt, 5, cached)


def _busy(profile, requests):
    """Sum of step durations serving `requests` one after another on one engine."""
    eng, now, busy = EngineModel(profile, 4000), 0.0, 0.0
    for q in requests:
        eng.add(q, now)
        while (res := eng.step(now)) is not None:
            now += res.duration
            busy += res.duration
    return busy


def _requests():
    shared = tuple(range(100, 164))                  # 64 blocks (1,024 tokens) every request shares
    return [Request(i, float(i), f"k{i % 2}", 1024 + 16 * (i % 5) + 7, 20 + i, shared + tuple(range(1000 * i, 1000 * i + i % 5)))
            for i in range(6)]


def test_bound_is_the_engine_time_without_fixed_costs():
    reqs = _requests()
    assert sum(ideal_hits(reqs)) > 0
    work = utilization_bound(LINEAR, reqs, 1, 0.0, 10.0) * 10.0
    assert work == pytest.approx(_busy(LINEAR, reqs), rel=1e-9)


def test_bound_is_below_the_engine_time_with_them():
    reqs = _requests()
    bound = utilization_bound(P70, reqs, 1, 0.0, 10.0) * 10.0
    busy = _busy(P70, reqs)
    assert bound < busy
    # per replica and per second of window: 2 replicas over a window twice as long quarter it
    assert utilization_bound(P70, reqs, 2, 0.0, 20.0) * 10.0 == pytest.approx(bound / 4)


def test_window_counts_only_its_arrivals():
    reqs = _requests()
    hits = ideal_hits(reqs)
    late = utilization_bound(P70, reqs, 1, 3.0, 10.0) * 7.0
    assert late == pytest.approx(sum(request_work(P70, q.prompt_tokens, q.output_tokens, c)
                                     for q, c in zip(reqs[3:], hits[3:])))
    with pytest.raises(ValueError):
        utilization_bound(P70, reqs, 0, 0.0, 1.0)
