"""RedisStore keeps the plans it wrote or decoded (services/store/redis.py `get_plan`): the
control loop reads the active plan every interval, and decoding a million-key plan's JSON
takes seconds. A kept plan is handed back only while Redis still holds that version with the
same summary and size; a pruned version, or one written anew after the store lost its state,
is read again. Real redis-server and Redis Cluster."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools

import pytest

from services.core.planning import build_plan
from services.core.replan import replan_incremental
from services.errors import NotFound
from services.store import RedisStore
from services.store.keys import decode_plan, encode_plan

_prefixes = itertools.count()


@pytest.fixture(params=["redis", "redis-cluster"])
def any_redis_url(request):
    return request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")


def plans(version: int, seed: float = 1.0):
    keys = [f"tenant-{i}" for i in range(300)]
    rates = [seed * (1 + (i * 7919) % 97) for i in range(300)]
    first = build_plan(keys, rates, ["a", "b", "c"], q_cap=60.0, warm_slots=50, version=version, created_at=seed)
    rates2 = [r * (1.1 if i % 5 == 0 else 1.0) for i, r in enumerate(rates)]
    second = replan_incremental(first, keys, rates2, ["a", "b", "c"], 60.0, 50, version=version + 1,
                                created_at=seed + 1)
    return first, second


def test_a_written_plan_reads_back_equal_to_its_decoded_json():
    """What get_plan hands back without decoding is what decoding would give."""
    for plan in plans(1):
        assert decode_plan(encode_plan(plan)) == plan


def test_a_plan_written_or_read_once_is_not_decoded_again(any_redis_url):
    prefix = f"d{next(_prefixes)}"

    async def main():
        store = RedisStore(any_redis_url, prefix=prefix)
        other = RedisStore(any_redis_url, prefix=prefix)       # another planner: nothing kept yet
        try:
            first, second = plans(1)
            await store.put_plan(first)
            await store.put_plan(second)
            assert await store.get_plan(2) is second           # kept by the writer
            assert await store.get_plan(1) is first
            read = await other.get_plan(2)
            assert read == second and read is not second
            assert await other.get_plan(2) is read             # kept by the reader after one decode
        finally:
            await store.close()
            await other.close()

    asyncio.run(main())


def test_a_pruned_or_rewritten_version_is_read_again(any_redis_url):
    prefix = f"d{next(_prefixes)}"

    async def main():
        store = RedisStore(any_redis_url, prefix=prefix)
        other = RedisStore(any_redis_url, prefix=prefix)
        try:
            first, second = plans(1)
            await store.put_plan(first)
            await store.put_plan(second)
            await store.activate(2, expected=0, now=5.0)
            assert await store.prune_plans(0) == 1             # version 1 goes (not active, not in history)
            with pytest.raises(NotFound):
                await store.get_plan(1)
            # the store loses its state and another planner writes a different plan under
            # version 2 (no version number seen by `store` is lower, so it cannot tell)
            await other._redis.delete(other._p("plan:2"), other._p("summary:2"))
            _, again = plans(1, seed=3.0)
            await other.put_plan(again)
            got = await store.get_plan(2)
            assert got == again and got != second
        finally:
            await store.close()
            await other.close()

    asyncio.run(main())


def test_overlapping_version_calls_are_not_taken_for_a_lost_store(any_redis_url):
    """The planner's loop, its repairs and its engine changes take versions and read the control
    state at the same time on one store. A call that went out before another's answer raised the
    highest version seen may read a lower counter: that is no reset, so the kept plans stay and
    on_reset is not called, while puts of the taken versions land in any order."""
    prefix = f"d{next(_prefixes)}"

    async def main():
        store = RedisStore(any_redis_url, prefix=prefix)
        resets = []
        store.on_reset = lambda seen, counter: resets.append((seen, counter))
        try:
            first, _ = plans(1)
            await store.put_plan(first)
            for _ in range(30):
                got = await asyncio.gather(*(store.next_version() for _ in range(6)),
                                           *(store.get_control() for _ in range(3)))
                versions = got[:6]
                assert len(set(versions)) == 6
                for v in sorted(versions, reverse=True)[:2]:      # the newest first, then an older one
                    written = dataclasses.replace(first, version=v)
                    await store.put_plan(written)
                assert await store.get_plan(written.version) is written   # kept: nothing was cleared
            assert resets == []
        finally:
            await store.close()

    asyncio.run(main())
