"""The planner's rate-history option: an EWMA over the collector's buckets, read as nested
windows, and its flags."""

from __future__ import annotations

import asyncio
import math

import pytest

from services.planner.__main__ import build_parser, config_from_args
from services.planner.control import history_snapshot
from services.store import ArrivalRecord, MemoryStore, TelemetryConfig


def test_history_snapshot_remembers_a_key_the_last_window_forgot():
    async def scenario():
        store = MemoryStore(TelemetryConfig(bucket_seconds=10, retention_seconds=600))
        now = 1_000_000.0
        # "steady" at 1 req/s over the last 240 s; "gone" at 2 req/s from 240 s to 120 s ago
        arrivals = [ArrivalRecord("steady", now - 240 + i + 0.5, 1000, 800) for i in range(240)]
        arrivals += [ArrivalRecord("gone", now - 240 + i / 2 + 0.25, 1000, 600) for i in range(240)]
        await store.record_arrivals("b1", arrivals)
        last = await store.window_rates(now, 30)
        hist = await history_snapshot(store, now, 30, 120, 240)
        return last, hist

    last, hist = asyncio.run(scenario())
    assert "gone" not in last.keys
    rates = dict(zip(hist.keys, hist.rates))
    assert rates["steady"] == pytest.approx(1.0, rel=0.1)
    assert 0 < rates["gone"] < 1.0                      # remembered, discounted by its age
    assert hist.keys[0] == "steady" and hist.snapshot_id.startswith("ewma:")
    assert hist.prefix_map()["gone"] == pytest.approx(600)


def test_rate_history_flags(monkeypatch):
    monkeypatch.setenv("CACHEROUTE_REPLICAS", "a,b")
    parse = lambda *a: config_from_args(build_parser().parse_args(list(a)))   # noqa: E731
    assert parse().loop.rate_horizon is None
    cfg = parse("--rate-horizon", "600")
    assert cfg.loop.rate_horizon == 600 and cfg.loop.rate_history == 1800
    assert parse("--rate-horizon", "600", "--rate-history", "900").loop.rate_history == 900
    monkeypatch.setenv("CACHEROUTE_RATE_HORIZON", "60")
    assert parse().loop.rate_horizon == 60
    for bad in (["--rate-horizon", "-1"], ["--rate-history", "99999"], ["--rate-horizon", "nan"]):
        with pytest.raises(ValueError):
            parse(*bad)
    assert math.isfinite(parse("--rate-horizon", "10").loop.rate_history)
