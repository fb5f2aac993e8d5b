"""Sealed telemetry buckets (services/store/lua/seal.lua): a window read turns each closed
bucket's three count hashes into one blob, the open bucket stays hashes; late arrivals into a
sealed bucket, fresh stores with cold caches, the per-bucket key cap and Redis Cluster all
read what a MemoryStore reads."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

from services.store import ArrivalRecord, MemoryStore, RedisStore, TelemetryConfig
from services.store.connect import parse_redis_url, sync_client
from services.store.keys import seal_blob, unseal_blob

CFG = TelemetryConfig(bucket_seconds=10, retention_seconds=600)
T0 = 1_700_000_000.0
_prefixes = itertools.count()


@pytest.fixture(params=["redis", "redis-cluster"])
def any_redis_url(request):
    return request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")


def rows(t0: float, n_keys: int, seed: int) -> list[ArrivalRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_keys):
        for _ in range(int(rng.integers(1, 4))):
            out.append(ArrivalRecord(f"key-{i}", t0 + float(rng.random()) * 9.0, int(rng.integers(1, 900)),
                                     int(rng.integers(0, 50))))
    return out


def snap_tuple(s):
    return s.keys, s.rates, s.mean_prompt_tokens, s.mean_prefix_tokens, s.total_arrivals, s.snapshot_id


def test_blob_round_trip_and_refusals():
    keys = [b"a", "é".encode(), b"x" * 256]
    values = np.array([[1, 2, 3], [4, 5, 6], [2**62, 0, 1]], dtype=np.int64)
    got_keys, got = unseal_blob(seal_blob(keys, values))
    assert got_keys == keys and (got == values).all()
    assert unseal_blob(seal_blob([], np.zeros((0, 3), dtype=np.int64)))[0] == []
    assert seal_blob([b"a\0b", b"c"], values[:2]) is None                  # NUL inside a key
    assert seal_blob([b"a"], np.array([[2**70, 0, 0]], dtype=object)) is None   # past int64
    with pytest.raises(ValueError):
        unseal_blob(b"nope")


def test_a_read_seals_closed_buckets_and_late_writes_still_count(any_redis_url):
    prefix = f"s{next(_prefixes)}"
    now = T0 + 45.0

    async def main():
        redis_store = RedisStore(any_redis_url, telemetry=CFG, prefix=prefix)
        memory = MemoryStore(CFG)
        try:
            for b in range(5):                      # buckets T0..T0+40; the last one is open at `now`
                batch = rows(T0 + 10 * b, 300, b)
                assert await redis_store.record_arrivals(f"b{b}", batch) == await memory.record_arrivals(f"b{b}", batch)
            first = await redis_store.window_rates(now, 50.0)
            assert snap_tuple(first) == snap_tuple(await memory.window_rates(now, 50.0))
            client = sync_client(parse_redis_url(any_redis_url))
            try:
                base = CFG.bucket(T0)
                names = lambda i, h: f"{prefix}:{{tb:{base + i}}}:{h}"     # noqa: E731
                sealed = [client.exists(names(i, "sealed")) for i in range(5)]
                hashes = [client.exists(names(i, "n")) for i in range(5)]
                ttl = client.pttl(names(0, "sealed"))
            finally:
                client.close()
            assert sealed == [1, 1, 1, 1, 0] and hashes == [0, 0, 0, 0, 1]     # the open bucket stays hashes
            assert 0 < ttl <= CFG.ttl * 1000
            # late arrivals into a sealed bucket (new and old keys), read by the same store (cached)
            # and by a fresh one (cold cache): the blob plus the new hashes, then sealed again
            late = rows(T0 + 10, 40, 99) + [ArrivalRecord("late-new", T0 + 11.0, 5, 1)]
            assert await redis_store.record_arrivals("late", late) == await memory.record_arrivals("late", late)
            want = snap_tuple(await memory.window_rates(now, 50.0))
            assert snap_tuple(await redis_store.window_rates(now, 50.0)) == want
            fresh = RedisStore(any_redis_url, telemetry=CFG, prefix=prefix)
            try:
                assert snap_tuple(await fresh.window_rates(now, 50.0)) == want
                assert snap_tuple(await fresh.window_rates(now, 30.0)) == snap_tuple(await memory.window_rates(now, 30.0))
            finally:
                await fresh.close()
            # a replayed batch into a sealed bucket is still recognised as a duplicate
            assert await redis_store.record_arrivals("b1", rows(T0 + 10, 300, 1)) is False
            assert snap_tuple(await redis_store.window_rates(now, 50.0)) == want
        finally:
            await redis_store.close()

    asyncio.run(main())


def test_the_key_cap_counts_sealed_keys(redis_url):
    cfg = TelemetryConfig(bucket_seconds=10, retention_seconds=600, keys_per_bucket=50)

    async def main():
        store = RedisStore(redis_url, telemetry=cfg, prefix="cap")
        try:
            await store.record_arrivals("a", [ArrivalRecord(f"k{i}", T0 + 1, 10, 0) for i in range(40)])
            await store.window_rates(T0 + 25, 30.0)                           # seals bucket T0
            await store.record_arrivals("b", [ArrivalRecord(f"j{i}", T0 + 2, 10, 0) for i in range(30)])
            snap = await store.window_rates(T0 + 25, 30.0)
        finally:
            await store.close()
        return snap

    snap = asyncio.run(main())
    assert len(snap.keys) == 50 and snap.untracked_arrivals == 20 and snap.total_arrivals == 70


def test_the_cached_key_order_follows_the_index_as_it_grows():
    from services.store.window_cache import BucketCache

    rng = np.random.default_rng(3)
    cache = BucketCache()
    for step in range(6):        # keys arrive in batches, some shorter prefixes of others
        fresh = [("k" * int(rng.integers(1, 4)) + str(int(x))).encode() for x in rng.integers(0, 10**6, 200)]
        fresh += [b"k", b"kk"] if step == 2 else []
        cache._ids(list(dict.fromkeys(k for k in fresh if k not in cache.index)))
        keys = list(cache.index)
        rank = cache.key_rank(keys)
        assert [keys[i] for i in np.argsort(rank)] == sorted(keys)
    cache._ids([b"with\0nul"])
    assert cache.key_rank(list(cache.index)) is None
