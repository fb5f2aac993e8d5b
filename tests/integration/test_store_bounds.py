"""Issue 16, items 3-5: bounded key growth, GetRates that neither explodes nor stalls
ingestion, cache counters that cannot overflow int64, capped batch ids, a bounded embedded
Redis. Store rules run against every store (redis-server, a Redis Cluster, MemoryStore)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
import redis

from cacheroute.v1 import collector_pb2 as pb, collector_pb2_grpc
from services.collector.service import CollectorConfig, CollectorService
from services.local.redis_server import RedisProcess
from services.rpc import ServerConfig
from services.store import ArrivalRecord, CacheStatRecord, MemoryStore, RedisStore, TelemetryConfig

T0 = 1_700_000_000.0
CAPPED = TelemetryConfig(bucket_seconds=10, retention_seconds=600, keys_per_bucket=50)
TOKEN = "bounds-token"
AUTH = [("authorization", f"Bearer {TOKEN}")]


@pytest.fixture(params=["redis", "redis-cluster", "memory"])
def make_store(request):
    if request.param != "memory":
        url = request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")
        return lambda cfg=CAPPED: RedisStore(url, telemetry=cfg)
    return lambda cfg=CAPPED: MemoryStore(cfg)


def run(make_store, scenario, cfg=CAPPED):
    async def main():
        store = make_store(cfg)
        try:
            return await scenario(store)
        finally:
            await store.close()

    return asyncio.run(main())


def test_a_bucket_counts_at_most_its_key_cap_and_the_rest_as_untracked(make_store):
    async def scenario(store):
        await store.record_arrivals("a", [ArrivalRecord(f"k{i:02d}", T0 + 1, 10, 5) for i in range(40)])
        # k30..k39 are known (counted again); k40..k49 fill the cap; k50..k89 are untracked
        await store.record_arrivals("b", [ArrivalRecord(f"k{i:02d}", T0 + 2, 10, 5) for i in range(30, 90)])
        await store.record_arrivals("c", [ArrivalRecord(f"n{i:02d}", T0 + 12, 10, 5) for i in range(60)])  # next bucket
        return await store.window_rates(T0 + 15, 15.0)

    snap = run(make_store, scenario)
    counts = {k: round(r * snap.window_seconds) for k, r in zip(snap.keys, snap.rates)}
    first = {k for k in counts if k.startswith("k")}
    assert first == {f"k{i:02d}" for i in range(50)}
    assert all(counts[f"k{i:02d}"] == 2 for i in range(30, 40))
    assert len([k for k in counts if k.startswith("n")]) == 50          # its own cap
    assert snap.untracked_arrivals == 40 + 10
    assert snap.total_arrivals == 40 + 60 + 60


def test_cache_counters_stop_before_int64_and_refuse_only_that_replica(make_store):
    big = 2**61

    async def scenario(store):
        out = []
        for i in range(3):
            out.append(await store.write_cache_stats(f"c{i}", [CacheStatRecord("r0", big, big, 1),
                                                              CacheStatRecord("r1", 10, 5, 1)], now=T0))
        return out, await store.cache_totals()

    writes, totals = run(make_store, scenario)
    assert [(w.counted, w.refused) for w in writes] == [(True, ()), (True, ()), (True, ("r0",))]
    assert totals["r0"].prompt_tokens == 2**62 and totals["r0"].requests == 2
    assert totals["r1"].prompt_tokens == 30 and totals["r1"].requests == 3


def collector(redis_url: str, **kw) -> CollectorConfig:
    server = ServerConfig(name="collector", port=0, metrics_port=-1, auth_token=TOKEN,
                          max_message_bytes=kw.pop("max_message_bytes", 8 * 1024 * 1024))
    return CollectorConfig(server=server, redis_url=redis_url, window_seconds=60, **kw)


def test_lifetime_cache_counters_reach_the_limit_with_partial_acceptance_not_internal(redis_url):
    """The issue: 1,024 valid batches of 2^53-1 tokens overflowed a lifetime int64 (INTERNAL, a
    traceback, a key stuck at 9.2e18). Now the batches past 2^62 are refused, one line each."""
    n = 2**53 - 1

    def batches():
        for i in range(1024):
            yield pb.CacheStatsBatch(batch_id=f"b{i}", source="e", stats=[
                pb.CacheStat(replica_id="e0", prompt_tokens=n, cached_tokens=n, requests=1),
                pb.CacheStat(replica_id="e1", prompt_tokens=100, cached_tokens=50, requests=1)])

    async def main():
        service = await CollectorService(collector(redis_url)).start()
        store = RedisStore(redis_url)
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                summary = await collector_pb2_grpc.CollectorStub(ch).ReportCacheStats(batches(), metadata=AUTH,
                                                                                     timeout=60)
            return summary, await store.cache_totals()
        finally:
            await store.close()
            await service.stop(0)

    summary, totals = asyncio.run(main())
    accepted_e0 = 2**62 // n                                   # 512 batches fit under 2^62
    assert summary.batches == 1024 and summary.rejected == 1024 - accepted_e0
    assert summary.accepted == 1024 + accepted_e0
    assert "would pass 2^62" in summary.first_rejection and "\n" not in summary.first_rejection
    assert totals["e0"].prompt_tokens == accepted_e0 * n <= 2**62 and totals["e1"].requests == 1024


def test_the_issue_key_flood_stays_bounded_and_get_rates_is_capped(redis_url):
    """40 calls of distinct keys (the issue: 10k each, one per second; here 5k each, times
    spread the same way over four 10 s buckets): Redis holds at most the cap per bucket, the
    rest is counted as untracked, GetRates answers at most --max-rates keys within the message
    limit and needs the token."""
    now = time.time()
    calls, per_call = 40, 5000

    def batch(c: int) -> pb.ArrivalBatch:
        return pb.ArrivalBatch(batch_id=f"flood-{c}", source="x", arrivals=[
            pb.Arrival(key=f"flood-{c}-{j:05d}-" + "z" * 40, time=now - calls + c, prompt_tokens=10)
            for j in range(per_call)])

    async def main():
        service = await CollectorService(collector(redis_url, max_rates=20_000, max_message_bytes=1024 * 1024)).start()
        r = redis.Redis.from_url(redis_url)
        try:
            async with grpc.aio.insecure_channel(service.address) as ch:
                stub = collector_pb2_grpc.CollectorStub(ch)
                for c in range(calls):
                    await stub.ReportArrivals(iter([batch(c)]), metadata=AUTH, timeout=120)
                sizes = [r.hlen(k) for k in r.scan_iter("cr:{tb:*}:n")]
                used = r.info("memory")["used_memory"]
                answer = await stub.GetRates(pb.GetRatesRequest(window_seconds=600), metadata=AUTH, timeout=120)
                try:
                    await stub.GetRates(pb.GetRatesRequest(window_seconds=600), timeout=30)
                    unauth = "OK"
                except grpc.aio.AioRpcError as err:
                    unauth = err.code().name
            return sizes, used, answer, unauth
        finally:
            r.close()
            await service.stop(0)

    sizes, used, answer, unauth = asyncio.run(main())
    cap = TelemetryConfig().keys_per_bucket
    assert sizes and max(sizes) <= cap and sum(sizes) < calls * per_call
    tracked = sum(sizes)
    print(f"\nFIGURES key_flood: {calls * per_call} distinct keys, {len(sizes)} buckets, {tracked} tracked "
          f"(cap {cap}), redis used_memory {used / 2**20:.1f} MiB, GetRates {len(answer.rates)} of "
          f"{answer.total_keys} keys, {answer.ByteSize()} bytes")
    assert answer.total_arrivals == calls * per_call and answer.untracked_arrivals == calls * per_call - tracked
    assert answer.total_keys == tracked and answer.truncated
    assert 0 < len(answer.rates) <= 20_000 and answer.ByteSize() <= 1024 * 1024
    assert unauth == "UNAUTHENTICATED"


def test_window_reads_run_off_the_event_loop(redis_url):
    """The issue: after 400k distinct keys each GetRates blocked the collector for 2.2-2.4 s and
    dispatchers' reports timed out. The fold of a large window now runs in a worker thread: the
    loop keeps ticking while it runs (no key cap here, so the window is as large as it gets)."""
    cfg = TelemetryConfig(bucket_seconds=10, retention_seconds=600, keys_per_bucket=0)
    now = time.time()

    async def main():
        store = RedisStore(redis_url, telemetry=cfg)
        try:
            rows = [ArrivalRecord(f"key-{i:06d}", now - 25 + (i % 3) * 10, 10, 0) for i in range(150_000)]
            for start in range(0, len(rows), 25_000):
                await store.record_arrivals(f"load-{start}", rows[start:start + 25_000])
            gaps: list[float] = []
            done = asyncio.Event()

            async def ticker():
                last = time.perf_counter()
                while not done.is_set():
                    await asyncio.sleep(0.005)
                    t = time.perf_counter()
                    gaps.append(t - last)
                    last = t

            tick = asyncio.create_task(ticker())
            started = time.perf_counter()
            snap = await store.window_rates(now, 40)
            took = time.perf_counter() - started
            done.set()
            await tick
            return snap, took, max(gaps)
        finally:
            await store.close()

    snap, took, worst = asyncio.run(main())
    print(f"\nFIGURES window_read: 150,000 keys folded in {took:.2f} s; longest event-loop stall {worst * 1000:.0f} ms")
    assert len(snap.keys) == 150_000
    assert worst < max(0.25, took / 3)


def test_batch_ids_are_capped_and_the_embedded_redis_is_bounded(redis_url):
    async def main():
        service = await CollectorService(collector(redis_url)).start()
        r = redis.Redis.from_url(redis_url)
        try:
            before = sorted(r.scan_iter())
            async with grpc.aio.insecure_channel(service.address) as ch:
                summary = await collector_pb2_grpc.CollectorStub(ch).ReportArrivals(iter([pb.ArrivalBatch(
                    batch_id="x" * 200, source="d", arrivals=[pb.Arrival(key="k", time=time.time())] * 3)]),
                    metadata=AUTH, timeout=10)
            return summary, before, sorted(r.scan_iter())
        finally:
            r.close()
            await service.stop(0)

    summary, before, after = asyncio.run(main())
    assert (summary.accepted, summary.rejected) == (0, 3) and "batch_id is 200 bytes (max 128)" in summary.first_rejection
    assert before == after
    with RedisProcess() as embedded:
        r = redis.Redis.from_url(embedded.url)
        try:
            config = r.config_get("maxmemory*")
        finally:
            r.close()
    assert int(config["maxmemory"]) == 256 * 2**20 and config["maxmemory-policy"] == "volatile-lru"
