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
"""

from __future__ import annotations

from typing import Callable

from services.core.policy import ClusterState, Pick, Policy
from services.core.request import Request


class Tier:
    """N router instances of one policy, requests round-robin over them (module header)."""

    def __init__(self, make: Callable[[int], Policy], instances: int):
        if instances < 1:
            raise ValueError(f"a tier needs at least one instance, got {instances}")
        self.members = [make(i) for i in range(instances)]
        first = self.members[0]
        self.name = getattr(first, "name", type(first).__name__)
        self.prefix = getattr(first, "prefix", False)
        self._next = 0

    def pick(self, request: Request, state: ClusterState) -> Pick:
        members = self.members
        member = members[self._next]
        self._next = (self._next + 1) % len(members)
        if len(members) == 1:
            return member.pick(request, state)
        share = state.share
        state.share = share / len(members)
        try:
            return member.pick(request, state)
        finally:
            state.share = share

    def set_plan(self, plan) -> None:
        for member in self.members:
            member.set_plan(plan)
