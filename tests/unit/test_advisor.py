"""The capacity advisor (services/planner/advisor.py): more load needs more replicas, the table
covers N-k..N+k, bad input is a one-line error; the planner gauge follows a real store's window."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from services.model import ArrivalRecord
from services.planner.advisor import AdviceConfig, KeyLoad, RecommendedReplicas, advise, gauge_value
from services.store import RedisStore


def loads(total_qps: float, keys: int = 40) -> list[KeyLoad]:
    weights = [1.0 / (i + 1) for i in range(keys)]
    s = sum(weights)
    return [KeyLoad(f"k{i}", total_qps * w / s, 3000, 2500) for i, w in enumerate(weights)]


def test_more_load_needs_more_replicas_and_the_table_spans_the_range():
    cfg = AdviceConfig(replicas=8, spread=3, slo_p99=0.5, seconds=20, max_requests=2500)
    t0 = time.monotonic()
    low, high = advise(loads(40), cfg), advise(loads(400), cfg)
    assert time.monotonic() - t0 < 30
    assert [p.replicas for p in low.points] == list(range(5, 12))
    assert low.recommended is not None
    assert high.recommended is None or high.recommended > low.recommended
    # the smallest N meeting the SLO: every point from there on meets it too, none before
    for adv in (low, high):
        if adv.recommended is not None:
            assert all(p.meets_slo == (p.replicas >= adv.recommended) for p in adv.points), adv.points
    assert high.points[0].ttft_p99 > high.points[-1].ttft_p99      # more replicas, shorter queues
    assert gauge_value(high, cfg) >= gauge_value(low, cfg)
    assert gauge_value(type(high)(high.points, None, 0, 0.0), cfg) == 12


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="too little traffic"):
        advise([KeyLoad("k", 0.01, 100, 50)], AdviceConfig(seconds=10))
    with pytest.raises(ValueError, match="replicas"):
        AdviceConfig(replicas=0)
    with pytest.raises(ValueError):
        AdviceConfig(profile="no-such-profile")


def test_the_planner_gauge_follows_the_store_window(redis_url):
    async def main():
        store = RedisStore(redis_url)
        now = time.time()
        arrivals = [ArrivalRecord(f"k{i % 10}", now - 50 + i * 0.05, 2000, 1500) for i in range(1000)]
        await store.record_arrivals("b1", arrivals)
        registry = CollectorRegistry()
        rec = RecommendedReplicas(store, registry, AdviceConfig(replicas=2, spread=1, slo_p99=5.0, seconds=20),
                                  window_seconds=60, interval=1, clock=lambda: now)
        assert registry.get_sample_value("cacheroute_recommended_replicas") == 0
        await rec.step()
        await store.close()
        return rec, registry.get_sample_value("cacheroute_recommended_replicas")

    rec, value = asyncio.run(main())
    assert rec.last is not None and rec.last.qps == pytest.approx(20, rel=0.3)
    assert value == gauge_value(rec.last, rec.config) and 1 <= value <= 4


def test_the_planner_flag_turns_the_gauge_on():
    from services.planner.__main__ import build_parser, config_from_args

    base = ["--replicas", "a,b,c", "--port", "0"]
    assert config_from_args(build_parser().parse_args(base)).advice is None
    cfg = config_from_args(build_parser().parse_args(base + ["--advise-slo-p99", "1.5"])).advice
    assert cfg is not None and cfg.replicas == 3 and cfg.slo_p99 == 1.5
