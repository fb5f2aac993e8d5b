"""The coalesced telemetry write path: many batches in one `record_arrival_batches` call
must land exactly as the same batches recorded one call each (counts, flags, duplicate
markers, the capped gap and log lists), on both stores."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.store import ArrivalRecord, MemoryStore, RedisStore, TelemetryConfig, log_blob, log_lines

CFG = TelemetryConfig(bucket_seconds=10, retention_seconds=600, gaps_per_bucket=7, log_per_bucket=9)
T0 = 1_700_000_000.0
NOW = T0 + 40.0
_prefixes = itertools.count()

arrival = st.builds(ArrivalRecord, st.sampled_from(["a", "b", "c", "d],[e", "k\nx"]),
                    st.integers(0, 349).map(lambda i: T0 + i / 10), st.integers(0, 5_000), st.integers(0, 2_000))
batch = st.tuples(st.sampled_from(["", "x", "y", "z", "w"]), st.lists(arrival, max_size=12))
calls = st.lists(st.lists(batch, min_size=1, max_size=6), min_size=1, max_size=4)


async def replay(store, grouped: list[list[tuple[str, list[ArrivalRecord]]]], one_by_one: bool):
    flags = []
    try:
        for call in grouped:
            if one_by_one:
                flags += [await store.record_arrivals(bid, arrivals) for bid, arrivals in call]
            else:
                flags += await store.record_arrival_batches(call)
        snap = await store.window_rates(NOW, 40.0)
        return (flags, snap.keys, snap.rates, snap.mean_prompt_tokens, snap.mean_prefix_tokens,
                await store.interarrival_sample(NOW, 40.0), await store.recent_arrivals(NOW, 40.0))
    finally:
        await store.close()


@pytest.fixture(params=["redis", "redis-cluster"])
def any_redis_url(request):
    """A single redis-server, then the session's Redis Cluster (3 + 3 nodes)."""
    return request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(grouped=calls)
def test_grouped_batches_land_like_single_batches(any_redis_url, grouped):
    redis_url = any_redis_url
    reference = asyncio.run(replay(MemoryStore(CFG), grouped, one_by_one=True))
    for make in (lambda: MemoryStore(CFG), lambda: RedisStore(redis_url, telemetry=CFG, prefix=f"p{next(_prefixes)}")):
        assert asyncio.run(replay(make(), grouped, one_by_one=False)) == reference
    single = asyncio.run(replay(RedisStore(redis_url, telemetry=CFG, prefix=f"p{next(_prefixes)}"), grouped, True))
    assert single == reference


def test_replayed_batch_inside_a_group_is_retried_without_it(redis_url):
    async def scenario():
        store = RedisStore(redis_url, telemetry=CFG, prefix="replay")
        try:
            first = await store.record_arrivals("seen", [ArrivalRecord("k", T0 + 1, 10, 5)])
            flags = await store.record_arrival_batches([
                ("new1", [ArrivalRecord("k", T0 + 2, 10, 5)]),
                ("seen", [ArrivalRecord("k", T0 + 3, 10, 5)]),             # replay: not counted
                ("new2", [ArrivalRecord("k", T0 + 4, 10, 5), ArrivalRecord("j", T0 + 14, 1, 0)]),
                ("new1", [ArrivalRecord("k", T0 + 5, 10, 5)]),             # repeated in the group
            ])
            snap = await store.window_rates(T0 + 20, 20.0)
            return first, flags, snap.total_arrivals, await store.recent_arrivals(T0 + 20, 20.0)
        finally:
            await store.close()

    first, flags, total, log = asyncio.run(scenario())
    assert first and flags == [True, False, True, False]
    assert total == 1 + 1 + 2
    assert [r.time - T0 for r in log] == [1, 2, 4, 14]


def test_log_encoding_matches_one_record_at_a_time():
    import orjson

    rows = [("plain", T0 + 0.1, 1, 2), ("with],[inside", T0, 3, 4), ("nl\n\"q\"", 1e-7, 0, 0)]
    for chunk in (rows[:1], rows[::2], rows):
        assert log_lines(chunk) == [orjson.dumps(list(r)) for r in chunk]
        assert log_blob(chunk).split(b"\n") == log_lines(chunk)
    assert log_lines([ArrivalRecord("k", 2.5, 1, 0)]) == [b'["k",2.5,1,0]'] and log_blob([]) == b""


write = st.tuples(st.just("w"), st.lists(arrival, min_size=1, max_size=6), st.sampled_from(["", "x", "y"]))
read = st.tuples(st.just("r"), st.integers(0, 40), st.sampled_from([10.0, 25.0, 40.0]))
flush = st.just(("f",))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.one_of(write, write, read, read, flush), min_size=1, max_size=14), compact=st.booleans())
def test_cached_window_reads_follow_every_write(redis_url, ops, compact, monkeypatch):
    """A long-lived RedisStore (bucket cache on) reads what a MemoryStore reads after any mix
    of writes (late ones into already-read buckets included), reads and data loss."""
    from services.store.window_cache import BucketCache

    if compact:   # compact the key index on every read
        monkeypatch.setattr(BucketCache, "GROWTH", 0)
        monkeypatch.setattr(BucketCache, "SLACK", 0)
    prefix = f"c{next(_prefixes)}"

    async def scenario():
        redis_store = RedisStore(redis_url, telemetry=CFG, prefix=prefix)
        memory = MemoryStore(CFG)
        try:
            for op in ops:
                if op[0] == "w":
                    _, arrivals, bid = op
                    assert await redis_store.record_arrivals(bid, arrivals) == await memory.record_arrivals(bid, arrivals)
                elif op[0] == "r":
                    _, dt, window = op
                    got = await redis_store.window_rates(T0 + dt, window)
                    want = await memory.window_rates(T0 + dt, window)
                    assert (got.keys, got.rates, got.mean_prompt_tokens, got.snapshot_id) == \
                           (want.keys, want.rates, want.mean_prompt_tokens, want.snapshot_id)
                else:   # the store loses its data (Redis restarted without persistence)
                    async for key in redis_store._redis.scan_iter(f"{prefix}:*"):
                        await redis_store._redis.delete(key)
                    memory = MemoryStore(CFG)
        finally:
            await redis_store.close()

    asyncio.run(scenario())
