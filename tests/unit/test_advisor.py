"""The capacity advisor (services/planner/advisor.py): more load needs more replicas, the table
covers N-k..N+k, bad input is a one-line error; the planner gauge follows a real store's window."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from services.core.engines import ACTIVE, DRAINING, Engine, EngineSet
from services.core.metrics import gap_cv
from services.model import ArrivalRecord, CacheStatRecord
from services.planner.advisor import (DEFAULT_OUTPUT_TOKENS, AdviceConfig, KeyLoad, RecommendedReplicas, advise,
                                     gauge_value)
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
    with pytest.raises(ValueError, match="output_tokens"):
        AdviceConfig(output_tokens=0)


def test_measured_output_and_burstiness_are_simulated_and_longer_outputs_need_more_replicas():
    cfg = AdviceConfig(replicas=4, spread=3, slo_p99=1.0, seconds=60, max_requests=3000)
    short = advise(loads(60), cfg, output_tokens=16)
    long = advise(loads(60), cfg, output_tokens=600)
    assert (short.output_tokens, short.output_measured, long.output_tokens) == (16, True, 600)
    assert long.recommended is None or (short.recommended is not None and long.recommended > short.recommended)
    fallback = advise(loads(60), cfg)
    assert (fallback.output_tokens, fallback.output_measured) == (DEFAULT_OUTPUT_TOKENS, False)
    assert advise(loads(60), cfg, output_tokens=float("nan")).output_measured is False
    bursty = advise(loads(60), cfg, output_tokens=200, cv=3.0)
    smooth = advise(loads(60), cfg, output_tokens=200, cv=1.0)
    assert bursty.cv == 3.0 and bursty.points[0].ttft_p99 > smooth.points[0].ttft_p99
    # the stream stays within max_requests (shortened, not cut)
    assert advise(loads(400), AdviceConfig(replicas=20, spread=0, seconds=60, max_requests=1000)).requests <= 1000


def test_gap_cv():
    import numpy as np

    rng = np.random.default_rng(1)
    assert gap_cv(rng.exponential(1.0, 20000).tolist()) == pytest.approx(1.0, abs=0.05)
    assert gap_cv(rng.gamma(1 / 1.9**2, 1.9**2, 20000).tolist()) == pytest.approx(1.9, rel=0.1)
    assert gap_cv([1.0] * 10) is None and gap_cv([1.0] * 40) == pytest.approx(0.1)     # clipped at 1/10


def test_the_planner_gauge_follows_the_store_window_off_the_planner_process(redis_url):
    """The gauge reads rates, the measured output (the completion counters) and the gap CV from
    a real store, and the simulation runs in a worker process: the planner's own CPU time stays
    a small part of what one advice costs."""

    async def main():
        store = RedisStore(redis_url)
        now = time.time()
        arrivals = [ArrivalRecord(f"k{i % 10}", now - 50 + i * 0.05, 2000, 1500) for i in range(1000)]
        await store.record_arrivals("b1", arrivals)
        await store.record_cache_stats("c1", [CacheStatRecord("e0", 1000, 500, 10, 10, 1230)], now=now - 5)
        registry = CollectorRegistry()
        rec = RecommendedReplicas(store, registry, AdviceConfig(replicas=2, spread=1, slo_p99=5.0),
                                  window_seconds=60, interval=1, clock=lambda: now)
        assert registry.get_sample_value("cacheroute_recommended_replicas") == 0
        try:
            await rec.step()                    # the worker process starts (imports the simulator)
            cpu = time.process_time()
            await rec.step()
            cpu = time.process_time() - cpu
            assert rec.last_replicas == 2       # no engine set stored: the configured N0
            engines = EngineSet(1, tuple(Engine(i, f"e{i}", state=ACTIVE if i < 3 else DRAINING) for i in range(4)))
            await store.put_engine_set(engines, expected=0)
            _, config, _, _ = await rec.inputs()
            assert config.replicas == 3         # the active engines now, not the draining one
        finally:
            await rec.stop()
            await store.close()
        return rec, registry.get_sample_value("cacheroute_recommended_replicas"), cpu

    rec, value, cpu = asyncio.run(main())
    assert rec.last is not None and rec.last.qps == pytest.approx(20, rel=0.3)
    assert (rec.last.output_tokens, rec.last.output_measured) == (123, True)
    assert rec.last.cv == pytest.approx(0.1)             # evenly spaced arrivals: the smallest CV kept
    assert value == gauge_value(rec.last, rec.config) and 1 <= value <= 4
    assert cpu < 0.5, cpu                                # the advice's seconds of CPU were the worker's


def test_the_planner_flags_turn_the_gauge_on_with_its_own_interval():
    from services.planner.__main__ import build_parser, config_from_args

    base = ["--replicas", "a,b,c", "--port", "0"]
    assert config_from_args(build_parser().parse_args(base)).advice is None
    cfg = config_from_args(build_parser().parse_args(base + ["--advise-slo-p99", "1.5"]))
    assert cfg.advice is not None and cfg.advice.replicas == 3 and cfg.advice.slo_p99 == 1.5
    assert (cfg.advice_interval, cfg.advice.output_tokens) == (60.0, DEFAULT_OUTPUT_TOKENS)
    cfg = config_from_args(build_parser().parse_args(
        base + ["--advise-slo-p99", "1", "--advise-interval", "5", "--advise-output-tokens", "300"]))
    assert (cfg.advice_interval, cfg.advice.output_tokens) == (5.0, 300)
    with pytest.raises(ValueError, match="advise-interval"):
        config_from_args(build_parser().parse_args(base + ["--advise-interval", "0"]))
