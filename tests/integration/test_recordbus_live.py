"""The record bus between live dispatchers (services/dispatcher/recordbus.py) on a real
redis-server: what one dispatcher routes is in the other's cold-home record and key memory within
a second, the other's share counts its open streams, bad messages on the channel are dropped and
counted without harm, the bus is off without a Redis store, a Redis Cluster carries it on a shard
channel, and two worker processes of one dispatcher are each other's peers and stop on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import urllib.request

import grpc
import orjson
import pytest
import redis

from cacheroute.v1 import dispatcher_pb2, dispatcher_pb2_grpc, engine_pb2
from services.core.policies._caches import BlockLRU, KeyLRU
from services.dispatcher.recordbus import MAX_BATCH_BYTES, encode_batch
from services.dispatcher.service import DispatcherService, serve
from services.engine.fleet import EngineFleet
from services.store import RedisStore
from tests.faults.procs import Procs
from tests.integration.test_dispatcher import dispatcher_config, wait_until

pytestmark = [pytest.mark.timeout(120)]
CHANNEL = "cr:{records}:bus"


def blocks_request(key: str, tag: int, n: int = 24, max_tokens: int = 2) -> engine_pb2.GenerateRequest:
    hashes = [tag * 1_000_000 + i for i in range(n)]
    return engine_pb2.GenerateRequest(request_id=f"{key}-{tag}", key=key, max_tokens=max_tokens,
                                      blocks=engine_pb2.PromptBlocks(block_hashes=hashes, prompt_tokens=16 * n))


async def pair(fleet: EngineFleet, redis_url: str, **kw) -> tuple[DispatcherService, DispatcherService]:
    a = await serve(dispatcher_config(fleet, redis_url=redis_url, dispatcher_id="a", seed=1, record_bus=True, **kw))
    b = await serve(dispatcher_config(fleet, redis_url=redis_url, dispatcher_id="b", seed=2, record_bus=True, **kw))
    ready = lambda d: all(d.router.state.healthy) and all(d.router.state.kv_blocks)   # noqa: E731
    await wait_until(lambda: ready(a) and ready(b))
    await wait_until(lambda: a.bus.peers and b.bus.peers)          # each has heard the other's heartbeat
    return a, b


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


@pytest.mark.parametrize("prefix_nodes", [False, True])
def test_what_a_routes_is_in_bs_record_within_a_second(redis_url, prefix_nodes):
    async def main():
        fleet = await EngineFleet(3, time_scale=0.01).start()
        a, b = await pair(fleet, redis_url, prefix_nodes=prefix_nodes)
        try:
            async with grpc.aio.insecure_channel(a.address) as ch:
                stub = dispatcher_pb2_grpc.DispatcherStub(ch)
                req = blocks_request("tenant-x", 7)
                [c async for c in stub.Generate(req, timeout=10)]
                assert sum(a.router.routed_to) == 1
                home = a.router.routed_to.index(1)
                took = await wait_until(lambda: b.router.policy.remembered("tenant-x") == home, timeout=5)
                index = b.router.policy._index
                if prefix_nodes:          # the request's cacheable blocks travel: a record of block hashes
                    hashes = tuple(req.blocks.block_hashes)
                    assert isinstance(index, BlockLRU) and index.match(home, hashes) >= 23
                    assert index.match((home + 1) % 3, hashes) == 0
                else:                     # a Generate carries no blocks to the router: a record by key
                    assert isinstance(index, KeyLRU)
                    assert index.holds(home, "tenant-x") and not index.holds((home + 1) % 3, "tenant-x")
                # A's own record has it from its pick; A never observes its own batches
                assert a.bus.own >= 1 and a.bus.received[1] == 0 and b.bus.received[1] == 1
                text = await asyncio.to_thread(scrape, b.running.metrics_port)
            return took, text
        finally:
            await a.stop()
            await b.stop()
            await fleet.stop()

    took, text = asyncio.run(main())
    assert took < 1.0, took
    assert 'cacheroute_dispatcher_record_entries_total{direction="received"} 1.0' in text
    assert "cacheroute_dispatcher_record_peers 1.0" in text
    assert re.search(r'cacheroute_dispatcher_record_batches_total\{direction="published"\} [1-9]', text)


def test_bs_share_counts_as_open_streams(redis_url):
    """A holds 6 long streams, B 2: B's own fraction is 2/8, its record's coverage 8/8. From 0 the
    share climbs to about 1 with the bus (it would settle near 0.25 without: the old estimate)."""
    async def main():
        fleet = await EngineFleet(3, time_scale=1.0).start()
        a, b = await pair(fleet, redis_url)
        calls = []
        try:
            async with grpc.aio.insecure_channel(a.address) as ca, grpc.aio.insecure_channel(b.address) as cb:
                sa, sb = dispatcher_pb2_grpc.DispatcherStub(ca), dispatcher_pb2_grpc.DispatcherStub(cb)
                calls = [sa.Generate(blocks_request(f"a{i}", i, max_tokens=4000), timeout=60) for i in range(6)]
                calls += [sb.Generate(blocks_request(f"b{i}", 10 + i, max_tokens=4000), timeout=60) for i in range(2)]
                for call in calls:
                    await call.read()                     # first chunk: the stream is open
                await wait_until(lambda: sum(b.router.outstanding) == 2 and b.router.peer_outstanding == 6
                                 and sum(b.router.engine_load) == 8, timeout=10)
                b.router.state.share = 0.0
                took = await wait_until(lambda: b.router.state.share > 0.85, timeout=10)
                await asyncio.sleep(1.0)
                return took, b.router.state.share, a.router.peer_outstanding
        finally:
            for call in calls:
                call.cancel()
            await a.stop()
            await b.stop()
            await fleet.stop()

    took, share, a_peers = asyncio.run(main())
    assert share > 0.85 and a_peers == 2, (share, a_peers)
    assert took < 5.0


def test_bad_messages_are_dropped_and_counted_and_the_bus_keeps_working(redis_url):
    async def main():
        fleet = await EngineFleet(3, time_scale=0.01).start()
        a, b = await pair(fleet, redis_url, record_batch_max=8)
        client = redis.Redis.from_url(redis_url)
        try:
            for data in (b"\x00garbage\xff" * 10, b"CRB1" + b"\x00" * 10, b"x" * (MAX_BATCH_BYTES + 1),
                         encode_batch("intruder", 0, 0.1, [("e0", f"k{i}", 16, ()) for i in range(9)])[0],
                         encode_batch("intruder", 0, 0.1, [("nowhere", "lost", 16, (1, 2))])[0]):
                assert client.publish(CHANNEL, data) == 2            # both dispatchers are subscribed
            await wait_until(lambda: all(d.bus.dropped["garbage"] == 2 and d.bus.dropped["oversize"] == 2
                                         and d.bus.dropped["unknown_replica"] == 1 for d in (a, b)), timeout=5)
            assert b.router.policy.remembered("lost") is None and b.router.policy.remembered("k0") is None
            async with grpc.aio.insecure_channel(a.address) as ch:
                stub = dispatcher_pb2_grpc.DispatcherStub(ch)
                decision = await stub.Route(dispatcher_pb2.RouteRequest(key="after", prompt_tokens=64), timeout=2)
                home = a.router.index_of(decision.replica_id)
                await wait_until(lambda: b.router.policy.remembered("after") == home, timeout=5)
            # the intruder's valid batch made it a peer (it reported 0 streams); it expires
            await wait_until(lambda: "intruder" not in b.bus.peers, timeout=5)
        finally:
            client.close()
            await a.stop()
            await b.stop()
            await fleet.stop()

    asyncio.run(main())


def test_no_bus_without_a_redis_store_or_when_turned_off(redis_url):
    async def main():
        fleet = await EngineFleet(2, time_scale=0.01).start()
        try:
            alone = DispatcherService(dispatcher_config(fleet, record_bus=True))
            off = DispatcherService(dispatcher_config(fleet, redis_url=redis_url, record_bus=False))
            on = DispatcherService(dispatcher_config(fleet, redis_url=redis_url))           # the default
            assert alone.bus is None and off.bus is None and on.bus is not None
            await alone.start()
            try:
                async with grpc.aio.insecure_channel(alone.address) as ch:
                    await dispatcher_pb2_grpc.DispatcherStub(ch).Route(dispatcher_pb2.RouteRequest(key="k"), timeout=2)
                assert alone.router.routes_out is None and alone.router.peer_outstanding == 0
            finally:
                await alone.stop()
            await off.store.close()
            await on.store.close()
        finally:
            await fleet.stop()

    asyncio.run(main())


def test_a_redis_cluster_carries_the_bus_on_a_shard_channel(redis_cluster_url):
    async def main():
        pub, sub_store = RedisStore(redis_cluster_url), RedisStore(redis_cluster_url)
        sub = sub_store.records().subscription()
        try:
            await sub.start()
            data = encode_batch("s", 1, 0.1, [("e0", "k", 16, (1,))])[0]
            got = None
            for _ in range(20):                      # a subscription may need a moment to take
                assert await pub.records().publish(data) >= 0
                got = await sub.get(timeout=0.5)
                if got is not None:
                    break
            assert got == data
            # a hand-over key in the Cluster: written once (NX), read and deleted once
            assert await pub.records().put_handover("d#1.aa", b"first", 30)
            assert not await pub.records().put_handover("d#1.aa", b"second", 30)
            assert await sub_store.records().take_handover("d#1.aa") == b"first"
            assert await sub_store.records().take_handover("d#1.aa") is None
        finally:
            await sub.close()
            await pub.close()
            await sub_store.close()

    asyncio.run(main())



def test_two_worker_processes_are_peers_and_stop_on_sigterm(procs: Procs, redis_url):
    engine = procs.start("engine", "engine-1", ["--replica-id", "engine-1", "--time-scale", "0.01"])
    sup = procs.start("dispatcher", "d1", ["--replicas", f"engine-1={engine.address}", "--workers", "2",
                                           "--http-port", "-1", "--poll-interval", "0.1", "--redis", redis_url,
                                           "--record-bus", "1"],
                      timeout=60)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = scrape(sup.metrics_port)
        if all(f'cacheroute_dispatcher_record_peers{{worker="{w}"}} 1.0' in text for w in "01"):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the workers never saw each other on the bus:\n"
                             + "\n".join(line for line in text.splitlines() if "record" in line))
    os.kill(sup.pid, signal.SIGTERM)
    sup.proc.wait(timeout=20)
    assert sup.proc.returncode == 0
    lines = [orjson.loads(line) for line in sup.log_path.read_bytes().splitlines() if line.startswith(b"{")]
    assert sum(1 for d in lines if d.get("msg") == "record bus on") == 2
    assert sum(1 for d in lines if d.get("msg") == "record bus stopped") == 2


def test_a_dispatcher_started_later_takes_a_peers_memory_by_hand_over(redis_url):
    """A routes keys while alone (asks for 3 s, nobody answers); B starts afterwards and has A's
    routes within a second of its start, though none of them crossed the bus while B was there."""
    async def main():
        fleet = await EngineFleet(3, time_scale=0.01).start()
        a = await serve(dispatcher_config(fleet, redis_url=redis_url, dispatcher_id="a", seed=1, record_bus=True))
        b = None
        try:
            await wait_until(lambda: all(a.router.state.healthy) and all(a.router.state.kv_blocks))
            async with grpc.aio.insecure_channel(a.address) as ch:
                stub = dispatcher_pb2_grpc.DispatcherStub(ch)
                for i in range(12):
                    [c async for c in stub.Generate(blocks_request(f"user-{i}", i, max_tokens=1), timeout=10)]
            homes = {f"user-{i}": a.router.policy.remembered(f"user-{i}") for i in range(12)}
            await wait_until(lambda: a.bus.asking_until is None, timeout=6)
            alone = dict(a.bus.handovers)
            t0 = time.monotonic()
            b = await serve(dispatcher_config(fleet, redis_url=redis_url, dispatcher_id="b", seed=2, record_bus=True))
            await wait_until(lambda: b.bus.handovers["taken"] == 1, timeout=5)
            took = time.monotonic() - t0
            got = {k: b.router.policy.remembered(k) for k in homes}
            text = await asyncio.to_thread(scrape, b.running.metrics_port)
            return homes, alone, dict(a.bus.handovers), got, took, text
        finally:
            await a.stop()
            if b is not None:
                await b.stop()
            await fleet.stop()

    homes, alone, given, got, took, text = asyncio.run(main())
    assert None not in homes.values() and got == homes
    assert alone["none"] == 1 and alone["taken"] == 0          # alone: asked, nobody answered
    assert given["given"] == 1 and took < 2.0, took
    assert 'cacheroute_dispatcher_record_handovers_total{outcome="taken"} 1.0' in text
    r = redis.Redis.from_url(redis_url)
    assert not r.keys("cr:{records}:handover:*")               # read and deleted
