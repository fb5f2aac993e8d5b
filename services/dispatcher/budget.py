"""How much one caller's routing decisions may add to the planner's input.

The planner admits the keys with the highest arrival rates, and a dispatcher reports an
arrival for every decision it makes. A Route or RouteBatch decision costs the caller
nothing and need never be followed by a request to an engine, so without a bound one
caller could make up keys and rates at will (issue 16: 25 RouteBatch calls of 9,000
requests over made-up keys displaced every real tenant from the plan). Two rules:

- Generate arrivals are reported once the engine has accepted the request (its first
  chunk arrived): traffic that was served. The engines' own capacity bounds them.
- Route and RouteBatch arrivals are reported within a per-caller token bucket: `rate`
  arrivals per second, up to `burst` at once. Decisions beyond it are still made and
  returned; only their arrivals are left out of the telemetry (counted as
  `telemetry_capped`). A caller is its tenant when the data plane has API keys, else its
  peer host (address without the port), so reconnecting does not refill the bucket.

- HTTP arrivals (the OpenAI API, reported once the engine answered 200) draw on the same
  bucket as the caller's gRPC Route/RouteBatch arrivals (issue 20: 534 max_tokens=1
  requests/s over 64 made-up keys filled a whole plan).

One bucket per caller across dispatchers (issue 20). With a bucket per dispatcher, N
dispatchers gave a caller N budgets. Two ways out were measured with 2 dispatchers and a
real redis-server (tests/faults/test_shared_budget.py, figures in docs/reliability.md):
divide the budget by the dispatcher count, or keep the bucket in the store. Division is
right only for a caller that spreads evenly over every dispatcher; the client library sticks
to one dispatcher until it fails, and such a caller got half its budget. So the bucket lives
in the store (`Store.take_budget`: one Lua call per decision batch, Cluster-safe, one slot per
caller) whenever the dispatcher has one (`--redis`), and `SharedBudget` falls back to the
local bucket when the store does not answer within `timeout` (0.1 s), retrying it after
`retry_after` (2 s): during an outage a caller has a bucket per dispatcher again, which is
the degraded bound, not none.

What it bounds: one caller can add at most `rate` arrivals/s to the window, however many
keys and dispatchers it spreads them over; a tenant at a few requests per second is never
capped. What it does not: many callers (or many hosts on an open data plane) together.
Knobs (dispatcher flags): `--caller-telemetry-rate` (CACHEROUTE_CALLER_TELEMETRY_RATE,
100/s; 0 = no bound), `--caller-telemetry-burst` (CACHEROUTE_CALLER_TELEMETRY_BURST, 200),
`--caller-telemetry-scope` (CACHEROUTE_CALLER_TELEMETRY_SCOPE: `shared`, the default, in the
store when there is one; `local`: per dispatcher).

Served arrivals are charged per flush, not per request (issue 22: the Lua call through
redis-py was ~14% of the dispatcher's CPU a request). A request the engine took (HTTP API,
gRPC Generate) leaves its arrival with its caller in `DeferredArrivals`; before each flush to
the collector (`settle`, every `--telemetry-interval`, 0.5 s) each caller's waiting arrivals
are taken from the bucket in one call, as one RouteBatch's are: the granted number is kept as
a uniform sample (in time order, each with its own arrival time), the rest count as
`telemetry_capped`. The bound is the same (every reported arrival was granted by the bucket)
and arrivals reach the collector in the same flush; what moves is when the bucket is charged,
by at most one interval. Only the shared scope defers (the local bucket is a dict lookup);
waiting arrivals are bounded (`capacity`, beyond it dropped as `telemetry_dropped`).

`CallerBudget` is pure (the caller passes `now`; no clock reads, no I/O); `SharedBudget`
awaits the store.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass

from services.errors import Unavailable
from services.rpc import kv

log = logging.getLogger("cacheroute.dispatcher.budget")
SCOPES = ("shared", "local")


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    rate: float = 100.0          # arrivals per second per caller; 0: unbounded
    burst: float = 200.0         # bucket size
    max_callers: int = 10_000    # buckets kept; idle (full) ones are dropped first
    scope: str = "shared"        # shared: in the store when the dispatcher has one; local: per dispatcher

    def __post_init__(self) -> None:
        if not (self.rate >= 0 and self.burst >= 1 and self.max_callers >= 1):
            raise ValueError("caller telemetry budget: rate >= 0, burst >= 1 and max_callers >= 1 required")
        if self.scope not in SCOPES:
            raise ValueError(f"caller telemetry scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")


class CallerBudget:
    def __init__(self, config: BudgetConfig = BudgetConfig()) -> None:
        self.config = config
        self._buckets: dict[str, list[float]] = {}   # caller -> [tokens, last refill time]

    @property
    def bounded(self) -> bool:
        return self.config.rate > 0

    def take(self, caller: str, n: int, now: float) -> int:
        """How many of `n` arrivals `caller` may report now (the rest are over its budget)."""
        if not self.bounded or n <= 0:
            return max(n, 0)
        cfg = self.config
        bucket = self._buckets.get(caller)
        if bucket is None:
            if len(self._buckets) >= cfg.max_callers:
                self._evict(now)
            bucket = self._buckets[caller] = [cfg.burst, now]
        else:
            bucket[0] = min(cfg.burst, bucket[0] + max(0.0, now - bucket[1]) * cfg.rate)
            bucket[1] = now
        granted = min(n, int(bucket[0]))
        bucket[0] -= granted
        return granted

    def _evict(self, now: float) -> None:
        """Halve the table, dropping the fullest buckets first: a refilled bucket loses its
        caller nothing, and a drained one (a caller over its budget) is kept, so flooding
        the table with new callers does not refill it."""
        cfg = self.config
        level = sorted(((min(cfg.burst, t + (now - at) * cfg.rate), c) for c, (t, at) in self._buckets.items()),
                       reverse=True)
        for _, caller in level[:len(level) - cfg.max_callers // 2]:
            del self._buckets[caller]


class SharedBudget:
    """The caller budget every entry point awaits (gRPC Route/RouteBatch, the HTTP API): the
    store's bucket when there is a store and the scope is shared, else the local one; the
    local one too while the store does not answer (module header)."""

    def __init__(self, config: BudgetConfig = BudgetConfig(), store=None, *, timeout: float = 0.1,
                 retry_after: float = 2.0) -> None:
        self.config = config
        self.local = CallerBudget(config)
        self.store = store if config.scope == "shared" else None
        self.timeout, self.retry_after = timeout, retry_after
        self.fallbacks = 0                  # decisions budgeted locally because the store did not answer
        self._down_until = 0.0

    @property
    def bounded(self) -> bool:
        return self.config.rate > 0

    @property
    def shared(self) -> bool:
        return self.store is not None

    async def take(self, caller: str, n: int, now: float) -> int:
        """How many of `n` arrivals `caller` may report now."""
        if not self.bounded or n <= 0:
            return max(n, 0)
        if self.store is None or now < self._down_until:
            return self._local(caller, n, now)
        cfg = self.config
        try:
            granted = await asyncio.wait_for(
                self.store.take_budget(caller, n, rate=cfg.rate, burst=cfg.burst, now=now), self.timeout)
        except (Unavailable, asyncio.TimeoutError) as exc:
            self._down_until = now + self.retry_after
            log.warning("caller budget: store unavailable, budgeting locally", extra=kv(
                error=" ".join(str(exc).split())[:160] or type(exc).__name__, retry_after=self.retry_after))
            return self._local(caller, n, now)
        if self._down_until:
            self._down_until = 0.0
            log.info("caller budget: back on the store")
        return granted

    def _local(self, caller: str, n: int, now: float) -> int:
        if self.store is not None:
            self.fallbacks += n
        return self.local.take(caller, n, now)


class DeferredArrivals:
    """Served arrivals waiting for their caller's budget until the next `settle` (module header).
    `router` is the dispatcher's Router: settled arrivals go to its telemetry buffer
    (`record_arrival`), the rest to its `telemetry_capped` / `telemetry_dropped` counts."""

    def __init__(self, budget: SharedBudget, router, *, capacity: int = 100_000, seed: int | None = None) -> None:
        self.budget = budget
        self.router = router
        self.capacity = capacity
        self.calls = 0                      # budget calls made by settle (one per caller per settle)
        self._waiting: dict[str, list[tuple]] = {}
        self._count = 0
        self._rng = random.Random(seed)

    def __len__(self) -> int:
        return self._count

    def add(self, caller: str, key: str, now: float, prompt_tokens: int, prefix_tokens: int, blocks, replica: int) -> None:
        """One served arrival of `caller`, charged at the next settle."""
        if self._count >= self.capacity:
            self.router.telemetry_dropped += 1
            return
        self._count += 1
        waiting = self._waiting.get(caller)
        if waiting is None:
            self._waiting[caller] = [(key, now, prompt_tokens, prefix_tokens, blocks, replica)]
        else:
            waiting.append((key, now, prompt_tokens, prefix_tokens, blocks, replica))

    async def settle(self, now: float | None = None) -> None:
        """Charge every caller's waiting arrivals (one budget call each) and buffer the granted ones."""
        if not self._waiting:
            return
        waiting, self._waiting, self._count = self._waiting, {}, 0
        router = self.router
        for caller, arrivals in waiting.items():
            n = len(arrivals)
            self.calls += 1
            granted = await self.budget.take(caller, n, time.time() if now is None else now)
            if granted < n:
                keep = sorted(self._rng.sample(range(n), granted))
                router.telemetry_capped += n - granted
                arrivals = [arrivals[k] for k in keep]
            for key, at, prompt_tokens, prefix_tokens, blocks, replica in arrivals:
                router.record_arrival(key, at, prompt_tokens, prefix_tokens, blocks, replica=replica)


def http_caller(tenant: str, keys_configured: bool, remote: str | None) -> str | None:
    """Whose budget an HTTP request draws on, named as the gRPC servicer names callers: its
    tenant; None for the deployment token (empty tenant with keys configured), which is not
    budgeted; on an open data plane its host as gRPC peers are named ("ipv4:127.0.0.1")."""
    if tenant:
        return "tenant:" + tenant
    if keys_configured:
        return None
    host = remote or "local"
    return f"ipv6:[{host}]" if ":" in host else f"ipv4:{host}"
