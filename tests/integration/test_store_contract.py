"""One contract suite for both stores: RedisStore on a real redis-server and MemoryStore."""

from __future__ import annotations

import asyncio
import math

import pytest

from services.core.engines import EngineSet, add_engine, drain_engine
from services.core.plan import Plan, SwitchDecision
from services.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from services.store import (ArrivalRecord, CacheStatRecord, Fenced, FlatMode, MemoryStore, Mode, Pinned, RedisStore,
                            StaleVersion, TelemetryConfig)

CFG = TelemetryConfig(bucket_seconds=10, retention_seconds=600, gaps_per_bucket=5, log_per_bucket=4)
T0 = 1_700_000_000.0  # a bucket boundary (divisible by 10)


@pytest.fixture(params=["redis", "redis-cluster", "memory"])
def make_store(request):
    if request.param in ("redis", "redis-cluster"):
        url = request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")
        return lambda: RedisStore(url, telemetry=CFG)
    return lambda: MemoryStore(CFG)


def run(make_store, scenario):
    async def main():
        store = make_store()
        try:
            return await scenario(store)
        finally:
            await store.close()

    return asyncio.run(main())


def plan(version: int, parent: int = 0, keys=("a", "b")) -> Plan:
    return Plan(version=version, parent_version=parent, created_at=T0 + version, replica_ids=("r0", "r1"),
                q_cap=10.0, warm_slots=4, table={k: (i % 2,) for i, k in enumerate(keys)},
                rates={k: 1.0 for k in keys}, expected_load=(1.0, 1.0), predicted_imbalance=1.0,
                total_keys=len(keys), admitted_keys=len(keys), admitted_rate_share=1.0,
                decision=SwitchDecision(True, "first plan"))


# ------------------------------------------------------------------ telemetry


def test_window_rates_count_arrivals_per_key(make_store):
    async def scenario(store):
        arrivals = [ArrivalRecord("hot", T0 + i * 0.5, 100, 80) for i in range(40)]      # 20 s
        arrivals += [ArrivalRecord("cold", T0 + 3.0, 50, 10), ArrivalRecord("cold", T0 + 15.0, 70, 30)]
        assert await store.record_arrivals("b1", arrivals)
        return await store.window_rates(T0 + 20.0, 20.0)

    snap = run(make_store, scenario)
    assert snap.keys == ("hot", "cold")
    assert snap.window_seconds == pytest.approx(20.0)
    assert snap.rates == pytest.approx((2.0, 0.1))
    assert snap.mean_prompt_tokens == pytest.approx((100.0, 60.0))
    assert snap.mean_prefix_tokens == pytest.approx((80.0, 20.0))
    assert snap.total_arrivals == 42


def test_a_window_telemetry_has_filled_in_part_divides_by_the_part(make_store):
    """Collection began 10 s ago: a 60 s window's rates are over those 10 s, not 60; the first
    start recorded stays (a collector restart keeps it); without a start, the whole window."""
    async def scenario(store):
        arrivals = [ArrivalRecord("k", T0 + 50.0 + i * 0.5, 10, 5) for i in range(20)]
        await store.record_arrivals("b1", arrivals)
        unmarked = await store.window_rates(T0 + 60.0, 60.0)
        first = await store.mark_telemetry_start(T0 + 50.0)
        again = await store.mark_telemetry_start(T0 + 55.0)
        young = await store.window_rates(T0 + 60.0, 60.0)
        later = await store.window_rates(T0 + 200.0, 60.0)
        return unmarked, first, again, young, later

    unmarked, first, again, young, later = run(make_store, scenario)
    assert unmarked.window_seconds == pytest.approx(60.0) and unmarked.rates == pytest.approx((20 / 60,))
    assert first == again == T0 + 50.0
    assert young.window_seconds == pytest.approx(10.0) and young.rates == pytest.approx((2.0,))
    assert later.window_seconds == pytest.approx(60.0) and later.keys == ()


def test_window_excludes_old_buckets_and_snapshot_id_tracks_content(make_store):
    async def scenario(store):
        await store.record_arrivals("old", [ArrivalRecord("k", T0 - 100.0, 1, 1)])
        await store.record_arrivals("new", [ArrivalRecord("k", T0 + 1.0, 1, 1)])
        a = await store.window_rates(T0 + 5.0, 10.0)
        b = await store.window_rates(T0 + 5.0, 10.0)
        await store.record_arrivals("more", [ArrivalRecord("k", T0 + 2.0, 1, 1)])
        c = await store.window_rates(T0 + 5.0, 10.0)
        return a, b, c

    a, b, c = run(make_store, scenario)
    assert a.total_arrivals == 1 and c.total_arrivals == 2
    assert a.snapshot_id == b.snapshot_id != c.snapshot_id


def test_duplicate_batch_is_not_counted_twice(make_store):
    async def scenario(store):
        batch = [ArrivalRecord("k", T0 + 1.0, 10, 5), ArrivalRecord("k", T0 + 12.0, 10, 5)]  # two buckets
        first = await store.record_arrivals("same", batch)
        again = await store.record_arrivals("same", batch)
        flags = await store.record_arrival_batches([("x1", batch[:1]), ("same", batch), ("", batch[:1]), ("", batch[:1])])
        return first, again, flags, await store.window_rates(T0 + 19.0, 20.0)

    first, again, flags, snap = run(make_store, scenario)
    assert (first, again) == (True, False)
    assert flags == [True, False, True, True]   # empty batch ids are never deduplicated
    assert snap.total_arrivals == 2 + 1 + 2


def test_interarrival_and_log_are_bounded(make_store):
    async def scenario(store):
        arrivals = [ArrivalRecord(f"k{i}", T0 + i * 0.1, i, 0) for i in range(10)]
        await store.record_arrivals("b", arrivals)
        return await store.interarrival_sample(T0 + 9, 10.0), await store.recent_arrivals(T0 + 9, 10.0)

    gaps, log = run(make_store, scenario)
    assert len(gaps) == 5 and all(g == pytest.approx(0.1, abs=1e-5) for g in gaps)
    assert [r.key for r in log] == ["k6", "k7", "k8", "k9"]           # newest 4 kept
    assert log[-1] == ArrivalRecord("k9", T0 + 0.9, 9, 0)


def test_cache_counters_windowed_and_total(make_store):
    async def scenario(store):
        await store.record_cache_stats("c1", [CacheStatRecord("r0", 100, 60, 2)], now=T0 - 50)
        await store.record_cache_stats("c2", [CacheStatRecord("r0", 100, 20, 1), CacheStatRecord("r1", 10, 0, 1)], now=T0)
        dup = await store.record_cache_stats("c2", [CacheStatRecord("r1", 10, 0, 1)], now=T0)
        return dup, await store.cache_stats(T0 + 1, 10.0), await store.cache_totals()

    dup, window, total = run(make_store, scenario)
    assert dup is False
    assert (window["r0"].prompt_tokens, window["r0"].cached_tokens, window["r0"].requests) == (100, 20, 1)
    assert total["r0"].hit_rate == pytest.approx(0.4) and total["r1"].requests == 1


def test_output_counters_are_windowed_totalled_and_deduplicated(make_store):
    from services.model import mean_output_tokens

    async def scenario(store):
        await store.record_cache_stats("o1", [CacheStatRecord("r0", 100, 60, 2, 2, 500)], now=T0 - 50)
        await store.record_cache_stats("o2", [CacheStatRecord("r0", 100, 20, 1, 3, 300),
                                              CacheStatRecord("r1", 10, 0, 1, 1, 40),
                                              CacheStatRecord("r2", 10, 0, 1)], now=T0)   # cannot tell: 0, 0
        dup = await store.record_cache_stats("o2", [CacheStatRecord("r1", 10, 0, 1, 1, 40)], now=T0)
        return dup, await store.cache_stats(T0 + 1, 10.0), await store.cache_totals()

    dup, window, total = run(make_store, scenario)
    assert dup is False
    assert (window["r0"].completed, window["r0"].completion_tokens) == (3, 300)     # the old bucket is out
    assert (window["r1"].completed, window["r1"].completion_tokens) == (1, 40)      # the replay counted nothing
    assert (window["r2"].completed, window["r2"].completion_tokens, window["r2"].requests) == (0, 0, 1)
    assert mean_output_tokens(window.values()) == pytest.approx(340 / 4)
    assert (total["r0"].completed, total["r0"].completion_tokens) == (5, 800)
    assert mean_output_tokens(total.values()) == pytest.approx(840 / 6)
    assert mean_output_tokens([window["r2"]]) is None

def test_prefix_counts_windowed_deduplicated_and_bounded(make_store, monkeypatch):
    from services.core.prefixes import count_fields, samples_from_counts
    from services.store import contract, memory, redis as redis_store

    for module in (contract, memory, redis_store):
        monkeypatch.setattr(module, "PREFIX_FIELDS_PER_BUCKET", 5, raising=False)

    async def scenario(store):
        rows = [(T0 + 1, f, 1) for key in ("a", "b") for f in count_fields(key, [11, 22])]   # 4 fields
        assert await store.record_prefix_counts("p1", rows)
        assert not await store.record_prefix_counts("p1", rows)                # a replay counts nothing
        assert await store.record_prefix_counts("p2", [(T0 - 100, f, 7) for f in count_fields("a", [11])])
        flood = [(T0 + 2, f, 1) for i in range(10) for f in count_fields(f"x{i}", [99])]
        assert await store.record_prefix_counts("p3", flood)                  # only 1 new field fits
        return await store.prefix_counts(T0 + 5, 10.0), await store.prefix_counts(T0 + 5, 200.0)

    recent, wide = run(make_store, scenario)
    assert len(recent) == 5 and sum(recent.values()) == 5
    by_node = {s.node: s for s in samples_from_counts(recent)}
    assert by_node[11].count == 2 and by_node[22].count == 2 and by_node[22].parent == 11
    assert by_node[22].depth == 64 and len(by_node[11].keys) == 2
    assert {s.node: s.count for s in samples_from_counts(wide)}[11] == 9


def test_served_homes_latest_wins_windowed_and_bounded(make_store, monkeypatch):
    from services.store import contract, memory, redis as redis_store

    for module in (contract, memory, redis_store):
        monkeypatch.setattr(module, "HOME_FIELDS_PER_BUCKET", 3, raising=False)

    async def scenario(store):
        await store.record_homes([(T0 + 1, "a", "r0"), (T0 + 2, "b", "r1"), (T0 + 3, "a", "r2")])  # a: r2 wins
        await store.record_homes([(T0 + 12, "b", "r3")])               # a newer bucket: b moved to r3
        await store.record_homes([(T0 - 100, "old", "r0")])            # outside a 30 s window
        await store.record_homes([(T0 + 4, f"x{i}", "r0") for i in range(5)])   # only 1 new key fits
        await store.record_homes([(T0 + 5, "a", "r1")])                # an existing key still updates
        await store.record_homes([])
        return await store.served_homes(T0 + 15, 30.0), await store.served_homes(T0 + 15, 200.0)

    recent, wide = run(make_store, scenario)
    assert recent == {"a": "r1", "b": "r3", "x0": "r0"}
    assert wide == {**recent, "old": "r0"}


def test_window_beyond_retention_is_invalid(make_store):
    async def scenario(store):
        with pytest.raises(InvalidArgument):
            await store.window_rates(T0, CFG.retention_seconds * 2)
        with pytest.raises(InvalidArgument):
            await store.window_rates(T0, math.nan)

    run(make_store, scenario)


# ------------------------------------------------------------------ plans


def test_plans_are_written_once_and_listed_newest_first(make_store):
    async def scenario(store):
        v1, v2 = await store.next_version(), await store.next_version()
        await store.put_plan(plan(v1))
        await store.put_plan(plan(v2, v1, keys=("a", "b", "c")))
        with pytest.raises(FailedPrecondition):
            await store.put_plan(plan(v2))
        with pytest.raises(NotFound):
            await store.get_plan(99)
        await store.put_plan(plan(7))
        return (v1, v2, await store.get_plan(v2), await store.list_plans(), await store.list_plans(1, before_version=7),
                await store.next_version())

    v1, v2, got, listed, page, after = run(make_store, scenario)
    assert (v1, v2) == (1, 2)
    assert dict(got.table) == {"a": (0,), "b": (1,), "c": (0,)} and got.parent_version == 1
    assert got.decision == SwitchDecision(True, "first plan")
    assert [p.version for p in listed] == [7, 2, 1] and all(not p.table for p in listed)
    assert [p.version for p in page] == [2]
    assert after == 8   # the counter never hands out a stored version


def test_activation_is_compare_and_set_with_history_and_rollback(make_store):
    async def scenario(store):
        for v in (1, 2, 3):
            await store.put_plan(plan(v))
        out = {"first": await store.activate(1, expected=0, now=T0, reason="boot")}
        with pytest.raises(StaleVersion):
            await store.activate(2, expected=0, now=T0)
        with pytest.raises(NotFound):
            await store.activate(9, expected=1, now=T0)
        out["second"] = await store.activate(2, expected=1, now=T0 + 1)
        out["same"] = await store.activate(2, expected=2, now=T0 + 2)
        out["third"] = await store.activate(3, expected=2, now=T0 + 3)
        out["back"] = await store.rollback(expected=3, now=T0 + 4, reason="bad p99")
        out["explicit"] = await store.rollback(expected=2, to_version=1, now=T0 + 5)
        out["history"] = await store.history(10)
        out["control"] = await store.get_control()
        out["active"] = await store.get_active_plan()
        return out

    o = run(make_store, scenario)
    assert (o["first"].active_version, o["first"].previous_version, o["first"].changed) == (1, 0, True)
    assert o["same"].changed is False
    assert (o["back"].active_version, o["back"].previous_version) == (2, 3)
    assert o["explicit"].active_version == 1
    assert [(h.version, h.previous, h.event) for h in o["history"]] == [
        (1, 2, "rollback"), (2, 3, "rollback"), (3, 2, "activate"), (2, 1, "activate"), (1, 0, "activate")]
    assert o["history"][1].reason == "bad p99"
    assert o["control"].active_version == 1 and o["control"].latest_version == 3
    state, active = o["active"]
    assert active.version == 1 and state.active_version == 1


def test_rollback_without_previous_is_refused(make_store):
    async def scenario(store):
        await store.put_plan(plan(1))
        await store.activate(1, expected=0, now=T0)
        with pytest.raises(FailedPrecondition, match="no previously active"):
            await store.rollback(expected=1, now=T0)

    run(make_store, scenario)


def test_concurrent_activations_exactly_one_wins(make_store):
    async def scenario(store):
        for v in (1, 2, 3):
            await store.put_plan(plan(v))
        await store.activate(1, expected=0, now=T0)

        async def attempt(v):
            try:
                await store.activate(v, expected=1, now=T0)
                return v
            except StaleVersion:
                return None

        results = await asyncio.gather(*(attempt(v) for v in (2, 3) * 5))
        return results, (await store.get_control()).active_version

    results, active = run(make_store, scenario)
    winners = [r for r in results if r is not None]
    assert len(winners) == 1 and active == winners[0]


def test_mode_pin_and_events(make_store):
    async def scenario(store):
        await store.put_plan(plan(1))
        await store.put_plan(plan(2))
        async with store.subscribe() as sub:
            await store.activate(1, expected=0, now=T0)
            await store.set_mode(Mode.FLAT, reason="p99 out of range", now=T0 + 1)
            await store.set_mode(Mode.FLAT, reason="still", now=T0 + 2)           # no change, no event
            with pytest.raises(FlatMode):
                await store.activate(2, expected=1, now=T0, automatic=True)
            await store.set_mode(Mode.PLANNED, reason="ok", now=T0 + 3)
            with pytest.raises(FailedPrecondition):
                await store.pin(2)                                              # not active
            pinned = await store.pin(1)
            with pytest.raises(Pinned):
                await store.activate(2, expected=1, now=T0)
            await store.unpin()
            await store.activate(2, expected=1, now=T0 + 4)
            events = []
            while (ev := await sub.get(timeout=1.0)) is not None:
                events.append(ev)
                if len(events) == 4:
                    break
        return pinned, events, await store.get_control()

    pinned, events, control = run(make_store, scenario)
    assert pinned.pinned_version == 1
    assert [(e.event, e.active_version, e.mode) for e in events] == [
        ("activate", 1, Mode.PLANNED), ("mode", 1, Mode.FLAT), ("mode", 1, Mode.PLANNED), ("activate", 2, Mode.PLANNED)]
    assert control.mode is Mode.PLANNED and control.mode_reason == "ok" and control.pinned_version == 0


# ------------------------------------------------------------------ lease


def test_lease_is_exclusive_and_fencing_tokens_increase(make_store):
    async def scenario(store):
        await store.put_plan(plan(1))
        await store.put_plan(plan(2))
        t1 = await store.acquire_lease("p1", 0.3)
        blocked = await store.acquire_lease("p2", 0.3)
        again = await store.acquire_lease("p1", 0.3)
        renewed = await store.renew_lease("p1", t1, 0.3)
        wrong = await store.renew_lease("p2", t1, 0.3)
        await store.activate(1, expected=0, now=T0, fencing_token=t1)
        await asyncio.sleep(0.45)                                                # p1's lease expires
        t2 = await store.acquire_lease("p2", 5.0)
        info = await store.lease()
        with pytest.raises(Fenced):
            await store.activate(2, expected=1, now=T0, fencing_token=t1)        # deposed p1
        late_renew = await store.renew_lease("p1", t1, 5.0)
        await store.activate(2, expected=1, now=T0, fencing_token=t2)
        released = await store.release_lease("p2", t2)
        t3 = await store.acquire_lease("p1", 5.0)
        return t1, blocked, again, renewed, wrong, t2, info, late_renew, released, t3

    t1, blocked, again, renewed, wrong, t2, info, late_renew, released, t3 = run(make_store, scenario)
    assert blocked is None and again == t1 and renewed and not wrong
    assert t2 > t1 and info.holder == "p2" and info.token == t2 and 0 < info.ttl_seconds <= 5.0
    assert late_renew is False and released and t3 > t2


# ------------------------------------------------------------------ outages


def test_unreachable_redis_raises_unavailable():
    async def scenario():
        store = RedisStore("redis://127.0.0.1:1/0", timeout=0.5)
        try:
            for call in (store.ping, store.get_control, lambda: store.window_rates(T0, 10.0),
                         lambda: store.record_arrivals("b", [ArrivalRecord("k", T0, 1, 1)])):
                with pytest.raises(Unavailable, match=r"^redis unavailable at 127.0.0.1:1: "):
                    await call()
        finally:
            await store.close()

    asyncio.run(scenario())


def test_redis_restart_reconnects_on_next_call(redis_server):
    from services.local.redis_server import RedisProcess

    async def scenario(server):
        store = RedisStore(server.url, timeout=0.5)
        try:
            await store.set_mode(Mode.FLAT, reason="x", now=T0)
            server.stop()
            with pytest.raises(Unavailable):
                await store.get_control()
            server.start()
            return (await store.get_control()).mode
        finally:
            await store.close()

    with RedisProcess() as server:
        assert asyncio.run(scenario(server)) is Mode.PLANNED   # a fresh process: default mode


def test_prune_keeps_newest_active_pinned_and_history(make_store):
    async def scenario(store):
        for v in range(1, 9):
            await store.put_plan(plan(v))
        await store.activate(2, expected=0, now=T0)
        await store.activate(3, expected=2, now=T0)
        await store.pin(3)
        deleted = await store.prune_plans(keep=2)
        again = await store.prune_plans(keep=2)
        return deleted, again, [p.version for p in await store.list_plans(100)]

    deleted, again, left = run(make_store, scenario)
    assert (deleted, again) == (4, 0)          # 1, 4, 5, 6 go
    assert left == [8, 7, 3, 2]


# ------------------------------------------------------------------ the engine set


def test_engine_set_is_versioned_compare_and_set_and_fenced(make_store):
    """Absent reads as version 0; a write needs the stored version; the loser of two writers
    from the same version is refused; a stale lease token is refused; a reader sees the set
    exactly as written (slots, states, sources)."""
    async def scenario(store):
        empty = await store.get_engine_set()
        one = add_engine(EngineSet(), "127.0.0.1:1", now=T0)
        two = add_engine(one, "127.0.0.1:2", engine_id="b", now=T0)
        await store.put_engine_set(one, expected=0)
        await store.put_engine_set(two, expected=1)
        with pytest.raises(StaleVersion, match="stored version is 2"):
            await store.put_engine_set(add_engine(one, "127.0.0.1:3", now=T0), expected=1)   # lost the race
        with pytest.raises(InvalidArgument):
            await store.put_engine_set(two, expected=2)                                      # not above expected
        token = await store.acquire_lease("p1", 30)
        drained = drain_engine(two, "b", now=T0 + 1)
        with pytest.raises(Fenced):
            await store.put_engine_set(drained, expected=2, fencing_token=token + 1)
        await store.put_engine_set(drained, expected=2, fencing_token=token)
        return empty, await store.get_engine_set()

    empty, stored = run(make_store, scenario)
    assert empty == EngineSet() and empty.version == 0
    assert stored.version == 3
    assert [(e.slot, e.id, e.address, e.state) for e in stored.engines] == [
        (0, "e0", "127.0.0.1:1", "active"), (1, "b", "127.0.0.1:2", "draining")]
    assert stored.engines[1].changed_at == T0 + 1

# ------------------------------------------------------------------ caller budgets


def test_budget_is_a_token_bucket_per_caller(make_store):
    async def scenario(store):
        take = lambda caller, n, at: store.take_budget(caller, n, rate=10.0, burst=20.0, now=T0 + at)  # noqa: E731
        return [await take("a", 15, 0.0), await take("a", 15, 0.0),     # a full bucket of 20: 15, then 5
                await take("b", 25, 0.0),                                # another caller: its own bucket
                await take("a", 100, 0.5),                               # 0.5 s at 10/s: 5 more
                await take("a", 100, 0.4),                               # a clock behind: nothing refilled
                await take("a", 100, 60.0),                              # long idle: full again, not more
                await take("a", 0, 61.0), await take("a", -3, 61.0)]

    assert run(make_store, scenario) == [15, 5, 20, 5, 0, 20, 0, 0]


@pytest.mark.parametrize("url_fixture", ["redis_url", "redis_cluster_url"])
def test_budget_is_shared_by_every_client_of_the_store(url_fixture, request):
    """Two RedisStore clients (two dispatchers) draw on one bucket (a MemoryStore has one client)."""
    url = request.getfixturevalue(url_fixture)
    make_store = lambda: RedisStore(url, telemetry=CFG)   # noqa: E731

    async def scenario(store):
        other = make_store()          # a second dispatcher's connection to the same store
        try:
            got = [await s.take_budget("t", 7, rate=1.0, burst=10.0, now=T0) for s in (store, other, store)]
        finally:
            await other.close()
        return got

    assert run(make_store, scenario) == [7, 3, 0]
