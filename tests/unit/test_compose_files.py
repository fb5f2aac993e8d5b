"""docker-compose*.yml as written: images from the environment, every published port on the
CACHEROUTE_PUBLISH_HOST address (127.0.0.1 by default) and movable, Redis unpublished, and
scripts/compose_check.py's list of port variables complete (the CI check moves every published
port to a free one; a port it missed would collide with whatever listens on the default).
scripts/compose_check.sh runs the stack itself in CI; this file needs no Docker."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FILES = ["docker-compose.yml", "docker-compose.external.yml"]
PORT = re.compile(r"^\$\{CACHEROUTE_PUBLISH_HOST:-127\.0\.0\.1\}:\$\{CACHEROUTE_PUBLISH_([A-Z0-9_]+):-\d+\}:\d+$")


def services(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text())["services"]


def compose_check():
    spec = importlib.util.spec_from_file_location("compose_check", ROOT / "scripts" / "compose_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", FILES)
def test_published_ports_bind_the_publish_host_and_are_overridable(name):
    seen = set()
    for svc, body in services(name).items():
        for entry in body.get("ports", []):
            match = PORT.match(entry)
            assert match, f"{name} {svc}: {entry!r} is not ${{CACHEROUTE_PUBLISH_HOST:-127.0.0.1}}:${{CACHEROUTE_PUBLISH_X:-N}}:N"
            assert match.group(1) not in seen, f"{name}: CACHEROUTE_PUBLISH_{match.group(1)} used twice"
            seen.add(match.group(1))
    assert seen


@pytest.mark.parametrize("name", FILES)
def test_redis_is_not_published_and_images_come_from_the_environment(name):
    svcs = services(name)
    assert "ports" not in svcs["redis"]
    assert svcs["redis"]["image"] == "${CACHEROUTE_REDIS_IMAGE:-redis:7}"
    for svc, body in svcs.items():
        if svc == "redis":
            continue
        assert re.fullmatch(r"\$\{CACHEROUTE_([A-Z]+_)?IMAGE:-[^}]+\}", body["image"]), f"{name} {svc}: {body['image']}"
        if "build" in body:
            assert body["build"]["args"] == {"BASE_IMAGE": "${CACHEROUTE_BASE_IMAGE:-python:3.11-slim}",
                                             "WHEELHOUSE": "${CACHEROUTE_WHEELHOUSE:-}"}


def test_the_check_moves_every_published_port_of_the_core_stack():
    core = {svc: body for svc, body in services("docker-compose.yml").items() if "profiles" not in body}
    variables = {PORT.match(p).group(1) for body in core.values() for p in body.get("ports", [])}
    assert variables == set(compose_check().PUBLISHED)


def test_the_observability_profile_mounts_deploy_observability():
    svcs = services("docker-compose.yml")
    assert svcs["prometheus"]["profiles"] == svcs["grafana"]["profiles"] == ["observability"]
    assert "./deploy/observability/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in svcs["prometheus"]["volumes"]
    assert all(v.startswith("./deploy/observability/grafana/") for v in svcs["grafana"]["volumes"])


def demo_result(**planned):
    base = {"requests": 10, "errors": 0, "plan_versions": [3], "by_reason": {"planned": 6, "cold": 4}, "error_codes": {}}
    flat = {"requests": 10, "errors": 0, "plan_versions": [3], "by_reason": {"fallback": 10}, "error_codes": {}}
    return {"modes": {"planned": {**base, **planned}, "flat": flat}, "notes": ["plan v3: 5 of 5 keys admitted"]}


def test_demo_verdict_passes_a_clean_run_and_names_each_failure():
    verdict = compose_check().demo_verdict
    assert verdict(demo_result(), require_planned_routes=True) == ""
    assert "2 errors" in verdict(demo_result(errors=2, error_codes={"UNAVAILABLE": 2}), require_planned_routes=True)
    assert "no requests" in verdict(demo_result(requests=0), require_planned_routes=True)
    cold = demo_result(by_reason={"cold": 10})
    assert "routed by the plan" in verdict(cold, require_planned_routes=True)
    assert verdict(cold, require_planned_routes=False) == ""
    unplanned = demo_result()
    unplanned["notes"] = ["BuildPlan failed (ABORTED: ...); using the planner loop's plan"]
    assert "no plan was built" in verdict(unplanned, require_planned_routes=True)
