"""CacheRoutePolicy.observe (services/core/policies/cacheroute.py): what another router instance
routed enters this one's cold-home record and cold-tail memory, so a peer's evictions and spills
are seen here too (the record bus)."""

from __future__ import annotations

from services.core.policies import make_policy
from services.core.policies._common import Ring
from services.core.policy import Reason
from tests.unit.test_cacheroute_cold_home import blocks, cluster
from tests.unit.test_policies_rules import R, make_plan, request


def planned():
    p = make_policy("cacheroute", R)
    p.set_plan(make_plan({"a": (2,), "b": (2,), "c": (2,)}))
    return p


def test_a_peers_evictions_move_an_evicted_home_here():
    """Key "a" routed home by this instance, then a peer fills home with "b" and "c": home has
    evicted "a", which this instance learns only from the peer's observations."""
    alone, s = planned(), cluster()
    assert alone.pick(request("a", blocks(1)), s) == (2, Reason.PLANNED)
    s.prefill_tokens[2] = 6000
    told = planned()
    assert told.pick(request("a", blocks(1)), s) == (2, Reason.PLANNED)
    for tag, key in ((2, "b"), (3, "c")):
        told.observe(2, request(key, blocks(tag)), s)
    assert alone.pick(request("a", blocks(1)), s) == (2, Reason.PLANNED)     # its record: still held
    moved = told.pick(request("a", blocks(1)), s)
    assert moved.reason == Reason.FALLBACK and moved.replica != 2


def test_observe_sizes_the_record_and_updates_the_key_memory():
    p, s = planned(), cluster()
    assert p.remembered("z") is None
    p.observe(3, request("z", blocks(9)), s)
    assert p.remembered("z") == 3
    assert p._index is not None and p._index.match(3, blocks(9)) == len(blocks(9))
    p.observe(1, request("y", blocks(8)), s, memory=False)
    assert p.remembered("y") is None


def test_a_replica_outside_the_slots_or_no_pool_size_records_nothing():
    p, s = planned(), cluster()
    p.observe(R + 5, request("z", blocks(9)), s)
    assert p.remembered("z") is None and p._index is None
    p.observe(1, request("z", blocks(9)))          # no state: the pool size is unknown
    assert p._index is None and p.remembered("z") == 1


def test_a_cold_key_follows_a_peers_latest_replica():
    """The cold tail's memory learns where a peer sent the key, so the tier agrees on it."""
    p, s = planned(), cluster()
    owner = next(iter(Ring(R).walk("k")))
    other = (owner + 1) % R
    p.observe(other, request("k", blocks(7)), s)
    assert p.pick(request("k", blocks(7)), s) == (other, Reason.COLD)


def test_a_keyed_request_under_one_block_never_leaves_its_home():
    """Recorded by key (no block hashes: the HTTP API, Route calls): a request with less than one
    block of prompt caches nothing, so an "evicted" home costs it nothing and it stays planned (a
    Route call carries 0 prompt tokens; the e2e activation test routes those)."""
    from services.core.request import Request

    def keyed(key, tokens):
        return Request(rid=0, arrival=0.0, key=key, prompt_tokens=tokens, output_tokens=1)

    for tokens, stays in ((0, True), (15, True), (4000, False)):
        p, s = planned(), cluster()
        assert p.pick(keyed("a", 4000), s) == (2, Reason.PLANNED)
        for key in ("b", "c", "d"):
            p.observe(2, keyed(key, 20000), s)     # a peer fills home: "a" evicted from the record
        s.prefill_tokens[2] = 6000
        pick = p.pick(keyed("a", tokens), s)
        assert (pick == (2, Reason.PLANNED)) == stays, (tokens, pick)
