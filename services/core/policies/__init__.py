"""Routing policies: one module per rule, built through `make_policy`.

Every policy follows services.core.policy.Policy: `pick(request, state) -> Pick` over the
healthy replicas (NoHealthyReplica when there are none) and `set_plan(plan)` (a no-op for
unplanned policies). Reasons: planned policies report PLANNED / COLD / FALLBACK as
CacheRoute defines them; unplanned peers report COLD (no plan was involved).
Randomness comes from one `random.Random(seed)` per policy, so a seeded run repeats.
"""

from __future__ import annotations

import random

from services.core.policies.affinity import AffinityPolicy
from services.core.policies.affinity_replication import AffinityReplicationPolicy
from services.core.policies.cacheroute import CacheRoutePolicy, prefix_policy
from services.core.policies.chwbl import ChwblPolicy
from services.core.policies.dualmap import DualMapPolicy
from services.core.policies.dynamo import DynamoPolicy
from services.core.policies.flat import FlatPolicy
from services.core.policies.llmd import LlmdPolicy
from services.core.policies.preble import PreblePolicy
from services.core.policies.sglang import SglangPolicy
from services.core.policies.sticky import StickyPolicy
from services.core.policy import Policy

POLICIES = ("flat", "sticky", "chwbl", "cacheroute", "cacheroute-prefix", "affinity", "affinity-replication",
            "sglang", "llmd", "dynamo", "preble", "dualmap")

PLANNED_POLICIES = ("cacheroute", "cacheroute-prefix", "affinity", "affinity-replication")


def make_policy(name: str, replicas: int, *, seed: int = 0, **knobs) -> Policy:
    """Build policy `name` for replicas 0..replicas-1; knobs are the policy's own (see its module)."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    rng = random.Random(seed)
    match name:
        case "flat":
            return FlatPolicy(replicas, rng=rng, **knobs)
        case "sticky":
            return StickyPolicy(replicas, rng=rng, **knobs)
        case "chwbl":
            return ChwblPolicy(replicas, rng=rng, **knobs)
        case "cacheroute":
            return CacheRoutePolicy(replicas, rng=rng, **knobs)
        case "cacheroute-prefix":
            return prefix_policy(replicas, rng=rng, **knobs)
        case "affinity":
            return AffinityPolicy(replicas, rng=rng, **knobs)
        case "affinity-replication":
            return AffinityReplicationPolicy(replicas, rng=rng, **knobs)
        case "sglang":
            return SglangPolicy(replicas, rng=rng, **knobs)
        case "llmd":
            return LlmdPolicy(replicas, rng=rng, **knobs)
        case "dynamo":
            return DynamoPolicy(replicas, rng=rng, **knobs)
        case "preble":
            return PreblePolicy(replicas, rng=rng, **knobs)
        case "dualmap":
            return DualMapPolicy(replicas, rng=rng, **knobs)
        case _:
            raise ValueError(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}")


__all__ = ["POLICIES", "PLANNED_POLICIES", "make_policy"]
