"""Sticky: consistent hashing of the routing key.

Rule: hash the key onto a ring of `vnodes` points per replica and send it to the owner of
the first point clockwise; if that replica is unhealthy, to the next distinct owner.
Perfect affinity, no load awareness: rate skew becomes queue skew (paper: 87.3% hit,
lowest SLO capacity). Knob `vnodes` (default 160: libketama / nginx `hash ... consistent`
place 160 points per server; measured at 30 replicas: per-replica key share within
0.86-1.15x of the mean, std 8%).
Source: Karger et al., STOC'97; ketama.
"""

from __future__ import annotations

import random

from services.core.policies._common import Ring
from services.core.policy import ClusterState, NoHealthyReplica, Pick, Reason
from services.core.request import Request


class StickyPolicy:
    name = "sticky"

    def __init__(self, replicas: int, *, rng: random.Random, vnodes: int = 160):
        self.replicas = replicas
        self._ring = Ring(replicas, vnodes)

    def pick(self, request: Request, state: ClusterState) -> Pick:
        healthy = state.healthy
        for r in self._ring.walk(request.key):
            if healthy[r]:
                return Pick(r, Reason.COLD)
        raise NoHealthyReplica("no healthy replica")

    def set_plan(self, plan: object | None) -> None:
        pass
