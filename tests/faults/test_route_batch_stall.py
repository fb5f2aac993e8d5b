"""A max-size RouteBatch must not stall the dispatcher's event loop for other callers (issue 20).

A real dispatcher (gRPC on 127.0.0.1:0) in front of two simulated engines; three RouteBatch
calls of `--max-batch` requests (10,000) over 3,000 keys, one after the other, while a probe
asks GetStatus every 5 ms and a ticker in the same loop measures how late each 5 ms tick
fires. Before the fix a batch ran in one go: the longest gap was the whole batch. Now it is
routed in slices of 500 (services/dispatcher/batches.py) and the probe keeps answering.

The assertions are relative (a gap against the batch's own duration), so a loaded machine
slows both sides alike; the batch cap itself is checked too (INVALID_ARGUMENT naming it).
The garbage collector is off while the three batches run: a full (generation 2) collection
of this process's heap, which holds the engines and the test client too, took 85 ms in one
run here, a stall of its own that no slicing can split (see docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import gc
import time

import grpc

from cacheroute.v1 import dispatcher_pb2, dispatcher_pb2_grpc
from services.dispatcher.service import serve
from services.engine.fleet import EngineFleet
from tests.integration.test_dispatcher import dispatcher_config, wait_until

MAX_BATCH = 10_000


def test_a_max_size_route_batch_leaves_the_loop_to_a_5ms_probe():
    async def main():
        fleet = await EngineFleet(2, time_scale=0.01).start()
        service = await serve(dispatcher_config(fleet, poll_interval=0.5))
        ticks: list[float] = []
        answered: list[float] = []
        stop = asyncio.Event()

        async def ticker():
            while not stop.is_set():
                await asyncio.sleep(0.005)
                ticks.append(time.monotonic())

        async def probe(stub):
            while not stop.is_set():
                await stub.GetStatus(dispatcher_pb2.GetDispatcherStatusRequest(), timeout=10)
                answered.append(time.monotonic())
                await asyncio.sleep(0.005)

        try:
            await wait_until(lambda: all(service.router.state.healthy), timeout=5)
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = dispatcher_pb2_grpc.DispatcherStub(ch)
                batch = dispatcher_pb2.RouteBatchRequest(requests=[
                    dispatcher_pb2.RouteRequest(key=f"tenant-{i % 3000}", prompt_tokens=100) for i in range(MAX_BATCH)])
                await stub.RouteBatch(batch, timeout=30)                         # warm-up
                background = [asyncio.create_task(ticker()), asyncio.create_task(probe(stub))]
                await asyncio.sleep(0.05)
                runs = []
                gc.collect()
                gc.disable()
                for _ in range(3):
                    start = time.monotonic()
                    reply = await stub.RouteBatch(batch, timeout=30)
                    end = time.monotonic()
                    assert len(reply.decisions) == MAX_BATCH
                    assert [d.key for d in reply.decisions[:3]] == ["tenant-0", "tenant-1", "tenant-2"]
                    inside = [t for t in ticks if start <= t <= end]
                    gaps = [b - a for a, b in zip([start] + inside, inside + [end])]
                    runs.append((end - start, max(gaps), sum(start <= t <= end for t in answered)))
                    await asyncio.sleep(0.05)
                gc.enable()
                stop.set()
                await asyncio.gather(*background)
                over = dispatcher_pb2.RouteBatchRequest(
                    requests=[dispatcher_pb2.RouteRequest(key="k")] * (MAX_BATCH + 1))
                try:
                    await stub.RouteBatch(over, timeout=10)
                    refused = None
                except grpc.aio.AioRpcError as err:
                    refused = (err.code(), err.details())
        finally:
            gc.enable()
            stop.set()
            await service.stop(0)
            await fleet.stop()
        return runs, refused

    runs, refused = asyncio.run(main())
    print("FIGURES", [f"batch {d * 1e3:.0f} ms, longest loop gap {g * 1e3:.1f} ms, {n} probes answered"
                      for d, g, n in runs])
    for duration, gap, _ in runs:
        # a fast machine answers the whole batch in ~25 ms, and parsing the 10,000-entry request
        # and writing its reply (one step each, not sliceable) take ~9 ms of that: allow a third of
        # the batch or 20 ms, whichever is larger (issue 22's probe goal is 50 ms)
        assert gap < max(duration / 3, 0.020), f"the loop stalled {gap * 1e3:.1f} ms of a {duration * 1e3:.1f} ms batch"
    # a GetStatus round trip in this one loop takes several loop turns, so under load only a
    # few fit in a batch; before the fix those that "fit" were answered at its edges
    assert sum(n for _, _, n in runs) >= 2, f"GetStatus probes answered during the batches: {runs}"
    assert refused is not None and refused[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert "10001" in refused[1] and "10000" in refused[1] and "--max-batch" in refused[1]
