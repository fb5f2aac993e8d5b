"""Collector RPCs: decode, hand to the ingestor or the store, encode."""

from __future__ import annotations

from typing import Callable

from cacheroute.v1 import collector_pb2, collector_pb2_grpc
from services.collector.ingest import Ingestor, Tally
from services.errors import InvalidArgument
from services.store import Store


def _summary(t: Tally) -> collector_pb2.IngestSummary:
    return collector_pb2.IngestSummary(batches=t.batches, accepted=t.accepted, rejected=t.rejected,
                                       duplicate_batches=t.duplicate_batches, first_rejection=t.first_rejection)


class CollectorServicer(collector_pb2_grpc.CollectorServicer):
    def __init__(self, ingestor: Ingestor, store: Store, *, window_seconds: float, clock: Callable[[], float]) -> None:
        self.ingestor = ingestor
        self.store = store
        self.window_seconds = window_seconds
        self.clock = clock

    async def ReportArrivals(self, request_iterator, context):
        return _summary(await self.ingestor.ingest_arrivals(request_iterator))

    async def ReportCacheStats(self, request_iterator, context):
        return _summary(await self.ingestor.ingest_cache_stats(request_iterator))

    async def GetRates(self, request, context):
        if request.window_seconds < 0:
            raise InvalidArgument("window_seconds must be >= 0")
        snap = await self.store.window_rates(self.clock(), request.window_seconds or self.window_seconds)
        n = request.limit or len(snap.keys)
        rates = [collector_pb2.KeyRateSample(key=k, rate=r, mean_prompt_tokens=p, mean_prefix_tokens=x)
                 for k, r, p, x in zip(snap.keys[:n], snap.rates, snap.mean_prompt_tokens, snap.mean_prefix_tokens)]
        return collector_pb2.GetRatesResponse(snapshot_id=snap.snapshot_id, window_seconds=snap.window_seconds,
                                              rates=rates, total_arrivals=snap.total_arrivals)
