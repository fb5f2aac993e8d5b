"""Ablation "+affinity": the plan's admission, one hashed replica per admitted key.

Rule: keys admitted by the plan (its table's keys) are pinned to a single replica chosen
by consistent hashing of the key (k_b = 1 for every key, no LPT); dispatch is otherwise
CacheRoute's (unhealthy owner -> P2C FALLBACK, cold tail -> P2C COLD). Isolates what
affinity alone buys: hit rate up, and rate skew mapped onto replicas (paper's 8B
ablation: 88% hit, imbalance 3.46x). Knob `vnodes` (160). Source: CacheRoute paper,
section 5.2 (component ablation).
"""

from __future__ import annotations

import random
from typing import Mapping

from services.core.policies._common import Ring
from services.core.policies.cacheroute import CacheRoutePolicy


class AffinityPolicy(CacheRoutePolicy):
    name = "affinity"

    def __init__(self, replicas: int, *, rng: random.Random, vnodes: int = 160, **knobs):
        knobs.setdefault("balance_factor", None)     # the ablations isolate placement: no overload guard
        knobs.setdefault("cold", "p2c")              # ... and keep the paper's cold tail
        super().__init__(replicas, rng=rng, **knobs)
        self._ring = Ring(replicas, vnodes)

    def table_from(self, plan) -> Mapping[str, tuple[int, ...]]:
        return {key: (self._ring.first(key),) for key in plan.table}
