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

What it bounds: one caller can add at most `rate` arrivals/s per dispatcher to the window,
however many keys it spreads them over; a tenant at a few requests per second is never
capped. What it does not: many callers (or many hosts on an open data plane) together,
and N dispatchers give one caller N buckets. Knobs (dispatcher flags):
`--caller-telemetry-rate` (CACHEROUTE_CALLER_TELEMETRY_RATE, 100/s; 0 = no bound) and
`--caller-telemetry-burst` (CACHEROUTE_CALLER_TELEMETRY_BURST, 200).

Pure: the caller passes `now`; no clock reads, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    rate: float = 100.0          # arrivals per second per caller; 0: unbounded
    burst: float = 200.0         # bucket size
    max_callers: int = 10_000    # buckets kept; idle (full) ones are dropped first

    def __post_init__(self) -> None:
        if not (self.rate >= 0 and self.burst >= 1 and self.max_callers >= 1):
            raise ValueError("caller telemetry budget: rate >= 0, burst >= 1 and max_callers >= 1 required")


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
