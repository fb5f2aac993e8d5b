"""kill -9 an engine replica: a stream proxied through Dispatcher.Generate fails with
UNAVAILABLE promptly (no hang), and new requests stop going to the dead replica within 1 s,
whether the dispatcher learns it from the broken stream or from its health poll."""

from __future__ import annotations

import signal
import time

import grpc
import pytest

from cacheroute.v1 import dispatcher_pb2, dispatcher_pb2_grpc, engine_pb2
from tests.faults.procs import Procs

pytestmark = [pytest.mark.timeout(60)]


def routes_to(stub, replica: str, seconds: float) -> tuple[list[float], int]:
    """Route distinct keys for `seconds`; times (monotonic) of decisions that went to `replica`."""
    hits, n, end = [], 0, time.monotonic() + seconds
    while time.monotonic() < end:
        n += 1
        d = stub.Route(dispatcher_pb2.RouteRequest(key=f"k{n}"), timeout=2)
        if d.replica_id == replica:
            hits.append(time.monotonic())
        time.sleep(0.002)
    return hits, n


def test_engine_kill9_mid_stream_fails_fast_and_is_avoided(procs: Procs):
    engines = [procs.spawn("engine", f"engine-{i}", ["--replica-id", f"engine-{i}", "--time-scale", "1"])
               for i in (1, 2, 3)]
    procs.wait(*engines)
    by_id = {f"engine-{i}": e for i, e in zip((1, 2, 3), engines)}
    dispatcher = procs.start("dispatcher", "d1", [
        "--replicas", ",".join(f"{rid}={e.address}" for rid, e in by_id.items()), "--seed", "3"])
    with grpc.insecure_channel(dispatcher.address) as ch:
        stub = dispatcher_pb2_grpc.DispatcherStub(ch)
        # a long generation (2000 decode steps of ~6 ms) through the dispatcher
        stream = stub.Generate(engine_pb2.GenerateRequest(prompt="hello " * 200, max_tokens=2000), timeout=30)
        chunks = [next(stream) for _ in range(5)]
        victim = chunks[0].route.replica_id
        by_id[victim].proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            for _ in stream:
                pass
        failed_after = time.monotonic() - killed
        code, detail = err.value.code(), err.value.details()
        hits, routed = routes_to(stub, victim, 1.5)

        # a second replica dies while idle: only the health poll can tell
        idle = next(rid for rid in by_id if rid != victim)
        by_id[idle].proc.send_signal(signal.SIGKILL)
        killed_idle = time.monotonic()
        idle_hits, idle_routed = routes_to(stub, idle, 1.5)
        survivor = next(rid for rid in by_id if rid not in (victim, idle))
        after = [c for c in stub.Generate(engine_pb2.GenerateRequest(prompt="after", max_tokens=3), timeout=10)]

    assert code == grpc.StatusCode.UNAVAILABLE and "\n" not in detail and victim in detail
    assert failed_after < 2.0
    assert [t for t in hits if t - killed > 1.0] == [] and routed > 100
    avoided_idle = max(idle_hits, default=killed_idle) - killed_idle
    assert avoided_idle < 1.0 and idle_routed > 100
    assert after[0].route.replica_id == survivor and after[-1].finished
    print(f"\nFIGURES engine_kill9: stream_unavailable_ms={failed_after * 1000:.0f} "
          f"stream_path_last_route_ms={(max(hits, default=killed) - killed) * 1000:.0f} "
          f"poll_path_last_route_ms={avoided_idle * 1000:.0f}")
