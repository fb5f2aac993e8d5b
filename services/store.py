"""The control-plane store: telemetry aggregates, plan versions, activation, mode and the
planner lease. The only code that knows Redis key names.

Two implementations share one contract (the docstrings on `Store`): `RedisStore`
(redis.asyncio, Lua scripts for every conditional multi-key step) and `MemoryStore` (an
in-process twin for unit tests and single-process demos). One contract test suite runs
against both (tests/integration/test_store_contract.py). Callers pass `now` (unix seconds)
wherever time matters; only lease and dedup TTLs run on the server's clock.

Key schema (prefix P, default "cr"; `{...}` is the Redis Cluster hash tag, so every Lua
script or transaction touches keys of one slot):

  telemetry, one slot per time bucket (idx = floor(time / bucket_seconds)):
    P:{tb:IDX}:n            hash  routing key -> arrivals in the bucket
    P:{tb:IDX}:pt           hash  routing key -> summed prompt tokens
    P:{tb:IDX}:xt           hash  routing key -> summed reusable prefix tokens
    P:{tb:IDX}:gaps         list  inter-arrival seconds (consecutive arrivals of one
                                  reported batch), newest `gaps_per_bucket` kept
    P:{tb:IDX}:log          list  JSON [key, time, prompt_tokens, prefix_tokens], newest
                                  `log_per_bucket` kept (aggregates only, never content)
    P:{tb:IDX}:seen:BATCH   string  idempotency marker of the batch's part in this bucket
    P:{tb:IDX}:v            string  random token replaced by every write to the bucket (window
                                  readers re-read a bucket only when it changed)
  cache counters, one slot:
    P:{cache}:b:IDX         hash  "replica|p|c|r" fields: prompt, cached tokens, requests
    P:{cache}:total         hash  the same fields, since the start (bounded by replicas)
    P:{cache}:seen:BATCH    string  idempotency marker
  plans, one slot:
    P:{plans}:seq           int   highest version number handed out or stored
    P:{plans}:plan:V        string  the plan's JSON (services.codec), written once (SET NX)
    P:{plans}:summary:V     string  the same plan without table and rates (for listings)
    P:{plans}:index         zset  version -> version
    P:{plans}:active        int   active version (absent: none)
    P:{plans}:history       list  JSON activation records, newest first, capped
    P:{plans}:mode          hash  mode ("planned" | "flat"), reason, at
    P:{plans}:pinned        int   pinned version (absent: none)
    P:{plans}:lease         hash  holder, token; expires after the lease TTL
    P:{plans}:fence         int   fencing-token counter (never decreases)
    P:{plans}:events        pub/sub channel: JSON PlanEvent on activation, rollback, mode

Every telemetry key carries a TTL of retention + one bucket, so Redis stays bounded.
Idempotency: a batch's records are split by bucket and each part has a `seen` marker. One
script per bucket writes the parts of every batch in a round trip: if any of their markers is
already set it writes nothing and names them (the caller retries without those parts), else it
sets the markers (EX ttl) and adds the counts summed over the parts, one HINCRBY per distinct
key. A batch is a duplicate when every part was seen. Activation is one script: compare-and-set on the active
version, the version must exist, the lease fencing token (when given) must be current, a
pinned version blocks replacement, and an automatic activation is refused in flat mode. Mode
changes, pin and unpin take the same optional fencing token, checked in the same script as the
write, so a deposed planner's automatic fallback cannot land after it lost the lease.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import enum
import hashlib
import logging
import math
import operator
import os
import time
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Iterable, NamedTuple, Sequence

import numpy as np
import orjson

from services.core.plan import Plan
from services.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable

log = logging.getLogger("cacheroute.store")

# ---------------------------------------------------------------------------------------------
# records and results


class Mode(str, enum.Enum):
    PLANNED = "planned"
    FLAT = "flat"


class ArrivalRecord(NamedTuple):
    """One request arrival in aggregate form: routing key, time, token counts. No content.
    A tuple, so the collector can hand the store plain `(key, time, prompt, prefix)` rows
    without building one object per record."""

    key: str
    time: float
    prompt_tokens: int = 0
    prefix_tokens: int = 0


@dataclass(frozen=True, slots=True)
class CacheStatRecord:
    """Per-replica deltas since the replica's previous report."""

    replica_id: str
    prompt_tokens: int
    cached_tokens: int
    requests: int


@dataclass(frozen=True, slots=True)
class CacheCounters:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0

    @property
    def hit_rate(self) -> float:
        """Token-weighted hit rate (SPEC section 6); 0 without traffic."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True, slots=True)
class RatesSnapshot:
    """Per-key rates over a window, hottest first (ties: key ascending)."""

    snapshot_id: str
    start: float                          # unix seconds, first bucket's start
    end: float                            # `now` of the read
    window_seconds: float                 # end - start: the span rates are divided by
    total_arrivals: int
    keys: tuple[str, ...]
    rates: tuple[float, ...]              # req/s
    mean_prompt_tokens: tuple[float, ...]
    mean_prefix_tokens: tuple[float, ...]

    def rate_map(self) -> dict[str, float]:
        return dict(zip(self.keys, self.rates))

    def prefix_map(self) -> dict[str, float]:
        return dict(zip(self.keys, self.mean_prefix_tokens))


@dataclass(frozen=True, slots=True)
class ControlState:
    """What the dispatchers and the planner loop act on, read in one round trip."""

    active_version: int = 0               # 0: none
    mode: Mode = Mode.PLANNED
    mode_reason: str = ""
    mode_changed_at: float = 0.0
    pinned_version: int = 0               # 0: none
    latest_version: int = 0


@dataclass(frozen=True, slots=True)
class Activation:
    active_version: int
    previous_version: int
    changed: bool                         # False: the version was already active


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    version: int
    previous: int
    event: str                            # "activate" | "rollback"
    reason: str
    at: float
    fencing_token: int = 0                # 0: a manual activation


@dataclass(frozen=True, slots=True)
class PlanEvent:
    event: str                            # "activate" | "rollback" | "mode"
    active_version: int
    mode: Mode
    at: float


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    holder: str
    token: int
    ttl_seconds: float


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    bucket_seconds: float = 10.0          # width of one telemetry bucket
    retention_seconds: float = 3600.0     # how long buckets and batch markers live
    gaps_per_bucket: int = 2000           # inter-arrival samples kept per bucket
    log_per_bucket: int = 20000           # arrival-log records kept per bucket

    def __post_init__(self) -> None:
        if not (self.bucket_seconds > 0 and math.isfinite(self.bucket_seconds)):
            raise ValueError("bucket_seconds must be a positive number")
        if not self.retention_seconds >= self.bucket_seconds:
            raise ValueError("retention_seconds must be at least one bucket")
        if self.gaps_per_bucket < 0 or self.log_per_bucket < 0:
            raise ValueError("sample sizes must be >= 0")

    def bucket(self, t: float) -> int:
        return math.floor(t / self.bucket_seconds)

    @property
    def ttl(self) -> int:
        return math.ceil(self.retention_seconds + self.bucket_seconds)


# Stale and fenced activations are FailedPrecondition (gRPC FAILED_PRECONDITION); callers that
# care tell them apart by type.
class StaleVersion(FailedPrecondition):
    pass


class Fenced(FailedPrecondition):
    pass


class Pinned(FailedPrecondition):
    pass


class FlatMode(FailedPrecondition):
    pass


HISTORY_MAX = 200


# ---------------------------------------------------------------------------------------------
# plan encoding (services.codec owns the format)


def _encode_plan(plan: Plan) -> bytes:
    from services import codec

    return codec.plan_to_json(plan)


def _decode_plan(data: bytes) -> Plan:
    from services import codec

    return codec.plan_from_json(data)


def summary_of(plan: Plan) -> Plan:
    """The plan without its table and rates: what listings carry."""
    return dataclasses.replace(plan, table={}, rates={})


# ---------------------------------------------------------------------------------------------
# pure helpers shared by both implementations


@dataclass(slots=True)
class _BucketPart:
    """A batch's arrivals that fall into one bucket."""

    rows: list[ArrivalRecord]             # in time order
    gaps: list[float]                     # between consecutive arrivals of the batch


_KEY, _TIME = operator.itemgetter(0), operator.itemgetter(1)


def split_by_bucket(arrivals: Sequence[ArrivalRecord], cfg: TelemetryConfig) -> dict[int, _BucketPart]:
    """Group a batch by bucket (rows in time order; each gap goes to the later arrival's bucket)."""
    rows = sorted(arrivals, key=_TIME)
    if not rows:
        return {}
    times = [r[1] for r in rows]
    first, last = cfg.bucket(times[0]), cfg.bucket(times[-1])
    if first == last:
        spans = [(first, 0, len(rows))]
    else:   # sorted, so each bucket is one contiguous run
        spans, start = [], 0
        idxs = [cfg.bucket(t) for t in times]
        for j in range(1, len(rows) + 1):
            if j == len(rows) or idxs[j] != idxs[start]:
                spans.append((idxs[start], start, j))
                start = j
    parts: dict[int, _BucketPart] = {}
    for idx, lo, hi in spans:
        g = max(lo, 1)
        parts[idx] = _BucketPart(rows[lo:hi], [b - a for a, b in zip(times[g - 1:hi - 1], times[g:hi])])
    return parts


def key_totals(parts: Iterable[_BucketPart]) -> dict[str, list[int]]:
    """key -> [arrivals, summed prompt tokens, summed prefix tokens] over the parts' rows."""
    totals: dict[str, list[int]] = {}
    get = totals.get
    for part in parts:
        for key, _, pt, xt in part.rows:
            acc = get(key)
            if acc is None:
                totals[key] = [1, pt, xt]
            else:
                acc[0] += 1
                acc[1] += pt
                acc[2] += xt
    return totals


def log_blob(rows: Sequence[ArrivalRecord]) -> bytes:
    """Arrival-log entries, newline-separated: JSON [key, time, prompt_tokens, prefix_tokens]
    each (JSON escapes newlines inside strings). Encoded in one orjson call, the outer
    array's "],[" separators becoming newlines; only a key containing "],[" itself needs
    one call per record."""
    if not rows:
        return b""
    if "],[" in "\0".join(map(_KEY, rows)):
        return b"\n".join(orjson.dumps(list(r)) for r in rows)
    return orjson.dumps(rows, default=tuple)[1:-1].replace(b"],[", b"]\n[")


def log_lines(rows: Sequence[ArrivalRecord]) -> list[bytes]:
    return log_blob(rows).split(b"\n") if rows else []


def _newest(chunks: Iterable[list], cap: int) -> list:
    """The last `cap` items of the chunks concatenated in order."""
    if cap <= 0:
        return []
    out: list = []
    for chunk in reversed(list(chunks)):
        out[:0] = chunk[-(cap - len(out)):]
        if len(out) >= cap:
            break
    return out


def _first_of_each_batch_id(parts: list[tuple[int, str, _BucketPart]]) -> list[tuple[int, str, _BucketPart]]:
    """Drop a repeated batch id's later parts (a duplicate of the first, whatever happens to it)."""
    ids: set[str] = set()
    out = []
    for p in parts:
        if p[1]:
            if p[1] in ids:
                continue
            ids.add(p[1])
        out.append(p)
    return out


def _window_buckets(now: float, window_seconds: float, cfg: TelemetryConfig) -> tuple[int, int, float]:
    """Buckets covering the window (the current, partial one included) and its span start."""
    if not (window_seconds > 0 and math.isfinite(window_seconds)):
        raise InvalidArgument("window_seconds must be a positive number")
    if window_seconds > cfg.retention_seconds:
        raise InvalidArgument(f"window {window_seconds:g}s exceeds the telemetry retention {cfg.retention_seconds:g}s")
    first, last = cfg.bucket(now - window_seconds), cfg.bucket(now)
    return first, last, first * cfg.bucket_seconds


def _snapshot(first: int, last: int, start: float, now: float, totals: dict[str, list[int]]) -> RatesSnapshot:
    values = list(totals.values())
    big = any(max(v) >= _BucketCache.LIMIT for v in values) if values else False
    acc = np.array(values, dtype=object if big else np.int64).reshape(len(values), 3)
    return _snapshot_columns(first, last, start, now, [k.encode() for k in totals], acc)


def _snapshot_columns(first: int, last: int, start: float, now: float, keys: list[bytes],
                      acc: np.ndarray) -> RatesSnapshot:
    """The snapshot of per-key (n, prompt, prefix) sums, `acc[i]` for `keys[i]`: keys with
    arrivals, hottest first, ties by key (bytewise, i.e. code-point order). Sorting and
    dividing are numpy (a million-key window); the id hashes the ranked keys and counts."""
    span = max(now - start, 1e-9)
    n = acc[:, 0]
    live = np.flatnonzero(n > 0)
    live_keys = [keys[i] for i in live.tolist()]
    plain = b"\0" not in b"".join(live_keys)
    if acc.dtype != object and plain:
        order = live[np.lexsort((np.array(live_keys, dtype=bytes), -n[live]))] if live_keys else live
    else:   # counts past int64, or keys numpy's fixed-width bytes would truncate: plain Python
        order = np.array(sorted(live.tolist(), key=lambda i: (-int(n[i]), keys[i])), dtype=np.int64)
    ranked = [keys[i] for i in order.tolist()]
    counts = n[order]
    digest = hashlib.blake2b(digest_size=6)
    digest.update(b"\0".join(ranked))
    digest.update(b"\1")
    digest.update(counts.tobytes() if counts.dtype != object else ",".join(map(str, counts.tolist())).encode())
    rows = acc[order]
    nf = counts.astype(np.float64)
    return RatesSnapshot(
        snapshot_id=f"b{first}-{last}-{digest.hexdigest()}",
        start=start, end=now, window_seconds=span,
        total_arrivals=int(sum(counts.tolist())) if counts.dtype == object else int(counts.sum()),
        keys=(tuple(b"\0".join(ranked).decode().split("\0")) if plain and ranked else tuple(k.decode() for k in ranked)),
        rates=tuple((nf / span).tolist()),
        mean_prompt_tokens=tuple((rows[:, 1].astype(np.float64) / nf).tolist()),
        mean_prefix_tokens=tuple((rows[:, 2].astype(np.float64) / nf).tolist()),
    )


def _merge_counters(into: dict[str, list[int]], fields: dict[str, int]) -> None:
    """Fold "replica|p|c|r" style hash fields into replica -> [prompt, cached, requests]."""
    slot = {"p": 0, "c": 1, "r": 2}
    for name, value in fields.items():
        replica, _, kind = name.rpartition("|")
        into.setdefault(replica, [0, 0, 0])[slot[kind]] += int(value)


def _counters(rows: dict[str, list[int]]) -> dict[str, CacheCounters]:
    return {r: CacheCounters(*v) for r, v in sorted(rows.items())}


def _stat_fields(stats: Sequence[CacheStatRecord]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for s in stats:
        out[f"{s.replica_id}|p"] += s.prompt_tokens
        out[f"{s.replica_id}|c"] += s.cached_tokens
        out[f"{s.replica_id}|r"] += s.requests
    return out


def _check_version(version: int) -> None:
    if version < 1:
        raise InvalidArgument(f"plan version must be >= 1, got {version}")


# ---------------------------------------------------------------------------------------------
# the contract


class Store(abc.ABC):
    """Storage contract. Every method may raise `services.errors.Unavailable` (one-line
    message) when the backing store is unreachable; the next call reconnects."""

    def __init__(self, telemetry: TelemetryConfig | None = None) -> None:
        self.telemetry = telemetry or TelemetryConfig()
        # Called with (highest version seen before, version counter now) when the backing
        # store is found to have lost its plan state (a Redis restart without persistence).
        self.on_reset: Callable[[int, int], None] = lambda seen, now: None

    # ---- telemetry

    async def record_arrivals(self, batch_id: str, arrivals: Sequence[ArrivalRecord]) -> bool:
        """Count one batch of (already validated) arrivals. Returns False, counting nothing,
        when `batch_id` was recorded before within the retention. An empty batch_id disables
        the idempotency check."""
        return (await self.record_arrival_batches([(batch_id, arrivals)]))[0]

    @abc.abstractmethod
    async def record_arrival_batches(self, batches: Sequence[tuple[str, Sequence[ArrivalRecord]]]) -> list[bool]:
        """`record_arrivals` for several batches in one round trip; one flag per batch."""

    @abc.abstractmethod
    async def record_cache_stats(self, batch_id: str, stats: Sequence[CacheStatRecord], *, now: float) -> bool:
        """Add per-replica deltas to the bucket of `now` and to the running totals. Same
        idempotency rule as `record_arrivals`."""

    @abc.abstractmethod
    async def window_rates(self, now: float, window_seconds: float) -> RatesSnapshot:
        """Per-key arrival rates over the buckets covering [now - window, now] (the current,
        partial bucket included): counts divided by the span from the first bucket's start to
        `now`, which is between window and window + one bucket, so rates are unbiased for a
        steady stream. The snapshot id is stable for the same buckets and counts.
        InvalidArgument for a window beyond the retention."""

    @abc.abstractmethod
    async def cache_stats(self, now: float, window_seconds: float) -> dict[str, CacheCounters]:
        """Per-replica cache counters summed over the window's buckets."""

    @abc.abstractmethod
    async def cache_totals(self) -> dict[str, CacheCounters]:
        """Per-replica cache counters since the start."""

    @abc.abstractmethod
    async def interarrival_sample(self, now: float, window_seconds: float) -> list[float]:
        """Inter-arrival seconds recorded in the window's buckets (bounded per bucket)."""

    @abc.abstractmethod
    async def recent_arrivals(self, now: float, window_seconds: float) -> list[ArrivalRecord]:
        """The arrival log of the window's buckets, oldest bucket first (bounded per bucket;
        within a bucket in recording order)."""

    # ---- plans

    @abc.abstractmethod
    async def next_version(self) -> int:
        """A fresh version number, strictly greater than any handed out or stored, and than
        any this client has seen even if the backing store has since lost its data."""

    @abc.abstractmethod
    async def put_plan(self, plan: Plan) -> None:
        """Store an immutable version. FailedPrecondition if the version exists."""

    @abc.abstractmethod
    async def get_plan(self, version: int) -> Plan:
        """A stored version, with its table. NotFound if unknown."""

    @abc.abstractmethod
    async def list_plans(self, limit: int = 20, before_version: int = 0) -> list[Plan]:
        """Newest first, versions < before_version (0: all), as summaries (`summary_of`)."""

    @abc.abstractmethod
    async def get_control(self) -> ControlState:
        """Active version, mode, pin and latest version, read atomically."""

    async def get_active_plan(self) -> tuple[ControlState, Plan | None]:
        """The control state and the active plan (None when no version is active)."""
        state = await self.get_control()
        if not state.active_version:
            return state, None
        return state, await self.get_plan(state.active_version)

    @abc.abstractmethod
    async def activate(self, version: int, *, expected: int, now: float, reason: str = "",
                       fencing_token: int | None = None, automatic: bool = False) -> Activation:
        """Compare-and-set the active version, atomically:
        StaleVersion if the active version is not `expected` (0: none active);
        NotFound if `version` is not stored;
        Fenced if `fencing_token` is given and is not the current lease's token;
        Pinned if a version is pinned and `version` is not it;
        FlatMode if `automatic` and the mode is flat.
        Activating the already-active version changes nothing (changed=False). Otherwise the
        change is appended to the history and published as a PlanEvent."""

    @abc.abstractmethod
    async def rollback(self, *, expected: int, now: float, to_version: int = 0, reason: str = "",
                       fencing_token: int | None = None) -> Activation:
        """Like `activate` (same checks) for `to_version`, or when 0 for the version that was
        active before the current one (the latest history record's `previous`):
        FailedPrecondition if there is none. Recorded and published as "rollback"."""

    @abc.abstractmethod
    async def history(self, limit: int = 20) -> list[HistoryEntry]:
        """Activation records, newest first (at most HISTORY_MAX are kept)."""

    @abc.abstractmethod
    async def set_mode(self, mode: Mode, *, reason: str, now: float,
                       fencing_token: int | None = None) -> ControlState:
        """Set planned / flat-fallback mode; published as a "mode" PlanEvent when it changes.
        Fenced (nothing written) if `fencing_token` is given and is not the current lease's
        token: the control loop passes its own, operator calls pass none."""

    @abc.abstractmethod
    async def pin(self, version: int, *, fencing_token: int | None = None) -> ControlState:
        """Pin a stored version (NotFound otherwise). It must be the active one:
        FailedPrecondition if not. The automatic loop never replaces a pinned version and
        activations of any other version are refused until `unpin`. Fenced as `set_mode`."""

    @abc.abstractmethod
    async def unpin(self, *, fencing_token: int | None = None) -> ControlState:
        """Remove the pin (no-op without one). Fenced as `set_mode`."""

    @abc.abstractmethod
    async def prune_plans(self, keep: int) -> int:
        """Delete stored versions beyond the `keep` newest, except the active, the pinned and
        any version named in the activation history (so rollback targets survive). Returns
        how many were deleted. Atomic with respect to activation."""

    @abc.abstractmethod
    def subscribe(self) -> "Subscription":
        """A subscription to PlanEvents published from now on (`async with` it)."""

    # ---- lease

    @abc.abstractmethod
    async def acquire_lease(self, holder: str, ttl_seconds: float) -> int | None:
        """Take the planner lease if it is free (or already `holder`'s, which extends it).
        Returns the fencing token, strictly greater than any earlier holder's, or None when
        another holder has it."""

    @abc.abstractmethod
    async def renew_lease(self, holder: str, token: int, ttl_seconds: float) -> bool:
        """Extend the lease if `holder` still holds it with `token`; False otherwise."""

    @abc.abstractmethod
    async def release_lease(self, holder: str, token: int) -> bool:
        """Give the lease up if held by `holder` with `token`."""

    @abc.abstractmethod
    async def lease(self) -> LeaseInfo | None:
        """The current lease, or None."""

    # ---- lifecycle

    @abc.abstractmethod
    async def ping(self) -> None:
        """Unavailable unless the backing store answers."""

    async def close(self) -> None:
        """Release connections."""


class Subscription(abc.ABC):
    async def __aenter__(self) -> "Subscription":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def get(self, timeout: float) -> PlanEvent | None:
        """The next event, or None after `timeout` seconds without one."""

    @abc.abstractmethod
    async def close(self) -> None: ...


def _event_from_json(data: bytes | str) -> PlanEvent:
    doc = orjson.loads(data)
    return PlanEvent(doc["event"], int(doc["active_version"]), Mode(doc["mode"]), float(doc["at"]))


def _history_from_json(data: bytes | str) -> HistoryEntry:
    d = orjson.loads(data)
    return HistoryEntry(int(d["version"]), int(d["previous"]), d["event"], d.get("reason", ""),
                        float(d["at"]), int(d.get("token", 0)))


_REFUSALS = {
    "stale": lambda v, cur: StaleVersion(f"stale expected version: active is {cur}"),
    "missing": lambda v, cur: NotFound(f"plan version {v} not found"),
    "fenced": lambda v, cur: Fenced("lease fencing token is not current: this planner was deposed"),
    "pinned": lambda v, cur: Pinned(f"version {cur} is pinned; unpin it first"),
    "flat": lambda v, cur: FlatMode("mode is flat: automatic activation refused"),
    "no_previous": lambda v, cur: FailedPrecondition("no previously active version to roll back to"),
}


def _refusal(status: str, version: int, current: int) -> Exception:
    return _REFUSALS[status](version, current)


def _token_arg(fencing_token: int | None) -> str | int:
    return "" if fencing_token is None else fencing_token


def _raise_if_fenced(status: bytes) -> None:
    if status == b"fenced":
        raise _refusal("fenced", 0, 0)


# ---------------------------------------------------------------------------------------------
# Redis

_ARRIVALS_LUA = """
-- One bucket's share of several batches, all or nothing.
-- KEYS: n, pt, xt, gaps, log, v, then the seen marker of every deduplicated batch part.
-- ARGV: ttl, gap_cap, log_cap, counts (JSON array: key, n, prompt, prefix, ... as strings,
-- summed over the parts), gaps and log records (each newline-separated, only the newest cap),
-- a fresh random token for v.
-- Returns {} when written, else the 1-based positions of the markers already set (nothing
-- written; the caller retries without those parts).
local ttl = tonumber(ARGV[1])
local seen = {}
for k = 7, #KEYS do
  if redis.call('EXISTS', KEYS[k]) == 1 then seen[#seen + 1] = k - 6 end
end
if #seen > 0 then return seen end
for k = 7, #KEYS do redis.call('SET', KEYS[k], '1', 'EX', ttl) end
redis.call('SET', KEYS[6], ARGV[7], 'EX', ttl)
local c = cjson.decode(ARGV[4])
for i = 1, #c, 4 do
  redis.call('HINCRBY', KEYS[1], c[i], c[i + 1])
  redis.call('HINCRBY', KEYS[2], c[i], c[i + 2])
  redis.call('HINCRBY', KEYS[3], c[i], c[i + 3])
end
local function push(key, blob, cap)
  if cap <= 0 or blob == '' then return end
  local items = {}
  for item in string.gmatch(blob, '[^\\n]+') do
    items[#items + 1] = item
    if #items == 1000 then redis.call('RPUSH', key, unpack(items)); items = {} end
  end
  if #items > 0 then redis.call('RPUSH', key, unpack(items)) end
  redis.call('LTRIM', key, -cap, -1)
  redis.call('EXPIRE', key, ttl)
end
push(KEYS[4], ARGV[5], tonumber(ARGV[2]))
push(KEYS[5], ARGV[6], tonumber(ARGV[3]))
for k = 1, 3 do redis.call('EXPIRE', KEYS[k], ttl) end
return {}
"""

_CACHE_LUA = """
-- KEYS: seen, bucket, total.  ARGV: ttl, dedup, then (field, delta) pairs.
local ttl = tonumber(ARGV[1])
if ARGV[2] == '1' then
  if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ttl) then return 0 end
end
for i = 3, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
  redis.call('HINCRBY', KEYS[3], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[2], ttl)
return 1
"""

_PUT_PLAN_LUA = """
-- KEYS: plan, summary, index, seq.  ARGV: version, plan json, summary json.
if redis.call('SET', KEYS[1], ARGV[2], 'NX') == false then return 0 end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[1])
if tonumber(redis.call('GET', KEYS[4]) or '0') < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[4], ARGV[1])
end
return 1
"""

# Activation and rollback. ARGV[1] = version ("0" with event "rollback": the previous one).
_ACTIVATE_LUA = """
-- KEYS: active, history, lease, pinned, mode, index, events channel
-- ARGV: version, expected, token ("" = none), event, reason, now, automatic, history_max
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local version = tonumber(ARGV[1])
if current ~= tonumber(ARGV[2]) then return {'stale', current, 0} end
if version == 0 then
  local head = redis.call('LINDEX', KEYS[2], 0)
  if not head then return {'no_previous', current, 0} end
  version = tonumber(cjson.decode(head)['previous'])
  if version == 0 then return {'no_previous', current, 0} end
end
if not redis.call('ZSCORE', KEYS[6], version) then return {'missing', current, version} end
if ARGV[3] ~= '' and redis.call('HGET', KEYS[3], 'token') ~= ARGV[3] then
  return {'fenced', current, version}
end
local pinned = tonumber(redis.call('GET', KEYS[4]) or '0')
if pinned ~= 0 and pinned ~= version then return {'pinned', pinned, version} end
local mode = redis.call('HGET', KEYS[5], 'mode') or 'planned'
if ARGV[7] == '1' and mode == 'flat' then return {'flat', current, version} end
if version == current then return {'same', current, version} end
redis.call('SET', KEYS[1], version)
local token = 0
if ARGV[3] ~= '' then token = tonumber(ARGV[3]) end
redis.call('LPUSH', KEYS[2], cjson.encode({version = version, previous = current, event = ARGV[4],
  reason = ARGV[5], at = tonumber(ARGV[6]), token = token}))
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[8]) - 1)
redis.call('PUBLISH', KEYS[7], cjson.encode({event = ARGV[4], active_version = version,
  mode = mode, at = tonumber(ARGV[6])}))
return {'ok', current, version}
"""

_SET_MODE_LUA = """
-- KEYS: mode, active, events, lease.  ARGV: mode, reason, now, token ("" = none)
if ARGV[4] ~= '' and redis.call('HGET', KEYS[4], 'token') ~= ARGV[4] then return 'fenced' end
local old = redis.call('HGET', KEYS[1], 'mode') or 'planned'
redis.call('HSET', KEYS[1], 'mode', ARGV[1], 'reason', ARGV[2], 'at', ARGV[3])
if old ~= ARGV[1] then
  local active = tonumber(redis.call('GET', KEYS[2]) or '0')
  redis.call('PUBLISH', KEYS[3], cjson.encode({event = 'mode', active_version = active,
    mode = ARGV[1], at = tonumber(ARGV[3])}))
end
return 'ok'
"""

_PIN_LUA = """
-- KEYS: pinned, active, index, lease.  ARGV: version, token ("" = none)
if ARGV[2] ~= '' and redis.call('HGET', KEYS[4], 'token') ~= ARGV[2] then return 'fenced' end
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then return 'missing' end
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[1]) then return 'not_active' end
redis.call('SET', KEYS[1], ARGV[1])
return 'ok'
"""

_UNPIN_LUA = """
-- KEYS: pinned, lease.  ARGV: token ("" = none)
if ARGV[1] ~= '' and redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then return 'fenced' end
redis.call('DEL', KEYS[1])
return 'ok'
"""

_PRUNE_LUA = """
-- KEYS: index, active, pinned, history, plan key prefix, summary key prefix. ARGV: keep
local old = redis.call('ZREVRANGE', KEYS[1], tonumber(ARGV[1]), -1)
if #old == 0 then return 0 end
local protect = {}
protect[redis.call('GET', KEYS[2]) or '0'] = true
protect[redis.call('GET', KEYS[3]) or '0'] = true
for _, row in ipairs(redis.call('LRANGE', KEYS[4], 0, -1)) do
  local h = cjson.decode(row)
  protect[tostring(h['version'])] = true
  protect[tostring(h['previous'])] = true
end
local n = 0
for _, v in ipairs(old) do
  if not protect[v] then
    redis.call('DEL', KEYS[5] .. v, KEYS[6] .. v)
    redis.call('ZREM', KEYS[1], v)
    n = n + 1
  end
end
return n
"""

# A new version number that never goes below what this client has seen (ARGV[1]), so a store
# that lost its data (Redis restarted without persistence) cannot hand out a reused version.
_NEXT_VERSION_LUA = """
-- KEYS: seq.  ARGV: highest version the caller has seen.  Returns {version, counter before}.
local before = tonumber(redis.call('GET', KEYS[1]) or '0')
local v = math.max(before, tonumber(ARGV[1])) + 1
redis.call('SET', KEYS[1], v)
return {v, before}
"""

_ACQUIRE_LUA = """
-- KEYS: lease, fence.  ARGV: holder, ttl_ms
local holder = redis.call('HGET', KEYS[1], 'holder')
if holder then
  if holder ~= ARGV[1] then return false end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('HGET', KEYS[1], 'token'))
end
local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return token
"""

_RENEW_LUA = """
-- KEYS: lease.  ARGV: holder, token, ttl_ms ("" = release)
if redis.call('HGET', KEYS[1], 'holder') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'token') ~= ARGV[2] then
  return 0
end
if ARGV[3] == '' then redis.call('DEL', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return 1
"""


class _BucketCache:
    """Per-bucket (n, pt, xt) columns as numpy arrays over one growing key index, tagged with
    the bucket's write token. Summing a window is one fancy-index add per bucket; the Python
    work per hash field is two C-level maps (key -> index, bytes -> int)."""

    LIMIT = 2**56    # columns above this fall back to Python ints (int64 must not overflow)
    GROWTH, SLACK = 4, 1024    # compact the key index beyond GROWTH x cached entries + SLACK

    def __init__(self) -> None:
        self.index: dict[bytes, int] = {}
        self.buckets: dict[int, tuple[bytes | None, np.ndarray, np.ndarray]] = {}   # idx -> token, ids, (m, 3)

    def fresh(self, idx: int, token: bytes) -> bool:
        entry = self.buckets.get(idx)
        return entry is not None and entry[0] == token

    def put(self, idx: int, token: bytes | None, n: dict, pt: dict, xt: dict) -> None:
        keys = list(n)
        if list(pt) == keys and list(xt) == keys:   # written together, so normally aligned
            cols = [n.values(), pt.values(), xt.values()]
        else:
            keys = list(dict.fromkeys([*n, *pt, *xt]))
            cols = [[h.get(k, 0) for k in keys] for h in (n, pt, xt)]
        ints = [list(map(int, c)) for c in cols]
        big = any(c and max(c) >= self.LIMIT for c in ints)
        index = self.index
        for k in [k for k in keys if k not in index]:
            index[k] = len(index)
        ids = np.fromiter(map(index.__getitem__, keys), dtype=np.int64, count=len(keys))
        values = np.array(ints, dtype=object if big else np.int64).T.reshape(len(keys), 3)
        self.buckets[idx] = (token, ids, values)

    def totals(self, idxs: range) -> dict[str, tuple[int, int, int]]:
        """Sums over the window's buckets, by key; buckets outside it are dropped."""
        keys, acc = self.columns(idxs)
        hit = np.flatnonzero(acc[:, 0] > 0)
        return {keys[i].decode(): row for i, row in zip(hit.tolist(), map(tuple, acc[hit].tolist()))}

    def columns(self, idxs: range) -> tuple[list[bytes], np.ndarray]:
        """Sums over the window's buckets: the key index and an (m, 3) array of (n, prompt,
        prefix) per key; buckets outside the window are dropped (one process reads one
        window, the planner's)."""
        for old in [i for i in self.buckets if i not in idxs]:
            del self.buckets[old]
        live = [self.buckets[i] for i in idxs if i in self.buckets]
        if len(self.index) > self.GROWTH * sum(len(ids) for _, ids, _ in live) + self.SLACK:
            self._compact()
            live = [self.buckets[i] for i in idxs if i in self.buckets]
        big = any(values.dtype == object for _, _, values in live)
        acc = np.zeros((len(self.index), 3), dtype=object if big else np.int64)
        for _, ids, values in live:
            acc[ids] += values          # ids are distinct within a bucket
        return list(self.index), acc

    def _compact(self) -> None:
        """Drop keys no cached bucket holds (keys churn; the index must not grow forever)."""
        keys = list(self.index)
        used = sorted({int(i) for _, ids, _ in self.buckets.values() for i in ids.tolist()})
        remap = np.full(len(keys), -1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        self.index = {keys[i]: j for j, i in enumerate(used)}
        self.buckets = {b: (t, remap[ids], v) for b, (t, ids, v) in self.buckets.items()}


def _ms(seconds: float) -> int:
    if not (seconds > 0 and math.isfinite(seconds)):
        raise InvalidArgument("lease ttl must be a positive number of seconds")
    return max(1, int(seconds * 1000))


class RedisStore(Store):
    """The store on Redis (single node; key layout is Redis Cluster compatible)."""

    def __init__(self, url: str, *, prefix: str = "cr", telemetry: TelemetryConfig | None = None,
                 timeout: float = 2.0) -> None:
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError

        super().__init__(telemetry)
        self.url = url
        self.prefix = prefix
        # One immediate retry on a broken connection (a pooled socket to a restarted server);
        # none on timeouts, where the command may have run. Writes are safe to repeat: batches
        # are deduplicated, activation is a CAS, a skipped version number is harmless.
        from services.redisconn import async_client, parse_redis_url

        self.target = parse_redis_url(url)
        self._cluster = self.target.cluster
        self._redis = async_client(
            self.target, socket_timeout=timeout, socket_connect_timeout=timeout, retry_on_timeout=False,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)), health_check_interval=30)
        self._where = self.target.where  # never the password
        r = self._redis
        self._arrivals = r.register_script(_ARRIVALS_LUA)
        self._cache = r.register_script(_CACHE_LUA)
        self._put_plan = r.register_script(_PUT_PLAN_LUA)
        self._activate = r.register_script(_ACTIVATE_LUA)
        self._set_mode = r.register_script(_SET_MODE_LUA)
        self._pin = r.register_script(_PIN_LUA)
        self._unpin = r.register_script(_UNPIN_LUA)
        self._prune = r.register_script(_PRUNE_LUA)
        self._acquire = r.register_script(_ACQUIRE_LUA)
        self._renew = r.register_script(_RENEW_LUA)
        self._next_version = r.register_script(_NEXT_VERSION_LUA)
        self._seen_version = 0   # highest version seen in the store (reset detection, no reuse)
        self.unreplicated_writes = 0
        self._cluster_ready = False   # plan writes whose WAIT saw fewer replicas than asked
        self._windows = _BucketCache()

    # ---- keys

    def _tb(self, idx: int, name: str) -> str:
        return f"{self.prefix}:{{tb:{idx}}}:{name}"

    def _c(self, name: str) -> str:
        return f"{self.prefix}:{{cache}}:{name}"

    def _p(self, name: str) -> str:
        return f"{self.prefix}:{{plans}}:{name}"

    async def _queue_script(self, pipe, script, keys: list[str], args: list[object]) -> None:
        """Queue a Lua script call on a pipeline. Redis Cluster pipelines refuse EVALSHA, so
        there the script text goes with EVAL (the server caches it by its SHA all the same)."""
        if self._cluster:
            pipe.eval(script.script, len(keys), *keys, *args)
        else:
            await script(keys=keys, args=args, client=pipe)

    async def _plan_write(self, script, keys: list[str], args: list[object]):
        """A plan-slot script, then (wait_replicas > 0) WAIT on the same connection, so the
        write is on that many replicas before the caller acknowledges it: a replica promoted
        after the master dies has it. WAIT counts the connection's own writes, hence one
        pipeline (a cluster pipeline groups the two commands on the slot's master). Fewer
        acknowledgements than asked (no replica reachable within the timeout) leave the write
        in place and are logged and counted (`unreplicated_writes`)."""
        need = self.target.wait_replicas
        if need <= 0:
            return await script(keys=keys, args=args)
        pipe = self._redis.pipeline(transaction=False)
        if self._cluster:
            await self._redis.initialize()
            node = self._redis.get_node_from_key(keys[0])
            pipe.eval(script.script, len(keys), *keys, *args)
            pipe.execute_command("WAIT", need, self.target.wait_timeout_ms, target_nodes=node)
        else:
            await script(keys=keys, args=args, client=pipe)
            pipe.execute_command("WAIT", need, self.target.wait_timeout_ms)
        result, acked = await pipe.execute()
        if int(acked) < need:
            self.unreplicated_writes += 1
            log.warning("plan write not replicated", extra={"fields": {
                "replicas_acked": int(acked), "wanted": need, "timeout_ms": self.target.wait_timeout_ms,
                "key": keys[0], "where": self._where}})
        return result

    async def _mget(self, keys: list[str]) -> list[bytes | None]:
        """MGET of keys in any slots (a cluster splits it per slot)."""
        if self._cluster:
            return await self._redis.mget_nonatomic(keys)
        return await self._redis.mget(keys)

    @contextlib.asynccontextmanager
    async def _guard(self) -> AsyncIterator[None]:
        from redis import exceptions as rx

        try:
            if self._cluster and not self._cluster_ready:
                # before the first command: redis-py's async cluster client runs a transaction
                # pipeline on an uninitialised client against another event loop
                await self._redis.initialize()
                self._cluster_ready = True
            yield
        except rx.RedisClusterException as exc:
            # the cluster client's own refusals of a command (keys in several slots) are bugs,
            # not outages; "cannot be connected", an uncovered slot and the like are outages
            if "same slot" in str(exc) or "same key slot" in str(exc):
                raise
            detail = " ".join(str(exc).split())[:160] or type(exc).__name__
            raise Unavailable(f"redis unavailable at {self._where}: {detail}") from None
        except (rx.ConnectionError, rx.TimeoutError, rx.BusyLoadingError, rx.ClusterError, rx.TryAgainError,
                OSError, asyncio.TimeoutError) as exc:
            detail = " ".join(str(exc).split())[:160] or type(exc).__name__
            raise Unavailable(f"redis unavailable at {self._where}: {detail}") from None

    # ---- telemetry

    async def record_arrival_batches(self, batches: Sequence[tuple[str, Sequence[ArrivalRecord]]]) -> list[bool]:
        # One script per bucket for all the batches' parts in it: counts summed over the parts
        # (one HINCRBY per distinct key), only the newest gaps/log records that the caps keep.
        # A part whose marker is already set makes the script write nothing and name it; the
        # bucket is retried without it (rare: replays), so every part lands at most once.
        counted = [not arrivals for _, arrivals in batches]
        pending: dict[int, list[tuple[int, str, _BucketPart]]] = {}
        for b, (batch_id, arrivals) in enumerate(batches):
            for idx, part in split_by_bucket(arrivals, self.telemetry).items():
                pending.setdefault(idx, []).append((b, batch_id, part))
        async with self._guard():
            while pending:
                calls = [(idx, _first_of_each_batch_id(parts)) for idx, parts in pending.items()]
                pipe = self._redis.pipeline(transaction=False)
                for idx, parts in calls:
                    keys, args = self._arrival_call(idx, parts)
                    await self._queue_script(pipe, self._arrivals, keys, args)
                results = await pipe.execute()
                pending = {}
                for (idx, parts), seen in zip(calls, results):
                    if not seen:
                        for b, _, _ in parts:
                            counted[b] = True
                        continue
                    marked = [j for j, p in enumerate(parts) if p[1]]
                    drop = {marked[i - 1] for i in seen}
                    if rest := [p for j, p in enumerate(parts) if j not in drop]:
                        pending[idx] = rest
        return counted

    def _arrival_call(self, idx: int, parts: list[tuple[int, str, _BucketPart]]) -> tuple[list[str], list[object]]:
        cfg = self.telemetry
        flat: list[str] = []
        for key, (n, pt, xt) in key_totals(part for _, _, part in parts).items():
            flat += (key, str(n), str(pt), str(xt))
        gaps = _newest((part.gaps for _, _, part in parts), cfg.gaps_per_bucket)
        rows = _newest((part.rows for _, _, part in parts), cfg.log_per_bucket)
        keys = [self._tb(idx, h) for h in ("n", "pt", "xt", "gaps", "log", "v")]
        keys += [self._tb(idx, f"seen:{batch_id}") for _, batch_id, _ in parts if batch_id]
        args = [cfg.ttl, cfg.gaps_per_bucket, cfg.log_per_bucket, orjson.dumps(flat),
                "\n".join(map(repr, gaps)), log_blob(rows), os.urandom(9).hex()]
        return keys, args

    async def record_cache_stats(self, batch_id: str, stats: Sequence[CacheStatRecord], *, now: float) -> bool:
        cfg = self.telemetry
        args: list[object] = [cfg.ttl, "1" if batch_id else "0"]
        for name, value in _stat_fields(stats).items():
            args += (name, value)
        keys = [self._c(f"seen:{batch_id}"), self._c(f"b:{cfg.bucket(now)}"), self._c("total")]
        async with self._guard():
            return bool(await self._cache(keys=keys, args=args))

    async def _hashes(self, names: Iterable[str]) -> list[dict[bytes, bytes]]:
        async with self._guard():
            pipe = self._redis.pipeline(transaction=False)
            for name in names:
                pipe.hgetall(name)
            return await pipe.execute()

    async def window_rates(self, now: float, window_seconds: float) -> RatesSnapshot:
        # Buckets whose token is unchanged since the last read come from the cache. The token
        # is read before the hashes in one pipeline, so a write racing the read can only make
        # the cached token older than the content (one extra re-read later), never newer.
        first, last, start = _window_buckets(now, window_seconds, self.telemetry)
        idxs = range(first, last + 1)
        cache = self._windows
        async with self._guard():
            tokens = await self._mget([self._tb(i, "v") for i in idxs])
            stale = [(i, t) for i, t in zip(idxs, tokens) if t is None or not cache.fresh(i, t)]
            pipe = self._redis.pipeline(transaction=False)
            for i, _ in stale:
                for h in ("n", "pt", "xt"):
                    pipe.hgetall(self._tb(i, h))
            rows = await pipe.execute() if stale else []
        for j, (i, token) in enumerate(stale):
            cache.put(i, token, *rows[3 * j:3 * j + 3])
        return _snapshot_columns(first, last, start, now, *cache.columns(idxs))

    async def cache_stats(self, now: float, window_seconds: float) -> dict[str, CacheCounters]:
        first, last, _ = _window_buckets(now, window_seconds, self.telemetry)
        rows: dict[str, list[int]] = {}
        for row in await self._hashes(self._c(f"b:{i}") for i in range(first, last + 1)):
            _merge_counters(rows, {k.decode(): int(v) for k, v in row.items()})
        return _counters(rows)

    async def cache_totals(self) -> dict[str, CacheCounters]:
        rows: dict[str, list[int]] = {}
        (row,) = await self._hashes([self._c("total")])
        _merge_counters(rows, {k.decode(): int(v) for k, v in row.items()})
        return _counters(rows)

    async def _lists(self, now: float, window_seconds: float, name: str) -> list[bytes]:
        first, last, _ = _window_buckets(now, window_seconds, self.telemetry)
        async with self._guard():
            pipe = self._redis.pipeline(transaction=False)
            for i in range(first, last + 1):
                pipe.lrange(self._tb(i, name), 0, -1)
            return [item for chunk in await pipe.execute() for item in chunk]

    async def interarrival_sample(self, now: float, window_seconds: float) -> list[float]:
        return [float(g) for g in await self._lists(now, window_seconds, "gaps")]

    async def recent_arrivals(self, now: float, window_seconds: float) -> list[ArrivalRecord]:
        return [ArrivalRecord(*orjson.loads(r)) for r in await self._lists(now, window_seconds, "log")]

    # ---- plans

    def _observe_versions(self, counter: int) -> None:
        if counter < self._seen_version:
            self.on_reset(self._seen_version, counter)
        self._seen_version = max(self._seen_version, counter)

    async def next_version(self) -> int:
        async with self._guard():
            version, before = await self._plan_write(self._next_version, [self._p("seq")], [self._seen_version])
        self._observe_versions(int(before))
        self._observe_versions(int(version))
        return int(version)

    async def put_plan(self, plan: Plan) -> None:
        _check_version(plan.version)
        v = plan.version
        keys = [self._p(f"plan:{v}"), self._p(f"summary:{v}"), self._p("index"), self._p("seq")]
        blob, summary = _encode_plan(plan), _encode_plan(summary_of(plan))
        async with self._guard():
            if not await self._plan_write(self._put_plan, keys, [v, blob, summary]):
                raise FailedPrecondition(f"plan version {v} already exists")
        self._observe_versions(v)

    async def get_plan(self, version: int) -> Plan:
        async with self._guard():
            blob = await self._redis.get(self._p(f"plan:{version}"))
        if blob is None:
            raise NotFound(f"plan version {version} not found")
        return _decode_plan(blob)

    async def list_plans(self, limit: int = 20, before_version: int = 0) -> list[Plan]:
        top = f"({before_version}" if before_version > 0 else "+inf"
        async with self._guard():
            versions = await self._redis.zrevrangebyscore(self._p("index"), top, "-inf", start=0, num=max(0, limit))
            if not versions:
                return []
            blobs = await self._redis.mget([self._p(f"summary:{int(v)}") for v in versions])
        return [_decode_plan(b) for b in blobs if b is not None]

    async def get_control(self) -> ControlState:
        async with self._guard():
            pipe = self._redis.pipeline(transaction=True)
            pipe.get(self._p("active"))
            pipe.hgetall(self._p("mode"))
            pipe.get(self._p("pinned"))
            pipe.get(self._p("seq"))
            active, mode, pinned, seq = await pipe.execute()
        mode = {k.decode(): v.decode() for k, v in mode.items()}
        self._observe_versions(int(seq or 0))
        return ControlState(int(active or 0), Mode(mode.get("mode", "planned")), mode.get("reason", ""),
                            float(mode.get("at", 0.0)), int(pinned or 0), int(seq or 0))

    async def _cas(self, version: int, *, expected: int, now: float, reason: str, event: str,
                   fencing_token: int | None, automatic: bool) -> Activation:
        keys = [self._p("active"), self._p("history"), self._p("lease"), self._p("pinned"), self._p("mode"),
                self._p("index"), self._p("events")]
        args = [version, expected, "" if fencing_token is None else fencing_token, event, reason, repr(float(now)),
                "1" if automatic else "0", HISTORY_MAX]
        async with self._guard():
            status, current, target = await self._plan_write(self._activate, keys, args)
        status = status.decode()
        if status == "ok":
            return Activation(int(target), int(current), True)
        if status == "same":
            return Activation(int(current), int(current), False)
        raise _refusal(status, int(target), int(current))

    async def activate(self, version: int, *, expected: int, now: float, reason: str = "",
                       fencing_token: int | None = None, automatic: bool = False) -> Activation:
        _check_version(version)
        return await self._cas(version, expected=expected, now=now, reason=reason, event="activate",
                               fencing_token=fencing_token, automatic=automatic)

    async def rollback(self, *, expected: int, now: float, to_version: int = 0, reason: str = "",
                       fencing_token: int | None = None) -> Activation:
        return await self._cas(to_version, expected=expected, now=now, reason=reason, event="rollback",
                               fencing_token=fencing_token, automatic=False)

    async def history(self, limit: int = 20) -> list[HistoryEntry]:
        async with self._guard():
            rows = await self._redis.lrange(self._p("history"), 0, max(0, limit) - 1) if limit > 0 else []
        return [_history_from_json(r) for r in rows]

    async def set_mode(self, mode: Mode, *, reason: str, now: float,
                       fencing_token: int | None = None) -> ControlState:
        mode = Mode(mode)
        async with self._guard():
            keys = [self._p("mode"), self._p("active"), self._p("events"), self._p("lease")]
            status = await self._plan_write(self._set_mode, keys, [mode.value, reason, repr(float(now)),
                                                                   _token_arg(fencing_token)])
        _raise_if_fenced(status)
        return await self.get_control()

    async def pin(self, version: int, *, fencing_token: int | None = None) -> ControlState:
        _check_version(version)
        async with self._guard():
            status = await self._plan_write(self._pin, [self._p("pinned"), self._p("active"), self._p("index"),
                                                        self._p("lease")], [version, _token_arg(fencing_token)])
        _raise_if_fenced(status)
        status = status.decode()
        if status == "missing":
            raise NotFound(f"plan version {version} not found")
        if status == "not_active":
            raise FailedPrecondition(f"version {version} is not the active version")
        return await self.get_control()

    async def unpin(self, *, fencing_token: int | None = None) -> ControlState:
        async with self._guard():
            status = await self._plan_write(self._unpin, [self._p("pinned"), self._p("lease")],
                                            [_token_arg(fencing_token)])
        _raise_if_fenced(status)
        return await self.get_control()

    async def prune_plans(self, keep: int) -> int:
        # Plan keys are derived inside the script from prefixes; all share the {plans} tag.
        keys = [self._p("index"), self._p("active"), self._p("pinned"), self._p("history"), self._p("plan:"),
                self._p("summary:")]
        async with self._guard():
            return int(await self._prune(keys=keys, args=[max(0, keep)]))

    def subscribe(self) -> "Subscription":
        return _RedisSubscription(self)

    # ---- lease

    async def acquire_lease(self, holder: str, ttl_seconds: float) -> int | None:
        async with self._guard():
            token = await self._plan_write(self._acquire, [self._p("lease"), self._p("fence")],
                                           [holder, _ms(ttl_seconds)])
        return None if token is None else int(token)

    async def renew_lease(self, holder: str, token: int, ttl_seconds: float) -> bool:
        async with self._guard():
            return bool(await self._renew(keys=[self._p("lease")], args=[holder, token, _ms(ttl_seconds)]))

    async def release_lease(self, holder: str, token: int) -> bool:
        async with self._guard():
            return bool(await self._renew(keys=[self._p("lease")], args=[holder, token, ""]))

    async def lease(self) -> LeaseInfo | None:
        async with self._guard():
            pipe = self._redis.pipeline(transaction=True)
            pipe.hgetall(self._p("lease"))
            pipe.pttl(self._p("lease"))
            row, ttl = await pipe.execute()
        if not row:
            return None
        return LeaseInfo(row[b"holder"].decode(), int(row[b"token"]), max(0, ttl) / 1000)

    # ---- lifecycle

    async def ping(self) -> None:
        async with self._guard():
            await self._redis.ping()

    async def close(self) -> None:
        await self._redis.aclose()


class _RedisSubscription(Subscription):
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.channel = store._p("events")
        self._pubsub = None

    async def start(self) -> None:
        async with self.store._guard():
            self._pubsub = self.store._redis.pubsub(ignore_subscribe_messages=True)
            await self._pubsub.subscribe(self.channel)

    async def get(self, timeout: float) -> PlanEvent | None:
        if self._pubsub is None:
            await self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with self.store._guard():
            while (left := deadline - loop.time()) > 0:
                msg = await self._pubsub.get_message(timeout=left)
                if msg is not None and msg.get("type") == "message":
                    return _event_from_json(msg["data"])
        return None

    async def close(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
            self._pubsub = None


# ---------------------------------------------------------------------------------------------
# in-memory twin


class MemoryStore(Store):
    """The same contract in process memory. TTLs run on `clock` (monotonic by default)."""

    def __init__(self, telemetry: TelemetryConfig | None = None, *, clock=time.monotonic) -> None:
        super().__init__(telemetry)
        self._clock = clock
        self._buckets: dict[int, dict[str, dict[str, list]]] = {}
        self._seen: dict[str, float] = {}                      # marker -> expiry
        self._cache_b: dict[int, dict[str, list[int]]] = {}
        self._cache_total: dict[str, list[int]] = {}
        self._plans: dict[int, bytes] = {}
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
                b = self._buckets.setdefault(idx, {"n": {}, "gaps": [], "log": []})
                for key, (n, pt, xt) in key_totals([part]).items():
                    acc = b["n"].setdefault(key, [0, 0, 0])
                    acc[0] += n
                    acc[1] += pt
                    acc[2] += xt
                b["gaps"] = _newest([b["gaps"], part.gaps], cfg.gaps_per_bucket)
                b["log"] = _newest([b["log"], log_lines(_newest([part.rows], cfg.log_per_bucket))], cfg.log_per_bucket)
            out.append(counted)
        self._expire()
        return out

    async def record_cache_stats(self, batch_id: str, stats: Sequence[CacheStatRecord], *, now: float) -> bool:
        self._check()
        if batch_id and not self._mark(f"cache:{batch_id}"):
            return False
        fields = _stat_fields(stats)
        _merge_counters(self._cache_b.setdefault(self.telemetry.bucket(now), {}), fields)
        _merge_counters(self._cache_total, fields)
        return True

    async def window_rates(self, now: float, window_seconds: float) -> RatesSnapshot:
        self._check()
        first, last, start = _window_buckets(now, window_seconds, self.telemetry)
        totals: dict[str, list[int]] = {}
        for i in range(first, last + 1):
            for key, row in self._buckets.get(i, {"n": {}})["n"].items():
                acc = totals.setdefault(key, [0, 0, 0])
                for j in range(3):
                    acc[j] += row[j]
        return _snapshot(first, last, start, now, totals)

    async def cache_stats(self, now: float, window_seconds: float) -> dict[str, CacheCounters]:
        self._check()
        first, last, _ = _window_buckets(now, window_seconds, self.telemetry)
        rows: dict[str, list[int]] = {}
        for i in range(first, last + 1):
            for replica, v in self._cache_b.get(i, {}).items():
                acc = rows.setdefault(replica, [0, 0, 0])
                for j in range(3):
                    acc[j] += v[j]
        return _counters(rows)

    async def cache_totals(self) -> dict[str, CacheCounters]:
        self._check()
        return _counters({k: list(v) for k, v in self._cache_total.items()})

    def _window_lists(self, now: float, window_seconds: float, name: str) -> list:
        first, last, _ = _window_buckets(now, window_seconds, self.telemetry)
        return [x for i in range(first, last + 1) for x in self._buckets.get(i, {}).get(name, [])]

    async def interarrival_sample(self, now: float, window_seconds: float) -> list[float]:
        self._check()
        return list(self._window_lists(now, window_seconds, "gaps"))

    async def recent_arrivals(self, now: float, window_seconds: float) -> list[ArrivalRecord]:
        self._check()
        return [ArrivalRecord(*orjson.loads(r)) for r in self._window_lists(now, window_seconds, "log")]

    # ---- plans

    async def next_version(self) -> int:
        self._check()
        self._seq += 1
        return self._seq

    async def put_plan(self, plan: Plan) -> None:
        self._check()
        _check_version(plan.version)
        if plan.version in self._plans:
            raise FailedPrecondition(f"plan version {plan.version} already exists")
        self._plans[plan.version] = _encode_plan(plan)
        self._summaries[plan.version] = _encode_plan(summary_of(plan))
        self._seq = max(self._seq, plan.version)

    async def get_plan(self, version: int) -> Plan:
        self._check()
        if version not in self._plans:
            raise NotFound(f"plan version {version} not found")
        return _decode_plan(self._plans[version])

    async def list_plans(self, limit: int = 20, before_version: int = 0) -> list[Plan]:
        self._check()
        versions = sorted((v for v in self._summaries if before_version <= 0 or v < before_version), reverse=True)
        return [_decode_plan(self._summaries[v]) for v in versions[:max(0, limit)]]

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
            raise _refusal("fenced", 0, 0)

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
            raise _refusal("stale", version, current)
        if version == 0:
            version = self._history[0].previous if self._history else 0
            if version == 0:
                raise _refusal("no_previous", version, current)
        if version not in self._plans:
            raise _refusal("missing", version, current)
        self._check_fence(fencing_token)
        if self._pinned and self._pinned != version:
            raise _refusal("pinned", version, self._pinned)
        if automatic and self._mode[0] is Mode.FLAT:
            raise _refusal("flat", version, current)
        if version == current:
            return Activation(current, current, False)
        self._active = version
        self._history.insert(0, HistoryEntry(version, current, event, reason, float(now), fencing_token or 0))
        del self._history[HISTORY_MAX:]
        self._publish(PlanEvent(event, version, self._mode[0], float(now)))
        return Activation(version, current, True)

    async def activate(self, version: int, *, expected: int, now: float, reason: str = "",
                       fencing_token: int | None = None, automatic: bool = False) -> Activation:
        _check_version(version)
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
        _check_version(version)
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
        expiry = self._clock() + _ms(ttl_seconds) / 1000
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
        self._lease = (holder, token, self._clock() + _ms(ttl_seconds) / 1000)
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


def open_store(url: str, *, telemetry: TelemetryConfig | None = None, prefix: str = "cr") -> Store:
    """`memory://` for the in-process twin, otherwise a Redis URL."""
    if url.startswith("memory://"):
        return MemoryStore(telemetry)
    return RedisStore(url, prefix=prefix, telemetry=telemetry)


def add_store_flags(parser) -> None:
    """Flags for reaching the store, shared by the planner and the collector (which must agree
    on the telemetry bucketing). Defaults from env vars."""
    from services.rpc import env, env_number

    g = parser.add_argument_group("store")
    g.add_argument("--redis", default=env("REDIS_URL", "redis://127.0.0.1:6379/0"),
                   help="Redis URL, or memory:// for an in-process store "
                        "(env CACHEROUTE_REDIS_URL, default redis://127.0.0.1:6379/0)")
    g.add_argument("--key-prefix", default=env("KEY_PREFIX", "cr"),
                   help="prefix of every Redis key (env CACHEROUTE_KEY_PREFIX, default cr)")
    g.add_argument("--bucket-seconds", type=float, default=env_number("BUCKET_SECONDS", "10", float),
                   help="telemetry bucket width (env CACHEROUTE_BUCKET_SECONDS, default 10)")
    g.add_argument("--retention-seconds", type=float, default=env_number("RETENTION_SECONDS", "3600", float),
                   help="telemetry retention (env CACHEROUTE_RETENTION_SECONDS, default 3600)")


def telemetry_from_args(args) -> TelemetryConfig:
    return TelemetryConfig(bucket_seconds=args.bucket_seconds, retention_seconds=args.retention_seconds)
