"""Per-caller telemetry budget (services.dispatcher.budget): a token bucket per caller."""

from __future__ import annotations

import pytest

from services.dispatcher.budget import BudgetConfig, CallerBudget
from services.dispatcher.router import Router
from services.model import Replica


def test_burst_then_rate_per_caller():
    b = CallerBudget(BudgetConfig(rate=10, burst=50))
    assert b.take("a", 9000, 0.0) == 50            # one big batch: only the burst
    assert b.take("a", 100, 0.0) == 0
    assert b.take("a", 100, 2.0) == 20             # 2 s at 10/s
    assert b.take("b", 30, 2.0) == 30              # another caller has its own bucket
    assert b.take("a", 100, 1000.0) == 50          # refills to the burst, no more


def test_unbounded_when_rate_is_zero_and_bad_configs_refused():
    assert CallerBudget(BudgetConfig(rate=0)).take("a", 10**6, 0.0) == 10**6
    for bad in (dict(rate=-1), dict(burst=0), dict(max_callers=0)):
        with pytest.raises(ValueError):
            BudgetConfig(**bad)


def test_caller_table_is_bounded_and_a_drained_bucket_outlives_idle_ones():
    b = CallerBudget(BudgetConfig(rate=1, burst=10, max_callers=100))
    for i in range(99):
        b.take(f"idle{i}", 1, 0.0)
    b.take("heavy", 10, 20.0)                      # drained at t=20; the idle ones refilled by then
    for i in range(300):
        b.take(f"new{i}", 1, 20.0)
        assert len(b._buckets) <= 100
    assert b.take("heavy", 10, 20.0) == 0          # its bucket survived the evictions of idle ones


def test_route_many_reports_only_the_granted_arrivals():
    r = Router([Replica("e0", "x"), Replica("e1", "y")], seed=1)
    r.state.healthy[:] = [True, True]
    picks = r.route_many([(f"k{i}", 0, 0) for i in range(10)], 5.0, report=(3, 10))
    assert len(picks) == 10 and r.routed == 10
    assert len(r.drain_telemetry()) == 3 and r.telemetry_capped == 7
    # a random sample through the batch, not its head, whatever the batch's period
    r.route_many([(f"k{i % 300}", 0, 0) for i in range(9000)], 5.0, report=(600, 9000))
    sample = [k for k, *_ in r.drain_telemetry()]
    assert len(sample) == 600 and len(set(sample)) > 200 and max(map(sample.count, set(sample))) < 12
    r.route("x", 6.0, report=False)
    assert r.drain_telemetry() == [] and r.routed == 9011


def test_route_avoids_a_replica_unless_it_is_the_only_healthy_one():
    from services.core.policy import NoHealthyReplica

    r = Router([Replica("e0", "x"), Replica("e1", "y")], seed=1)
    r.state.healthy[:] = [True, True]
    assert {r.route(f"k{i}", 0.0, avoid=0).replica for i in range(20)} == {1}
    assert r.state.healthy == [True, True]
    r.state.healthy[1] = False
    with pytest.raises(NoHealthyReplica):
        r.route("k", 0.0, avoid=0)
    assert r.state.healthy == [True, False]


def test_http_callers_are_named_as_grpc_callers():
    from services.dispatcher.budget import http_caller

    assert http_caller("acme", True, "10.0.0.5") == "tenant:acme"
    assert http_caller("", True, "10.0.0.5") is None                 # the deployment token: not budgeted
    assert http_caller("", False, "10.0.0.5") == "ipv4:10.0.0.5"      # as services.dispatcher.servicer.peer_host
    assert http_caller("", False, "::1") == "ipv6:[::1]"
    assert http_caller("", False, None) == "ipv4:local"


def test_shared_budget_uses_the_store_and_falls_back_to_the_local_bucket():
    import asyncio

    from services.dispatcher.budget import SharedBudget
    from services.store import MemoryStore

    async def main():
        store = MemoryStore()
        shared = SharedBudget(BudgetConfig(rate=10, burst=20), store, retry_after=2.0)
        other = SharedBudget(BudgetConfig(rate=10, burst=20), store)          # a second dispatcher
        got = [await shared.take("t", 15, 0.0), await other.take("t", 15, 0.0)]
        store.down = True
        got += [await shared.take("t", 15, 0.1), shared.fallbacks]           # the local bucket, full
        store.down = False
        got += [await shared.take("t", 5, 1.0), await shared.take("t", 5, 2.2)]   # still local; then the store
        local = SharedBudget(BudgetConfig(rate=10, burst=20, scope="local"), store)
        got += [local.shared, await local.take("u", 25, 0.0)]
        return got

    # the store's bucket: 15 + 5 of 20; then local: 15 (and 15 counted as fallbacks), then
    # 5 more locally (1 s later); at 2.2 s back on the store (2.2 s x 10/s refilled, capped at 20)
    assert asyncio.run(main()) == [15, 5, 15, 15, 5, 5, False, 20]


def test_deferred_arrivals_one_call_per_caller_a_sample_in_time_order_and_a_bound():
    import asyncio

    from services.dispatcher.budget import DeferredArrivals, SharedBudget
    from services.store import MemoryStore

    class Counting(MemoryStore):
        calls: list = []

        async def take_budget(self, caller, n, **kw):
            self.calls.append((caller, n))
            return await super().take_budget(caller, n, **kw)

    async def main():
        r = Router([Replica("e0", "x"), Replica("e1", "y")], seed=1)
        store = Counting()
        deferred = DeferredArrivals(SharedBudget(BudgetConfig(rate=0.001, burst=30), store), r, capacity=150, seed=3)
        for n in range(100):
            deferred.add("heavy", f"h{n}", float(n), 10, 5, (), n % 2)
        for n in range(20):
            deferred.add("light", f"l{n}", float(n) + 0.5, 10, 5, (), 0)
        for n in range(40):                     # over the capacity of 150: 10 dropped
            deferred.add("late", f"z{n}", 200.0, 10, 5, (), 1)
        assert len(deferred) == 150 and r.telemetry_dropped == 10 and r.telemetry == []
        await deferred.settle(now=300.0)
        return r, store.calls

    r, calls = asyncio.run(main())
    assert sorted(calls) == [("heavy", 100), ("late", 30), ("light", 20)], "one call per caller"
    heavy = [a for a in r.telemetry if a[0].startswith("h")]
    assert len(heavy) == 30 and r.telemetry_capped == 70
    assert [a[1] for a in heavy] == sorted(a[1] for a in heavy), "in time order, their own times"
    assert max(a[1] for a in heavy) - min(a[1] for a in heavy) > 50, "a sample through the run, not its head"
    assert all(a[5] == ("e1" if int(a[0][1:]) % 2 else "e0") for a in heavy), "the replica each was sent to"
    assert sum(a[0].startswith("l") for a in r.telemetry) == 20
    assert sum(a[0].startswith("z") for a in r.telemetry) == 30
