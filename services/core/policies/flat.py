"""Flat-LB: power-of-two choices on in-flight requests.

Rule: draw two distinct healthy replicas uniformly at random, send the request to the one
with fewer requests in flight. Cache-oblivious; the paper's baseline (SPEC section 8).
Source: Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing" (2001);
SGLang router `power_of_two.rs`. No knobs.
"""

from __future__ import annotations

import random

from services.core.policies._common import p2c
from services.core.policy import ClusterState, Pick, Reason
from services.core.request import Request


class FlatPolicy:
    name = "flat"

    def __init__(self, replicas: int, *, rng: random.Random):
        self.replicas = replicas
        self._rng = rng

    def pick(self, request: Request, state: ClusterState) -> Pick:
        return Pick(p2c(self._rng, state), Reason.COLD)

    def set_plan(self, plan: object | None) -> None:
        pass
