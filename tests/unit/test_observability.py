"""deploy/observability: the generated dashboard is the committed one, the scrape config names
every compose service's metrics endpoint, and `promtool check config` accepts it (required
under CI=true)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OBS = ROOT / "deploy" / "observability"
sys.path.insert(0, str(ROOT / "scripts"))
import gen_dashboard  # noqa: E402


def test_regenerating_the_dashboard_gives_the_committed_json():
    committed = (OBS / "grafana" / "dashboards" / "cacheroute.json").read_text()
    assert gen_dashboard.render() == committed, "run python scripts/gen_dashboard.py"
    assert gen_dashboard.main(["--check"]) == 0


def test_dashboard_has_the_panels_and_the_provisioned_datasource():
    doc = json.loads((OBS / "grafana" / "dashboards" / "cacheroute.json").read_text())
    titles = " | ".join(p["title"] for p in doc["panels"]).lower()
    for word in ("per-replica", "achieved vs available", "routing reasons", "plan version", "churn", "ttft",
                 "ejections", "planner interval"):
        assert word in titles, word
    ds = yaml.safe_load((OBS / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uid = ds["datasources"][0]["uid"]
    assert all(t["datasource"]["uid"] == uid for p in doc["panels"] for t in p["targets"])
    provider = yaml.safe_load((OBS / "grafana" / "provisioning" / "dashboards" / "cacheroute.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    assert "vllm:time_to_first_token_seconds_bucket" in gen_dashboard.metric_names()


def _targets(config: dict) -> dict[str, set[str]]:
    return {job["job_name"]: {t for sc in job["static_configs"] for t in sc["targets"]}
            for job in config["scrape_configs"]}


def test_scrape_config_names_every_compose_metrics_endpoint():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    scraped = set().union(*_targets(yaml.safe_load((OBS / "prometheus.yml").read_text())).values())
    wanted = set()
    for name, svc in compose["services"].items():
        env = svc.get("environment") or {}
        if env.get("CACHEROUTE_METRICS_PORT"):
            wanted.add(f"{name}:{env['CACHEROUTE_METRICS_PORT']}")
        if name.startswith("engine-") and env.get("CACHEROUTE_HTTP_PORT"):
            wanted.add(f"{name}:{env['CACHEROUTE_HTTP_PORT']}")   # vLLM-named /metrics
    assert len(wanted) >= 8
    assert wanted <= scraped, sorted(wanted - scraped)


def test_promtool_accepts_the_scrape_config():
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool missing under CI=true: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    out = subprocess.run([promtool, "check", "config", str(OBS / "prometheus.yml")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
