"""The routing-policy contract.

A policy picks one replica index for a request, reading only the load signals in a
`ClusterState` that its owner (the simulator, or a dispatcher) keeps current. Policies
never read clocks, sockets or Redis; randomness comes from the `random.Random` they are
built with, so a seeded run is reproducible. Planned policies receive plans through
`set_plan`; prefix-aware peers learn from their own routing history via `pick`.

Replica indices are 0..R-1 and fixed for a policy's lifetime; a replica that is down is
marked in `ClusterState.healthy` and must not be picked. When no replica is healthy a
policy raises `NoHealthyReplica`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Protocol, Sequence

from services.core.request import Request


class Reason(enum.IntEnum):
    """Values 1-3 match cacheroute.v1.RouteReason. HOLD is no route: the chosen replica cannot
    take the request without overcommitting its KV and no acceptable other can; a caller that
    can wait holds the request and asks again when a replica frees KV, one that cannot (or a
    hold past its bound) sends it to `Pick.replica` (the policy's choice) anyway."""

    PLANNED = 1
    COLD = 2
    FALLBACK = 3
    HOLD = 4


class Pick(NamedTuple):
    replica: int
    reason: Reason


class NoHealthyReplica(RuntimeError):
    pass


@dataclass(slots=True)
class ClusterState:
    """Per-replica load signals, indexed by replica. The owner mutates the lists in place.

    in_flight        requests routed to the replica and not yet finished
    prefill_tokens   uncached prompt tokens queued or being prefilled (prefill load)
    active_blocks    KV blocks held by running requests (decode load, Dynamo's signal)
    kv_usage         share of the replica's KV blocks in use, 0..1
    healthy          False: never pick this replica
    prefix_match     optional exact oracle (replica, blocks) -> cached leading blocks, the
                     way Dynamo's KV events expose engine state; None where unavailable
    waiting          requests queued at the replica, not yet scheduled (engines report it:
                     vllm:num_requests_waiting); empty: not known
    kv_blocks        the replica's KV pool in blocks of 16 tokens; 0 (or empty): not known,
                     and then no policy can tell whether a request would overcommit it
    share            the fraction of the cluster's in-flight requests this router instance
                     routes (one number, not per replica): 1.0 = the only router, or unknown;
                     1/N in a tier of N behind a round-robin Service
    """

    in_flight: list[int]
    prefill_tokens: list[int]
    active_blocks: list[int]
    kv_usage: list[float]
    healthy: list[bool]
    prefix_match: Callable[[int, Sequence[int]], int] | None = field(default=None)
    waiting: list[int] = field(default_factory=list)
    kv_blocks: list[int] = field(default_factory=list)
    share: float = 1.0

    @classmethod
    def empty(cls, replicas: int) -> "ClusterState":
        return cls([0] * replicas, [0] * replicas, [0] * replicas, [0.0] * replicas, [True] * replicas,
                   waiting=[0] * replicas, kv_blocks=[0] * replicas)

    @property
    def replicas(self) -> int:
        return len(self.in_flight)

    def healthy_indices(self) -> list[int]:
        return [i for i, ok in enumerate(self.healthy) if ok]


class Policy(Protocol):
    """One routing rule. `pick` must be cheap: it runs once per request."""

    name: str

    def pick(self, request: Request, state: ClusterState) -> Pick:
        """Choose a healthy replica for `request`; raise NoHealthyReplica if there is none."""
        ...

    def set_plan(self, plan: object | None) -> None:
        """Receive the active plan (services.core.plan.Plan) or None. No-op for unplanned policies."""
        ...
