"""The cacheroute policy's prefix-node and token-balance rules: what `cacheroute-prefix`
(policies/cacheroute.py PREFIX_KNOBS: prefix nodes in the plan, balance="tokens") adds to the
table lookup. A mixin of CacheRoutePolicy, kept apart so the default policy's rules read in one
file; the rules themselves are described in the methods and in cacheroute.py's module header."""

from __future__ import annotations

import math
from itertools import compress

from services.core.policies._common import p2c
from services.core.policy import ClusterState, Pick, Reason
from services.core.prefixes import NODE_SHARE


class PrefixRules:
    """Methods CacheRoutePolicy takes from here; they read its table, nodes, ring and knobs."""

    def _pick_tokens(self, request, state: ClusterState) -> Pick:
        """balance="tokens": the home set H is the key's planned members, else the members of the
        deepest planned prefix node on the request's chain, else the key's ring owner (the cold
        tail). The least-backlogged healthy member of H (backlog = `prefill_tokens`, uncached
        prompt tokens queued) wins unless its backlog exceeds the tokens it saves (the request's
        reusable prefix x reuse_weight) and some replica's backlog is lower than the home's minus
        that saving: a replica is worth leaving only when its queue costs more than the prefill
        its cache spares. The spill goes to the first such replica on the key's ring (as the
        overload guard's spill does), not the globally least busy: scattering spills re-prefills
        the prefix everywhere, which adds work exactly when there is too much (measured: the
        flagship K=128 collapsed above 200 QPS that way). With `balance_factor` set, members must
        also meet the in-flight bound."""
        members = self._table.get(request.key)
        reason = Reason.PLANNED
        healthy = state.healthy
        if members is None and self._nodes:
            node = self._node_members(request)
            if node is not None:          # a session keeps to one member: the first on its ring
                members = (next((r for r in self._spill_ring.walk(request.key) if r in node and healthy[r]),
                                node[0]),)
        if members is None:
            reason = Reason.COLD
            owner = next((r for r in self._spill_ring.walk(request.key) if healthy[r]), -1)
            if owner < 0:
                return Pick(p2c(self._rng, state), Reason.COLD)   # raises NoHealthyReplica
            members = (owner,)
        load, backlog = state.in_flight, state.prefill_tokens
        bound = self._bound(state)
        home = -1
        for r in members:
            if healthy[r] and load[r] + 1 <= bound and (home < 0 or (backlog[r], load[r]) < (backlog[home], load[home])):
                home = r
        if home < 0:
            if not any(healthy):
                return Pick(p2c(self._rng, state), Reason.FALLBACK)
            return Pick(self._spill(request.key, state, bound), Reason.FALLBACK)
        saved = request.prefix_tokens * self.reuse_weight
        limit = backlog[home] - saved
        if limit <= 0:
            return Pick(home, reason)
        # the home's queue costs more than its cache saves: the first replica on the key's ring
        # whose queue is shorter by that much (walking the key's own ring keeps one key's spill
        # on few replicas, so the spilled prefix warms there instead of everywhere)
        for r in self._spill_ring.walk(request.key):
            if healthy[r] and backlog[r] < limit and load[r] + 1 <= bound and r not in members:
                return Pick(r, Reason.FALLBACK)
        return Pick(home, reason)

    def _bound(self, state: ClusterState) -> float:
        """The in-flight bound of the overload guard (inf with the guard off)."""
        c = self.balance_factor
        if c is None:
            return math.inf
        load, healthy = state.in_flight, state.healthy
        live = healthy.count(True)
        if not live:
            return math.inf
        total = sum(load) if live == len(load) else sum(compress(load, healthy))
        return max(self.spill_floor, math.ceil(c * (total + 1) / live))

    def _node_members(self, request) -> tuple[int, ...] | None:
        """Members of the deepest planned prefix node on the request's chain, if that node covers
        at least NODE_SHARE of the request's reusable prefix (else None: a session that has grown
        far past a shared system prompt is better served where its own turns are)."""
        blocks = request.blocks
        n = len(blocks)
        nodes = self._nodes
        for d in self._depths:
            if d <= n:
                members = nodes.get(blocks[d - 1])
                if members is not None:
                    return members if d >= NODE_SHARE * n else None
        return None

    def _pick_node(self, key: str, members: tuple[int, ...], state: ClusterState) -> Pick:
        """A cold key reaching a planned prefix node: the first member on the key's ring within the
        bound (so a session keeps to one member), else the ring spill (FALLBACK)."""
        load, healthy = state.in_flight, state.healthy
        bound = self._bound(state)
        seen = False
        for r in self._spill_ring.walk(key):
            if r in members and healthy[r]:
                if load[r] + 1 <= bound:
                    return Pick(r, Reason.PLANNED)
                seen = True
        if not seen:
            return Pick(p2c(self._rng, state), Reason.FALLBACK)
        return Pick(self._spill(key, state, bound), Reason.FALLBACK)
