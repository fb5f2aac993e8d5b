"""Cache telemetry for HTTP engine replicas, reported by the dispatcher.

The simulated gRPC engine reports its own cache counters to the collector; vLLM, SGLang and
llama.cpp do not, so the dispatcher that proxies their responses does it for them, in the
same CacheStatsBatch shape (source = dispatcher id):

- Per response: `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens` of a
  non-streaming body, or of the final usage chunk of a stream (the front door asks the
  engine for it with `stream_options.include_usage` and drops it again when the client did
  not ask). A `usage` without details counts as 0 cached tokens (vLLM reports them only when
  > 0). Its `completion_tokens` (when present) count as one completed request's output
  (the capacity advisor's mean output length; a gRPC Generate counts its text chunks).
- Otherwise from the engine's counters: when some response of the interval had no usage at
  all, that interval's figures for the replica are the deltas of its scraped counters
  (`EngineStats.prompt_tokens` / `cached_tokens`, see services.backends) instead. Counter
  deltas are engine-wide, so with several dispatchers they are counted by each; per-response
  usage has no such overlap and is preferred.

Every `interval` seconds (default 1) the accumulated figures go to the collector with a
deadline; a batch the collector does not take is dropped and counted (aggregates only).
"""

from __future__ import annotations

import logging
from typing import Sequence

import grpc

from cacheroute.v1 import collector_pb2
from services.rpc.sender import PeriodicSender
from services.rpc import TLSFiles, kv

log = logging.getLogger("cacheroute.dispatcher.cachestats")


class CacheUsage:
    """Per-replica accumulator (no I/O): what responses said, and the engines' counters."""

    def __init__(self, replica_ids: Sequence[str]) -> None:
        self.ids = tuple(replica_ids)
        n = len(self.ids)
        self.requests = [0] * n
        self.prompt = [0] * n
        self.cached = [0] * n
        self.missing = [0] * n                      # responses without usage this interval
        self.completed = [0] * n                    # responses whose usage gave completion tokens
        self.completion = [0] * n
        self._counters: list[tuple[int, int, int] | None] = [None] * n   # last scraped (req, prompt, cached)
        self._reported: list[tuple[int, int, int] | None] = [None] * n   # counters at the last report

    def add(self, replica_id: str) -> int:
        """A slot for an engine added at run time (services/core/engines.py); its index."""
        self.ids += (replica_id,)
        for column in (self.requests, self.prompt, self.cached, self.missing, self.completed, self.completion):
            column.append(0)
        self._counters.append(None)
        self._reported.append(None)
        return len(self.ids) - 1

    def record(self, i: int, prompt_tokens: int, cached_tokens: int, completion_tokens: int | None = None) -> None:
        self.requests[i] += 1
        self.prompt[i] += prompt_tokens
        self.cached[i] += min(cached_tokens, prompt_tokens)
        if completion_tokens is not None and completion_tokens >= 0:
            self.completed[i] += 1
            self.completion[i] += completion_tokens

    def record_missing(self, i: int) -> None:
        self.missing[i] += 1

    def counters(self, i: int, requests: int, prompt_tokens: int, cached_tokens: int) -> None:
        self._counters[i] = (requests, prompt_tokens, cached_tokens)
        if self._reported[i] is None:
            self._reported[i] = self._counters[i]

    def take(self) -> list[tuple[str, int, int, int, int, int]]:
        """(replica id, requests, prompt tokens, cached tokens, completed, completion tokens) per
        replica with something to report; resets. The output figures are always the responses'
        own (counters do not say which requests they cover)."""
        out = []
        for i, rid in enumerate(self.ids):
            now, last = self._counters[i], self._reported[i]
            done = (self.completed[i], self.completion[i])
            if self.missing[i] and now is not None and last is not None:
                req = max(now[0] - last[0], self.requests[i] + self.missing[i])
                prompt, cached = max(0, now[1] - last[1]), max(0, now[2] - last[2])
                cached = min(cached, prompt)
                if prompt or req:
                    out.append((rid, req, prompt, cached, *done))
            elif self.requests[i]:
                out.append((rid, self.requests[i], self.prompt[i], self.cached[i], *done))
            self._reported[i] = now
            self.requests[i] = self.prompt[i] = self.cached[i] = self.missing[i] = 0
            self.completed[i] = self.completion[i] = 0
        return out


class CacheStatsSender(PeriodicSender):
    """Sends `CacheUsage.take()` to the collector every `interval` seconds."""

    task_name = "cache-usage"

    def __init__(self, usage: CacheUsage, collector: str, source: str, *, interval: float = 1.0,
                 timeout: float = 2.0, tls: TLSFiles | None = None, token: str | None = None) -> None:
        super().__init__(collector, interval=interval, timeout=timeout, tls=tls, token=token)
        self.usage = usage
        self.source = source
        self.sent_batches = 0
        self.dropped_batches = 0

    async def flush(self) -> bool:
        rows = self.usage.take()
        if not rows:
            return True
        batch = collector_pb2.CacheStatsBatch(
            batch_id=self.next_batch_id(f"{self.source}-cache"), source=self.source,
            stats=[collector_pb2.CacheStat(replica_id=rid, requests=req, prompt_tokens=p, cached_tokens=c,
                                           completed=f, completion_tokens=o)
                   for rid, req, p, c, f, o in rows])
        try:
            await self.stub.ReportCacheStats(iter([batch]), timeout=self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as err:
            self.dropped_batches += 1
            log.warning("cache stats dropped", extra=kv(collector=self.collector, code=err.code().name))
            return False
        self.sent_batches += 1
        return True
