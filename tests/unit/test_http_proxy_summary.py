"""bench/http_proxy.py --routers' table: per router and rate, the median and range over blocks,
errors summed, and the CPU ratio against vllm-router from the same run. Blocks are made up."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import http_proxy  # noqa: E402


def block(router: str, rate: float, cpu_ms: float, p50: float, p99: float, errors: int = 0) -> dict:
    return {"router": router, "rate": rate, "block": 0, "idle_cpu_share": 0.01, "requests": 100,
            "errors": {"direct": 0, "proxied": errors}, "lag_p99_ms": 1.0, "cpu_s_per_1k": cpu_ms,
            "ttfb": {"added_p50_ms": p50, "added_p99_ms": p99}}


def doc(blocks: list[dict], routers=("cacheroute", "vllm-router")) -> dict:
    return {"routers": list(routers), "rates": [500.0], "engines": 1, "time_scale": 0.01, "seconds": 5,
            "blocks_per_router": 3, "idle_seconds": 3, "versions": {"vllm-router": "0.1.17"},
            "policies": {"vllm-router": "cache_aware"}, "loadavg_start": (0.5, 0.4, 0.3),
            "loadavg_end": (0.9, 0.5, 0.3), "blocks": blocks}


def test_median_and_range_over_blocks_per_router():
    blocks = [block("cacheroute", 500.0, c, p, 3.0, e) for c, p, e in ((0.9, 0.8, 0), (0.7, 0.6, 2), (1.5, 1.0, 1))]
    blocks += [block("vllm-router", 500.0, c, 0.5, 2.0) for c in (0.5, 0.6, 0.4)]
    rows = {r["router"]: r for r in http_proxy.summary(doc(blocks))}
    ours = rows["cacheroute"]
    assert ours["blocks"] == 3 and ours["requests"] == 300 and ours["errors_proxied"] == 3
    assert ours["cpu_ms_per_request"] == {"median": 0.9, "min": 0.7, "max": 1.5}
    assert ours["ttfb_added_p50_ms"] == {"median": 0.8, "min": 0.6, "max": 1.0}
    assert rows["vllm-router"]["cpu_ms_per_request"]["median"] == 0.5


@pytest.mark.parametrize("ours, verdict", [(0.9, "1.80x (medians of the same run; goal <= 1: NOT met)"),
                                           (0.4, "0.80x (medians of the same run; goal <= 1: met)")])
def test_the_ratio_line_compares_medians_of_the_same_run(ours, verdict):
    blocks = [block("cacheroute", 500.0, ours, 0.8, 3.0), block("vllm-router", 500.0, 0.5, 0.5, 2.0)]
    text = http_proxy.beside_table(doc(blocks))
    assert "load average at start 0.50 0.40 0.30, at end 0.90 0.50 0.30" in text
    assert "vllm-router 0.1.17 (policy cache_aware, its default)" in text
    assert f"500 req/s: CPU per request cacheroute / vllm-router {verdict}" in text


def test_no_ratio_without_vllm_router():
    text = http_proxy.beside_table(doc([block("cacheroute", 500.0, 0.9, 0.8, 3.0)], routers=("cacheroute",)))
    assert "cacheroute / vllm-router" not in text


def test_an_unknown_router_is_refused():
    with pytest.raises(ValueError, match="unknown router 'nginx'"):
        http_proxy.missing("nginx")


def test_a_ratio_to_each_vllm_router_policy_and_no_default_claim_for_round_robin():
    d = doc([block("cacheroute", 500.0, 0.6, 0.8, 3.0), block("vllm-router", 500.0, 0.5, 0.5, 2.0),
             block("vllm-router-rr", 500.0, 0.3, 0.4, 1.0)], routers=("cacheroute", "vllm-router", "vllm-router-rr"))
    d["versions"]["vllm-router-rr"] = "0.1.17"
    d["policies"]["vllm-router-rr"] = "round_robin"
    text = http_proxy.beside_table(d)
    assert "cacheroute / vllm-router 1.20x" in text and "cacheroute / vllm-router-rr 2.00x" in text
    assert "vllm-router-rr 0.1.17 (policy round_robin)" in text


def test_each_peer_name_runs_its_own_launchers_policy():
    assert {n: http_proxy.peer_policy(n) for n in http_proxy.PEER_LAUNCHERS} == {
        "vllm-router": "cache_aware", "vllm-router-rr": "round_robin", "smg": "cache_aware"}
