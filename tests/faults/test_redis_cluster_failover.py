"""kill -9 the Redis Cluster master that owns the plan keys while versions are being
activated and a dispatcher routes (planner, collector, engine, dispatcher: separate
processes on a real 3 + 3 cluster on loopback).

- Routing never stops: the dispatcher keeps its last plan and every Route call succeeds.
- No acknowledged activation is lost: the store runs WAIT 1 after every plan-slot write on
  the connection that made it, so a version the planner acknowledged is on a replica before
  the RPC returns, and after the replica's promotion every acknowledged version is still
  stored, still in the history, and the active one is the last acknowledged (or newer).
- The planner carries on: RPCs that need the store are UNAVAILABLE for the failover window
  (node timeout 1 s), then building and activating work again and reach the dispatcher.
"""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from clients import CacheRouteClient
from services.local.redis_cluster import RedisClusterProcess
from services.store import HISTORY_MAX, RedisStore
from tests.faults.procs import Procs
from tests.faults.test_planner_crash import wait_for
from tests.faults.traffic import RouteTraffic

pytestmark = [pytest.mark.timeout(90)]

STORE = ["--bucket-seconds", "1", "--retention-seconds", "120"]
PLANS_KEY = "cr:{plans}:active"


async def store_history(url: str):
    store = RedisStore(url)
    try:
        return await store.history(HISTORY_MAX)
    finally:
        await store.close()


class Activations:
    """BuildPlan(activate=True) in a loop, recording what the planner acknowledged."""

    def __init__(self, planner: str) -> None:
        self.planner = planner
        self.acked: list[tuple[float, int]] = []     # (monotonic time, version)
        self.failed: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Activations":
        self._thread.start()
        return self

    def _run(self) -> None:
        with CacheRouteClient(planner=self.planner, timeout=3.0) as client:
            i = 0
            while not self._stop.is_set():
                i += 1
                rates = {"hot": 10.0 + i % 7, "warm": 5.0 + i % 3, f"k{i % 5}": 2.0}
                try:
                    active = client.planner_status().active_version
                    reply = client.build_plan(rates, activate=True, expected_active_version=active)
                    if reply.activated:
                        self.acked.append((time.monotonic(), reply.plan.version))
                except grpc.RpcError as err:
                    self.failed.append((time.monotonic(), err.code().name))
                    time.sleep(0.05)
                time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


def test_killing_the_plan_master_loses_no_activated_version(procs: Procs):
    cluster = RedisClusterProcess(masters=3, replicas=1, node_timeout_ms=1000).start()
    try:
        url = cluster.url
        planner = procs.spawn("planner", "planner", ["--redis", url, *STORE, "--replicas", "engine-1",
                                                     "--q-cap", "10", "--warm-slots", "4", "--window", "30",
                                                     "--auto", "0"])
        collector = procs.spawn("collector", "collector", ["--redis", url, *STORE, "--window", "30"])
        engine = procs.spawn("engine", "engine-1", ["--replica-id", "engine-1", "--time-scale", "0.01"])
        procs.wait(planner, collector, engine)
        dispatcher = procs.start("dispatcher", "d1", [
            "--replicas", f"engine-1={engine.address}", "--planner", planner.address, "--redis", url,
            "--collector", collector.address, "--poll-interval", "0.1"])

        client = CacheRouteClient(dispatcher.address, planner=planner.address, timeout=3.0)
        first = client.build_plan({"hot": 20.0, "warm": 5.0}, activate=True).plan.version
        wait_for(lambda: client.dispatcher_status().plan_version == first, 10, "the dispatcher to get v1")

        traffic = RouteTraffic([dispatcher.address]).start()
        acts = Activations(planner.address).start()
        wait_for(lambda: len(acts.acked) >= 5, 20, "activations before the kill")

        victim = cluster.master_of(PLANS_KEY)
        killed_at = time.monotonic()
        cluster.kill(victim)
        promoted = cluster.wait_promoted(victim, PLANS_KEY, timeout=20)
        promoted_at = time.monotonic()
        wait_for(lambda: any(t > promoted_at for t, _ in acts.acked[-3:]) and
                 sum(t > promoted_at for t, _ in acts.acked) >= 5, 30, "activations after the promotion")
        acts.stop()
        calls = traffic.stop()

        status = client.planner_status()
        acked = [v for _, v in acts.acked]
        missing = []
        for v in [first, *acked]:
            try:
                client.get_plan(v, summary_only=True)
            except grpc.RpcError as err:
                missing.append((v, err.code().name))
        history = {h.version for h in asyncio.run(store_history(url))}
        final = acked[-1]
        wait_for(lambda: client.dispatcher_status().plan_version >= final, 10, "the dispatcher to follow")
        client.close()
    finally:
        cluster.close()

    bad = [c for c in calls if c.code != "OK"]
    assert calls and not bad, f"{len(bad)} of {len(calls)} Route calls failed: {bad[:3]}"
    assert not missing, f"acknowledged versions lost after the failover: {missing}"
    assert set(acked) <= history, f"activations missing from the history: {sorted(set(acked) - history)}"
    assert status.active_version >= final
    assert acked == sorted(acked)
    after = [v for t, v in acts.acked if t > promoted_at]
    assert len(after) >= 5
    outage = [t for t, _ in acts.failed if t > killed_at]
    print(f"\nFIGURES cluster_failover: victim={victim} promoted={promoted} "
          f"promotion_s={promoted_at - killed_at:.2f} acked={len(acked)} after={len(after)} "
          f"failed_rpcs={len(acts.failed)} unavailable_s={(max(outage) - killed_at) if outage else 0:.2f} "
          f"routes={len(calls)}")
