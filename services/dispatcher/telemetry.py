"""Arrival telemetry from a dispatcher to the collector, off the request path.

`Router.route` appends (key, time, prompt tokens, prefix tokens, prefix chain, replica id) to a bounded buffer
(full: the arrival is dropped and counted). Every `interval` seconds this task drains the
buffer and sends it as ArrivalBatch messages of at most `batch_size` arrivals on one
client-streaming ReportArrivals call with a deadline, presenting the deployment's bearer
token when one is configured (the collector requires it then). Batch ids are dispatcher id, boot
nonce and a sequence number, so the collector ignores a replay. When the collector is
down or slow the drained arrivals are dropped and counted; routing never waits on this.
Before each drain the served arrivals waiting for their caller's budget are settled
(`settle`: services.dispatcher.budget.DeferredArrivals), so they go out in the same flush.
"""

from __future__ import annotations

import logging

import grpc

from cacheroute.v1 import collector_pb2
from services.dispatcher.router import Router
from services.rpc.sender import PeriodicSender
from services.rpc import TLSFiles, kv

log = logging.getLogger("cacheroute.dispatcher.telemetry")


class ArrivalReporter(PeriodicSender):
    task_name = "arrival-reporter"

    def __init__(self, router: Router, collector: str, source: str, *, interval: float = 0.5,
                 batch_size: int = 5000, timeout: float = 2.0, tls: TLSFiles | None = None,
                 token: str | None = None, settle=None) -> None:
        super().__init__(collector, interval=interval, timeout=timeout, tls=tls, token=token)
        self.router = router
        self.settle = settle                # awaited before each drain: deferred arrivals charged to their budget
        self.source = source
        self.batch_size = batch_size
        self.sent_arrivals = 0
        self.sent_batches = 0

    def _batches(self, arrivals: list[tuple]) -> list[collector_pb2.ArrivalBatch]:
        out = []
        for start in range(0, len(arrivals), self.batch_size):
            batch = collector_pb2.ArrivalBatch(batch_id=self.next_batch_id(self.source), source=self.source)
            batch.arrivals.extend(
                collector_pb2.Arrival(key=a[0], time=a[1], prompt_tokens=a[2], prefix_tokens=a[3],
                                      prefix_nodes=a[4] if len(a) > 4 else (), replica=a[5] if len(a) > 5 else "")
                for a in arrivals[start:start + self.batch_size])
            out.append(batch)
        return out

    async def flush(self) -> bool:
        """Send what the router buffered. True if the collector took it (or there was nothing)."""
        if self.settle is not None:
            await self.settle()
        arrivals = self.router.drain_telemetry()
        if not arrivals:
            return True
        batches = self._batches(arrivals)
        try:
            await self.stub.ReportArrivals(iter(batches), timeout=self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as err:
            self.router.telemetry_dropped += len(arrivals)
            log.warning("arrivals dropped", extra=kv(collector=self.collector, code=err.code().name,
                                                     arrivals=len(arrivals), dropped=self.router.telemetry_dropped))
            return False
        self.sent_arrivals += len(arrivals)
        self.sent_batches += len(batches)
        return True
