"""Cache-stat deltas from an engine replica to the collector, off the request path.

Every `interval` seconds the reporter takes the model's cumulative counters (first tokens,
prompt and cached tokens; finished requests and their output tokens), sends the
difference from the previous report as one CacheStatsBatch (batch id = replica id, boot
nonce and sequence number, so the collector can drop a replayed batch), with the
deployment's bearer token when one is configured (the collector requires it then), and moves on.
When the collector is down or slow the batch is dropped and counted: the counters are
aggregates, so a lost delta only costs the planner a little precision.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from cacheroute.v1 import collector_pb2
from services.core.engine import EngineModel
from services.rpc.sender import PeriodicSender
from services.rpc import TLSFiles, kv

log = logging.getLogger("cacheroute.engine.reporter")


@dataclass(frozen=True, slots=True)
class Counters:
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completed: int = 0              # finished requests
    completion_tokens: int = 0      # their output tokens

    @classmethod
    def of(cls, model: EngineModel) -> "Counters":
        return cls(model.requests, model.prompt_tokens, model.cached_tokens, model.finished_requests,
                   model.output_tokens)

    def minus(self, other: "Counters") -> "Counters":
        return Counters(self.requests - other.requests, self.prompt_tokens - other.prompt_tokens,
                        self.cached_tokens - other.cached_tokens, self.completed - other.completed,
                        self.completion_tokens - other.completion_tokens)


class CacheStatsReporter(PeriodicSender):
    task_name = "cache-stats-reporter"
    flush_on_stop = False

    def __init__(self, model: EngineModel, replica_id: str, collector: str, *, interval: float = 1.0,
                 timeout: float = 2.0, tls: TLSFiles | None = None, token: str | None = None) -> None:
        super().__init__(collector, interval=interval, timeout=timeout, tls=tls, token=token)
        self.model = model
        self.replica_id = replica_id
        self.sent_batches = 0
        self.dropped_batches = 0
        self._last = Counters.of(model)

    async def flush(self) -> bool:
        """Send the delta since the last report (if any). True if the collector took it."""
        now = Counters.of(self.model)
        delta = now.minus(self._last)
        if delta.requests == 0 and delta.completed == 0:
            return True
        self._last = now
        batch = collector_pb2.CacheStatsBatch(
            batch_id=self.next_batch_id(self.replica_id), source=self.replica_id,
            stats=[collector_pb2.CacheStat(replica_id=self.replica_id, prompt_tokens=delta.prompt_tokens,
                                           cached_tokens=delta.cached_tokens, requests=delta.requests,
                                           completed=delta.completed, completion_tokens=delta.completion_tokens)])
        try:
            await self.stub.ReportCacheStats(iter([batch]), timeout=self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as err:
            self.dropped_batches += 1
            log.warning("cache stats dropped", extra=kv(collector=self.collector, code=err.code().name,
                                                        dropped=self.dropped_batches))
            return False
        self.sent_batches += 1
        return True
