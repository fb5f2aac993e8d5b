"""RedisStore on a real Redis Cluster beyond the contract suite (which runs on it too):
plan writes are acknowledged by a replica (WAIT on the writing connection), a single node
asked to WAIT for a replica it does not have still writes and counts the miss, keys of
every slot family land where their hash tag says, and the sync client speaks cluster too."""

from __future__ import annotations

import asyncio

from services.core.plan import Plan, SwitchDecision
from services.local.redis_cluster import key_slot
from services.store.connect import sync_client
from services.store import ArrivalRecord, Mode, RedisStore, TelemetryConfig

CFG = TelemetryConfig(bucket_seconds=10, retention_seconds=600)
T0 = 1_700_000_000.0


def plan(version: int) -> Plan:
    return Plan(version=version, parent_version=0, created_at=T0, replica_ids=("r0", "r1"), q_cap=10.0,
                warm_slots=4, table={"a": (0,), "b": (1,)}, rates={"a": 1.0, "b": 1.0}, expected_load=(1.0, 1.0),
                predicted_imbalance=1.0, total_keys=2, admitted_keys=2, admitted_rate_share=1.0,
                decision=SwitchDecision(True, "first plan"))


async def plan_writes(store: RedisStore) -> None:
    v = await store.next_version()
    await store.put_plan(plan(v))
    await store.activate(v, expected=0, now=T0)
    await store.set_mode(Mode.FLAT, reason="test", now=T0)
    await store.set_mode(Mode.PLANNED, reason="test", now=T0)
    token = await store.acquire_lease("p1", 5.0)
    assert token is not None


def test_plan_writes_are_on_a_replica_before_they_return(redis_cluster_url):
    async def scenario():
        store = RedisStore(redis_cluster_url, telemetry=CFG)
        try:
            await plan_writes(store)
            return store.unreplicated_writes, store.target.wait_replicas
        finally:
            await store.close()

    assert asyncio.run(scenario()) == (0, 1)


def test_a_write_no_replica_acknowledges_still_lands_and_is_counted(redis_url):
    async def scenario():
        store = RedisStore(redis_url + "?wait_replicas=1&wait_timeout_ms=20", telemetry=CFG)
        try:
            await plan_writes(store)
            state, active = await store.get_active_plan()
            return store.unreplicated_writes, state.active_version, active is not None
        finally:
            await store.close()

    missed, active, found = asyncio.run(scenario())
    assert missed == 6 and active == 1 and found       # next_version, put, activate, 2 modes, lease: all stored


def test_keys_spread_over_slots_by_their_hash_tags(redis_cluster, redis_cluster_url):
    async def scenario():
        store = RedisStore(redis_cluster_url, telemetry=CFG)
        try:
            await store.record_arrivals("b1", [ArrivalRecord("k", T0 + i * 10.0, 10, 5) for i in range(6)])
            await plan_writes(store)
        finally:
            await store.close()

    asyncio.run(scenario())
    client = sync_client(redis_cluster_url)
    try:
        keys = [k.decode() for node in client.get_primaries() for k in client.scan_iter(match="cr:*", target_nodes=node)]
    finally:
        client.close()
    plan_keys = [k for k in keys if "{plans}" in k]
    bucket_keys = [k for k in keys if "{tb:" in k]
    assert plan_keys and len(bucket_keys) >= 6 * 4
    assert len({key_slot(k) for k in plan_keys}) == 1
    slots = {key_slot(k) for k in bucket_keys}
    assert len(slots) == 6                               # one slot per time bucket
    owners = {redis_cluster.master_of(k) for k in bucket_keys}
    assert len(owners) >= 2                              # the buckets really are spread over masters
