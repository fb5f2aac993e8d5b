"""Telemetry ingestion: per-record validation and a bounded write pipeline.

Validation keeps the valid records of a batch and counts the rest (with the first
rejection's one-line reason). Writes go through one bounded queue shared by every stream:
stream readers block on a full queue (backpressure on the gRPC stream, so memory stays
bounded whatever the number of clients), and a few writer tasks drain it, coalescing up to
`max_coalesce` queued arrival batches into one store round trip.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from typing import AsyncIterable, Callable, Iterable

from services.core.prefixes import count_fields
from services.errors import Unavailable
from services.model import MAX_KEY_BYTES, CacheStatRecord
from services.rpc import kv
from services.store import Store
from services.store.keys import replica_id_problem

log = logging.getLogger("cacheroute.collector")

FUTURE_SLACK_SECONDS = 60.0
MAX_COUNT = 2**53  # beyond this a float sum of counts would lose integers
MAX_BATCH_ID_BYTES = 128   # a batch id becomes part of a Redis key (its dedup marker) for one retention


def batch_id_problem(batch_id: str) -> str | None:
    size = len(batch_id.encode("utf-8", "replace"))
    return f"batch_id is {size} bytes (max {MAX_BATCH_ID_BYTES})" if size > MAX_BATCH_ID_BYTES else None


def arrival_problem(key: str, t: float, prompt_tokens: int, prefix_tokens: int, *, now: float,
                    retention_seconds: float) -> str | None:
    """Why an arrival record is invalid, or None if it is fine."""
    if not key:
        return "empty key"
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return "key is not valid UTF-8"
    if size > MAX_KEY_BYTES:
        return f"key is {size} bytes (max {MAX_KEY_BYTES})"
    if not math.isfinite(t):
        return f"time is {t}"
    if t > now + FUTURE_SLACK_SECONDS:
        return f"time {t:.3f} is more than {FUTURE_SLACK_SECONDS:g}s in the future"
    if t < now - retention_seconds:
        return f"time {t:.3f} is older than the {retention_seconds:g}s retention"
    for name, value in (("prompt_tokens", prompt_tokens), ("prefix_tokens", prefix_tokens)):
        if not 0 <= value < MAX_COUNT:
            return f"{name} {value} out of range"
    return None


def valid_arrivals(rows: list[tuple[str, float, int, int]], *, now: float,
                   retention_seconds: float) -> list[tuple[str, float, int, int]]:
    """The rows `arrival_problem` accepts, as (key, time, prompt, prefix) tuples (ArrivalRecord
    rows). One comprehension with a cheap test: a key of at most 64 characters is at most 256
    UTF-8 bytes, and NaN fails both time comparisons; rows it refuses (long keys included)
    get the exact test."""
    lo, hi = now - retention_seconds, now + FUTURE_SLACK_SECONDS
    quick = MAX_KEY_BYTES // 4
    good = [r for r in rows if 0 < len(r[0]) <= quick and lo <= r[1] <= hi
            and 0 <= r[2] < MAX_COUNT and 0 <= r[3] < MAX_COUNT]
    try:
        "".join(r[0] for r in good).encode("utf-8")
    except UnicodeEncodeError:   # lone surrogates: only a non-protobuf caller can send them
        good = []
    if len(good) == len(rows):
        return good
    return [r for r in rows if arrival_problem(*r, now=now, retention_seconds=retention_seconds) is None]


def arrival_problems(rows: list[tuple[str, float, int, int]], *, now: float,
                     retention_seconds: float) -> list[tuple[int, str]]:
    """(index, reason) of every invalid row."""
    found = ((i, arrival_problem(*r, now=now, retention_seconds=retention_seconds)) for i, r in enumerate(rows))
    return [(i, problem) for i, problem in found if problem is not None]


def cache_stat_problem(replica_id: str, prompt_tokens: int, cached_tokens: int, requests: int,
                       completed: int = 0, completion_tokens: int = 0) -> str | None:
    """Why a cache-counter record is invalid, or None if it is fine."""
    if (problem := replica_id_problem(replica_id)) is not None:
        return problem
    for name, value in (("prompt_tokens", prompt_tokens), ("cached_tokens", cached_tokens), ("requests", requests),
                        ("completed", completed), ("completion_tokens", completion_tokens)):
        if not 0 <= value < MAX_COUNT:
            return f"{name} {value} out of range"
    if cached_tokens > prompt_tokens:
        return f"cached_tokens {cached_tokens} > prompt_tokens {prompt_tokens}"
    if completion_tokens and not completed:
        return f"completion_tokens {completion_tokens} without completed requests"
    return None


def _label(batch_id: str, ordinal: int) -> str:
    """A batch id fit for a one-line message (ids are client-chosen), else its ordinal."""
    text = " ".join(batch_id.split())
    return (text[:64] + "...") if len(text) > 64 else (text or str(ordinal))


@dataclass
class Tally:
    """One stream's counts; writers update it as its batches land."""

    batches: int = 0
    accepted: int = 0
    rejected: int = 0
    duplicate_batches: int = 0
    first_rejection: str = ""
    error: Exception | None = None
    pending: int = 0
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def reject(self, where: str, reason: str) -> None:
        self.rejected += 1
        if not self.first_rejection:
            self.first_rejection = f"{where}: {reason}"

    def landed(self, records: int, counted: bool) -> None:
        if counted:
            self.accepted += records
        else:
            self.duplicate_batches += 1

    def done_one(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self._idle.set()

    async def wait(self) -> None:
        if self.pending:
            self._idle.clear()
            await self._idle.wait()
        if self.error is not None:
            raise self.error


def prefix_rows(arrivals, rows: list, good: list) -> list[tuple[float, str, int]]:
    """(time, field, 1) prefix-node count rows of the valid arrivals that carry a prefix chain
    (services.core.prefixes.count_fields; at most len(NODE_DEPTHS) per arrival)."""
    if not any(a.prefix_nodes for a in arrivals):
        return []
    if len(good) == len(rows):
        keep: Iterable[int] = range(len(rows))
    else:
        valid = set(good)
        keep = [i for i, r in enumerate(rows) if r in valid]
    out = []
    for i in keep:
        a = arrivals[i]
        if a.prefix_nodes:
            out.extend((a.time, f, 1) for f in count_fields(a.key, a.prefix_nodes))
    return out


def home_rows(arrivals, rows: list, good: list) -> list[tuple[float, str, str]]:
    """(time, key, replica id) of the valid arrivals that name the replica they were sent to
    (1..64 bytes; others are kept as arrivals and carry no home)."""
    if len(good) == len(rows):
        keep: Iterable[int] = range(len(rows))
    else:
        valid = set(good)
        keep = [i for i, r in enumerate(rows) if r in valid]
    out = []
    for i in keep:
        a = arrivals[i]
        if 0 < len(a.replica) <= 64:
            out.append((a.time, a.key, a.replica))
    return out


@dataclass(slots=True)
class _Item:
    kind: str                                  # "arrivals" | "cache" | "prefix" | "homes"
    batch_id: str
    records: list
    tally: Tally
    now: float = 0.0


@dataclass
class IngestCounters:
    """Callbacks for metrics (no-ops by default, so the pipeline is testable alone)."""

    events: Callable[[int], None] = lambda n: None
    rejected: Callable[[str, int], None] = lambda kind, n: None
    duplicates: Callable[[str], None] = lambda kind: None


class Ingestor:
    def __init__(self, store: Store, *, queue_size: int = 64, writers: int = 2, max_coalesce: int = 16,
                 clock: Callable[[], float], counters: IngestCounters | None = None) -> None:
        if queue_size < 1 or writers < 1 or max_coalesce < 1:
            raise ValueError("queue_size, writers and max_coalesce must be >= 1")
        self.store = store
        self.queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=queue_size)
        self.writers = writers
        self.max_coalesce = max_coalesce
        self.clock = clock
        self.counters = counters or IngestCounters()
        self._tasks: list[asyncio.Task] = []
        self._stopping = False

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._write_loop(), name=f"collector-writer-{i}") for i in range(self.writers)]

    async def stop(self) -> None:
        # bounded wait: a cancel racing a redis-py read timeout can be swallowed on Python 3.11
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)
        self._tasks = []

    # ---- stream side

    async def ingest_arrivals(self, batches: AsyncIterable) -> Tally:
        """Validate and queue every ArrivalBatch of a stream; return once all have landed."""
        retention = self.store.telemetry.retention_seconds
        tally = Tally()
        async for batch in batches:
            if tally.error is not None:
                break
            tally.batches += 1
            if problem := batch_id_problem(batch.batch_id):
                self._refuse_batch(tally, batch.batch_id, len(batch.arrivals), "arrival", problem)
                continue
            rows = [(a.key, a.time, a.prompt_tokens, a.prefix_tokens) for a in batch.arrivals]
            now = self.clock()
            good = valid_arrivals(rows, now=now, retention_seconds=retention)
            if len(good) < len(rows):
                for i, problem in arrival_problems(rows, now=now, retention_seconds=retention):
                    tally.reject(f"batch {_label(batch.batch_id, tally.batches)} arrival {i}", problem)
            self.counters.rejected("arrival", len(rows) - len(good))
            if good:
                await self._put(_Item("arrivals", batch.batch_id, good, tally))
                prefix = prefix_rows(batch.arrivals, rows, good)
                if prefix:
                    await self._put(_Item("prefix", batch.batch_id, prefix, tally))
                homes = home_rows(batch.arrivals, rows, good)
                if homes:
                    await self._put(_Item("homes", batch.batch_id, homes, tally))
        await tally.wait()
        return tally

    async def ingest_cache_stats(self, batches: AsyncIterable) -> Tally:
        tally = Tally()
        async for batch in batches:
            if tally.error is not None:
                break
            tally.batches += 1
            if problem := batch_id_problem(batch.batch_id):
                self._refuse_batch(tally, batch.batch_id, len(batch.stats), "cache", problem)
                continue
            good = []
            for i, s in enumerate(batch.stats):
                problem = cache_stat_problem(s.replica_id, s.prompt_tokens, s.cached_tokens, s.requests,
                                             s.completed, s.completion_tokens)
                if problem is None:
                    good.append(CacheStatRecord(s.replica_id, s.prompt_tokens, s.cached_tokens, s.requests,
                                                s.completed, s.completion_tokens))
                else:
                    tally.reject(f"batch {_label(batch.batch_id, tally.batches)} stat {i}", problem)
            self.counters.rejected("cache", len(batch.stats) - len(good))
            if good:
                await self._put(_Item("cache", batch.batch_id, good, tally, self.clock()))
        await tally.wait()
        return tally

    def _refuse_batch(self, tally: Tally, batch_id: str, records: int, kind: str, problem: str) -> None:
        for _ in range(records):
            tally.reject(f"batch {_label(batch_id, tally.batches)}", problem)
        self.counters.rejected(kind, records)

    async def _put(self, item: _Item) -> None:
        item.tally.pending += 1
        await self.queue.put(item)   # blocks while the writers are behind: backpressure

    # ---- writer side

    def _take_more(self, first: _Item) -> list[_Item]:
        """The first item plus whatever else is queued, up to max_coalesce: one round trip."""
        items = [first]
        while len(items) < self.max_coalesce:
            try:
                items.append(self.queue.get_nowait())
            except asyncio.QueueEmpty:
                break
        return items

    async def _write_loop(self) -> None:
        while not self._stopping:
            items = self._take_more(await self.queue.get())
            try:
                await self._write(items)
            except Unavailable as exc:
                for it in items:
                    it.tally.error = exc
                log.warning("telemetry write failed", extra=kv(error=str(exc), batches=len(items)))
            except Exception as exc:  # noqa: BLE001 - reported on the stream, logged here
                for it in items:
                    it.tally.error = exc
                log.exception("telemetry write failed")
            finally:
                for it in items:
                    self.queue.task_done()
                    it.tally.done_one()

    async def _write(self, items: list[_Item]) -> None:
        arrivals = [it for it in items if it.kind == "arrivals"]
        if arrivals:
            flags = await self.store.record_arrival_batches([(it.batch_id, it.records) for it in arrivals])
            for it, counted in zip(arrivals, flags):
                self._landed(it, counted)
        for it in items:
            if it.kind == "cache":
                done = await self.store.write_cache_stats(it.batch_id, it.records, now=it.now)
                if done.refused:
                    refused = set(done.refused)
                    for i, record in enumerate(it.records):
                        if record.replica_id in refused:
                            it.tally.reject(f"batch {_label(it.batch_id, 0)} stat {i}",
                                            f"lifetime counters of replica {record.replica_id[:64]} would pass 2^62")
                    self.counters.rejected("cache", sum(r.replica_id in refused for r in it.records))
                    it.records = [r for r in it.records if r.replica_id not in refused]
                self._landed(it, done.counted)
            elif it.kind == "prefix":
                await self.store.record_prefix_counts(it.batch_id, it.records)   # tallied with its arrivals
            elif it.kind == "homes":
                await self.store.record_homes(it.records)                        # tallied with its arrivals

    def _landed(self, it: _Item, counted: bool) -> None:
        it.tally.landed(len(it.records), counted)
        if counted:
            if it.kind == "arrivals":
                self.counters.events(len(it.records))
        else:
            self.counters.duplicates(it.kind)
