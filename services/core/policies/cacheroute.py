"""CacheRoute dispatch: apply the active plan with a table lookup (SPEC section 1, step 4).

Rule: a request whose key is admitted in the plan goes to the least-loaded (in_flight)
healthy member of T(b) -> Reason.PLANNED; if no member is healthy, power-of-two choices
over all healthy replicas -> Reason.FALLBACK. A key outside the table (the cold tail)
goes to the cold-tail policy -> Reason.COLD. In flat-fallback mode (SPEC section 3, step
4: the active set or p99 left the validated range) every request goes P2C ->
Reason.FALLBACK. Without a plan every key is cold.
Knobs: `cold` = "p2c" (default; the paper's cold tail) or "chwbl" (session-aware cold
tail: consistent hashing with bounded loads, so a recurring cold key tends to return to
the same replica); `flat_fallback` (initial mode, also `set_flat_fallback`).
Source: CacheRoute paper, Algorithm 1 line 21 and section 3.3.
"""

from __future__ import annotations

import random
from typing import Mapping

from services.core.policies._common import least_loaded, p2c
from services.core.policies.chwbl import ChwblPolicy
from services.core.policy import ClusterState, Pick, Reason
from services.core.request import Request

COLD_TAILS = ("p2c", "chwbl")


class CacheRoutePolicy:
    name = "cacheroute"

    def __init__(self, replicas: int, *, rng: random.Random, cold: str = "p2c",
                 flat_fallback: bool = False):
        if cold not in COLD_TAILS:
            raise ValueError(f"unknown cold-tail policy {cold!r}; valid: {', '.join(COLD_TAILS)}")
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
        return Pick(best, Reason.PLANNED)
