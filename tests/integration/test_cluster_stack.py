"""`cacheroute up --redis redis+cluster://... --dispatcher-workers 2`: the whole local stack
on a real Redis Cluster (3 + 3 nodes on loopback), its dispatcher as two worker processes
on one port: a plan built and activated reaches both workers, routing follows it,
telemetry lands in the cluster, and SIGTERM stops everything."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import grpc
import orjson
import pytest

from cacheroute.v1 import common_pb2, dispatcher_pb2, dispatcher_pb2_grpc
from clients import CacheRouteClient
from services.store.connect import sync_client


def _telemetry_buckets(url: str) -> list[bytes]:
    """The arrival buckets in the cluster (a closed bucket a window read sealed is one blob)."""
    client = sync_client(url)
    try:
        return [k for node in client.get_primaries() for k in client.scan_iter(match="cr:{tb:*}:*", target_nodes=node)
                if k.endswith((b":n", b":sealed"))]
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_up_runs_on_a_redis_cluster(redis_cluster, redis_cluster_url, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "up", "--json", "--redis", redis_cluster_url,
                             "--num-engines", "2", "--num-dispatchers", "1", "--dispatcher-workers", "2",
                             "--time-scale", "0.05",
                             "--log-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        doc = orjson.loads(proc.stdout.readline())
        services = {s["name"]: s for s in doc["services"]}
        planner, dispatcher = services["planner"]["address"], services["dispatcher-1"]["address"]
        with CacheRouteClient([dispatcher], planner=planner, timeout=5.0) as client:
            reply = client.build_plan({"tenant-a": 10.0, "tenant-b": 5.0}, activate=True)
            version = reply.plan.version
            deadline = time.monotonic() + 15
            while client.dispatcher_status().plan_version != version:
                assert time.monotonic() < deadline, "the dispatcher never got the plan"
                time.sleep(0.05)
            decisions = [client.route(key) for key in ("tenant-a", "tenant-b", "cold-1", "cold-2")]
            workers = {}
            for _ in range(40):                       # fresh connections: the kernel spreads them
                with grpc.insecure_channel(dispatcher, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
                    st = dispatcher_pb2_grpc.DispatcherStub(ch).GetStatus(
                        dispatcher_pb2.GetDispatcherStatusRequest(), timeout=5)
                    workers[st.dispatcher_id] = st.plan_version
            stored = client.get_plan(version)
            ids = list(stored.inputs.replica_ids)
            owners = {ids[i] for e in stored.table if e.key == "tenant-a" for i in e.replicas}
            deadline = time.monotonic() + 20          # telemetry flushes every 0.5 s: poll, never a fixed sleep
            while not _telemetry_buckets(redis_cluster_url):
                assert time.monotonic() < deadline, "no arrival telemetry reached the cluster"
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert doc["redis"] == redis_cluster_url and not doc["redis_embedded"]
    assert {d.plan_version for d in decisions} == {version}
    assert workers == {"dispatcher-1/w0": version, "dispatcher-1/w1": version}
    assert decisions[0].reason == common_pb2.ROUTE_REASON_PLANNED
    assert decisions[0].replica_id in owners                 # an admitted key goes to its planned replicas
    assert decisions[2].reason == common_pb2.ROUTE_REASON_COLD
    assert proc.returncode == 0, err[-2000:]
    client = sync_client(redis_cluster_url)
    try:
        assert int(client.get("cr:{plans}:active")) == version
    finally:
        client.close()
    assert _telemetry_buckets(redis_cluster_url), "no arrival telemetry reached the cluster"
