"""The record bus (services/dispatcher/recordbus.py): the batch codec, the Router's hook that feeds
it, the receive side (own batches ignored, bad ones dropped and counted, peers' entries in the
policy's record) and the share's peer term. The Redis transport is tested in
tests/integration/test_recordbus_live.py."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from services.core.policy import ClusterState
from services.dispatcher.recordbus import (ALONE_BEACON, MAGIC, MAX_BATCH_BYTES, PEER_EXPIRY, BadBatch, Entry, RecordBus,
                                           decode_batch, encode_batch)
from services.dispatcher.router import SHARE_ROUNDS, Router
from services.model import Replica

BIG = (1 << 64) - 1          # block hashes are uint64: the top bit must survive


def router(n: int = 3) -> Router:
    r = Router([Replica(f"e{i}", f"127.0.0.1:{i + 1}") for i in range(n)], seed=1)
    r.state.healthy[:] = [True] * n
    r.state.kv_blocks[:] = [64] * n
    return r


def test_a_batch_round_trips():
    entries = [("e1", "k1", 300, (1, 2, BIG)), ("e0", "k2", 20, ()), ("e1", "k3", 0, (7,))]
    data, left = encode_batch("d1#1.ab", 5, 0.1, entries)
    assert left == 0 and data.startswith(MAGIC)
    b = decode_batch(data)
    assert (b.sender, b.outstanding, b.interval) == ("d1#1.ab", 5, 0.1)
    assert b.entries == (Entry("e1", "k1", 300, (1, 2, BIG)), Entry("e0", "k2", 20, ()), Entry("e1", "k3", 0, (7,)))
    empty, _ = encode_batch("d1#1.ab", 0, 0.1, [])
    assert decode_batch(empty).entries == ()


def test_entries_past_the_byte_budget_are_left_out_in_order():
    chain = tuple(range(1000))                       # 8,000 bytes of hashes each
    data, left = encode_batch("s", 0, 0.1, [("e0", f"k{i}", 16000, chain) for i in range(10)], max_bytes=30_000)
    b = decode_batch(data)
    assert len(b.entries) == 3 and left == 7 and [e.key for e in b.entries] == ["k0", "k1", "k2"]
    assert len(data) <= 30_000


def _raw(head: dict, tail: bytes = b"") -> bytes:
    h = orjson.dumps(head)
    return MAGIC + len(h).to_bytes(4, "little") + h + tail


GOOD = {"s": "x", "o": 0, "i": 0.1, "r": ["e0"], "e": [[0, "k", 10, 1]]}


@pytest.mark.parametrize("data, reason", [
    (b"", "garbage"),
    (b"\x00" * 40, "garbage"),
    (MAGIC + b"\xff\xff\xff\x00{}", "garbage"),                                   # header longer than the message
    (MAGIC + (3).to_bytes(4, "little") + b"{x}", "garbage"),                     # not JSON
    (_raw([1, 2]), "garbage"),                                                 # not an object
    (_raw({**GOOD, "s": ""}, b"\0" * 8), "garbage"),
    (_raw({**GOOD, "o": -1}, b"\0" * 8), "garbage"),
    (_raw({**GOOD, "o": 1.5}, b"\0" * 8), "garbage"),
    (_raw({**GOOD, "i": 0}, b"\0" * 8), "garbage"),
    (_raw({**GOOD, "r": [3]}, b"\0" * 8), "garbage"),
    (_raw({**GOOD, "e": [[1, "k", 10, 1]]}, b"\0" * 8), "garbage"),             # replica index out of range
    (_raw({**GOOD, "e": [[0, "", 10, 1]]}, b"\0" * 8), "garbage"),              # empty key
    (_raw({**GOOD, "e": [[0, "k" * 300, 10, 1]]}, b"\0" * 8), "garbage"),       # key over MAX_KEY_BYTES
    (_raw({**GOOD, "e": [[0, "k", 10]]}, b"\0" * 8), "garbage"),
    (_raw(GOOD), "garbage"),                                                   # names a block it lacks
    (_raw(GOOD, b"\0" * 16), "garbage"),                                       # a block left over
    (_raw(GOOD, b"\0" * 9), "garbage"),                                        # not whole uint64s
    (_raw({**GOOD, "e": [[0, "k", 1, 0]] * 5}), "oversize"),                   # over max_entries (4 here)
    (MAGIC + b"\0" * MAX_BATCH_BYTES, "oversize"),
])
def test_bad_batches_are_refused_with_a_reason(data, reason):
    with pytest.raises(BadBatch) as err:
        decode_batch(data, max_entries=4)
    assert err.value.reason == reason
    assert decode_batch(_raw(GOOD, b"\0" * 8)).entries == (Entry("e0", "k", 10, (0,)),)


def test_the_router_feeds_the_bus_up_to_its_cap():
    r = router()
    r.route("a", 0.0, 100, blocks=(1, 2))              # bus off: nothing collected
    assert r.routes_out is None
    r.routes_out, r.routes_cap = [], 3
    p = r.route("b", 0.0, 200, blocks=(3,))
    assert r.routes_out == [(p.replica, "b", 200, (3,))]
    picks = r.route_many([("c", 10, 0), ("d", 20, 0), ("e", 30, 0)], 0.0)
    assert r.routes_out[1:] == [(picks[0].replica, "c", 10, ()), (picks[1].replica, "d", 20, ())]
    assert r.routes_dropped == 1
    r.route("f", 0.0, 1)
    assert r.routes_dropped == 2 and len(r.routes_out) == 3


def _bus(r: Router, sender: str = "me", **kw) -> RecordBus:
    return RecordBus(r, None, sender, **kw)


def _handle(bus: RecordBus, data: bytes, now: float = 100.0) -> None:
    asyncio.run(bus.handle(data, now))


def test_a_peers_entries_enter_the_record_and_own_and_bad_ones_do_not():
    r = router()
    bus = _bus(r)
    blocks = tuple(range(10, 20))
    mine, _ = encode_batch("me", 2, 0.1, [("e2", "own", 160, blocks)])
    _handle(bus, mine)
    assert bus.own == 1 and r.policy._index is None and r.policy.remembered("own") is None
    theirs, _ = encode_batch("peer", 4, 0.1, [("e2", "k", 160, blocks), ("e9", "x", 16, (5,))])
    _handle(bus, theirs)
    assert r.policy.remembered("k") == 2 and r.policy._index.match(2, blocks) == len(blocks)
    assert bus.received == [1, 1] and bus.dropped["unknown_replica"] == 1
    _handle(bus, b"not a batch")
    _handle(bus, theirs[:-3])
    assert bus.dropped["garbage"] == 2 and bus.received == [1, 1]
    assert r.peer_outstanding == 4 and set(bus.peers) == {"peer"}


def test_peers_expire_after_three_of_their_intervals():
    r = router()
    bus = _bus(r)
    _handle(bus, encode_batch("p1", 3, 0.1, [])[0], now=10.0)
    _handle(bus, encode_batch("p2", 5, 1.0, [])[0], now=10.0)
    assert r.peer_outstanding == 8
    bus.expire(10.0 + PEER_EXPIRY * 0.1 - 0.01)
    assert r.peer_outstanding == 8
    bus.expire(10.0 + PEER_EXPIRY * 0.1 + 0.01)
    assert r.peer_outstanding == 5 and set(bus.peers) == {"p2"}
    _handle(bus, encode_batch("p2", 1, 1.0, [])[0], now=12.0)      # the latest count replaces the older
    assert r.peer_outstanding == 1


def test_a_large_batch_is_observed_in_chunks_into_the_policy_a_plan_install_put_in():
    r = router()
    bus = _bus(r, batch_max=2000)
    old = r.policy
    r.set_plan(None, flat=False, source="test")                    # a fresh policy, memory carried over
    assert r.policy is not old
    data, _ = encode_batch("peer", 0, 0.1, [(f"e{i % 3}", f"k{i}", 16, ()) for i in range(1000)])
    _handle(bus, data)
    assert bus.received[1] == 1000 and r.policy.remembered("k999") == 999 % 3


def test_the_share_counts_the_peers_outstanding_only_with_the_bus():
    def share_after(peers: int, own: int) -> float:
        r = router(2)
        r.peer_outstanding = peers
        for _ in range(own):
            r.stream_opened(0)
        r.state.share = 0.0
        r.stats_received(0, 0, 0, 10, 0.0, None)        # engines: 10 requests in flight
        return r.state.share

    weight = 1 / (SHARE_ROUNDS * 2)
    assert share_after(0, 3) == pytest.approx(0.3 * weight)        # the old estimate
    assert share_after(6, 3) == pytest.approx(0.9 * weight)        # own 3 + peers' 6 of 10
    assert share_after(6, 0) == pytest.approx(0.6 * weight)        # a peer's streams are evidence too
    assert share_after(0, 0) == 0.0                                # no evidence: unchanged
    assert share_after(30, 3) == pytest.approx(1.0 * weight)       # clamped


def test_bad_knobs_are_refused():
    with pytest.raises(ValueError, match="interval"):
        _bus(router(), interval=0)
    with pytest.raises(ValueError, match="batch max"):
        _bus(router(), batch_max=0)
    assert isinstance(ClusterState.empty(1).share, float)


class _Channel:
    """A bus channel that keeps (when, stamped interval) of each batch published."""
    name = "test"

    def __init__(self):
        self.published: list[tuple[float, float]] = []

    async def publish(self, data: bytes) -> None:
        self.published.append((time.monotonic(), decode_batch(data).interval))

    @property
    def sent(self) -> list[float]:
        return [interval for _, interval in self.published]


def test_alone_a_router_publishes_a_beacon_and_every_interval_once_it_hears_a_peer():
    async def main():
        r = router()
        bus = _bus(r, interval=0.05)
        bus.channel = _Channel()
        r.routes_out = []
        task = asyncio.create_task(bus._send_loop())
        await asyncio.sleep(0.8)                 # alone: the first tick (the beacon is 2 s later)
        alone = list(bus.channel.sent)
        for _ in range(6):                       # a live peer: its heartbeat every interval
            await bus.handle(encode_batch("peer", 1, 0.05, [])[0], time.monotonic())
            await asyncio.sleep(0.05)
        task.cancel()
        return alone, bus.channel.sent[len(alone):]

    alone, together = asyncio.run(main())
    assert len(alone) == 1 and set(alone) == {ALONE_BEACON}
    assert len(together) >= 4 and set(together) == {0.05}


def test_alone_the_send_loop_sleeps_until_the_beacon_and_a_peer_wakes_it_at_once():
    async def main():
        r = router()
        bus = _bus(r, interval=0.01, handover=False)
        bus.channel = _Channel()
        r.routes_out = []
        ticks = []
        expire = bus.expire
        bus.expire = lambda now: (ticks.append(now), expire(now))
        task = asyncio.create_task(bus._send_loop())
        await asyncio.sleep(0.3)                 # 30 intervals alone: one tick (the first), no idle ones
        alone_ticks = len(ticks)
        heard_at = time.monotonic()
        await bus.handle(encode_batch("peer", 1, 0.05, [])[0], heard_at)
        await asyncio.sleep(0.1)
        task.cancel()
        return alone_ticks, heard_at, [t for t, _ in bus.channel.published if t >= heard_at]

    alone_ticks, heard_at, after = asyncio.run(main())
    assert alone_ticks == 1
    assert after and after[0] - heard_at < 0.05 and len(after) >= 3     # at once, then every interval
