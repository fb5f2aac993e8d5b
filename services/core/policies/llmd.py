"""llm-d inference scheduler, default weighted scoring.

Rule: score every healthy replica with three scorers, each in [0, 1], and pick the highest
weighted sum (exact ties at random):
    3 * prefix + 2 * queue + 2 * kv
  prefix  share of the request's prefix blocks found in the replica's approximate index
          of routed blocks (llm-d's prefix-cache scorer in estimate mode: it records the
          blocks of each request it routes, LRU-bounded per server);
  queue   min-max normalised queue: (max - q) / (max - min), 1 when all equal (llm-d
          queue-scorer; our queue signal is in_flight);
  kv      1 - kv_usage (kv-cache-utilization-scorer).
Knobs: prefix_weight 3, queue_weight 2, kv_weight 2, index_blocks (per-replica LRU bound,
65,536 16-token blocks), use_oracle (False; True scores prefix with the state's exact
match where available, like llm-d's precise-prefix-cache mode).
Source: llm-d inference-scheduler default profile (prefix 3, queue 2, kv-utilization 2);
gateway-api-inference-extension scorer/queue.go, kvcache_utilization.go, prefix plugin.
"""

from __future__ import annotations

import random

from services.core.policies._common import PrefixIndex, matcher, pick_best, require_healthy
from services.core.policy import ClusterState, Pick, Reason
from services.core.request import Request


class LlmdPolicy:
    name = "llmd"

    def __init__(self, replicas: int, *, rng: random.Random, prefix_weight: float = 3.0,
                 queue_weight: float = 2.0, kv_weight: float = 2.0, index_blocks: int = 65_536,
                 use_oracle: bool = False):
        self.replicas = replicas
        self.weights = (prefix_weight, queue_weight, kv_weight)
        self.use_oracle = use_oracle
        self.index = PrefixIndex(replicas, index_blocks)
        self._rng = rng

    def pick(self, request: Request, state: ClusterState) -> Pick:
        live = require_healthy(state)
        wp, wq, wk = self.weights
        load, kv = state.in_flight, state.kv_usage
        q_hi = max(load[r] for r in live)
        q_lo = min(load[r] for r in live)
        span = q_hi - q_lo
        blocks = request.blocks
        match = matcher(state, self.index, self.use_oracle)
        scores = {}
        for r in live:
            prefix = match(r, blocks) / len(blocks) if blocks else 0.0
            queue = (q_hi - load[r]) / span if span else 1.0
            scores[r] = wp * prefix + wq * queue + wk * (1.0 - kv[r])
        chosen = pick_best(scores, self._rng, lowest=False)
        self.index.insert(chosen, blocks)
        return Pick(chosen, Reason.COLD)

    def set_plan(self, plan: object | None) -> None:
        pass
