"""Restart Redis under a running planner and collector (separate processes).

With AOF persistence (restarted on the same port and data directory) nothing is lost: the
active version, every stored version and the telemetry come back, and the next version is
old max + 1. Without persistence the store comes back empty: while Redis is down every RPC
that needs it is UNAVAILABLE with a one-line reason (health stays SERVING, the RPC metric
counts it, the log says so); afterwards the planner logs and counts the lost state, never
hands out a version number it used before, and building and activating work again while
the dispatchers keep routing throughout."""

from __future__ import annotations

import time
import urllib.request

import grpc
import pytest

from cacheroute.v1 import collector_pb2, collector_pb2_grpc
from clients import CacheRouteClient
from services.local.redis_server import RedisProcess
from tests.faults.procs import Procs
from tests.faults.test_planner_crash import wait_for

pytestmark = [pytest.mark.timeout(60)]

STORE = ["--bucket-seconds", "1", "--retention-seconds", "120"]


def arrivals(batch_id: str, n: int) -> collector_pb2.ArrivalBatch:
    now = time.time()
    return collector_pb2.ArrivalBatch(batch_id=batch_id, source="test", arrivals=[
        collector_pb2.Arrival(key="hot" if i % 3 else "warm", time=now - i * 0.01, prompt_tokens=100,
                              prefix_tokens=64) for i in range(n)])


def report(channel, *batches) -> collector_pb2.IngestSummary:
    return collector_pb2_grpc.CollectorStub(channel).ReportArrivals(iter(batches), timeout=5)


def rates(channel) -> collector_pb2.GetRatesResponse:
    return collector_pb2_grpc.CollectorStub(channel).GetRates(collector_pb2.GetRatesRequest(window_seconds=60),
                                                              timeout=5)


def code_and_detail(call) -> tuple[str, str, float]:
    start = time.monotonic()
    try:
        call()
    except grpc.RpcError as err:
        return err.code().name, err.details(), time.monotonic() - start
    return "OK", "", time.monotonic() - start


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()


def control_plane(procs: Procs, redis_url: str, *, dispatcher: bool = False):
    planner = procs.spawn("planner", "planner", ["--redis", redis_url, *STORE, "--replicas", "engine-1",
                                                 "--q-cap", "10", "--warm-slots", "4", "--window", "30",
                                                 "--auto", "0"])
    collector = procs.spawn("collector", "collector", ["--redis", redis_url, *STORE, "--window", "30"])
    started = [planner, collector]
    if dispatcher:
        started.append(procs.spawn("engine", "engine-1", ["--replica-id", "engine-1", "--time-scale", "0.01"]))
    procs.wait(*started)
    if dispatcher:
        started.append(procs.start("dispatcher", "d1", [
            "--replicas", f"engine-1={started[2].address}", "--planner", planner.address, "--redis", redis_url,
            "--poll-interval", "0.1"]))
    return started


def outage_checks(client: CacheRouteClient, channel, port: int) -> dict:
    out = {"status": code_and_detail(client.planner_status),
           "build": code_and_detail(lambda: client.build_plan({"x": 1.0})),
           "report": code_and_detail(lambda: report(channel, arrivals("during", 3))),
           "rates": code_and_detail(lambda: rates(channel))}
    for name, (code, detail, seconds) in out.items():
        assert code == "UNAVAILABLE", (name, code, detail)
        assert detail.startswith(f"redis unavailable at 127.0.0.1:{port}") and "\n" not in detail, detail
        assert seconds < 2.5, (name, seconds)
    return out


def test_redis_restart_with_aof_loses_nothing(procs: Procs, tmp_path):
    (tmp_path / "redis").mkdir()
    server = RedisProcess(appendonly=True, data_dir=str(tmp_path / "redis")).start()
    try:
        planner, collector = control_plane(procs, server.url)
        client = CacheRouteClient(planner=planner.address)
        with grpc.insecure_channel(collector.address) as ch:
            b1 = arrivals("b1", 30)
            assert report(ch, b1, arrivals("b2", 30)).accepted == 60
            v1 = client.build_plan({"hot": 25.0, "warm": 5.0}, activate=True).plan.version
            v2 = client.build_plan({"hot": 5.0, "warm": 25.0}, activate=True, expected_active_version=v1).plan.version
            v3 = client.build_plan({"hot": 9.0}).plan.version
            before = rates(ch)

            server.stop(kill=True)                              # kill -9 redis
            outage = outage_checks(client, ch, server.port)
            assert "store unavailable" in planner.log_text()    # the watch hub says so
            assert 'cacheroute_rpc_total{code="UNAVAILABLE",method="GetStatus"}' in scrape(planner.metrics_port)

            server.start()                                      # same port, same data directory
            restarted = time.monotonic()
            status = wait_for(lambda: code_and_detail(client.planner_status)[0] == "OK" and client.planner_status(),
                              10, "the planner to reconnect")
            recovered = time.monotonic() - restarted
            after = rates(ch)
            again = report(ch, b1, arrivals("b3", 30))                 # b1 is a replay
            v4 = client.build_plan({"hot": 3.0}).plan.version
            listed = [p.version for p in client.list_plans().plans]
        client.close()
    finally:
        server.close()
    assert (v1, v2, v3) == (1, 2, 3)
    assert status.active_version == v2 and status.latest_version == v3
    assert after.total_arrivals == before.total_arrivals == 60
    assert (again.accepted, again.duplicate_batches) == (30, 1)     # the dedup markers survived too
    assert v4 == v3 + 1 and listed == [4, 3, 2, 1]
    print(f"\nFIGURES redis_aof: unavailable_ms={max(o[2] for o in outage.values()) * 1000:.0f} "
          f"reconnect_s={recovered:.2f}")


def test_redis_restart_without_persistence_degrades_clearly_and_recovers(procs: Procs):
    server = RedisProcess(appendonly=False).start()
    try:
        planner, collector, _engine, dispatcher = control_plane(procs, server.url, dispatcher=True)
        client = CacheRouteClient(dispatcher.address, planner=planner.address)
        with grpc.insecure_channel(collector.address) as ch:
            v1 = client.build_plan({"hot": 25.0, "warm": 5.0}, activate=True).plan.version
            v2 = client.build_plan({"hot": 5.0, "warm": 25.0}, activate=True, expected_active_version=v1).plan.version
            old_table = {e.key for e in client.get_plan(v2).table}
            wait_for(lambda: client.dispatcher_status().plan_version == v2, 5, "the dispatcher to get v2")

            server.stop(kill=True)
            outage_checks(client, ch, server.port)
            during = client.route("hot")                        # routing goes on with the last plan
            server.start()                                      # same port, empty

            def reset_seen():
                return "store lost its plan state" in planner.log_text()
            wait_for(reset_seen, 5, "the planner to notice the lost state")
            metrics = scrape(planner.metrics_port)
            status = client.planner_status()
            fresh = client.build_plan({"new-1": 8.0, "new-2": 4.0}, activate=True, expected_active_version=0).plan
            fetched = client.get_plan(fresh.version)
            wait_for(lambda: client.dispatcher_status().plan_version == fresh.version, 5, "the new plan pushed")
            routed = client.route("new-1")
            rep = report(ch, arrivals("after", 6))
        client.close()
    finally:
        server.close()
    assert during.plan_version == v2
    assert status.active_version == 0                                    # the store really is empty
    assert "cacheroute_planner_store_resets_total 1.0" in metrics
    assert fresh.version > v2                                            # no version number reused
    assert {e.key for e in fetched.table} == {"new-1", "new-2"} != old_table
    assert routed.plan_version == fresh.version and rep.accepted == 6
