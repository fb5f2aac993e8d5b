"""Every metric the Grafana dashboard queries (scripts/gen_dashboard.py) is exported by a
running local stack (services/local/stack.py): scrape each service's metrics port and each engine's
HTTP /metrics, a little traffic first so the request-path families have been touched."""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.local.stack import Stack, StackConfig

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gen_dashboard  # noqa: E402

SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",), "summary": ("_sum", "_count"), "unknown": ("",)}


def _scrape(url: str, attempts: int = 5) -> str:
    for i in range(attempts):                    # robust under a loaded machine: retry, bounded
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.read().decode()
        except OSError:
            if i == attempts - 1:
                raise
            time.sleep(0.5 * (i + 1))
    raise AssertionError("unreachable")


def exported(text: str) -> set[str]:
    """Series names a scrape offers: the samples', and each family's by type (labelled
    families without children yet still declare themselves)."""
    names: set[str] = set()
    for fam in text_string_to_metric_families(text):
        names.update(s.name for s in fam.samples)
        names.update(fam.name + suffix for suffix in SUFFIXES.get(fam.type, ("",)))
    return names


def _post(url: str, body: bytes) -> None:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


@pytest.mark.timeout(120)
def test_every_dashboard_metric_is_exported_by_a_running_stack(tmp_path):
    cfg = StackConfig(engines=2, dispatchers=1, planner_interval=1.0, window_seconds=10.0, log_dir=str(tmp_path),
                      grace_seconds=0.2)
    with Stack(cfg) as stack:
        for i in range(4):
            _post(stack.http[0] + "/v1/completions",
                  b'{"model": "m", "prompt": "system prompt number %d and a question", "max_tokens": 2}' % i)
        urls = [f"http://127.0.0.1:{c.metrics_port}/metrics" for c in stack.children if c.metrics_port]
        urls += [u + "/metrics" for u in stack.engines_http]
        assert len(urls) >= 5 + 2, urls
        have: set[str] = set()
        for url in urls:
            have |= exported(_scrape(url))
    missing = [m for m in gen_dashboard.metric_names() if m not in have]
    assert not missing, f"dashboard reads metrics no service exports: {missing}"
