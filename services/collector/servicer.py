"""Collector RPCs: decode, hand to the ingestor or the store, encode."""

from __future__ import annotations

import asyncio
from typing import Callable

from cacheroute.v1 import collector_pb2, collector_pb2_grpc
from services.collector.ingest import Ingestor, Tally
from services.core.metrics import gap_cv
from services.errors import InvalidArgument
from services.model import mean_output_tokens
from services.store import Store


def _summary(t: Tally) -> collector_pb2.IngestSummary:
    return collector_pb2.IngestSummary(batches=t.batches, accepted=t.accepted, rejected=t.rejected,
                                       duplicate_batches=t.duplicate_batches, first_rejection=t.first_rejection)


def rates_response(snap, limit: int, max_bytes: int) -> collector_pb2.GetRatesResponse:
    """The hottest `limit` keys of a snapshot that fit in `max_bytes` (the snapshot is sorted
    by rate, so a cut keeps the head); `truncated` says whether any were left out."""
    out = collector_pb2.GetRatesResponse(snapshot_id=snap.snapshot_id, window_seconds=snap.window_seconds,
                                         total_arrivals=snap.total_arrivals, total_keys=len(snap.keys),
                                         untracked_arrivals=getattr(snap, "untracked_arrivals", 0))
    used, rates = out.ByteSize() + 16, []
    for k, r, p, x in zip(snap.keys[:limit], snap.rates, snap.mean_prompt_tokens, snap.mean_prefix_tokens):
        used += len(k.encode("utf-8")) + 40       # bound of one KeyRateSample with its framing
        if used > max_bytes:
            break
        rates.append(collector_pb2.KeyRateSample(key=k, rate=r, mean_prompt_tokens=p, mean_prefix_tokens=x))
    out.rates.extend(rates)
    out.truncated = len(rates) < len(snap.keys)
    return out


class CollectorServicer(collector_pb2_grpc.CollectorServicer):
    def __init__(self, ingestor: Ingestor, store: Store, *, window_seconds: float, clock: Callable[[], float],
                 max_rates: int = 10_000, max_message_bytes: int = 8 * 1024 * 1024) -> None:
        self.ingestor = ingestor
        self.store = store
        self.window_seconds = window_seconds
        self.clock = clock
        self.max_rates = max_rates
        self.max_message_bytes = max_message_bytes

    async def ReportArrivals(self, request_iterator, context):
        return _summary(await self.ingestor.ingest_arrivals(request_iterator))

    async def ReportCacheStats(self, request_iterator, context):
        return _summary(await self.ingestor.ingest_cache_stats(request_iterator))

    async def GetRates(self, request, context):
        if request.window_seconds < 0:
            raise InvalidArgument("window_seconds must be >= 0")
        now, window = self.clock(), request.window_seconds or self.window_seconds
        snap = await self.store.window_rates(now, window)
        limit = min(request.limit or self.max_rates, self.max_rates)
        out = await asyncio.to_thread(rates_response, snap, limit, self.max_message_bytes - 1024)
        counters = (await self.store.cache_stats(now, window)).values()
        out.completed_requests = sum(c.completed for c in counters)
        out.mean_output_tokens = mean_output_tokens(counters) or 0.0
        out.arrival_cv = gap_cv(await self.store.interarrival_sample(now, window)) or 0.0
        return out
