"""In-process route decision time: the dispatcher's Router.route vs a dict lookup.

Setup: 30 replicas, all healthy, random loads; a plan with 128 admitted keys (every 8th
key on 2 replicas); traffic mixes admitted keys and cold keys (1 in 4 cold). Measured:
- baseline: `table.get(key)` for the same keys (a plain dict lookup, the floor);
- policy.pick alone (the cacheroute policy), planned and cold keys;
- Router.route: pick + load/counter/telemetry bookkeeping (what a Route RPC runs);
- the RouteBatch servicer on 1,000-key requests: parse, route, encode, serialize (per decision).
Each figure is the best of `--repeats` passes over `--n` keys; printed as µs per call and
as a ratio to the baseline of the same run. Goal: Router.route ≤ 5 µs.

    .venv/bin/python bench/route_decision.py [--n 200000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from services.core.plan import Plan
from services.dispatcher.router import Router
from services.model import Replica


def make_plan(replicas: int, keys: int) -> Plan:
    ids = tuple(f"r{i}" for i in range(replicas))
    table = {f"tenant-{k}": ((k % replicas, (k + 7) % replicas) if k % 8 == 0 else (k % replicas,)) for k in range(keys)}
    return Plan(version=1, parent_version=0, created_at=0.0, replica_ids=ids, q_cap=10.0, warm_slots=8,
                table=table, rates={k: 1.0 for k in table}, expected_load=(1.0,) * replicas,
                predicted_imbalance=1.0, total_keys=keys * 4, admitted_keys=keys, admitted_rate_share=0.75)


def best_per_call(fn, keys: list[str], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(keys)
        best = min(best, time.perf_counter() - t0)
    return best / len(keys) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--replicas", type=int, default=30)
    args = ap.parse_args(argv)

    rng = random.Random(1)
    plan = make_plan(args.replicas, 128)
    router = Router([Replica(rid, f"127.0.0.1:{7000 + i}") for i, rid in enumerate(plan.replica_ids)], seed=1,
                    telemetry_capacity=args.n + 1)
    router.state.healthy[:] = [True] * args.replicas
    router.state.in_flight[:] = [rng.randrange(50) for _ in range(args.replicas)]
    router.set_plan(plan, flat=False, source="bench")
    admitted = list(plan.table)
    mixed = [f"cold-{rng.randrange(10**6)}" if rng.random() < 0.25 else rng.choice(admitted) for _ in range(args.n)]
    planned = [rng.choice(admitted) for _ in range(args.n)]
    cold = [f"cold-{rng.randrange(10**6)}" for _ in range(args.n)]
    table = dict(plan.table)
    policy, state = router.policy, router.state

    def baseline(keys):
        get = table.get
        for k in keys:
            get(k)

    class Probe:
        __slots__ = ("key",)
        blocks = ()                     # no prompt blocks: the cold-home rule's index is per key
    probe = Probe()

    def pick_only(keys):
        pick = policy.pick
        for k in keys:
            probe.key = k
            pick(probe, state)

    def route(keys):
        r = router.route
        now = time.time()
        for k in keys:
            r(k, now, 1000, 512)
        router.drain_telemetry()
        state.in_flight[:] = [rng.randrange(50) for _ in range(args.replicas)]

    rows = [("dict lookup (baseline)", best_per_call(baseline, mixed, args.repeats))]
    rows.append(("policy.pick, admitted keys", best_per_call(pick_only, planned, args.repeats)))
    rows.append(("policy.pick, cold keys (P2C)", best_per_call(pick_only, cold, args.repeats)))
    rows.append(("Router.route, admitted keys", best_per_call(route, planned, args.repeats)))
    rows.append(("Router.route, cold keys", best_per_call(route, cold, args.repeats)))
    rows.append(("Router.route, 75/25 mix", best_per_call(route, mixed, args.repeats)))

    # RouteBatch as the servicer runs it: parse 1,000 requests, route, encode, serialize
    from cacheroute.v1 import dispatcher_pb2
    from services.dispatcher.servicer import DispatcherServicer, KeyRules

    servicer = DispatcherServicer(router, None, KeyRules(), "bench")   # type: ignore[arg-type]
    wire = dispatcher_pb2.RouteBatchRequest(requests=[dispatcher_pb2.RouteRequest(key=k, prompt_tokens=1000)
                                                      for k in mixed[:1000]]).SerializeToString()

    loop = asyncio.new_event_loop()       # RouteBatch yields the loop between slices: run it on one

    async def batches(n: int) -> None:
        for _ in range(n):
            reply = await servicer.RouteBatch(dispatcher_pb2.RouteBatchRequest.FromString(wire), None)
            if len(reply.SerializeToString()) == 0 or len(reply.decisions) != 1000:
                raise SystemExit(f"RouteBatch answered {len(reply.decisions)} decisions for 1,000 requests")

    def route_batch(keys):
        loop.run_until_complete(batches(len(keys) // 1000))
        router.drain_telemetry()
        state.in_flight[:] = [rng.randrange(50) for _ in range(args.replicas)]

    rows.append(("RouteBatch servicer, 1,000-key mix", best_per_call(route_batch, mixed, args.repeats)))
    base = rows[0][1]
    print(f"route decision, {args.replicas} replicas, 128 admitted keys, best of {args.repeats} x {args.n:,} calls")
    print(f"{'what':34} {'us/call':>8} {'x baseline':>11}")
    for name, us in rows:
        print(f"{name:34} {us:8.3f} {us / base:11.1f}")
    mix = dict(rows)["Router.route, 75/25 mix"]
    print(f"goal <= 5 us per Router.route decision: {'met' if mix <= 5 else 'NOT met'} ({mix:.2f} us, mix)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
