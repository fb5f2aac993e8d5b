"""`cacheroute route` and `cacheroute status`, run in-process against real servers."""

from __future__ import annotations

import json

import pytest

from clients.cli import main
from services.collector.service import CollectorConfig
from services.collector.service import serve as serve_collector
from services.dispatcher.service import serve
from services.engine.fleet import EngineFleet
from services.rpc import ServerConfig
from tests.integration.test_client import Background
from tests.integration.test_dispatcher import DEAD, dispatcher_config, hand_plan


@pytest.fixture
def stack(redis_url):
    bg = Background()

    async def up():
        collector = await serve_collector(CollectorConfig(server=ServerConfig(name="collector", port=0),
                                                          redis_url=redis_url))
        fleet = await EngineFleet(2, time_scale=0.01).start()
        dispatcher = await serve(dispatcher_config(fleet, dispatcher_id="d1"))
        dispatcher.router.set_plan(hand_plan(3, ("e0", "e1"), {"hot": (1,)}), flat=False, source="test")
        return collector, fleet, dispatcher

    collector, fleet, dispatcher = bg.run(up())
    yield collector, dispatcher

    async def down():
        await dispatcher.stop(0)
        await fleet.stop()
        await collector.stop(0)
    bg.run(down())
    bg.close()


def test_route_prints_the_decision(stack, capsys):
    _, dispatcher = stack
    assert main(["route", "hot", "--dispatcher", dispatcher.address]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"key": "hot", "replica_id": "e1", "address": doc["address"], "plan_version": 3, "reason": "planned"}
    assert main(["route", "--prompt", "some words here", "--dispatcher", f"{DEAD},{dispatcher.address}"]) == 0
    assert json.loads(capsys.readouterr().out)["reason"] == "cold"


def test_route_errors_are_one_line(stack, capsys):
    assert main(["route", "k", "--dispatcher", DEAD, "--timeout", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cacheroute: error: route failed at 127.0.0.1:1: UNAVAILABLE") and err.count("\n") == 1
    assert main(["route", "--dispatcher", DEAD]) == 2
    _, dispatcher = stack
    assert main(["route", "x" * 300, "--dispatcher", dispatcher.address]) == 2
    assert "INVALID_ARGUMENT" in capsys.readouterr().err


def test_status_reports_every_service(stack, capsys):
    collector, dispatcher = stack
    main(["route", "hot", "--dispatchers", dispatcher.address])      # route takes the shared flag
    capsys.readouterr()
    rc = main(["status", "--planner", "", "--collector", collector.address, "--dispatchers", dispatcher.address,
               "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["collector"]["health"] == "serving"
    [d] = doc["dispatchers"]
    assert (d["dispatcher_id"], d["plan_version"], d["mode"], d["routed"], d["planned"]) == ("d1", 3, "planned", 1, 1)
    assert [(r["replica_id"], r["healthy"], r["routed"]) for r in d["replicas"]] == [("e0", True, 0), ("e1", True, 1)]
    assert {"in_flight", "waiting", "running", "kv_usage", "hit_rate"} <= set(d["replicas"][0])

    rc = main(["status", "--planner", DEAD, "--collector", collector.address,
               "--dispatchers", f"{dispatcher.address},{DEAD}", "--timeout", "0.5", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert doc["planner"]["health"] == "unreachable" and doc["dispatchers"][1]["health"] == "unreachable"
    assert doc["dispatchers"][0]["health"] == "serving"

    # the default output is a table for people
    rc = main(["status", "--planner", DEAD, "--collector", collector.address, "--dispatchers", dispatcher.address,
               "--timeout", "0.5"])
    out = capsys.readouterr().out
    assert rc == 1
    lines = out.splitlines()
    assert lines[0].split() == ["SERVICE", "ADDRESS", "HEALTH", "DETAIL"]
    planner, coll, disp = lines[1:4]
    assert planner.split()[:3] == ["planner", DEAD, "unreachable"] and "UNAVAILABLE" in planner
    assert coll.split() == ["collector", collector.address, "serving"]
    assert disp.split()[:3] == ["dispatcher", dispatcher.address, "serving"]
    assert "d1, plan v3 (test), mode planned, routed 1 (planned 1, cold 0, fallback 0)" in disp
    assert lines[5] == f"replicas seen by d1 ({dispatcher.address})"
    assert lines[6].split() == ["REPLICA", "ADDRESS", "HEALTHY", "IN-FLIGHT", "WAITING", "RUNNING", "KV", "HIT", "ROUTED"]
    e0, e1 = (line.split() for line in lines[7:9])
    assert (e0[0], e0[2], e0[-1]) == ("e0", "yes", "0") and (e1[0], e1[2], e1[-1]) == ("e1", "yes", "1")
    assert e1[-2].endswith("%") and e1[-3].endswith("%")
