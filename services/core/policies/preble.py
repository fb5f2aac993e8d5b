"""Preble-style E2 (exploit / explore) routing.

Rule: find the healthy replica with the longest cached prefix of the request. Exploit if
the cached tokens are at least `threshold` of the prompt (Preble: when the matched prefix
is longer than the part still to compute, i.e. >= 50%): route there (ties: less prefill
load). Otherwise explore: route to the replica with the least prefill load
(`prefill_tokens`, uncached prompt tokens queued or running; ties: fewer in flight).
Preble's global scheduler mirrors each GPU's radix tree, so we read the state's exact
`prefix_match` when present and fall back to our own index of routed blocks.
Knobs: threshold 0.5, use_oracle True, index_blocks (65,536).
Not modelled: Preble's per-window load cost (prefill + decode + eviction) and its
hot-prefix replication; the CacheRoute paper's reimplementation is likewise simplified.
Source: Srivatsa et al., "Preble: Efficient Distributed Prompt Scheduling for LLM
Serving", ICLR'25, section 4 (E2 global scheduling).
"""

from __future__ import annotations

import random

from services.core.policies._common import PrefixIndex, matcher, require_healthy
from services.core.policy import ClusterState, Pick, Reason
from services.core.request import BLOCK_TOKENS, Request


class PreblePolicy:
    name = "preble"

    def __init__(self, replicas: int, *, rng: random.Random, threshold: float = 0.5,
                 use_oracle: bool = True, index_blocks: int = 65_536):
        self.replicas = replicas
        self.threshold = threshold
        self.use_oracle = use_oracle
        self.index = PrefixIndex(replicas, index_blocks)

    def pick(self, request: Request, state: ClusterState) -> Pick:
        live = require_healthy(state)
        match = matcher(state, self.index, self.use_oracle)
        prefill, load = state.prefill_tokens, state.in_flight
        matched = {r: match(r, request.blocks) for r in live}
        longest = max(matched.values())
        if request.prompt_tokens and longest * BLOCK_TOKENS >= self.threshold * request.prompt_tokens:
            chosen = min((r for r in live if matched[r] == longest), key=prefill.__getitem__)
        else:
            chosen = min(live, key=lambda r: (prefill[r], load[r]))
        if match == self.index.match:
            self.index.insert(chosen, request.blocks)
        return Pick(chosen, Reason.COLD)

    def set_plan(self, plan: object | None) -> None:
        pass
