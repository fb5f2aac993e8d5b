"""Ablation "+replication": the plan's admission and k_b sizing, hashed placement.

Rule: each admitted key gets k_b = max(1, ceil(rate_b / q_cap)) distinct replicas (rates
and q_cap from the plan), chosen as the first k_b distinct owners clockwise from the
key's point on a consistent-hash ring (no LPT); a request goes to the least-loaded healthy
member, like CacheRoute. Isolates what load-sized replication adds over affinity (paper's
8B ablation: imbalance 3.46x -> 2.60x). Knob `vnodes` (160). Source: CacheRoute paper,
section 5.2 and equation 2.
"""

from __future__ import annotations

import math
from typing import Mapping

from services.core.policies.affinity import AffinityPolicy


class AffinityReplicationPolicy(AffinityPolicy):
    """AffinityPolicy's knobs and ring; only the table differs (k_b replicas per key)."""

    name = "affinity-replication"

    def table_from(self, plan) -> Mapping[str, tuple[int, ...]]:
        return {key: self._ring.distinct(key, replicas_needed(plan.rates.get(key, 0.0), plan.q_cap,
                                                              self.replicas))
                for key in plan.table}


def replicas_needed(rate: float, q_cap: float, replicas: int) -> int:
    """k_b = max(1, ceil(rate / q_cap)), capped at the cluster size."""
    if q_cap <= 0:
        return 1
    return min(replicas, max(1, math.ceil(rate / q_cap)))
