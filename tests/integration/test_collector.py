"""Collector service on a real redis-server and real gRPC (127.0.0.1, port 0)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cacheroute.v1 import collector_pb2 as pb
from cacheroute.v1 import collector_pb2_grpc
from services.collector.__main__ import main
from services.collector.ingest import arrival_problem, cache_stat_problem
from services.collector.service import CollectorConfig, CollectorService
from services.rpc import ServerConfig
from services.store import MemoryStore, TelemetryConfig

NOW = 1_700_000_100.0
TELEMETRY = TelemetryConfig(bucket_seconds=10, retention_seconds=600)


def config(redis_url: str, **kw) -> CollectorConfig:
    return CollectorConfig(server=ServerConfig(name="collector", port=0, metrics_port=-1), redis_url=redis_url,
                           telemetry=TELEMETRY, window_seconds=60, clock=lambda: NOW, **kw)


async def with_collector(cfg: CollectorConfig, scenario, store=None):
    service = await CollectorService(cfg, store).start()
    try:
        async with grpc.aio.insecure_channel(service.address) as ch:
            return await scenario(collector_pb2_grpc.CollectorStub(ch), ch, service)
    finally:
        await service.stop(0)


def arrivals_batch(batch_id: str, items) -> pb.ArrivalBatch:
    return pb.ArrivalBatch(batch_id=batch_id, source="d0",
                           arrivals=[pb.Arrival(key=k, time=t, prompt_tokens=p, prefix_tokens=x) for k, t, p, x in items])


def test_arrivals_in_windowed_rates_out(redis_url):
    batches = [arrivals_batch(f"b{i}", [("hot", NOW - 60 + i, 200, 150)] * 3 + [("cold", NOW - 30, 90, 10)] * (i % 2))
               for i in range(60)]

    async def scenario(stub, ch, service):
        summary = await stub.ReportArrivals(iter(batches), timeout=5)
        rates = await stub.GetRates(pb.GetRatesRequest(), timeout=5)
        top1 = await stub.GetRates(pb.GetRatesRequest(window_seconds=60, limit=1), timeout=5)
        return summary, rates, top1

    summary, rates, top1 = asyncio.run(with_collector(config(redis_url), scenario))
    assert (summary.batches, summary.accepted, summary.rejected, summary.duplicate_batches) == (60, 210, 0, 0)
    assert rates.window_seconds == pytest.approx(60.0)      # NOW - 60 is a bucket boundary
    assert [(r.key, round(r.rate, 6)) for r in rates.rates] == [("hot", 3.0), ("cold", 0.5)]
    assert rates.rates[0].mean_prompt_tokens == pytest.approx(200) and rates.rates[1].mean_prefix_tokens == pytest.approx(10)
    assert rates.total_arrivals == 210 and rates.snapshot_id
    assert [r.key for r in top1.rates] == ["hot"]


def test_arrivals_carry_the_replica_they_were_served_on(redis_url):
    """The planner's served homes (services.core.replan.served_homes) come from these records:
    a key's latest replica wins; arrivals without a replica (or an over-long one) carry none."""
    batch = pb.ArrivalBatch(batch_id="h1", source="d0", arrivals=[
        pb.Arrival(key="a", time=NOW - 20, prompt_tokens=10, replica="e1"),
        pb.Arrival(key="a", time=NOW - 5, prompt_tokens=10, replica="e3"),
        pb.Arrival(key="b", time=NOW - 5, prompt_tokens=10),
        pb.Arrival(key="c", time=NOW - 5, prompt_tokens=10, replica="x" * 65),
        pb.Arrival(key="", time=NOW - 5, prompt_tokens=10, replica="e2")])       # invalid: no key

    async def scenario(stub, ch, service):
        summary = await stub.ReportArrivals(iter([batch]), timeout=5)
        return summary, await service.store.served_homes(NOW, 60)

    summary, homes = asyncio.run(with_collector(config(redis_url), scenario))
    assert (summary.accepted, summary.rejected) == (4, 1)
    assert homes == {"a": "e3"}


def test_invalid_records_are_rejected_and_valid_ones_kept(redis_url):
    batch = arrivals_batch("mixed", [
        ("ok", NOW - 1, 10, 5),
        ("", NOW - 1, 10, 5),                       # empty key
        ("x" * 257, NOW - 1, 10, 5),                # oversized key
        ("late", NOW + 61, 10, 5),                  # > 60 s in the future
        ("old", NOW - 601, 10, 5),                  # older than retention
        ("nan", float("nan"), 10, 5),
        ("ok", NOW - 2, 12, 5),
    ])
    stats = pb.CacheStatsBatch(batch_id="c", stats=[
        pb.CacheStat(replica_id="r0", prompt_tokens=100, cached_tokens=40, requests=2, completed=2,
                     completion_tokens=300),
        pb.CacheStat(replica_id="r1", prompt_tokens=10, cached_tokens=11, requests=1),   # cached > prompt
        pb.CacheStat(replica_id="r2", prompt_tokens=-1, cached_tokens=0, requests=1),    # negative
        pb.CacheStat(replica_id="r3", prompt_tokens=10, cached_tokens=0, requests=1, completion_tokens=5),  # done: 0
    ])

    async def scenario(stub, ch, service):
        a = await stub.ReportArrivals(iter([batch]), timeout=5)
        c = await stub.ReportCacheStats(iter([stats]), timeout=5)
        rates = await stub.GetRates(pb.GetRatesRequest(window_seconds=60), timeout=5)
        return a, c, rates, await service.store.cache_totals()

    a, c, rates, totals = asyncio.run(with_collector(config(redis_url), scenario))
    assert (a.accepted, a.rejected) == (2, 5)
    assert a.first_rejection == "batch mixed arrival 1: empty key"
    assert (c.accepted, c.rejected) == (1, 3) and "cached_tokens 11 > prompt_tokens 10" in c.first_rejection
    assert [(r.key, r.rate * 60) for r in rates.rates] == [("ok", pytest.approx(2.0))]
    # the window's mean output length, the capacity advisor's input (services/planner/advisor.py)
    assert (rates.completed_requests, rates.mean_output_tokens) == (2, pytest.approx(150.0))
    assert list(totals) == ["r0"] and totals["r0"].hit_rate == pytest.approx(0.4)


def test_duplicate_batches_are_not_counted_twice(redis_url):
    batch = arrivals_batch("dup-1", [("k", NOW - 5, 1, 1)] * 4)

    async def scenario(stub, ch, service):
        first = await stub.ReportArrivals(iter([batch, batch]), timeout=5)
        retry = await stub.ReportArrivals(iter([batch]), timeout=5)           # a client retrying the stream
        rates = await stub.GetRates(pb.GetRatesRequest(window_seconds=60), timeout=5)
        return first, retry, rates

    first, retry, rates = asyncio.run(with_collector(config(redis_url), scenario))
    assert (first.accepted, first.duplicate_batches) == (4, 1)
    assert (retry.accepted, retry.duplicate_batches) == (0, 1)
    assert rates.total_arrivals == 4


class SlowStore(MemoryStore):
    """A memory store whose writes take time, to make the write queue fill up."""

    def __init__(self) -> None:
        super().__init__(TELEMETRY)
        self.max_depth = 0
        self.queue = None

    async def record_arrival_batches(self, batches):
        self.max_depth = max(self.max_depth, self.queue.qsize())
        await asyncio.sleep(0.005)
        return await super().record_arrival_batches(batches)


def test_write_queue_is_bounded_and_every_batch_lands():
    store = SlowStore()
    cfg = config("memory://", queue_size=2, writers=1, coalesce=1)
    batches = [arrivals_batch(f"b{i}", [("k", NOW - 1, 1, 1)]) for i in range(40)]

    async def scenario(stub, ch, service):
        store.queue = service.ingestor.queue
        summary = await stub.ReportArrivals(iter(batches), timeout=10)
        return summary, await store.window_rates(NOW, 10)

    summary, snap = asyncio.run(with_collector(cfg, scenario, store))
    assert summary.accepted == 40 and snap.total_arrivals == 40
    assert 1 <= store.max_depth <= 2


def test_redis_down_gives_unavailable_and_the_service_stays_up():
    async def scenario(stub, ch, service):
        codes = []
        for call in (lambda: stub.ReportArrivals(iter([arrivals_batch("b", [("k", NOW, 1, 1)])]), timeout=5),
                     lambda: stub.GetRates(pb.GetRatesRequest(), timeout=5)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call()
            codes.append((err.value.code(), err.value.details()))
        health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="cacheroute.v1.Collector"), timeout=2)
        return codes, health.status

    codes, status = asyncio.run(with_collector(config("redis://127.0.0.1:1/0"), scenario))
    assert [c for c, _ in codes] == [grpc.StatusCode.UNAVAILABLE] * 2
    assert all(d.startswith("redis unavailable at 127.0.0.1:1") and "\n" not in d for _, d in codes)
    assert status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("args, problem", [
    (("k", NOW, 1, 1), None),
    (("\ud800", NOW, 1, 1), "key is not valid UTF-8"),
    (("k", float("inf"), 1, 1), "time is inf"),
    (("k", NOW, -1, 0), "prompt_tokens -1 out of range"),
])
def test_arrival_validation(args, problem):
    assert arrival_problem(*args, now=NOW, retention_seconds=600) == problem


def test_cache_stat_validation():
    assert cache_stat_problem("r0", 10, 10, 1) is None
    assert cache_stat_problem("r|0", 10, 1, 1) == "replica_id too long or contains '|'"
    assert cache_stat_problem("r0", 10, 1, -3) == "requests -3 out of range"


def test_help_lists_env_vars(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "CACHEROUTE_REDIS_URL" in out and "CACHEROUTE_COLLECTOR_QUEUE" in out
