"""bench/peers.py's CI smoke: the real SGLang Model Gateway binary (sglang-router, from the
`peers` extra) and the CacheRoute stack, each in front of two cold simulated engines, the same
few seconds of multi-tenant text traffic, open loop. Checks that the harness still measures
what docs/peers.md reports (so it cannot rot), not who wins."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_peers_smoke(tmp_path):
    out = tmp_path / "smoke.json"
    plot = tmp_path / "smoke.png"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "peers.py"), "--smoke", "--quiet", "--out", str(out),
                           "--plot", str(plot), "--logs", str(tmp_path / "logs")],
                          cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["versions"]["sglang-router"] != "not installed"
    assert set(result["points"]) == {"cacheroute", "sglang-ca"}
    for router, (point,) in result["points"].items():
        assert point["requests"] >= 20, (router, point)
        assert point["errors"] == 0, (router, point["error_kinds"])
        assert 0 < point["ttft_p50"] <= point["ttft_p99"] < 30
        # 20 tenants with 1-4k-word system prompts: repeats hit under any router that forwards usage
        assert 0.3 < point["hit_rate"] <= 1.0
        assert point["engine_hit_rate"] == pytest.approx(point["hit_rate"], abs=0.1)
        assert sum(point["shares"].values()) == pytest.approx(1.0, abs=0.02)
        assert len(point["shares"]) == 2
        assert point["router_cpu_per_1k"] > 0
    assert result["points"]["cacheroute"][0]["share_source"] == "header"
    assert result["points"]["sglang-ca"][0]["share_source"] == "engine counters"
    assert result["points"]["cacheroute"][0]["control_cpu_per_1k"] > 0
    reasons = result["points"]["cacheroute"][0]["reasons"]
    assert sum(reasons.values()) == result["points"]["cacheroute"][0]["requests"] and set(reasons) <= {
        "planned", "cold", "fallback"}, reasons
    assert "| cacheroute | 10 |" in proc.stdout and "SLO capacity" in proc.stdout
    assert plot.stat().st_size > 1000
