"""bench/peers.py's CI smoke: the real Shepherd Model Gateway (smg 1.13) and SGLang Model Gateway
(sglang-router 0.3.2) binaries from the `peers` extra, and the CacheRoute stack, each as a tier
of 2 instances in front of two cold simulated engines, the same few seconds of multi-tenant text
traffic spread round robin over the instances, with instance 1 restarted mid-run. Checks that
the harness still measures what docs/peers.md reports (so it cannot rot), not who wins."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_peers_smoke(tmp_path):
    out = tmp_path / "smoke.json"
    plot = tmp_path / "smoke.png"
    series = tmp_path / "series.png"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "peers.py"), "--smoke", "--workload", "restart",
                           "--quiet", "--out", str(out), "--plot", str(plot), "--series-plot", str(series),
                           "--logs", str(tmp_path / "logs")],
                          cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["versions"]["smg"].startswith("1.") and result["versions"]["sglang-router"] != "not installed"
    assert result["tier"] == 2 and set(result["points"]) == {"cacheroute", "smg-ca", "sglang-ca"}
    for router, (point,) in result["points"].items():
        assert point["tier"] == 2 and point["requests"] >= 20, (router, point)
        # instance 1 leaves the rotation, restarts and comes back; the other one serves meanwhile
        assert point["errors"] <= 1, (router, point["error_kinds"])
        assert [(e["kind"], e["instance"]) for e in point["events"]] == [("restart", 0)], point["events"]
        assert 0 < point["ttft_p50"] <= point["ttft_p99"] < 30
        # 20 tenants with 1-4k-word system prompts: repeats hit under any router that forwards usage
        assert 0.3 < point["hit_rate"] <= 1.0
        assert point["engine_hit_rate"] == pytest.approx(point["hit_rate"], abs=0.1)
        assert sum(point["shares"].values()) == pytest.approx(1.0, abs=0.02) and len(point["shares"]) == 2
        assert point["router_cpu_per_1k"] > 0 and point["router_core_share"] > 0
        m = point["misses"]
        assert m["hit"] == pytest.approx(point["hit_rate"])
        assert m["hit"] + sum(m["missed"].values()) == pytest.approx(m["reusable"], abs=1e-9)
        assert 0 < m["bound"] <= m["reusable"] + 1e-9
        assert point["series"] and sum(b["requests"] for b in point["series"]) == point["offered"]
    cr = result["points"]["cacheroute"][0]
    assert cr["share_source"] == "router header" and cr["control_cpu_per_1k"] > 0
    assert result["points"]["smg-ca"][0]["share_source"] == "engine header"   # x-engine-replica passed through
    assert cr["ok"] <= sum(cr["reasons"].values()) <= cr["requests"]
    assert set(cr["reasons"]) <= {"planned", "cold", "fallback"}, cr["reasons"]
    assert "| smg-ca | 2 | 10 |" in proc.stdout and "SLO capacity" in proc.stdout
    assert plot.stat().st_size > 1000 and series.stat().st_size > 1000
