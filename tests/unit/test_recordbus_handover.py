"""The record bus's hand-over (services/dispatcher/recordbus.py, "Hand-over"): the codec, the
policy's absorb (a peer's state goes below the router's own, within the usual bounds), who answers
an asker, and one asker served end to end over an in-process channel. The same over a real
redis-server: tests/integration/test_recordbus_live.py."""

from __future__ import annotations

import asyncio
import random

import orjson
import pytest

from services.core.policies._caches import BlockLRU, Handover, KeyLRU
from services.core.policies.cacheroute import CacheRoutePolicy
from services.core.policy import ClusterState
from services.core.request import Request
from services.dispatcher.recordbus import (HANDOVER_MAGIC, BadBatch, RecordBus, decode_batch, decode_handover,
                                           encode_batch, encode_handover)
from services.dispatcher.router import Router
from services.model import Replica

BIG = (1 << 64) - 1


def router(n: int = 3) -> Router:
    r = Router([Replica(f"e{i}", f"127.0.0.1:{i + 1}") for i in range(n)], seed=1)
    r.state.healthy[:] = [True] * n
    r.state.kv_blocks[:] = [64] * n
    return r


def test_a_handover_of_blocks_round_trips_into_the_receivers_slots():
    state = Handover([("k1", 0), ("k2", 2)], "blocks", 64, [[1, 2], [], [3, BIG]])
    blob = encode_handover("giver#1", ["e0", "e1", "e2"], state)
    assert blob.startswith(HANDOVER_MAGIC)
    giver, got = decode_handover(blob, ["e2", "e0", "e1"])            # the receiver orders its slots otherwise
    assert giver == "giver#1" and got.kind == "blocks" and got.blocks == 64
    assert list(got.memory) == [("k1", 1), ("k2", 0)]
    assert [list(e) for e in got.record] == [[3, BIG], [1, 2], []]


def test_a_handover_of_keys_skips_replicas_the_receiver_does_not_have():
    state = Handover([("a", 0), ("b", 1)], "keys", 10, [[("a", 160)], [("b", 32), ("c", 16)]])
    giver, got = decode_handover(encode_handover("g", ["e0", "gone"], state), ["e0", "e1"])
    assert list(got.memory) == [("a", 0)]
    assert [list(e) for e in got.record] == [[("a", 160)], []]
    _, empty = decode_handover(encode_handover("g", ["e0"], Handover([], None, 0, ())), ["e0"])
    assert empty.kind is None and list(empty.memory) == [] and list(empty.record) == []


def _raw(head: dict, tail: bytes = b"") -> bytes:
    h = orjson.dumps(head)
    return HANDOVER_MAGIC + len(h).to_bytes(4, "little") + h + tail


GOOD = {"s": "g", "r": ["e0"], "m": [["k", 0]], "k": "blocks", "b": 4, "x": [1]}


@pytest.mark.parametrize("data, reason", [
    (b"", "garbage"),
    (encode_batch("s", 0, 0.1, [])[0], "garbage"),                # a batch is not a hand-over
    (_raw({**GOOD, "m": [["k", 1]]}, b"\0" * 8), "garbage"),        # names a replica index past its ids
    (_raw({**GOOD, "m": [["k", -1]]}, b"\0" * 8), "garbage"),
    (_raw({**GOOD, "m": [[1, 0]]}, b"\0" * 8), "garbage"),
    (_raw(GOOD, b"\0" * 16), "garbage"),                           # counts do not match the blocks
    (_raw({**GOOD, "k": "trees"}, b"\0" * 8), "garbage"),
    (_raw({**GOOD, "k": "keys", "x": [[["k", -5]]]}), "garbage"),
    (_raw(GOOD, b"\0" * 8) + b"\0" * 100, "oversize"),
])
def test_bad_handovers_are_refused(data, reason):
    limit = len(_raw(GOOD, b"\0" * 8)) + 50
    with pytest.raises(BadBatch) as err:
        decode_handover(data, ["e0"], max_bytes=limit)
    assert err.value.reason == reason
    decode_handover(_raw(GOOD, b"\0" * 8), ["e0"], max_bytes=limit)          # the good one passes


def policy(n: int = 3, **kw) -> CacheRoutePolicy:
    return CacheRoutePolicy(n, rng=random.Random(1), **kw)


def test_absorb_puts_a_peers_state_below_the_routers_own():
    giver, taker = policy(), policy()
    state = ClusterState.empty(3)
    state.kv_blocks[:] = [4, 4, 4]                                     # a record of 4 blocks per replica
    for key, replica, blocks in (("a", 0, (1, 2)), ("b", 0, (3, 4)), ("c", 1, (5,))):
        giver.observe(replica, Request(0, 0.0, key, 32, 0, blocks), state)
    taker.observe(0, Request(0, 0.0, "b", 16, 0, (9,)), state)         # routed since it started: newer
    taker.observe(2, Request(0, 0.0, "a", 16, 0, (8,)), state)
    taker.absorb(giver.handover())
    assert taker.remembered("a") == 2 and taker.remembered("b") == 0 and taker.remembered("c") == 1
    index = taker._index
    assert isinstance(index, BlockLRU)
    assert index.entries(0) == [1, 4, 3, 9]                            # a chain is touched tail first; the peer's oldest (2) went
    assert index.full[0] and index.entries(1) == [5] and index.entries(2) == [8]


def test_absorb_creates_the_record_keeps_the_memory_bound_and_skips_another_kind():
    giver = policy(memory_keys=4)
    state = ClusterState.empty(3)
    state.kv_blocks[:] = [8, 8, 8]
    for i in range(6):
        giver.observe(i % 3, Request(0, 0.0, f"k{i}", 16, 0, ()), state)   # no blocks: a record by key
    taker = policy(memory_keys=4)
    taker.absorb(giver.handover())
    assert isinstance(taker._index, KeyLRU) and taker._index.holds(2, "k5")
    assert len(taker._seen_old) + len(taker._seen) <= 4 and taker.remembered("k5") == 2
    other = policy()
    other.observe(0, Request(0, 0.0, "z", 16, 0, (1,)), state)         # a record of blocks
    other.absorb(giver.handover())
    assert isinstance(other._index, BlockLRU) and other._index.entries(0) == [1]
    assert other.remembered("k5") == 2                                 # the memory is taken all the same


def test_the_lowest_live_peer_not_asking_answers_each_asker_once():
    def bus(sender: str, **kw) -> RecordBus:
        return RecordBus(router(), None, sender, **kw)

    b = bus("b")
    b.peers = {"a": (0.0, 0, 0.1, True), "c": (0.0, 0, 0.1, False), "new": (0.0, 0, 0.1, True)}
    assert b._answers("new", 1.0)                  # "a" asks itself: "b" is the lowest giver
    assert not b._answers("new", 1.1)              # once
    c = bus("c")
    c.peers = dict(b.peers, b=(0.0, 0, 0.1, False))
    assert not c._answers("new", 1.0)
    asking = bus("a")
    asking.asking_until = 5.0
    assert not asking._answers("new", 1.0)
    assert not bus("a0", handover=False)._answers("new", 1.0)


class Channel:
    """The bus's channel in process: publish to every bus, hand-overs in a dict (SET NX, GETDEL)."""
    name = "test"

    def __init__(self):
        self.buses: list[RecordBus] = []
        self.kept: dict[str, bytes] = {}

    async def publish(self, data: bytes) -> int:
        for bus in self.buses:
            await bus.handle(data, asyncio.get_running_loop().time())
        return len(self.buses)

    async def put_handover(self, asker: str, blob: bytes, ttl: int) -> bool:
        return self.kept.setdefault(asker, blob) is blob

    async def take_handover(self, asker: str) -> bytes | None:
        return self.kept.pop(asker, None)


def test_a_starting_router_takes_a_peers_memory_and_record():
    async def main():
        ch = Channel()
        old, new = router(), router()
        givers = [RecordBus(old, None, "old"), RecordBus(new, None, "new")]
        for i in range(50):
            old.route(f"t{i}", 0.0, 160)             # before the bus: only the hand-over can carry these
        for bus in givers:
            bus.channel = ch
            ch.buses.append(bus)
            bus.router.routes_out = []
        homes = {f"t{i}": old.policy.remembered(f"t{i}") for i in range(50)}
        await givers[0].flush()                      # "old" is heard: a live peer
        givers[1].asking_until = asyncio.get_running_loop().time() + 60
        await givers[1].flush()                      # the asker's batch carries "h"
        for _ in range(50):
            await asyncio.sleep(0.01)
            if givers[0].handovers["given"]:
                break
        await givers[1].take_handover(0.0)
        return homes, givers

    homes, (old_bus, new_bus) = asyncio.run(main())
    assert old_bus.handovers["given"] == 1 and new_bus.handovers["taken"] == 1
    assert new_bus.asking_until is None
    assert None not in homes.values()
    assert all(new_bus.router.policy.remembered(k) == r for k, r in homes.items())


def test_an_asking_batch_says_so_and_a_plain_one_does_not():
    asking, _ = encode_batch("s", 0, 0.1, [], asking=True)
    plain, _ = encode_batch("s", 0, 0.1, [])
    assert decode_batch(asking).asking and not decode_batch(plain).asking


def test_a_giver_counts_only_a_handover_it_wrote_and_refuses_one_too_large(monkeypatch):
    import services.dispatcher.recordbus as rb

    async def give(bus):
        await bus.give_handover("new")
        return dict(bus.handovers)

    ch = Channel()
    r = router()
    for i in range(20):
        r.route(f"t{i}", 0.0, 160)
    first, second = RecordBus(r, None, "a0"), RecordBus(r, None, "a1")
    first.channel = second.channel = ch
    assert asyncio.run(give(first))["given"] == 1
    kept = ch.kept["new"]
    assert asyncio.run(give(second))["given"] == 0          # NX: the first one's stays, not counted
    assert ch.kept["new"] is kept
    ch.kept.clear()
    monkeypatch.setattr(rb, "MAX_HANDOVER_BYTES", 16)
    third = RecordBus(r, None, "a2")
    third.channel = ch
    counts = asyncio.run(give(third))
    assert counts["failed"] == 1 and counts["given"] == 0 and "new" not in ch.kept
