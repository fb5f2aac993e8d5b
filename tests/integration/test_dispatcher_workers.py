"""`--workers 2`: two dispatcher processes on one gRPC port (SO_REUSEPORT) under a
supervisor (services/dispatcher/workers.py), as real processes on loopback.

New connections reach both workers; the supervisor's metrics port serves both workers'
metrics labelled worker="0"/"1" and their counts add up to the calls made; a worker killed
with SIGKILL is restarted while the other keeps serving; SIGTERM to the supervisor stops
and reaps every worker. A bad --workers value is a one-line error."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import grpc
import orjson
import pytest

from cacheroute.v1 import dispatcher_pb2, dispatcher_pb2_grpc
from tests.faults.procs import Procs

pytestmark = [pytest.mark.timeout(90)]



FRESH = [("grpc.use_local_subchannel_pool", 1)]     # a new TCP connection per channel


def status_of(address: str) -> dispatcher_pb2.DispatcherStatus:
    with grpc.insecure_channel(address, options=FRESH) as ch:   # the kernel picks a worker per connection
        return dispatcher_pb2_grpc.DispatcherStub(ch).GetStatus(dispatcher_pb2.GetDispatcherStatusRequest(),
                                                                  timeout=5)


def route(address: str, key: str) -> None:
    with grpc.insecure_channel(address, options=FRESH) as ch:
        dispatcher_pb2_grpc.DispatcherStub(ch).Route(dispatcher_pb2.RouteRequest(key=key), timeout=5)


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def route_counts(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in re.finditer(r'^cacheroute_rpc_total\{([^}]*)\} (\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("method") == "Route" and labels.get("code") == "OK":
            out[labels["worker"]] = out.get(labels["worker"], 0.0) + float(m.group(2))
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_two_workers_share_the_port_metrics_add_up_and_stop_together(procs: Procs):
    engine = procs.start("engine", "engine-1", ["--replica-id", "engine-1", "--time-scale", "0.01"])
    sup = procs.start("dispatcher", "d1", ["--replicas", f"engine-1={engine.address}", "--workers", "2",
                                           "--http-port", "0", "--poll-interval", "0.1"], timeout=60)
    serving = next(orjson.loads(line) for line in sup.log_path.read_bytes().splitlines()
                   if b'"msg":"serving"' in line)
    pids = serving["pids"]
    assert serving["workers"] == 2 and len(pids) == 2 and sup.metrics_port

    seen = {status_of(sup.address).dispatcher_id for _ in range(40)}
    assert seen == {"dispatcher-0/w0", "dispatcher-0/w1"}, seen
    http = serving["http_port"]                      # the OpenAI port is shared the same way
    assert http and all(urllib.request.urlopen(f"http://127.0.0.1:{http}/health", timeout=5).status == 200
                        for _ in range(10))
    http_lines = [orjson.loads(line) for line in sup.log_path.read_bytes().splitlines() if b'"http serving"' in line]
    assert {d["url"] for d in http_lines} == {f"http://127.0.0.1:{http}"} and len(http_lines) == 2

    calls = 30
    for i in range(calls):
        route(sup.address, f"k{i}")
    text = scrape(sup.metrics_port)
    counts = route_counts(text)
    assert set(counts) == {"0", "1"} and sum(counts.values()) == calls, counts
    assert "cacheroute_dispatcher_workers 2.0" in text
    assert re.search(r'cacheroute_dispatcher_plan_version\{worker="1"\} 0\.0', text)

    os.kill(pids[1], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while alive(pids[1]):                    # connections queued on the dying socket are reset
        assert time.monotonic() < deadline
        time.sleep(0.01)
    resets = 0
    for i in range(20):                      # the other worker keeps answering new connections
        try:
            route(sup.address, f"after{i}")
        except grpc.RpcError as err:         # a connect racing the restart may be reset: clients retry
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            resets += 1
            route(sup.address, f"after{i}-again")
    assert resets <= 2, resets
    deadline = time.monotonic() + 20
    while "cacheroute_dispatcher_worker_restarts_total 1.0" not in (text := scrape(sup.metrics_port)) \
            or "cacheroute_dispatcher_workers 2.0" not in text:
        assert time.monotonic() < deadline, "the killed worker was not restarted"
        time.sleep(0.1)
    deadline = time.monotonic() + 20
    while {status_of(sup.address).dispatcher_id for _ in range(20)} != {"dispatcher-0/w0", "dispatcher-0/w1"}:
        assert time.monotonic() < deadline, "the restarted worker takes no connections"
    workers_now = [int(p) for p in re.findall(r'"pid":(\d+)', sup.log_text())] + pids

    assert sup.terminate(wait=15) == 0
    assert not any(alive(p) for p in set(workers_now)), "a worker outlived the supervisor"
    assert "worker exited; restarting" in sup.log_text()


def test_bad_workers_value_is_a_one_line_error():
    out = subprocess.run([sys.executable, "-m", "services.dispatcher", "--replicas", "a=127.0.0.1:1",
                          "--workers", "-1"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].endswith("--workers must be >= 0 (0 = one per core)")
    out = subprocess.run([sys.executable, "-m", "services.dispatcher", "--replicas", "a=127.0.0.1:1"],
                         capture_output=True, text=True, timeout=30, env={**os.environ, "CACHEROUTE_WORKERS": "two"})
    assert out.returncode == 2 and "CACHEROUTE_WORKERS='two' is not a valid int" in out.stderr


_DEFAULT_WORKERS = """
import os, sys
if sys.argv[1] == "one":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
from services.dispatcher.__main__ import parse_args
print(parse_args(["--replicas", "a=127.0.0.1:1"]).workers, parse_args(["--replicas", "a=127.0.0.1:1",
      "--workers", "0"]).workers, parse_args(["--replicas", "a=127.0.0.1:1", "--workers", "1"]).workers)
"""


@pytest.mark.parametrize("cores", ["all", "one"])
def test_workers_default_to_the_cores_the_process_may_run_on(cores):
    env = {k: v for k, v in os.environ.items() if k != "CACHEROUTE_WORKERS"}
    out = subprocess.run([sys.executable, "-c", _DEFAULT_WORKERS, cores], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    available = len(os.sched_getaffinity(0)) if cores == "all" else 1
    assert out.stdout.split() == [str(available), str(available), "1"]
