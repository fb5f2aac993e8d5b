"""The capacity advisor on a live stack whose load is raised (issue 21, item 6): real
redis-server, collector, planner with `--advise-slo-p99` (its `cacheroute_recommended_replicas`
gauge, scraped from its metrics endpoint), 2 simulated engines and a dispatcher. Light traffic
gets a recommendation of at most 2 replicas; traffic raised ~8x gets at least 3, from the gauge
and from `cacheroute advise`, whose window also carries the output length the engines measured
(Generate calls of 48 tokens each). Bounded: every wait has a deadline, the stack stops itself."""

from __future__ import annotations

import random
import re
import threading
import time
import urllib.request

import grpc
import orjson
import pytest
from cacheroute.v1 import dispatcher_pb2, dispatcher_pb2_grpc, engine_pb2

from clients.cli import main as cli
from services.local.stack import Stack, StackConfig

WINDOW = 8.0                         # seconds of telemetry the planner's advisor reads
OUTPUT = 48                          # tokens per Generate call: what the engines report back


def gauge(port: int) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    m = re.search(r"^cacheroute_recommended_replicas (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


class Load(threading.Thread):
    """Open-loop Poisson Route calls at `rate` req/s over 16 keys (3,000 prompt tokens each)."""

    def __init__(self, address: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.address, self.rate, self.sent = address, rate, 0
        self.stop = threading.Event()

    def run(self) -> None:
        rng = random.Random(7)
        with grpc.insecure_channel(self.address) as ch:
            stub = dispatcher_pb2_grpc.DispatcherStub(ch)
            due = time.monotonic()
            while not self.stop.is_set():
                due += rng.expovariate(self.rate)
                time.sleep(max(0.0, due - time.monotonic()))
                stub.Route(dispatcher_pb2.RouteRequest(key=f"k{rng.randrange(16)}", prompt_tokens=3000), timeout=5)
                self.sent += 1


def generate(address: str, n: int) -> None:
    with grpc.insecure_channel(address) as ch:
        stub = dispatcher_pb2_grpc.DispatcherStub(ch)
        for i in range(n):
            chunks = list(stub.Generate(engine_pb2.GenerateRequest(prompt=f"tenant {i} " * 40, max_tokens=OUTPUT,
                                                                   key=f"g{i}"), timeout=10))
            assert chunks[-1].finished


def wait_gauge(port: int, ok, deadline: float) -> float | None:
    value = None
    while time.monotonic() < deadline:
        value = gauge(port)
        if value is not None and ok(value):
            return value
        time.sleep(0.5)
    return value


@pytest.mark.timeout(120)
def test_the_recommendation_rises_with_the_load(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CACHEROUTE_ADVISE_SLO_P99", "2")
    monkeypatch.setenv("CACHEROUTE_ADVISE_INTERVAL", "2")
    cfg = StackConfig(engines=2, dispatchers=1, planner_interval=30.0, window_seconds=WINDOW, log_dir=str(tmp_path),
                      grace_seconds=0.2, time_scale=0.05)
    t0 = time.monotonic()
    with Stack(cfg) as stack:
        port = stack.child("planner").metrics_port
        assert gauge(port) == 0                                          # no traffic yet
        assert cli(["advise", "--last", "--planner", stack.planner]) == 2
        assert "NOT_FOUND" in capsys.readouterr().err
        generate(stack.dispatchers[0], 6)            # the engines measure the output length
        light = Load(stack.dispatchers[0], 4.0)
        light.start()
        try:
            time.sleep(WINDOW)
            low = wait_gauge(port, lambda v: v > 0, time.monotonic() + 15)
        finally:
            light.stop.set()
            light.join(5)
        heavy = Load(stack.dispatchers[0], 32.0)
        heavy.start()
        try:
            started = time.monotonic()
            time.sleep(WINDOW)
            high = wait_gauge(port, lambda v: v >= 3, time.monotonic() + 15)
            heavy_rate = heavy.sent / (time.monotonic() - started)
            generate(stack.dispatchers[0], 6)        # output lengths inside the CLI's window too
            time.sleep(1.5)                          # the engines report every second
            code = cli(["advise", "--collector", stack.collector, "--replicas", "2", "--slo-p99", "2", "--json"])
            out, err = capsys.readouterr()
            last_code = cli(["advise", "--last", "--planner", stack.planner, "--json"])   # the planner's GetAdvice
            last, last_err = capsys.readouterr()
        finally:
            heavy.stop.set()
            heavy.join(5)
    doc = orjson.loads(out) if out else {}
    with capsys.disabled():
        print(f"\nlight: gauge {low}; heavy {heavy_rate:.1f} req/s: gauge {high}, advise {doc.get('recommended')} "
              f"({doc.get('output_tokens')} output tokens, {doc.get('output_source')}), {time.monotonic() - t0:.1f} s")
    assert low is not None and 1 <= low <= 2, low
    assert heavy_rate > 4 * 4.0, heavy_rate                      # the load was raised (not a stalled client)
    assert high is not None and high >= 3 and high > low, (low, high)
    assert code in (0, 1), err
    assert doc["output_source"] == "measured" and doc["output_tokens"] == OUTPUT, doc
    assert (doc["recommended"] or 5) >= 3, doc
    assert last_code in (0, 1), last_err
    last = orjson.loads(last)
    assert last["gauge"] >= 3 and last["replicas"] == 2 and [p["replicas"] for p in last["points"]] == [1, 2, 3, 4]
    assert time.monotonic() - t0 < 60
