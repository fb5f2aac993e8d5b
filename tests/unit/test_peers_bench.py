"""bench/peers.py's sweep bookkeeping: stopping past the knee, retrying a broken point once,
and merging re-run points into a stored result. run_point is replaced by a table of p99s."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def peers():
    spec = importlib.util.spec_from_file_location("peers_bench", ROOT / "bench" / "peers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def fake_points(monkeypatch, peers, p99: dict[float, float], broken: tuple[float, ...] = ()):
    calls: list[float] = []
    broken_once = set(broken)

    async def run_point(router, scale, workload, qps, seed, log_root, progress=True, tier=1):
        calls.append(qps)
        if qps in broken_once:
            broken_once.discard(qps)
            raise RuntimeError("engine-2 exited with 1")
        value = p99[qps] if not callable(p99[qps]) else p99[qps](seed)
        return {"router": router, "qps": qps, "requests": 10, "ok": 10, "errors": 0, "ttft_p99": value,
                "ttft_p50": value / 2, "hit_rate": 0.5, "shares": {}, "tier": tier, "seed": seed}

    monkeypatch.setattr(peers, "run_point", run_point)
    return calls


def test_the_sweep_stops_one_point_past_the_knee_and_retries_a_broken_point(monkeypatch, peers, tmp_path):
    grid = [25.0, 50.0, 100.0, 150.0, 200.0]
    calls = fake_points(monkeypatch, peers, {25.0: 0.1, 50.0: 0.9, 100.0: 0.2, 150.0: 3.0, 200.0: 4.0},
                        broken=(25.0,))
    result = asyncio.run(peers.sweep(peers.SIM, "tenants", ["sglang-rr"], grid, 1, tmp_path, progress=False,
                                     past_knee=1))
    assert calls == [25.0, 25.0, 50.0, 100.0]                 # 25 retried once; 50 fails; one more; stop
    assert result["skipped"] == {"sglang-rr": [150.0, 200.0]}
    assert result["capacity"]["sglang-rr"] == {"capacity": 25.0, "censored": "none"}

    calls.clear()
    everything = asyncio.run(peers.sweep(peers.SIM, "tenants", ["direct"], grid, 1, tmp_path, progress=False))
    assert calls == grid and not everything["skipped"]


def test_merge_replaces_only_the_rates_re_run(monkeypatch, peers, tmp_path):
    fake_points(monkeypatch, peers, {25.0: 0.1, 50.0: 0.2, 100.0: 0.3, 200.0: 9.0})
    old = asyncio.run(peers.sweep(peers.SIM, "tenants", ["sglang-ca", "direct"], [25.0, 50.0, 100.0], 1, tmp_path,
                                  progress=False))
    fake_points(monkeypatch, peers, {50.0: 0.4, 200.0: 9.0})
    new = asyncio.run(peers.sweep(peers.SIM, "tenants", ["sglang-ca"], [50.0, 200.0], 1, tmp_path, progress=False))
    merged = peers.merge(old, new)
    assert [(p["qps"], p["ttft_p99"]) for p in merged["points"]["sglang-ca"]] == [
        (25.0, 0.1), (50.0, 0.4), (100.0, 0.3), (200.0, 9.0)]
    assert merged["points"]["direct"] == old["points"]["direct"]
    assert merged["capacity"]["sglang-ca"] == {"capacity": 100.0, "censored": "none"}
    assert merged["grid"] == [25.0, 50.0, 100.0, 200.0] and len(merged["runs"]) == 2
    with pytest.raises(SystemExit, match="cannot merge"):
        peers.merge(old, {**new, "slo": math.pi})


def test_repeats_take_the_median_with_the_spread_and_a_capacity_per_repeat(monkeypatch, peers, tmp_path):
    # seed 1 and 3 pass at 50 req/s, seed 2 fails there: the median passes, one repeat's capacity is 25
    fake_points(monkeypatch, peers, {25.0: lambda s: 0.1 * s, 50.0: lambda s: {1: 0.2, 2: 0.9, 3: 0.3}[s]})
    result = asyncio.run(peers.sweep(peers.SIM, "tenants", ["smg-ca"], [25.0, 50.0], 1, tmp_path, progress=False,
                                     tier=4, repeats=3))
    p25, p50 = result["points"]["smg-ca"]
    assert p50["repeats"] == 3 and p50["ttft_p99"] == pytest.approx(0.3)
    assert p50["spread"]["ttft_p99"] == [pytest.approx(0.2), pytest.approx(0.9)]
    assert p25["ttft_p99"] == pytest.approx(0.2) and p50["requests"] == 30
    assert [r["seed"] for r in p50["runs"]] == [1, 2, 3] and p50["tier"] == 4
    cap = result["capacity"]["smg-ca"]
    assert cap["capacity"] == 50.0 and cap["repeats"] == [50.0, 25.0, 50.0] and cap["spread"] == [25.0, 50.0]
    assert result["tier"] == 4 and "| smg-ca | 4 | 50 |" in peers.table(result)
    assert "At 50 req/s, the highest rate every router passes: smg-ca p99 300 ms" in peers.table(result)


def test_event_times_per_workload(peers):
    assert peers.event_times(peers.BOUND, "restart", 4) == [(60.0, "restart", 0), (80.0, "restart", 1),
                                                           (100.0, "restart", 2), (120.0, "restart", 3)]
    assert peers.event_times(peers.BOUND, "kill", 4) == [(90.0, "kill", 3)]
    assert peers.event_times(peers.BOUND, "drift", 1) == [(60.0, "rotate", -1), (120.0, "rotate", -1)]
    assert peers.event_times(peers.BOUND, "tenants", 4) == []
    assert peers.event_times(peers.SMOKE, "restart", 2) == [(2.0, "restart", 0)]   # the second is past the run
    with pytest.raises(SystemExit):
        peers.main(["--scale", "bound", "--workload", "kill", "--tier", "1"])


def test_the_bound_scale_is_engine_bound_by_its_own_arithmetic(peers):
    from services.core.engine import get_profile

    b = peers.BOUND
    prof = get_profile(b.profile)
    mean_prompt = (4096 - 1024) / math.log(4)
    working_set = b.workload_knobs["tenants"]["tenants"] * mean_prompt
    cache = b.replicas * b.kv_blocks * 16
    assert 1.5 <= working_set / cache <= 3.0
    idle = prof.prefill_time(round(mean_prompt))
    assert 4 <= b.slo["tenants"] / b.time_scale / idle <= 8     # the SLO is a few idle cold prefills
    assert b.slo["tenants"] == pytest.approx(1.0 * b.time_scale)


def test_the_mooncake_trace_is_found_only_under_cacheroute_data(peers, tmp_path, monkeypatch):
    name = tmp_path / "mooncake" / "conversation_trace.first_half.jsonl"
    monkeypatch.setenv("CACHEROUTE_DATA", str(tmp_path))
    with pytest.raises(ValueError, match="set CACHEROUTE_DATA"):
        peers._mooncake_path()
    name.parent.mkdir()
    name.write_text("")
    assert peers._mooncake_path() == str(name)
    monkeypatch.delenv("CACHEROUTE_DATA")
    with pytest.raises(ValueError, match="set CACHEROUTE_DATA"):
        peers._mooncake_path()
