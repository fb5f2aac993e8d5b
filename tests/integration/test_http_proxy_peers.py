"""bench/http_proxy.py --routers: one tiny block per router (CacheRoute's dispatcher, and the real
vllm-router and smg binaries from the `peers` extra) in front of one simulated engine, so the
harness that compares their CPU per request keeps measuring what docs/benchmarks.md reports.
Checks the harness (every request answered through the router, its CPU read from the router's
own process tree, the peer's version and policy recorded), not who wins. A peer that is not
installed is skipped with the reason (the `peers` extra is what .ci/run installs)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import http_proxy  # noqa: E402

RATE, SECONDS = 40, 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("router", http_proxy.ROUTER_CHOICES)
def test_one_tiny_block_through_each_router(router):
    reason = http_proxy.missing(router)
    if reason:
        pytest.skip(reason)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "http_proxy.py"), "--routers", router,
                           "--blocks", "1", "--rates", str(RATE), "--seconds", str(SECONDS), "--idle", "0.5",
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=28)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    (block,) = doc["blocks"]
    assert block["router"] == router and block["rate"] == RATE and doc["engines"] == 1
    assert block["requests"] == RATE * SECONDS
    assert block["errors"] == {"direct": 0, "proxied": 0}, block["errors"]
    # the router's process tree did the proxying: its CPU over the proxied slices is not zero
    assert block["cpu_s"] > 0 and block["cpu_s_per_1k"] >= 0 and 0 <= block["idle_cpu_share"] < 1
    ttfb, total = block["ttfb"], block["total"]
    assert 0 < ttfb["proxied_p50_ms"] <= ttfb["proxied_p99_ms"] < 10_000
    assert ttfb["proxied_p50_ms"] <= total["proxied_p50_ms"]
    assert math.isfinite(ttfb["added_p50_ms"]) and math.isfinite(ttfb["added_p99_ms"])
    assert len(doc["loadavg_start"]) == len(doc["loadavg_end"]) == 3
    if router == "cacheroute":
        assert doc["versions"] == {} and doc["policies"] == {}
    else:
        policy = "round_robin" if router == "vllm-router-rr" else "cache_aware"
        assert doc["versions"][router][0].isdigit() and doc["policies"][router] == policy
