"""SGLang router, cache-aware policy.

Rule, per request, over healthy replicas (load = in_flight):
  1. Imbalanced if max - min > balance_abs AND max > balance_rel * min: send to the
     least-loaded replica (shortest queue).
  2. Otherwise find the replica whose approximate prefix tree has the longest match; if
     matched tokens / prompt tokens > cache_threshold, send there; else send to the
     replica with the smallest tree ("most available cache capacity").
  Either way the request's prefix is inserted into the chosen replica's tree.
The trees are built from routing history only (no engine feedback) and bounded with LRU
eviction; here one tree node is one 16-token block hash. Ties go to the less-loaded
replica, then the lower index.
Knobs (sglang_router CLI defaults): cache_threshold 0.3, balance_abs 64, balance_rel
1.5, tree_blocks (tree bound, default 65,536 blocks = 1M tokens per replica; SGLang's
--max-tree-size counts nodes).
Source: sgl-project/sglang sgl-router/src/policies/cache_aware.rs (header and
select_worker: imbalance test, match-rate test, get_smallest_tenant on a miss).
"""

from __future__ import annotations

import random

from services.core.policies._common import PrefixIndex, require_healthy
from services.core.policy import ClusterState, Pick, Reason
from services.core.request import BLOCK_TOKENS, Request


class SglangPolicy:
    name = "sglang"

    def __init__(self, replicas: int, *, rng: random.Random, cache_threshold: float = 0.3,
                 balance_abs: int = 64, balance_rel: float = 1.5, tree_blocks: int = 65_536):
        self.replicas = replicas
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.index = PrefixIndex(replicas, tree_blocks)

    def pick(self, request: Request, state: ClusterState) -> Pick:
        live = require_healthy(state)
        load = state.in_flight
        loads = [load[r] for r in live]
        hi, lo = max(loads), min(loads)
        if hi - lo > self.balance_abs and hi > self.balance_rel * lo:
            chosen = min(live, key=load.__getitem__)
        else:
            chosen = self._cache_choice(request, live, load)
        self.index.insert(chosen, request.blocks)
        return Pick(chosen, Reason.COLD)

    def _cache_choice(self, request: Request, live: list[int], load: list[int]) -> int:
        match = self.index.match
        best, best_blocks = live[0], -1
        for r in live:
            m = match(r, request.blocks)
            if m > best_blocks or (m == best_blocks and load[r] < load[best]):
                best, best_blocks = r, m
        if request.prompt_tokens and best_blocks * BLOCK_TOKENS / request.prompt_tokens > self.cache_threshold:
            return best
        size = self.index.size
        return min(live, key=lambda r: (size(r), load[r]))

    def set_plan(self, plan: object | None) -> None:
        pass
