"""The KV block pool of the engine model (services/core/engine.py), vLLM V1 semantics.

KV cache (vLLM V1 `KVCacheManager` / `BlockPool` semantics)
  A pool of `kv_blocks` blocks of 16 tokens. A request's shareable full prompt blocks carry
  chained hashes (`Request.blocks`); every other block (unique prompt suffix, the partial last
  block, generated tokens) is anonymous and can never hit. Blocks are ref-counted. A block
  whose count drops to 0 joins the tail of the free queue and keeps its hash; allocation
  takes blocks from the head and, if a taken block still had a hash, evicts it from the hash
  map. So the free queue is the LRU eviction order. A finishing (or preempted) request frees
  its blocks in reverse order, anonymous tail first and then its hashed blocks deepest first,
  so the deepest prefix blocks are evicted before shallower ones (vLLM V1
  `KVCacheManager.free`, which passes `reversed(blocks)` to `BlockPool.free_blocks`).
  `PrefixPool` keeps exactly these semantics but stores runs of blocks, not single blocks
  (tests/unit/test_engine_kv.py checks it against a literal per-block model).
  A full block is hashed (registered) when the step that computes it is scheduled, as vLLM
  does, so a request scheduled later may hit it. If its hash is already cached by another
  block, our copy stays anonymous and so do the rest of our blocks (a rare duplicate; vLLM
  keeps both copies, which changes nothing here).
"""

from __future__ import annotations

import heapq
from typing import Sequence

from services.core.request import BLOCK_TOKENS


def ceil_blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_TOKENS)


class _Node:
    """A run of consecutive cached blocks of one chain, positions [lo, hi) of `chain`, whose
    blocks share one ref count and, when unreferenced, one contiguous stretch of the free
    queue (deepest block nearest the head)."""

    __slots__ = ("chain", "lo", "hi", "ref", "stamp", "dead")

    def __init__(self, chain: Sequence[int], lo: int, hi: int, ref: int) -> None:
        self.chain = chain
        self.lo = lo
        self.hi = hi
        self.ref = ref
        self.stamp = -1       # free-queue position while ref == 0
        self.dead = False


class _Run:
    """Anonymous free blocks that joined the free queue together."""

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        self.count = count


class PrefixPool:
    """The KV block pool with vLLM V1 semantics (module header), stored by runs of blocks.

    Per-block bookkeeping costs the simulator hundreds of dict operations per request, so
    blocks are grouped into nodes: maximal runs of one chain with the same holders. Hashes
    are unique in the pool, so a node is found by the hash of its first block (`_head`).
    The free queue is a heap of (stamp, node or anonymous run): a node joins it when its ref
    count drops to 0, stamped with the next queue position, and allocation eats the oldest
    entry from its deep end, which is exactly vLLM's per-block queue because a request frees
    its blocks deepest first and a referenced block's ancestors are referenced too (so an
    unreferenced node's descendants always sit ahead of it). A partial hit splits a node.
    """

    def __init__(self, blocks: int) -> None:
        self.blocks = blocks
        self.free = blocks
        self._head: dict[int, _Node] = {}
        self._queue: list[tuple[int, object]] = [(0, _Run(blocks))]
        self._stamp = 1

    # -- lookups

    def lookup(self, blocks: Sequence[int], cap: int) -> tuple[int, int, list[tuple[_Node, int]]]:
        """(leading cached blocks up to `cap`, how many of them are unreferenced, the path of
        (node, end position) that covers them)."""
        head = self._head
        path: list[tuple[_Node, int]] = []
        pos = evictable = 0
        while pos < cap:
            node = head.get(blocks[pos])
            if node is None:
                break
            end = node.hi if node.hi < cap else cap
            chain = node.chain
            if chain is not blocks and blocks[end - 1] != chain[end - 1]:
                lo, hi = pos + 1, end - 1     # blocks[lo - 1] matches, blocks[hi] does not
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if blocks[mid - 1] == chain[mid - 1]:
                        lo = mid
                    else:
                        hi = mid - 1
                end = lo
            path.append((node, end))
            if not node.ref:
                evictable += end - pos
            pos = end
        return pos, evictable, path

    def match(self, blocks: Sequence[int]) -> int:
        return self.lookup(blocks, len(blocks))[0]

    def cached(self) -> int:
        """Blocks currently holding a hash."""
        return sum(n.hi - n.lo for n in self._head.values())

    # -- holding and freeing

    def touch(self, path: list[tuple[_Node, int]]) -> None:
        """Reference the blocks of a lookup path (ref++, out of the free queue)."""
        head = self._head
        for node, end in path:
            if end < node.hi:
                # split: a new node takes [lo, end); the old object keeps the deep part and
                # with it its place in the free queue
                part = _Node(node.chain, node.lo, end, node.ref)
                head[node.chain[node.lo]] = part
                node.lo = end
                head[node.chain[end]] = node
                node = part
            if node.ref == 0:
                self.free -= node.hi - node.lo
            node.ref += 1

    def register(self, blocks: Sequence[int], start: int, end: int) -> int:
        """Cache blocks[start:end] as a new node held once; stops before a hash that is
        already cached (returns how many were registered)."""
        if start >= end:
            return 0
        head = self._head
        if blocks[start] in head:
            return 0
        head[blocks[start]] = _Node(blocks, start, end, 1)
        return end - start

    def release(self, blocks: Sequence[int], hashed: int, anon: int) -> None:
        """Free a holder of blocks[:hashed] plus `anon` anonymous blocks, tail first."""
        queue = self._queue
        if anon:
            heapq.heappush(queue, (self._stamp, _Run(anon)))
            self._stamp += 1
            self.free += anon
        if not hashed:
            return
        head = self._head
        nodes = []
        pos = 0
        while pos < hashed:
            node = head[blocks[pos]]
            nodes.append(node)
            pos = node.hi
        for node in reversed(nodes):
            node.ref -= 1
            if node.ref == 0:
                node.stamp = self._stamp
                heapq.heappush(queue, (self._stamp, node))
                self._stamp += 1
                self.free += node.hi - node.lo
        if len(queue) > 4 * len(head) + 4096:
            self._compact()

    def take(self, m: int) -> None:
        """Allocate m blocks (m <= free) from the head of the free queue, evicting hashes."""
        self.free -= m
        queue = self._queue
        head = self._head
        while m:
            stamp, entry = queue[0]
            if type(entry) is _Run:
                if entry.count > m:
                    entry.count -= m
                    return
                m -= entry.count
                heapq.heappop(queue)
                continue
            if entry.ref or entry.stamp != stamp or entry.dead:
                heapq.heappop(queue)          # stale: touched since it was queued
                continue
            size = entry.hi - entry.lo
            if size > m:
                entry.hi -= m                 # the deepest blocks go first
                return
            m -= size
            heapq.heappop(queue)
            del head[entry.chain[entry.lo]]
            entry.dead = True

    def _compact(self) -> None:
        self._queue = [(s, e) for s, e in self._queue
                       if type(e) is _Run or (not e.ref and e.stamp == s and not e.dead)]
        heapq.heapify(self._queue)
