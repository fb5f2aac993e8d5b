"""A tier of router instances in the simulator: N policies of one kind behind one Service.

Production routing tiers are never one process (issue 24): requests are spread over N router
instances (a Kubernetes Service; bench/peers.py --tier N round-robins its client over them), every
instance runs its own copy of the policy with its own per-instance memory (for CacheRoute: the
cold tail's key memory, the cold-home rule's record of what it routed to each replica) and they
share only what the cluster shares: the plan (the planner sends every dispatcher the same one) and
the engines' load signals (ClusterState). `Tier` is that, as one Policy for the simulator: request
k goes to member k mod N, each member sees every plan. The load signals are exact and instant here
(the simulator's ClusterState), so a difference between a tier of 1 and a tier of N is what the
per-instance memory alone causes, not poll staleness. Each member picks with `ClusterState.share`
= 1/N (restored after the pick): round robin gives every instance a 1/N share of the requests in
flight, which is what a live dispatcher measures (services.dispatcher.router, `Router.share`).

The record bus (issue 23; `record_delay`, off by default): every member publishes what it routed and
every other member inserts it into its own record (`CacheRoutePolicy.observe`: the cold-home rule's
record and, with `record_memory`, the cold tail's key memory) once the simulated clock has reached
pick time + `record_delay`. The clock is the arrival of the request being picked (the simulator picks
in arrival order); deliveries due by then are made before that pick, oldest pick first. Members
without `observe` get nothing. With the bus on every member picks with share 1.0: its record covers
the tier's traffic (up to the delay), which is what the share gate asks of it. A HOLD pick is not
published (nothing was routed; hold is off by default). Measured in docs/experiments.md, "The record
bus in the simulator": with memory, a tier of 2 or 4 gets one router's drift figures, but by the rule
written before the runs it missed the no-bus tier on (a) tenants at one point (tier 2 @16, 0.28 point
of hit, tolerance 0.2), so the default stays off.

Restarts (issue 24 (e); `restarts`, none by default): `(t, i)` replaces member i by a fresh
`make(i)` given the tier's current plan, at the first pick whose arrival is at or past t (model
seconds), as a live dispatcher restarted in place comes back with the plan (the planner re-sends it)
and nothing else. `keep` names the per-instance state the new member takes over from the old one, for
diagnosis: "memory" (the cold tail's key memory), "record" (the cold-home rule's record of what each
replica holds); both is `carry_memory`, i.e. a restart that loses nothing. With "peer" the kept state
is a copy of the next live member's instead (a hand-over from a peer, whose copy covers the whole tier's
routes when the bus is on). Bus deliveries still due to the old member go to the new one.
experiments/restart_tier.py measures it.
"""

from __future__ import annotations

import copy
import types
from collections import deque
from typing import Callable, Collection, Sequence

from services.core.policy import ClusterState, Pick, Policy, Reason
from services.core.request import Request


KEEPS = frozenset({"memory", "record", "peer"})


class Tier:
    """N router instances of one policy, requests round-robin over them (module header).

    `record_delay` (simulated seconds; None: no bus) turns the record bus on: every member's pick
    is queued and handed to every other member's `observe(replica, request, state, memory=...)`
    before the first pick whose `request.arrival` is at or past pick time + delay, in pick order.
    With the bus on, members pick with share 1.0; `record_memory` is `observe`'s `memory`."""

    def __init__(self, make: Callable[[int], Policy], instances: int, record_delay: float | None = None,
                 record_memory: bool = True, restarts: Sequence[tuple[float, int]] = (),
                 keep: Collection[str] = ()):
        if instances < 1:
            raise ValueError(f"a tier needs at least one instance, got {instances}")
        if record_delay is not None and not record_delay >= 0:      # also rejects NaN
            raise ValueError(f"record_delay must be >= 0 simulated seconds or None, got {record_delay}")
        bad = set(keep) - KEEPS
        if bad:
            raise ValueError(f"unknown state to keep over a restart: {', '.join(sorted(bad))}; valid: {', '.join(sorted(KEEPS))}")
        for t, i in restarts:
            if not 0 <= i < instances:
                raise ValueError(f"restart of member {i}: the tier has members 0..{instances - 1}")
        self.make = make
        self.keep = frozenset(keep)
        self._restarts = deque(sorted(restarts))
        self.restarted = 0              # restarts made (for tests and diagnostics)
        self._plan = None
        self.members = [make(i) for i in range(instances)]
        first = self.members[0]
        if self.keep and not hasattr(first, "carry_memory"):
            raise ValueError(f"keep over a restart needs CacheRoute members, not {type(first).__name__}")
        self.name = getattr(first, "name", type(first).__name__)
        self.prefix = getattr(first, "prefix", False)
        self.record_delay = record_delay
        self.record_memory = record_memory
        self._observers = [getattr(m, "observe", None) for m in self.members]
        self._bus: deque = deque()      # (due, origin member, replica, request), in pick (= due) order
        self.delivered = 0              # observe calls made (for tests and diagnostics)
        self._next = 0

    def pick(self, request: Request, state: ClusterState) -> Pick:
        members = self.members
        n = len(members)
        if self._restarts and self._restarts[0][0] <= request.arrival:
            self._restart_due(request.arrival)
        k = self._next
        member = members[k]
        self._next = (k + 1) % n
        if n == 1:
            return member.pick(request, state)
        bus = self.record_delay is not None
        if bus:
            self._deliver(request.arrival, state)
            pick = member.pick(request, state)      # share 1.0: the record covers the tier
            if pick.reason != Reason.HOLD:
                self._bus.append((request.arrival + self.record_delay, k, pick.replica, request))
            return pick
        share = state.share
        state.share = share / n
        try:
            return member.pick(request, state)
        finally:
            state.share = share

    def _deliver(self, now: float, state: ClusterState) -> None:
        bus, observers, memory = self._bus, self._observers, self.record_memory
        while bus and bus[0][0] <= now:
            _, origin, replica, request = bus.popleft()
            for j, observe in enumerate(observers):
                if j != origin and observe is not None:
                    observe(replica, request, state, memory=memory)
                    self.delivered += 1

    def _restart_due(self, now: float) -> None:
        while self._restarts and self._restarts[0][0] <= now:
            _, i = self._restarts.popleft()
            old, new = self.members[i], self.make(i)
            new.set_plan(self._plan)
            if self.keep:
                if "peer" in self.keep:         # a copy: the peer goes on routing with its own
                    peer = self.members[(i + 1) % len(self.members)]
                    old = types.SimpleNamespace(_seen=dict(peer._seen), _seen_old=dict(peer._seen_old),
                                                _index=copy.deepcopy(peer._index))
                new._seen, new._seen_old = (old._seen, old._seen_old) if "memory" in self.keep else ({}, {})
                if "record" in self.keep:
                    new._index = old._index
            self.members[i] = new
            self._observers[i] = getattr(new, "observe", None)
            self.restarted += 1

    def set_plan(self, plan) -> None:
        self._plan = plan
        for member in self.members:
            member.set_plan(plan)
