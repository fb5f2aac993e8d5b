"""kill -9 the planner while dispatchers serve traffic: no Route call fails, the dispatchers
keep the last plan, and a new planner process takes the lease and continues the version
sequence from the store's counter (next version = old max + 1)."""

from __future__ import annotations

import signal
import time

import pytest
import redis

from clients import CacheRouteClient
from tests.faults.procs import Procs
from tests.faults.traffic import RouteTraffic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

STORE = ["--bucket-seconds", "1", "--retention-seconds", "120"]


def planner_args(redis_url: str, planner_id: str) -> list[str]:
    return ["--redis", redis_url, *STORE, "--replicas", "engine-1,engine-2", "--q-cap", "10", "--warm-slots", "4",
            "--interval", "0.5", "--window", "10", "--lease-ttl", "1", "--planner-id", planner_id, "--auto", "1"]


def wait_for(predicate, timeout: float, what: str, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(step)


def stored_versions(r: redis.Redis) -> list[int]:
    return sorted(int(v) for v in r.zrange("cr:{plans}:index", 0, -1))


def test_planner_kill9_keeps_routing_and_a_new_planner_resumes_the_sequence(procs: Procs, redis_url):
    r = redis.Redis.from_url(redis_url)
    collector = procs.spawn("collector", "collector", ["--redis", redis_url, *STORE, "--window", "10"])
    planner = procs.spawn("planner", "planner-a", planner_args(redis_url, "A"))
    engines = [procs.spawn("engine", f"engine-{i}", ["--replica-id", f"engine-{i}", "--time-scale", "0.01"])
               for i in (1, 2)]
    procs.wait(collector, planner, *engines)
    replicas = ",".join(f"engine-{i}={e.address}" for i, e in zip((1, 2), engines))
    dispatchers = [procs.spawn("dispatcher", f"d{i}", [
        "--replicas", replicas, "--planner", planner.address, "--redis", redis_url, "--collector", collector.address,
        "--dispatcher-id", f"d{i}", "--poll-interval", "0.1", "--telemetry-interval", "0.2"]) for i in (1, 2)]
    procs.wait(*dispatchers)

    traffic = [RouteTraffic([d.address]).start() for d in dispatchers]
    client = CacheRouteClient([d.address for d in dispatchers], planner=planner.address)
    try:
        def statuses():
            return [CacheRouteClient(d.address).dispatcher_status() for d in dispatchers]

        # telemetry -> the leader's loop -> an active plan on both dispatchers
        wait_for(lambda: all(s.plan_version and s.plan_source == "watch" for s in statuses()), 15, "a first plan")
        before = client.planner_status()
        assert before.leader and before.lease_fencing_token >= 1

        planner.proc.send_signal(signal.SIGKILL)
        planner.proc.wait(5)
        killed_at = time.monotonic()
        old_max = int(r.get("cr:{plans}:seq"))
        active_at_kill = int(r.get("cr:{plans}:active"))

        time.sleep(1.0)   # the outage: no planner at all
        during = statuses()
        assert [s.plan_version for s in during] == [active_at_kill] * 2

        planner.args = planner_args(redis_url, "B")              # a new process with its own lease name,
        procs.restart(planner, same_port=True)                   # on the same address: dispatchers re-watch it
        takeover = wait_for(lambda: client.planner_status().leader and time.monotonic(), 10, "the new leader")
        after = client.planner_status()
        # the new planner's first stored version continues from the counter the dead one left
        wait_for(lambda: any(v > old_max for v in stored_versions(r)), 10, "a version from the new leader")
        new_versions = [v for v in stored_versions(r) if v > old_max]
        rewatch = wait_for(lambda: all(s.plan_source == "watch" for s in statuses()) and time.monotonic(), 15,
                           "dispatchers watching the new planner")
    finally:
        calls = [t.stop() for t in traffic]
        client.close()
        r.close()

    all_calls = calls[0] + calls[1]
    assert len(all_calls) > 200
    assert [c for c in all_calls if c.code != "OK"] == []                    # zero failed Route calls
    outage = [c for c in all_calls if killed_at <= c.at <= takeover]
    assert len(outage) > 50 and {c.version for c in outage} == {active_at_kill}   # last plan kept
    assert after.lease_fencing_token > before.lease_fencing_token
    assert new_versions[0] == old_max + 1
    print(f"\nFIGURES planner_kill9: takeover_s={takeover - killed_at:.2f} rewatch_s={rewatch - killed_at:.2f} "
          f"routes_during_outage={len(outage)} max_route_ms={max(c.seconds for c in all_calls) * 1000:.1f}")
