"""Duplicated, reordered and replayed telemetry batches are counted once (idempotent batch
ids), including a replay after the collector was killed mid-stream."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import grpc
import pytest

from cacheroute.v1 import collector_pb2 as pb, collector_pb2_grpc
from services.store import RedisStore, TelemetryConfig
from tests.faults.procs import Procs

pytestmark = [pytest.mark.timeout(60)]

STORE = ["--bucket-seconds", "1", "--retention-seconds", "120"]
KEYS = ("a", "b", "c", "d")


def batch(i: int, now: float) -> pb.ArrivalBatch:
    """20 arrivals spread over ~3 one-second buckets, so each batch is split across buckets."""
    return pb.ArrivalBatch(batch_id=f"b{i}", source="fault-test", arrivals=[
        pb.Arrival(key=KEYS[j % 4], time=now - 2.5 + j * 0.125, prompt_tokens=100, prefix_tokens=50)
        for j in range(20)])


def stats(i: int) -> pb.CacheStatsBatch:
    return pb.CacheStatsBatch(batch_id=f"c{i}", source="engine-1", stats=[
        pb.CacheStat(replica_id="engine-1", prompt_tokens=1000, cached_tokens=400, requests=10)])


def send(stub, batches, pause: float = 0.0) -> pb.IngestSummary:
    def gen():
        for b in batches:
            yield b
            if pause:
                time.sleep(pause)
    return stub.ReportArrivals(gen(), timeout=10)


def counts(redis_url: str) -> tuple[dict[str, int], dict[str, tuple[int, int, int]]]:
    async def read():
        store = RedisStore(redis_url, telemetry=TelemetryConfig(bucket_seconds=1, retention_seconds=120))
        try:
            snap = await store.window_rates(time.time(), 30)
            totals = await store.cache_totals()
        finally:
            await store.close()
        per_key = {k: round(r * snap.window_seconds) for k, r in zip(snap.keys, snap.rates)}
        return per_key, {r: (c.prompt_tokens, c.cached_tokens, c.requests) for r, c in totals.items()}
    return asyncio.run(read())


def test_duplicated_reordered_and_replayed_batches_count_once(procs: Procs, redis_url):
    collector = procs.start("collector", "collector", ["--redis", redis_url, *STORE, "--window", "30"])
    now = time.time()
    first = [batch(i, now) for i in range(8)]
    rng = random.Random(7)
    with grpc.insecure_channel(collector.address) as ch:
        stub = collector_pb2_grpc.CollectorStub(ch)
        in_order = send(stub, first)
        # the same batches again, shuffled and doubled, on three concurrent streams
        replays, results = [], []
        for _ in range(3):
            dup = first + first[:4]
            rng.shuffle(dup)
            replays.append(dup)
        threads = [threading.Thread(target=lambda d=d: results.append(send(stub, d))) for d in replays]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        for s in (stats(0), stats(1), stats(0), stats(1), stats(1)):
            stub.ReportCacheStats(iter([s]), timeout=5)
        after_dups = counts(redis_url)

        # kill -9 the collector in the middle of a stream, restart it, replay everything (at least once)
        second = [batch(i, now) for i in range(8, 16)]
        sender = threading.Thread(target=lambda: _swallow(lambda: send(stub, second, pause=0.1)))
        sender.start()
        deadline = time.monotonic() + 5
        while sum(counts(redis_url)[0].values()) <= 160 and time.monotonic() < deadline:
            time.sleep(0.01)                                  # until part of the stream has landed
    collector.kill()
    sender.join(10)
    procs.restart(collector, same_port=True)
    with grpc.insecure_channel(collector.address) as ch:
        replay = send(collector_pb2_grpc.CollectorStub(ch), second[::-1])
    final = counts(redis_url)

    assert in_order.accepted == 160 and in_order.duplicate_batches == 0
    assert [r.duplicate_batches for r in results] == [12, 12, 12] and sum(r.accepted for r in results) == 0
    assert after_dups[0] == {k: 40 for k in KEYS}
    assert after_dups[1] == {"engine-1": (2000, 800, 20)}
    assert 0 < replay.duplicate_batches < 8                 # some landed before the kill, some did not
    assert final[0] == {k: 80 for k in KEYS}


def _swallow(fn) -> None:
    try:
        fn()
    except grpc.RpcError:
        pass
