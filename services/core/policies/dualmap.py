"""DualMap-style dual-hash routing.

Rule: two independent hashes of the routing key name two candidate replicas (distinct when
the cluster has two or more). Prefer the candidate with more of the request's prefix
cached; on equal match, the one with fewer requests in flight. Stand-in for DualMap's
SLO-aware switch (ClusterState carries no TTFT): if the cache-preferred candidate's
in_flight exceeds `overload` times the other's plus `slack`, take the other. An unhealthy
candidate is replaced by the next distinct owner on its ring.
Knobs: overload 2.0, slack 4, use_oracle False (match from our own index of routed
blocks, as DualMap tracks its own placements), index_blocks (65,536), vnodes (160).
Source: "DualMap: Enabling Both Cache Affinity and Load Balancing for Distributed LLM
Serving", arXiv 2602.06502 (ICLR'26), dual mapping + SLO-aware request routing.
"""

from __future__ import annotations

import random

from services.core.policies._common import PrefixIndex, Ring, matcher
from services.core.policy import ClusterState, NoHealthyReplica, Pick, Reason
from services.core.request import Request


class DualMapPolicy:
    name = "dualmap"

    def __init__(self, replicas: int, *, rng: random.Random, overload: float = 2.0, slack: int = 4,
                 use_oracle: bool = False, index_blocks: int = 65_536, vnodes: int = 160):
        self.replicas = replicas
        self.overload = overload
        self.slack = slack
        self.use_oracle = use_oracle
        self.index = PrefixIndex(replicas, index_blocks)
        self._rings = (Ring(replicas, vnodes, salt=1), Ring(replicas, vnodes, salt=2))

    def candidates(self, key: str, state: ClusterState) -> tuple[int, ...]:
        healthy = state.healthy
        first = next((r for r in self._rings[0].walk(key) if healthy[r]), None)
        if first is None:
            raise NoHealthyReplica("no healthy replica")
        second = next((r for r in self._rings[1].walk(key) if healthy[r] and r != first), None)
        return (first,) if second is None else (first, second)

    def pick(self, request: Request, state: ClusterState) -> Pick:
        cands = self.candidates(request.key, state)
        chosen = cands[0] if len(cands) == 1 else self._choose(request, state, *cands)
        self.index.insert(chosen, request.blocks)
        return Pick(chosen, Reason.COLD)

    def _choose(self, request: Request, state: ClusterState, a: int, b: int) -> int:
        match = matcher(state, self.index, self.use_oracle)
        load = state.in_flight
        ma, mb = match(a, request.blocks), match(b, request.blocks)
        if ma == mb:
            return a if load[a] <= load[b] else b
        warm, other = (a, b) if ma > mb else (b, a)
        if load[warm] > self.overload * load[other] + self.slack:
            return other
        return warm

    def set_plan(self, plan: object | None) -> None:
        pass
