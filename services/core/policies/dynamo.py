"""NVIDIA Dynamo KV router.

Rule: for every healthy replica
    cost = overlap_weight * (prefill blocks not cached) + active decode blocks
and pick the arg-min (temperature 0; exact ties at random). Prefill blocks not cached =
ceil(prompt_tokens / 16) - cached leading blocks; active decode blocks = the replica's
`active_blocks` (the request's own blocks would be added on every replica alike).
Cached blocks come from the state's exact `prefix_match` oracle when present (Dynamo's
KV-event indexer), else from the router's own approximate index of routed blocks
(Dynamo's approximate mode, --no-kv-events).
Knobs: overlap_weight 1.0 (--kv-overlap-score-weight), index_blocks (65,536).
Source: NVIDIA Dynamo docs, "KV Router" / "Router Design" (cost function, block
tracking, KV events vs approximation mode).
"""

from __future__ import annotations

import random

from services.core.policies._common import PrefixIndex, matcher, pick_best, require_healthy
from services.core.policy import ClusterState, Pick, Reason
from services.core.request import BLOCK_TOKENS, Request


class DynamoPolicy:
    name = "dynamo"

    def __init__(self, replicas: int, *, rng: random.Random, overlap_weight: float = 1.0,
                 index_blocks: int = 65_536):
        self.replicas = replicas
        self.overlap_weight = overlap_weight
        self.index = PrefixIndex(replicas, index_blocks)
        self._rng = rng

    def pick(self, request: Request, state: ClusterState) -> Pick:
        live = require_healthy(state)
        match = matcher(state, self.index, use_oracle=True)
        blocks = request.blocks
        total = -(-request.prompt_tokens // BLOCK_TOKENS)
        active, w = state.active_blocks, self.overlap_weight
        costs = {r: w * (total - match(r, blocks)) + active[r] for r in live}
        chosen = pick_best(costs, self._rng, lowest=True)
        if match == self.index.match:
            self.index.insert(chosen, blocks)
        return Pick(chosen, Reason.COLD)

    def set_plan(self, plan: object | None) -> None:
        pass
