"""CHWBL: consistent hashing with bounded loads.

Rule: walk the ring clockwise from the key's hash and take the first healthy replica whose
load after accepting stays within the bound:
    in_flight[r] + 1 <= ceil(c * (total_in_flight + 1) / healthy_replicas)
The least-loaded replica always satisfies the bound, so the walk terminates. Knobs: `c`
(default 1.25: Envoy ring-hash / HAProxy `hash-balance-factor 125`), `vnodes` (160, as
sticky). Source: Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded
Loads", SODA'18; Vimeo/HAProxy deployment notes.
"""

from __future__ import annotations

import math
import random

from services.core.policies._common import Ring, least_loaded, require_healthy
from services.core.policy import ClusterState, NoHealthyReplica, Pick, Reason
from services.core.request import Request


class ChwblPolicy:
    name = "chwbl"

    def __init__(self, replicas: int, *, rng: random.Random, c: float = 1.25, vnodes: int = 160):
        if c < 1.0:
            raise ValueError("chwbl needs c >= 1")
        self.replicas = replicas
        self.c = c
        self._ring = Ring(replicas, vnodes)

    def pick(self, request: Request, state: ClusterState) -> Pick:
        return Pick(self.choose(request.key, state), Reason.COLD)

    def choose(self, key: str, state: ClusterState) -> int:
        healthy, load = state.healthy, state.in_flight
        live = sum(healthy)
        if not live:
            raise NoHealthyReplica("no healthy replica")
        total = sum(l for l, ok in zip(load, healthy) if ok)
        bound = math.ceil(self.c * (total + 1) / live)
        for r in self._ring.walk(key):
            if healthy[r] and load[r] + 1 <= bound:
                return r
        return least_loaded(require_healthy(state), state)     # unreachable for c >= 1

    def set_plan(self, plan: object | None) -> None:
        pass
