"""`MemoryStore`: the storage contract in process memory, for unit tests and single-process
demos. The same refusals and codecs as the Redis store (plans are stored encoded, so both
hand out equal copies); TTLs run on an injectable clock."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Sequence

from services.core.plan import Plan
from services.errors import FailedPrecondition, NotFound, Unavailable
from services.model import (
    Activation,
    ArrivalRecord,
    CacheCounters,
    CacheStatRecord,
    CacheStatsWrite,
    ControlState,
    HistoryEntry,
    LeaseInfo,
    Mode,
    PlanEvent,
    RatesSnapshot,
)
from services.store.buckets import (
    CACHE_COUNTER_LIMIT,
    cap_new_keys,
    counters,
    key_totals,
    newest,
    snapshot,
    split_by_bucket,
    window_buckets,
)
from services.store.config import TelemetryConfig
from services.store.contract import (HISTORY_MAX, HOME_FIELDS_PER_BUCKET, PREFIX_FIELDS_PER_BUCKET, Store, Subscription, check_engine_write,
                                     check_version, lease_ms, refusal, stale_engines)
from services.store.keys import (
    engines_blob,
    engines_from_blob,
    arrival_from_log,
    decode_plan,
    encode_plan,
    log_lines,
    merge_counters,
    COUNTER_KINDS,
    stat_groups,
    summary_of,
)


class MemoryStore(Store):
    """The same contract in process memory. TTLs run on `clock` (monotonic by default)."""

    def __init__(self, telemetry: TelemetryConfig | None = None, *, clock=time.monotonic) -> None:
        super().__init__(telemetry)
        self._clock = clock
        self._buckets: dict[int, dict[str, dict[str, list]]] = {}
        self._since: float | None = None
        self._budgets: dict[str, tuple[float, int, float]] = {}   # caller -> (tokens, at ms, expires ms)
        self._seen: dict[str, float] = {}                      # marker -> expiry
        self._cache_b: dict[int, dict[str, list[int]]] = {}
        self._cache_total: dict[str, list[int]] = {}
        self._prefix_b: dict[int, dict[str, int]] = {}
        self._homes_b: dict[int, dict[str, str]] = {}
        self._plans: dict[int, bytes] = {}
        self._engines: tuple[int, bytes] = (0, b"")               # version, stored form
        self._summaries: dict[int, bytes] = {}
        self._seq = 0
        self._active = 0
        self._history: list[HistoryEntry] = []
        self._mode = (Mode.PLANNED, "", 0.0)
        self._pinned = 0
        self._lease: tuple[str, int, float] | None = None     # holder, token, expiry
        self._fence = 0
        self._subscribers: set[asyncio.Queue] = set()
        self.down = False                                      # fault injection for tests

    def _check(self) -> None:
        if self.down:
            raise Unavailable("memory store marked down")

    def _mark(self, marker: str) -> bool:
        now = self._clock()
        if self._seen.get(marker, -math.inf) > now:
            return False
        self._seen[marker] = now + self.telemetry.ttl
        return True

    def _expire(self) -> None:
        """Drop buckets older than the retention (relative to the newest bucket seen)."""
        if not self._buckets:
            return
        keep = max(self._buckets) - math.ceil(self.telemetry.ttl / self.telemetry.bucket_seconds)
        for idx in [i for i in self._buckets if i < keep]:
            del self._buckets[idx]

    async def record_arrival_batches(self, batches: Sequence[tuple[str, Sequence[ArrivalRecord]]]) -> list[bool]:
        self._check()
        cfg = self.telemetry
        out = []
        for batch_id, arrivals in batches:
            counted = not arrivals
            for idx, part in split_by_bucket(arrivals, cfg).items():
                if batch_id and not self._mark(f"tb:{idx}:{batch_id}"):
                    continue
                counted = True
                b = self._buckets.setdefault(idx, {"n": {}, "gaps": [], "log": [], "untracked": [0, 0, 0]})
                sums = key_totals([part])
                kept, _ = cap_new_keys(sums, b["n"].__contains__, len(b["n"]), cfg.keys_per_bucket)
                for key, (n, pt, xt) in sums.items():
                    acc = b["n"].setdefault(key, [0, 0, 0]) if key in kept else b["untracked"]
                    acc[0] += n
                    acc[1] += pt
                    acc[2] += xt
                b["gaps"] = newest([b["gaps"], part.gaps], cfg.gaps_per_bucket)
                b["log"] = newest([b["log"], log_lines(newest([part.rows], cfg.log_per_bucket))], cfg.log_per_bucket)
            out.append(counted)
        self._expire()
        return out

    async def write_cache_stats(self, batch_id: str, stats: Sequence[CacheStatRecord], *,
                                now: float) -> CacheStatsWrite:
        self._check()
        if batch_id and not self._mark(f"cache:{batch_id}"):
            return CacheStatsWrite(False)
        refused = []
        bucket = self._cache_b.setdefault(self.telemetry.bucket(now), {})
        for replica, deltas in stat_groups(stats).items():
            total = self._cache_total.get(replica, [0] * len(COUNTER_KINDS))
            if any(t + d > CACHE_COUNTER_LIMIT for t, d in zip(total, deltas)):
                refused.append(replica)
                continue
            fields = {f"{replica}|{k}": d for k, d in zip(COUNTER_KINDS, deltas)}
            merge_counters(bucket, fields)
            merge_counters(self._cache_total, fields)
        return CacheStatsWrite(True, tuple(refused))

    async def record_prefix_counts(self, batch_id: str, counts: Sequence[tuple[float, str, int]]) -> bool:
        self._check()
        cfg = self.telemetry
        parts: dict[int, list[tuple[str, int]]] = {}
        for t, field, n in counts:
            parts.setdefault(cfg.bucket(t), []).append((field, n))
        counted = not counts
        for idx, rows in parts.items():
            if batch_id and not self._mark(f"pfx:{idx}:{batch_id}"):
                continue
            counted = True
            bucket = self._prefix_b.setdefault(idx, {})
            for field, n in rows:
                if field in bucket:
                    bucket[field] += n
                elif len(bucket) < PREFIX_FIELDS_PER_BUCKET:
                    bucket[field] = n
        keep = max(self._prefix_b) - math.ceil(cfg.ttl / cfg.bucket_seconds) if self._prefix_b else 0
        for idx in [i for i in self._prefix_b if i < keep]:
            del self._prefix_b[idx]
        return counted

    async def record_homes(self, rows: Sequence[tuple[float, str, str]]) -> None:
        self._check()
        cfg = self.telemetry
        for t, key, replica in rows:
            bucket = self._homes_b.setdefault(cfg.bucket(t), {})
            if key in bucket or len(bucket) < HOME_FIELDS_PER_BUCKET:
                bucket[key] = replica
        keep = max(self._homes_b) - math.ceil(cfg.ttl / cfg.bucket_seconds) if self._homes_b else 0
        for idx in [i for i in self._homes_b if i < keep]:
            del self._homes_b[idx]

    async def served_homes(self, now: float, window_seconds: float) -> dict[str, str]:
        self._check()
        first, last, _ = window_buckets(now, window_seconds, self.telemetry)
        out: dict[str, str] = {}
        for i in range(first, last + 1):
            out.update(self._homes_b.get(i, {}))
        return out

    async def prefix_counts(self, now: float, window_seconds: float) -> dict[str, int]:
        self._check()
        first, last, _ = window_buckets(now, window_seconds, self.telemetry)
        out: dict[str, int] = {}
        for i in range(first, last + 1):
            for field, n in self._prefix_b.get(i, {}).items():
                out[field] = out.get(field, 0) + n
        return out

    async def mark_telemetry_start(self, now: float) -> float:
        self._check()
        if self._since is None:
            self._since = float(now)
        return self._since

    async def window_rates(self, now: float, window_seconds: float) -> RatesSnapshot:
        self._check()
        first, last, start = window_buckets(now, window_seconds, self.telemetry)
        if self._since is not None and self._since < now:
            start = max(start, self._since)
        totals: dict[str, list[int]] = {}
        untracked = 0
        for i in range(first, last + 1):
            bucket = self._buckets.get(i, {"n": {}, "untracked": [0, 0, 0]})
            untracked += bucket["untracked"][0]
            for key, row in bucket["n"].items():
                acc = totals.setdefault(key, [0, 0, 0])
                for j in range(3):
                    acc[j] += row[j]
        return snapshot(first, last, start, now, totals, untracked)

    async def cache_stats(self, now: float, window_seconds: float) -> dict[str, CacheCounters]:
        self._check()
        first, last, _ = window_buckets(now, window_seconds, self.telemetry)
        rows: dict[str, list[int]] = {}
        for i in range(first, last + 1):
            for replica, v in self._cache_b.get(i, {}).items():
                acc = rows.setdefault(replica, [0] * len(COUNTER_KINDS))
                for j, x in enumerate(v):
                    acc[j] += x
        return counters(rows)

    async def cache_totals(self) -> dict[str, CacheCounters]:
        self._check()
        return counters({k: list(v) for k, v in self._cache_total.items()})

    def _window_lists(self, now: float, window_seconds: float, name: str) -> list:
        first, last, _ = window_buckets(now, window_seconds, self.telemetry)
        return [x for i in range(first, last + 1) for x in self._buckets.get(i, {}).get(name, [])]

    async def interarrival_sample(self, now: float, window_seconds: float) -> list[float]:
        self._check()
        return list(self._window_lists(now, window_seconds, "gaps"))

    async def recent_arrivals(self, now: float, window_seconds: float) -> list[ArrivalRecord]:
        self._check()
        return [arrival_from_log(r) for r in self._window_lists(now, window_seconds, "log")]

    # ---- plans

    async def next_version(self) -> int:
        self._check()
        self._seq += 1
        return self._seq

    async def put_plan(self, plan: Plan) -> None:
        self._check()
        check_version(plan.version)
        if plan.version in self._plans:
            raise FailedPrecondition(f"plan version {plan.version} already exists")
        self._plans[plan.version] = encode_plan(plan)
        self._summaries[plan.version] = encode_plan(summary_of(plan))
        self._seq = max(self._seq, plan.version)

    async def get_plan(self, version: int) -> Plan:
        self._check()
        if version not in self._plans:
            raise NotFound(f"plan version {version} not found")
        return decode_plan(self._plans[version])

    async def list_plans(self, limit: int = 20, before_version: int = 0) -> list[Plan]:
        self._check()
        versions = sorted((v for v in self._summaries if before_version <= 0 or v < before_version), reverse=True)
        return [decode_plan(self._summaries[v]) for v in versions[:max(0, limit)]]

    async def get_control(self) -> ControlState:
        self._check()
        mode, reason, at = self._mode
        return ControlState(self._active, mode, reason, at, self._pinned, self._seq)

    def _lease_now(self) -> tuple[str, int, float] | None:
        if self._lease is not None and self._lease[2] <= self._clock():
            self._lease = None
        return self._lease

    def _check_fence(self, fencing_token: int | None) -> None:
        lease = self._lease_now()
        if fencing_token is not None and (lease is None or lease[1] != fencing_token):
            raise refusal("fenced", 0, 0)

    def _publish(self, event: PlanEvent) -> None:
        for q in self._subscribers:
            if q.full():
                q.get_nowait()
            q.put_nowait(event)

    def _cas(self, version: int, *, expected: int, now: float, reason: str, event: str,
             fencing_token: int | None, automatic: bool) -> Activation:
        self._check()
        current = self._active
        if current != expected:
            raise refusal("stale", version, current)
        if version == 0:
            version = self._history[0].previous if self._history else 0
            if version == 0:
                raise refusal("no_previous", version, current)
        if version not in self._plans:
            raise refusal("missing", version, current)
        self._check_fence(fencing_token)
        if self._pinned and self._pinned != version:
            raise refusal("pinned", version, self._pinned)
        if automatic and self._mode[0] is Mode.FLAT:
            raise refusal("flat", version, current)
        if version == current:
            return Activation(current, current, False)
        self._active = version
        self._history.insert(0, HistoryEntry(version, current, event, reason, float(now), fencing_token or 0))
        del self._history[HISTORY_MAX:]
        self._publish(PlanEvent(event, version, self._mode[0], float(now)))
        return Activation(version, current, True)

    async def activate(self, version: int, *, expected: int, now: float, reason: str = "",
                       fencing_token: int | None = None, automatic: bool = False) -> Activation:
        check_version(version)
        return self._cas(version, expected=expected, now=now, reason=reason, event="activate",
                         fencing_token=fencing_token, automatic=automatic)

    async def rollback(self, *, expected: int, now: float, to_version: int = 0, reason: str = "",
                       fencing_token: int | None = None) -> Activation:
        return self._cas(to_version, expected=expected, now=now, reason=reason, event="rollback",
                         fencing_token=fencing_token, automatic=False)

    async def history(self, limit: int = 20) -> list[HistoryEntry]:
        self._check()
        return self._history[:max(0, limit)]

    async def set_mode(self, mode: Mode, *, reason: str, now: float,
                       fencing_token: int | None = None) -> ControlState:
        self._check()
        self._check_fence(fencing_token)
        mode = Mode(mode)
        changed = mode is not self._mode[0]
        self._mode = (mode, reason, float(now))
        if changed:
            self._publish(PlanEvent("mode", self._active, mode, float(now)))
        return await self.get_control()

    async def pin(self, version: int, *, fencing_token: int | None = None) -> ControlState:
        self._check()
        check_version(version)
        self._check_fence(fencing_token)
        if version not in self._plans:
            raise NotFound(f"plan version {version} not found")
        if version != self._active:
            raise FailedPrecondition(f"version {version} is not the active version")
        self._pinned = version
        return await self.get_control()

    async def unpin(self, *, fencing_token: int | None = None) -> ControlState:
        self._check()
        self._check_fence(fencing_token)
        self._pinned = 0
        return await self.get_control()

    async def prune_plans(self, keep: int) -> int:
        self._check()
        protect = {self._active, self._pinned} | {h.version for h in self._history} | {h.previous for h in self._history}
        old = sorted(self._plans, reverse=True)[max(0, keep):]
        doomed = [v for v in old if v not in protect]
        for v in doomed:
            del self._plans[v], self._summaries[v]
        return len(doomed)

    def subscribe(self) -> "Subscription":
        return _MemorySubscription(self)

    # ---- lease

    async def acquire_lease(self, holder: str, ttl_seconds: float) -> int | None:
        self._check()
        expiry = self._clock() + lease_ms(ttl_seconds) / 1000
        lease = self._lease_now()
        if lease is not None:
            if lease[0] != holder:
                return None
            self._lease = (holder, lease[1], expiry)
            return lease[1]
        self._fence += 1
        self._lease = (holder, self._fence, expiry)
        return self._fence

    async def renew_lease(self, holder: str, token: int, ttl_seconds: float) -> bool:
        self._check()
        lease = self._lease_now()
        if lease is None or lease[:2] != (holder, token):
            return False
        self._lease = (holder, token, self._clock() + lease_ms(ttl_seconds) / 1000)
        return True

    async def release_lease(self, holder: str, token: int) -> bool:
        self._check()
        lease = self._lease_now()
        if lease is None or lease[:2] != (holder, token):
            return False
        self._lease = None
        return True

    async def lease(self) -> LeaseInfo | None:
        self._check()
        lease = self._lease_now()
        return None if lease is None else LeaseInfo(lease[0], lease[1], max(0.0, lease[2] - self._clock()))

    async def get_engine_set(self):
        self._check()
        return engines_from_blob(self._engines[1])

    async def put_engine_set(self, engines, *, expected: int, fencing_token: int | None = None):
        self._check()
        check_engine_write(engines, expected)
        self._check_fence(fencing_token)
        if self._engines[0] != expected:
            raise stale_engines(self._engines[0])
        self._engines = (engines.version, engines_blob(engines))
        return engines
    async def take_budget(self, caller: str, n: int, *, rate: float, burst: float, now: float) -> int:
        self._check()
        if n <= 0:
            return 0
        now_ms = int(now * 1000)
        tokens, at, expires = self._budgets.get(caller, (burst, now_ms, math.inf))
        if now_ms >= expires:
            tokens, at = burst, now_ms
        elif now_ms > at:
            tokens, at = min(burst, tokens + (now_ms - at) / 1000 * rate), now_ms
        granted = max(0, min(n, math.floor(tokens)))
        tokens -= granted
        self._budgets[caller] = (tokens, at, now_ms + math.ceil((burst - tokens) / rate * 1000) + 1000)
        if len(self._budgets) > 100_000:          # the Redis keys' TTL, done by sweeping
            self._budgets = {c: b for c, b in self._budgets.items() if b[2] > now_ms}
        return granted

    async def ping(self) -> None:
        self._check()


class _MemorySubscription(Subscription):
    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=256)

    async def start(self) -> None:
        self.store._check()
        self.store._subscribers.add(self.queue)

    async def get(self, timeout: float) -> PlanEvent | None:
        self.store._check()
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            return None

    async def close(self) -> None:
        self.store._subscribers.discard(self.queue)
