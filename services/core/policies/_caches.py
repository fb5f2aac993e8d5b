"""What a router can know of a replica's prefix cache from what it routed there alone: an LRU the
size of the replica's KV pool, of block hashes (`BlockLRU`) or of keys weighted by their prompt
tokens (`KeyLRU`). The cacheroute policy's cold-home rule reads them (policies/cacheroute.py).

Hand-over (services/dispatcher/recordbus.py): `entries(replica)` lists one replica's record least
recent first, and `absorb(replica, older)` takes such a list from another router as older than
everything this one holds: its entries go below this record's own, the pool's capacity still
bounds the whole, so what this router routed itself since it started is evicted last."""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple, Sequence

from services.core.request import BLOCK_TOKENS


class Handover(NamedTuple):
    """What a cacheroute policy knows of where keys are, for another router of the tier
    (CacheRoutePolicy.handover / absorb). Replicas are the receiving policy's slot indexes."""
    memory: Sequence[tuple[str, int]]    # key -> replica of its latest request, least recent first
    kind: str | None                     # the record's kind, "blocks" (BlockLRU) or "keys" (KeyLRU); None: no record
    blocks: int                          # the record's capacity, in blocks (the smallest KV pool)
    record: Sequence[Sequence]           # per replica: `entries(replica)`, least recent first


class BlockLRU:
    """Per replica, the latest `capacity` distinct block hashes routed there, least recently
    routed evicted first: what a prefix cache of that many blocks under LRU holds if it serves
    only this router's requests. A chain is touched last block first, so its head is the most
    recent and, as in vLLM (which frees a finished request's blocks tail first), a chain loses
    its tail before its head: what is left of it stays a prefix."""

    def __init__(self, replicas: int, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1 block")
        self.capacity = capacity
        self.blocks = capacity
        self._lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]
        self.full = [False] * replicas       # per replica: the record has evicted something

    def insert(self, replica: int, blocks) -> None:
        lru = self._lru[replica]
        move = lru.move_to_end
        for b in reversed(blocks):
            if b in lru:
                move(b)
            else:
                lru[b] = None
        while len(lru) > self.capacity:
            lru.popitem(last=False)
            self.full[replica] = True

    def entries(self, replica: int) -> list[int]:
        """Replica's block hashes, least recently routed first."""
        return list(self._lru[replica])

    def absorb(self, replica: int, older) -> None:
        """Take `older` (block hashes, least recent first) below this record's own (module header)."""
        lru = self._lru[replica]
        merged = OrderedDict.fromkeys(b for b in older if b not in lru)
        merged.update(lru)
        while len(merged) > self.capacity:
            merged.popitem(last=False)
            self.full[replica] = True
        self._lru[replica] = merged

    def match(self, replica: int, blocks) -> int:
        """Leading blocks of `blocks` held for `replica`."""
        lru = self._lru[replica]
        n = 0
        for b in blocks:
            if b not in lru:
                break
            n += 1
        return n


class KeyLRU:
    """Per replica, the latest keys routed there whose prompt tokens sum to at most `capacity`
    blocks' worth, least recently routed evicted first: `BlockLRU` for keys whose prompts share
    nothing across keys (the key stands for its prefix; a shared prefix is counted once per key,
    so this errs towards "evicted")."""

    def __init__(self, replicas: int, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1 block")
        self.capacity = capacity * BLOCK_TOKENS
        self.blocks = capacity
        self._lru: list[OrderedDict[str, int]] = [OrderedDict() for _ in range(replicas)]
        self._tokens = [0] * replicas
        self.full = [False] * replicas       # per replica: the record has evicted something

    def insert(self, replica: int, key: str, tokens: int) -> None:
        lru = self._lru[replica]
        old = lru.pop(key, 0)
        lru[key] = tokens
        total = self._tokens[replica] + tokens - old
        while total > self.capacity and len(lru) > 1:
            total -= lru.popitem(last=False)[1]
            self.full[replica] = True
        self._tokens[replica] = total

    def entries(self, replica: int) -> list[tuple[str, int]]:
        """Replica's (key, prompt tokens), least recently routed first."""
        return list(self._lru[replica].items())

    def absorb(self, replica: int, older) -> None:
        """Take `older` ((key, tokens), least recent first) below this record's own (module header)."""
        lru = self._lru[replica]
        merged: OrderedDict[str, int] = OrderedDict((k, t) for k, t in older if k not in lru)
        merged.update(lru)
        total = sum(merged.values())
        while total > self.capacity and len(merged) > 1:
            total -= merged.popitem(last=False)[1]
            self.full[replica] = True
        self._lru[replica] = merged
        self._tokens[replica] = total

    def holds(self, replica: int, key: str) -> bool:
        return key in self._lru[replica]
