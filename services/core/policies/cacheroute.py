"""CacheRoute dispatch: apply the active plan with a table lookup (SPEC section 1, step 4).

Rule: a request whose key is admitted in the plan goes to the least-loaded (in_flight)
healthy member of T(b) -> Reason.PLANNED; if no member is healthy, power-of-two choices
over all healthy replicas -> Reason.FALLBACK. A key outside the table (the cold tail)
goes to the cold-tail policy -> Reason.COLD. In flat-fallback mode (SPEC section 3, step
4: the active set or p99 left the validated range) every request goes P2C ->
Reason.FALLBACK. Without a plan every key is cold.

Overload guard (bounded loads on planned keys): the plan is open-loop within a control
interval and its load estimate comes from noisy windowed rates, so a member can pass its
knee and queue without bound while the plan still says it is fine. A planned pick must
therefore meet the bounded-load condition of Mirrokni et al. (as CHWBL does),
    in_flight[r] + 1 <= max(floor, ceil(c * (total_in_flight + 1) / healthy_replicas)).
The least-loaded member is tried first, so if it fails every member fails; the request then
spills to the key's consistent-hash ring successors (first one within the bound) ->
Reason.FALLBACK. Walking the key's own ring keeps one key's spill on few replicas, so the
spilled prefix stays warm there; the least-loaded healthy replica always meets the bound
(c >= 1), so the walk ends.

Knobs: `cold` = "chwbl" (default: the session-aware cold tail, consistent hashing with
bounded loads, so a recurring cold key tends to return to the replica that has its prefix)
or "p2c" (the paper's cold tail). Default chosen on measurements (docs/experiments.md,
"Session-aware cold tail"): with the guard on it ties P2C on the flagship, where the
bootstrap plan admits every key, and raises the hit rate on both Mooncake traces, where
most sessions never enter a plan; it needs no shared state. `flat_fallback` (initial mode,
also `set_flat_fallback`); `balance_factor` c (default 1.25, the Envoy/HAProxy factor CHWBL runs with; None turns
the guard off, as the ablation policies do). Chosen once (docs/experiments.md, "Overload
guard"): at the 30-100 requests in flight per replica of our loads near capacity, 1.25 is
~2 standard deviations of Poisson noise above the mean, so it rarely fires on noise, and
it holds the peak replica at 1.25x the mean; measured on flagship, ablation and low-reuse,
c = 1.1 bought a little more p99 for a few tenths of a point of hit rate, and 1.5 / 2.0
did not hold low-reuse at 100 QPS. `spill_floor` (default 8): a replica with fewer
requests in flight is never called overloaded; at small counts the ratio is noise (the
reason SGLang's router also wants an absolute gap before it balances), and 8 requests of a
few thousand prompt tokens are a handful of 8,192-token prefill steps, well under a second.
Sources: CacheRoute paper, Algorithm 1 line 21 and section 3.3; Mirrokni, Thorup,
Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA'18 (the bound).
"""

from __future__ import annotations

import math
import random
from itertools import compress
from typing import Mapping

from services.core.policies._common import Ring, least_loaded, p2c
from services.core.policies.chwbl import ChwblPolicy
from services.core.policy import ClusterState, Pick, Reason
from services.core.request import Request
from services.model import COLD_TAILS, DEFAULT_COLD_TAIL

BALANCE_FACTOR = 1.25
SPILL_FLOOR = 8


class CacheRoutePolicy:
    name = "cacheroute"

    def __init__(self, replicas: int, *, rng: random.Random, cold: str = DEFAULT_COLD_TAIL,
                 flat_fallback: bool = False, balance_factor: float | None = BALANCE_FACTOR,
                 spill_floor: int = SPILL_FLOOR):
        if cold not in COLD_TAILS:
            raise ValueError(f"unknown cold-tail policy {cold!r}; valid: {', '.join(COLD_TAILS)}")
        if balance_factor is not None and not (1.0 <= balance_factor < math.inf):
            raise ValueError(f"balance_factor must be a finite number >= 1, or None (guard off), "
                             f"got {balance_factor!r}")
        if spill_floor < 0:
            raise ValueError(f"spill_floor must be >= 0, got {spill_floor!r}")
        self.balance_factor = balance_factor
        self.spill_floor = spill_floor
        self._spill_ring = Ring(replicas) if balance_factor is not None else None
        self.replicas = replicas
        self.cold = cold
        self.flat_fallback = flat_fallback
        self._rng = rng
        self._cold_ring = ChwblPolicy(replicas, rng=rng) if cold == "chwbl" else None
        self._table: Mapping[str, tuple[int, ...]] = {}
        self.plan = None

    def set_plan(self, plan) -> None:
        table = self.table_from(plan) if plan is not None else {}
        for key, members in table.items():
            if not members or min(members) < 0 or max(members) >= self.replicas:
                raise ValueError(f"plan maps key {key!r} to {members}, outside 0..{self.replicas - 1}")
        self._table = table
        self.plan = plan

    def table_from(self, plan) -> Mapping[str, tuple[int, ...]]:
        """The dispatch table for a plan; ablations override this."""
        return plan.table

    def set_flat_fallback(self, on: bool) -> None:
        self.flat_fallback = on

    def pick(self, request: Request, state: ClusterState) -> Pick:
        if self.flat_fallback:
            return Pick(p2c(self._rng, state), Reason.FALLBACK)
        members = self._table.get(request.key)
        if members is None:
            if self._cold_ring is not None:
                return Pick(self._cold_ring.choose(request.key, state), Reason.COLD)
            return Pick(p2c(self._rng, state), Reason.COLD)
        best = least_loaded(members, state)
        if best is None:
            return Pick(p2c(self._rng, state), Reason.FALLBACK)
        c = self.balance_factor
        if c is None:
            return Pick(best, Reason.PLANNED)
        load, healthy = state.in_flight, state.healthy       # the bound, inline: this runs per request
        live = healthy.count(True)
        total = sum(load) if live == len(load) else sum(compress(load, healthy))
        bound = max(self.spill_floor, math.ceil(c * (total + 1) / live))
        if load[best] + 1 <= bound:
            return Pick(best, Reason.PLANNED)
        return Pick(self._spill(request.key, state, bound), Reason.FALLBACK)

    def _spill(self, key: str, state: ClusterState, bound: int) -> int:
        """First healthy ring successor of the key within the bound (members are all above it)."""
        healthy, load = state.healthy, state.in_flight
        for r in self._spill_ring.walk(key):
            if healthy[r] and load[r] + 1 <= bound:
                return r
        return least_loaded(range(len(load)), state)      # unreachable for c >= 1
