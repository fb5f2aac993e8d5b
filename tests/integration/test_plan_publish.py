"""A plan another process wrote, published by the planner to every dispatcher worker at once
(issue 22: at 1,000,000 keys `bench/control_loop.py`'s dispatchers were never on the plan).

The bench writes and activates plans from its own process, so the planner must read the
plan's JSON back from Redis and decode it before it can cut chunks. Every watcher (two
dispatchers of two workers each) asked for it at the same moment, and each read and decoded
it for itself on the planner's event loop: while one decode held the loop, the other
watchers' reads passed their socket timeout (2 s by default, seconds of decode at a million
keys), their streams failed with UNAVAILABLE, they came back and did it again. Here the
same at a small scale: a socket timeout shorter than one decode, four watchers at once."""

from __future__ import annotations

import asyncio
import time

from cacheroute.v1 import planner_pb2 as pb, planner_pb2_grpc
from services.wire import codec
from services.core.plan import Plan
from services.planner.control import LoopConfig
from services.planner.service import PlannerConfig, PlannerService
from services.rpc import ServerConfig, aio_channel
from services.store import RedisStore, TelemetryConfig

KEYS = 60_000
WATCHERS = 4
TELEMETRY = TelemetryConfig(bucket_seconds=1, retention_seconds=120)
REPLICAS = tuple(f"r{i}" for i in range(8))


class CountingStore(RedisStore):
    """The real RedisStore, counting plan reads that went to Redis and were decoded."""

    decodes = 0

    async def get_plan(self, version: int) -> Plan:
        before = set(self._decoded)
        plan = await super().get_plan(version)
        if version not in before:
            self.decodes += 1
        return plan


def big_plan(version: int) -> Plan:
    table = {f"tenant-{i:06d}": (i % 8, (i + 3) % 8) if i % 5 == 0 else (i % 8,) for i in range(KEYS)}
    return Plan(version=version, parent_version=0, created_at=1.0, replica_ids=REPLICAS, q_cap=100.0,
                warm_slots=KEYS, table=table, rates={k: 1.0 + i % 7 for i, k in enumerate(table)},
                expected_load=(1.0,) * 8, predicted_imbalance=1.0, total_keys=KEYS, admitted_keys=KEYS,
                admitted_rate_share=1.0)


async def watch_once(address: str, version: int) -> tuple[int, int]:
    """Follow WatchPlans (columnar, as dispatchers do) until `version` arrived whole."""
    channel = aio_channel(address, None, 64 * 1024 * 1024)
    try:
        call = planner_pb2_grpc.PlannerStub(channel).WatchPlans(
            pb.WatchPlansRequest(include_table=True, columnar=True, max_chunk_bytes=256 * 1024), timeout=30)
        chunks = []
        async for update in call:
            if update.active_version == version:
                chunks.append(update.plan)
                if sum(len(c.columns.key_lengths) // 4 for c in chunks) >= KEYS:
                    break
        call.cancel()
        plan = codec.plan_from_slices(chunks, columnar=True)
        return plan.version, len(plan.table)
    finally:
        await channel.close()


def test_watchers_of_a_plan_written_elsewhere_share_one_read_and_decode(redis_url):
    async def scenario():
        writer = RedisStore(redis_url, telemetry=TELEMETRY, timeout=30)
        plan = big_plan(await writer.next_version())
        await writer.put_plan(plan)
        await writer.activate(plan.version, expected=0, now=time.time(), reason="test")
        start = time.process_time()
        codec.plan_from_json(codec.plan_to_json(plan))
        decode = time.process_time() - start
        # a socket timeout below one decode: a decode on the loop makes the others' reads miss it
        store = CountingStore(redis_url, telemetry=TELEMETRY, timeout=max(0.05, decode / 3))
        loop = LoopConfig(replica_ids=REPLICAS, q_cap=100.0, warm_slots=KEYS, planner_id="p-pub", window_seconds=30)
        planner = await PlannerService(PlannerConfig(
            server=ServerConfig(name="planner", port=0, metrics_port=-1, max_message_bytes=256 * 1024),
            loop=loop, redis_url=redis_url, telemetry=TELEMETRY, auto=False, repair=False), store=store).start()
        try:
            got = await asyncio.wait_for(asyncio.gather(
                *(watch_once(planner.address, plan.version) for _ in range(WATCHERS)), return_exceptions=True), 60)
        finally:
            await planner.stop(0)
            await store.close()
            await writer.close()
        return plan.version, got, store.decodes, decode

    version, got, decodes, decode = asyncio.run(scenario())
    assert decode > 0.05, f"the plan decodes in {decode:.3f} s: too small to show a blocked loop"
    assert got == [(version, KEYS)] * WATCHERS
    assert decodes == 1
