"""Pieces shared by the policies: power-of-two choices, least-loaded member, and an
approximate per-replica prefix index (the consistent-hash ring lives in services/core/ring.py,
below the policies, because the planning core builds rings too; it is re-exported here).

Everything here is pure and per-instance: randomness comes from the `random.Random` the
policy was built with, hashing from blake2b (Python's `hash()` of a str is salted per
process, so it would break determinism across runs and between dispatchers).
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

from services.core.policy import ClusterState, NoHealthyReplica
from services.core.ring import Ring, stable_hash

__all__ = ["PrefixIndex", "Ring", "least_loaded", "matcher", "p2c", "pick_best", "require_healthy", "stable_hash"]


def p2c(rng: random.Random, state: ClusterState) -> int:
    """Power of two choices on in_flight over two distinct random healthy replicas."""
    healthy, n = state.healthy, len(state.healthy)
    a = _random_healthy(rng, healthy, n)
    b = a
    for _ in range(16):                      # rejection sampling: cheap when most are healthy
        b = rng.randrange(n)
        if b != a and healthy[b]:
            break
    else:
        others = [i for i in range(n) if healthy[i] and i != a]
        if not others:
            return a
        b = rng.choice(others)
    load = state.in_flight
    return a if load[a] <= load[b] else b


def _random_healthy(rng: random.Random, healthy: Sequence[bool], n: int) -> int:
    for _ in range(16):
        i = rng.randrange(n)
        if healthy[i]:
            return i
    live = [i for i in range(n) if healthy[i]]
    if not live:
        raise NoHealthyReplica("no healthy replica")
    return rng.choice(live)


def least_loaded(members: Sequence[int], state: ClusterState) -> int | None:
    """Healthy member with the fewest in-flight requests (first listed on ties), or None."""
    best, best_load = None, 0
    healthy, load = state.healthy, state.in_flight
    for r in members:
        if healthy[r] and (best is None or load[r] < best_load):
            best, best_load = r, load[r]
    return best


def require_healthy(state: ClusterState) -> list[int]:
    live = state.healthy_indices()
    if not live:
        raise NoHealthyReplica("no healthy replica")
    return live


def pick_best(scores: dict[int, float], rng: random.Random, *, lowest: bool) -> int:
    """Arg-min (lowest=True) or arg-max of scores; exact ties broken at random."""
    target = min(scores.values()) if lowest else max(scores.values())
    best = [r for r, s in scores.items() if s == target]
    return best[0] if len(best) == 1 else rng.choice(best)


class PrefixIndex:
    """Approximate per-replica record of the block hashes routed there, bounded.

    Two generations per replica (a cheap LRU approximation): inserts go to `current`; when
    it reaches capacity/2 blocks it becomes `previous` and the old `previous` is dropped, so
    each replica remembers between capacity/2 and capacity of its most recently routed
    blocks. Every insert records a whole chain, so each generation is prefix-closed: the
    deepest block of a chain being present means all of it is, which makes a repeat insert
    O(1) and the longest match a binary search.
    """

    def __init__(self, replicas: int, capacity_blocks: int):
        if capacity_blocks < 2:
            raise ValueError("capacity_blocks must be >= 2")
        self.capacity = capacity_blocks
        self._current: list[dict[int, None]] = [{} for _ in range(replicas)]
        self._previous: list[dict[int, None]] = [{} for _ in range(replicas)]

    def match(self, replica: int, blocks: Sequence[int]) -> int:
        """Leading blocks of `blocks` recorded on `replica`."""
        if not blocks:
            return 0
        cur, prev = self._current[replica], self._previous[replica]
        last = blocks[-1]
        if last in cur or last in prev:
            return len(blocks)
        first = blocks[0]
        if first not in cur and first not in prev:
            return 0
        lo, hi = 1, len(blocks) - 1          # blocks[lo-1] present, blocks[hi] absent
        while lo < hi:
            mid = (lo + hi + 1) // 2
            h = blocks[mid - 1]
            if h in cur or h in prev:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def insert(self, replica: int, blocks: Sequence[int]) -> None:
        if not blocks:
            return
        cur = self._current[replica]
        if blocks[-1] in cur:
            return
        cur.update(dict.fromkeys(blocks))
        if len(cur) >= self.capacity // 2:
            self._previous[replica] = cur
            self._current[replica] = {}

    def size(self, replica: int) -> int:
        """Blocks remembered (a block in both generations counts twice)."""
        return len(self._current[replica]) + len(self._previous[replica])


def matcher(state: ClusterState, index: PrefixIndex, use_oracle: bool) -> Callable[[int, Sequence[int]], int]:
    """(replica, blocks) -> cached leading blocks: the state's exact oracle when asked for
    and available (Dynamo-style KV events), else the policy's own approximate index."""
    if use_oracle and state.prefix_match is not None:
        return state.prefix_match
    return index.match
