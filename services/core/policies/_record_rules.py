"""The cacheroute policy's rules that read its record of what it routed where (`cold_home`,
`warm_spill`; the record is `_caches.BlockLRU` or `KeyLRU`, the size of the smallest KV pool): a
planned key whose member evicted its prefix leaves it (`_off_cold_home`), and a planned request over
the in-flight bound goes where its whole prefix is cached (`_warm_other`). A mixin of
CacheRoutePolicy, kept apart so that file stays readable; the rules, their gates and their
measurements are in cacheroute.py's module header."""

from __future__ import annotations

from services.core.policies._caches import BlockLRU, KeyLRU
from services.core.policy import ClusterState, Pick, Reason
from services.core.request import BLOCK_TOKENS, Request

SHARE_MIN = 0.75        # alone (1) vs one of two (0.5): the midpoint (cacheroute.py's module header)


class RecordRules:
    """Methods CacheRoutePolicy takes from here; they read its table, ring, record and knobs."""

    def _off_cold_home(self, request: Request, best: int, members, state: ClusterState) -> Pick | None:
        """The planned member does not hold the request's prefix (evicted): its prefill costs the
        same anywhere, so go where the prefix is cached among the key's members and first two ring
        replicas, else to the one of them with the least queued prefill. None: home holds it, or a
        gate of the module header (`cold_share`, `cold_backlog`) says the rule may not act."""
        holds = self._holds(request, state)      # first: it builds the record pick() keeps
        if holds is None or (self.cold_share and state.share < SHARE_MIN) or \
                (self.cold_backlog and state.prefill_tokens[best] <= self.spill_backlog) or holds(best):
            return None
        index = self._index
        if index is not None and not index.full[best]:
            return None     # this record has evicted nothing there yet: absence is not eviction
        healthy = state.healthy
        cands = [m for m in members if healthy[m]]
        for r in self._spill_ring.walk(request.key):
            if healthy[r] and r not in cands:
                cands.append(r)
                if len(cands) >= len(members) + 2:
                    break
        warm = [r for r in cands if holds(r)]
        if not warm and self.cold_fresh == "home" and self.remembered(request.key) is None:
            return None     # never seen, held nowhere: a first sight, which the plan placed
        backlog, load = state.prefill_tokens, state.in_flight
        pool = warm or cands
        pick = min(pool, key=lambda r: (backlog[r], load[r], r != best))
        if pick == best:
            return Pick(self._remember(request.key, best), Reason.PLANNED)
        return Pick(self._remember(request.key, pick), Reason.FALLBACK)

    def _warm_other(self, request: Request, best: int, members, state: ClusterState, bound: int) -> Pick | None:
        """The warm spill (cacheroute.py's module header): the least-loaded healthy replica other than
        `best` that this policy's record says holds the request's whole reusable prefix, has fewer
        requests in flight than `best` and is within `bound`; PLANNED if it is one of the key's
        members, else FALLBACK. None if there is none, or in a tier without the bus (`cold_share`)."""
        if self.cold_share and state.share < SHARE_MIN:
            return None
        holds = self._holds(request, state, whole=True)
        if holds is None:
            return None
        healthy, load = state.healthy, state.in_flight
        pick, low = None, load[best]
        for r in range(len(load)):
            if r != best and healthy[r] and load[r] < low and load[r] + 1 <= bound and holds(r):
                pick, low = r, load[r]
        if pick is None:
            return None
        return Pick(self._remember(request.key, pick), Reason.PLANNED if pick in members else Reason.FALLBACK)

    def _holds(self, request: Request, state: ClusterState, whole: bool = False):
        """replica -> whether it still caches at least half of the request's reusable prefix (for
        `_off_cold_home`), or all of it (`whole`, for `_warm_other`): by the engines' exact caches
        ("oracle", when the state has them), else by this policy's record of what it routed to each
        replica, an LRU the size of the smallest replica's KV pool: of block hashes ("index",
        `BlockLRU`) or of keys weighted by their prompt tokens ("keys", `KeyLRU`: what "index" keeps
        when the first request it records carries no block hashes, as the HTTP API's do not; a key
        is held whole or not at all). None when it cannot tell (no pool size known)."""
        mode = self.cold_home
        if mode == "index":
            kind = type(self._index) if self._index is not None else BlockLRU if request.blocks else KeyLRU
            mode = "keys" if kind is KeyLRU else mode
        if mode == "keys":
            if request.prompt_tokens < BLOCK_TOKENS:
                return None     # under one block: nothing an engine caches, so nothing to go after
            index = self._lru(state, KeyLRU)
            return None if index is None else (lambda r: index.holds(r, request.key))
        pre = request.prefix_tokens // BLOCK_TOKENS
        if pre < 1 or len(request.blocks) < pre:
            return None
        blocks, need = request.blocks[:pre], pre if whole else (pre + 1) // 2
        match = state.prefix_match if mode == "oracle" else None
        if match is None:
            index = self._lru(state, BlockLRU)
            if index is None:
                return None
            match = index.match
        return lambda r: match(r, blocks) >= need

    def _lru(self, state: ClusterState, kind):
        if self._index is None:
            pools = [b for b in state.kv_blocks if b > 0]
            if len(pools) < len(state.kv_blocks) or not pools:
                return None
            self._index = kind(self.replicas, min(pools))
        return self._index
