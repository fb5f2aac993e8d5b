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

    async def run_point(router, scale, workload, qps, seed, log_root, progress=True):
        calls.append(qps)
        if qps in broken_once:
            broken_once.discard(qps)
            raise RuntimeError("engine-2 exited with 1")
        return {"router": router, "qps": qps, "requests": 10, "ok": 10, "errors": 0, "ttft_p99": p99[qps],
                "ttft_p50": p99[qps] / 2, "hit_rate": 0.5, "shares": {}}

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
