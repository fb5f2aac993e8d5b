"""The engine's run-grouped KV pool against a literal per-block model of vLLM V1's block pool
(ref counts, an LRU free queue of single blocks, tail-first freeing)."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from services.core.kvpool import PrefixPool


class BlockLru:
    """One entry per block: the obvious transcription, too slow for the simulator."""

    def __init__(self, blocks):
        self.free = blocks
        self.ref = {}                      # hash -> ref count (cached blocks)
        self.queue = OrderedDict()         # head first; key: hash, or an object for an anonymous block
        for _ in range(blocks):
            self.queue[object()] = None

    def lookup(self, blocks, cap):
        n = 0
        while n < cap and blocks[n] in self.ref:
            n += 1
        return n, sum(1 for h in blocks[:n] if self.ref[h] == 0)

    def touch(self, blocks, n):
        for h in blocks[:n]:
            if self.ref[h] == 0:
                del self.queue[h]
                self.free -= 1
            self.ref[h] += 1

    def take(self, m):
        self.free -= m
        for _ in range(m):
            key, _ = self.queue.popitem(last=False)
            if isinstance(key, int):
                del self.ref[key]

    def register(self, blocks, start, end):
        i = start
        while i < end and blocks[i] not in self.ref:
            self.ref[blocks[i]] = 1
            i += 1
        # the engine stops at the first duplicate; the pool under test only checks the
        # first position (hashes are unique and cached prefixes closed), so compare counts
        return i - start

    def release(self, blocks, hashed, anon):
        for _ in range(anon):
            self.queue[object()] = None
        self.free += anon
        for h in reversed(blocks[:hashed]):
            self.ref[h] -= 1
            if self.ref[h] == 0:
                self.queue[h] = None
                self.free += 1


def make_chains(spec):
    """Chains that share leading blocks: chain i copies chain `parent` up to `cut`, then goes
    its own way. Equal contents, distinct tuple objects, as for different keys."""
    chains = [tuple(range(1000, 1000 + 12))]
    for i, (parent, cut, extra) in enumerate(spec, start=1):
        base = chains[parent % len(chains)]
        cut = min(cut, len(base))
        chains.append(tuple(base[:cut]) + tuple(range(100_000 * i, 100_000 * i + extra)))
    return chains


def acquire(pool, ref_pool, chain, tokens):
    """What EngineModel does when it schedules a fresh request (whole prompt in one chunk)."""
    cap = min(len(chain), (tokens - 1) // 16)
    total = -(-tokens // 16)
    hit, evictable, path = pool.lookup(chain, cap) if cap > 0 else (0, 0, [])
    ref_hit, ref_evictable = ref_pool.lookup(chain, cap) if cap > 0 else (0, 0)
    assert (hit, evictable) == (ref_hit, ref_evictable)
    need = total - hit
    if need + evictable > pool.free:
        return None
    if hit:
        pool.touch(path)
        ref_pool.touch(chain, hit)
    pool.take(need)
    ref_pool.take(need)
    last = min(len(chain), tokens // 16)
    added = pool.register(chain, hit, last)
    ref_added = ref_pool.register(chain, hit, last) if added else 0
    if not added and last > hit:
        # the pool refused at the first position: the reference must agree it is cached
        assert chain[hit] in ref_pool.ref
    else:
        assert added == ref_added
    return chain, hit + added, total - hit - added


@settings(max_examples=150, deadline=None)
@given(
    spec=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 12), st.integers(0, 10)), min_size=1, max_size=6),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 50), st.integers(1, 300)), min_size=1, max_size=60),
    size=st.integers(8, 60),
)
def test_pool_matches_per_block_reference(spec, ops, size):
    chains = make_chains(spec)
    pool, ref_pool = PrefixPool(size), BlockLru(size)
    holders = []
    for is_release, pick, tokens in ops:
        if is_release and holders:
            chain, hashed, anon = holders.pop(pick % len(holders))
            pool.release(chain, hashed, anon)
            ref_pool.release(chain, hashed, anon)
        else:
            held = acquire(pool, ref_pool, chains[pick % len(chains)], tokens)
            if held is not None:
                holders.append(held)
        assert pool.free == ref_pool.free
        for chain in chains:
            assert pool.match(chain) == ref_pool.lookup(chain, len(chain))[0]
        assert pool.cached() == len(ref_pool.ref)


def test_split_nodes_are_freed_deepest_first():
    x = tuple(range(10))
    y = x[:5] + tuple(range(50, 55))
    pool, ref_pool = PrefixPool(20), BlockLru(20)
    a = acquire(pool, ref_pool, x, 161)          # 10 hashed + 1 anonymous
    b = acquire(pool, ref_pool, y, 161)          # hits x[:5] (a split), registers y[5:]
    assert pool.free == 3
    for held in (a, b):
        pool.release(*held)
        ref_pool.release(*held)
    # queue: 3 never used, a's anonymous, x[9..5], b's anonymous, y[9..5], x[4..0]
    for p in (pool, ref_pool):
        p.take(3 + 1 + 5 + 1)
    assert pool.match(x) == ref_pool.lookup(x, 10)[0] == 5
    assert pool.match(y) == ref_pool.lookup(y, 10)[0] == 10
    for p in (pool, ref_pool):
        p.take(5)
    assert pool.match(y) == ref_pool.lookup(y, 10)[0] == 5
    assert pool.match(x) == 5
