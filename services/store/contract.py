"""The storage contract (the docstrings on `Store` and `Subscription`) and its refusals.

Two implementations: `RedisStore` (services/store/redis.py: redis.asyncio, a Lua script for
every conditional multi-key step) and `MemoryStore` (services/store/memory.py, an in-process
twin for unit tests and single-process demos). One contract test suite runs against both
(tests/integration/test_store_contract.py). Callers pass `now` (unix seconds) wherever time
matters; only lease and dedup TTLs run on the server's clock.

Telemetry is bucketed (services/store/buckets.py) and every telemetry key carries a TTL of
retention + one bucket, so the store stays bounded. Idempotency: a batch's records are split
by bucket and each part has a `seen` marker; a part is counted at most once, and a batch is a
duplicate when every part was seen. Activation is one atomic step: compare-and-set on the
active version, the version must exist, the lease fencing token (when given) must be current,
a pinned version blocks replacement, and an automatic activation is refused in flat mode. Mode
changes, pin and unpin take the same optional fencing token, checked atomically with the write,
so a deposed planner's automatic fallback cannot land after it lost the lease.
"""

from __future__ import annotations

import abc
import math
from typing import Callable, Sequence

from services.core.engines import EngineSet
from services.core.plan import Plan
from services.errors import FailedPrecondition, InvalidArgument, NotFound
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
from services.store.config import TelemetryConfig


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
PREFIX_FIELDS_PER_BUCKET = 100_000     # prefix-node count fields one telemetry bucket may hold
HOME_FIELDS_PER_BUCKET = 100_000       # keys whose serving replica one telemetry bucket may hold

_REFUSALS = {
    "stale": lambda v, cur: StaleVersion(f"stale expected version: active is {cur}"),
    "missing": lambda v, cur: NotFound(f"plan version {v} not found"),
    "fenced": lambda v, cur: Fenced("lease fencing token is not current: this planner was deposed"),
    "pinned": lambda v, cur: Pinned(f"version {cur} is pinned; unpin it first"),
    "flat": lambda v, cur: FlatMode("mode is flat: automatic activation refused"),
    "no_previous": lambda v, cur: FailedPrecondition("no previously active version to roll back to"),
}


def refusal(status: str, version: int, current: int) -> Exception:
    """The exception for a refused activation step ("stale", "missing", "fenced", ...)."""
    return _REFUSALS[status](version, current)


def check_engine_write(engines: EngineSet, expected: int) -> None:
    if engines.version <= expected:
        raise InvalidArgument(f"engine set version {engines.version} must be above the expected {expected}")


def stale_engines(current: int) -> StaleVersion:
    return StaleVersion(f"stale engine set: the stored version is {current}; read it and try again")


def check_version(version: int) -> None:
    if version < 1:
        raise InvalidArgument(f"plan version must be >= 1, got {version}")


def lease_ms(seconds: float) -> int:
    """A lease TTL in whole milliseconds (at least 1); InvalidArgument unless positive."""
    if not (seconds > 0 and math.isfinite(seconds)):
        raise InvalidArgument("lease ttl must be a positive number of seconds")
    return max(1, int(seconds * 1000))


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

    async def record_cache_stats(self, batch_id: str, stats: Sequence[CacheStatRecord], *, now: float) -> bool:
        """Add per-replica deltas to the bucket of `now` and to the running totals. Same
        idempotency rule as `record_arrivals`. (`write_cache_stats` also says what was refused.)"""
        return (await self.write_cache_stats(batch_id, stats, now=now)).counted

    @abc.abstractmethod
    async def write_cache_stats(self, batch_id: str, stats: Sequence[CacheStatRecord], *, now: float) -> CacheStatsWrite:
        """`record_cache_stats`, with partial acceptance: a replica whose lifetime totals would
        pass CACHE_COUNTER_LIMIT (2**62) has all its records of the batch refused (named in
        `refused`), the other replicas' records are counted; nothing overflows int64."""

    @abc.abstractmethod
    async def mark_telemetry_start(self, now: float) -> float:
        """Record that telemetry collection began at `now` unless a start is recorded already
        (the first call wins, so a collector restart keeps it); returns the recorded start."""

    @abc.abstractmethod
    async def window_rates(self, now: float, window_seconds: float) -> RatesSnapshot:
        """Per-key arrival rates over the buckets covering [now - window, now] (the current,
        partial bucket included): counts divided by the span from the first bucket's start to
        `now`, which is between window and window + one bucket, so rates are unbiased for a
        steady stream. If telemetry began later than that start (`mark_telemetry_start`), the
        span starts there: a window collection has filled for 10 s of its 60 divides by 10 s
        (issue 12: the planner's first plans saw every rate at a sixth of its value and sized
        k_b by that). The snapshot id is stable for the same buckets and counts.
        InvalidArgument for a window beyond the retention."""

    @abc.abstractmethod
    async def cache_stats(self, now: float, window_seconds: float) -> dict[str, CacheCounters]:
        """Per-replica cache counters summed over the window's buckets, the output counters
        (`completed`, `completion_tokens`) included."""

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

    @abc.abstractmethod
    async def record_prefix_counts(self, batch_id: str, counts: Sequence[tuple[float, str, int]]) -> bool:
        """Add prefix-node counts, (time, field, n) rows (field: services.core.prefixes.count_field),
        to the telemetry buckets of their times. Same idempotency rule as `record_arrivals`; a
        bucket holds at most PREFIX_FIELDS_PER_BUCKET fields (new ones beyond are dropped)."""

    @abc.abstractmethod
    async def prefix_counts(self, now: float, window_seconds: float) -> dict[str, int]:
        """Prefix-node counts summed over the window's buckets, by field."""

    @abc.abstractmethod
    async def record_homes(self, rows: Sequence[tuple[float, str, str]]) -> None:
        """Where keys were served: (time, key, replica id) rows into the telemetry buckets of
        their times; within a bucket a key's later row wins (rows are in arrival order). A replay
        writes the same values again, so no batch id is needed. A bucket holds at most
        HOME_FIELDS_PER_BUCKET keys (new ones beyond are dropped)."""

    @abc.abstractmethod
    async def served_homes(self, now: float, window_seconds: float) -> dict[str, str]:
        """key -> the replica id it was last served on within the window (the newest bucket wins)."""

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

    # ---- the engine set (services/core/engines.py)

    @abc.abstractmethod
    async def get_engine_set(self) -> EngineSet:
        """The stored engine set; `EngineSet()` (version 0, no engines) when none was ever written."""

    @abc.abstractmethod
    async def put_engine_set(self, engines: EngineSet, *, expected: int,
                             fencing_token: int | None = None) -> EngineSet:
        """Store `engines` if the stored set's version is `expected` (0: none stored yet), in one
        atomic step; `engines.version` must be greater than `expected`. StaleVersion (with the
        stored version in the message) when another writer got there first, Fenced when
        `fencing_token` is given and not the lease's. Kept in the plans' hash slot, so one
        Redis Cluster slot holds every piece of control state. Returns `engines`."""

    # ---- caller budgets

    @abc.abstractmethod
    async def take_budget(self, caller: str, n: int, *, rate: float, burst: float, now: float) -> int:
        """How many of `n` arrivals `caller` may report at `now`, from one token bucket per
        caller shared by every client of the store: `rate` tokens a second (> 0), up to
        `burst`; a new bucket starts full. A `now` behind the bucket's last refill (another
        client's clock) refills nothing. An idle bucket disappears once it would be full
        again. Atomic per call (services/dispatcher/budget.py says why it exists)."""

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
