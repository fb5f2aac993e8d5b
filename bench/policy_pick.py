"""Per-pick cost of every routing policy (the simulator needs >= 5,000 req/s overall).

    .venv/bin/python bench/policy_pick.py [--requests 20000] [--replicas 30]

Drives the `paper` workload through each policy with a ClusterState updated the way an
owner would (in-flight up on pick, down every third request), and reports microseconds
per pick next to a baseline measured in the same run: a bare dict lookup plus one
`random.randrange` per request (the least any table-driven policy must do).
"""

from __future__ import annotations

import argparse
import random
import time

from services.core.plan import Plan
from services.core.policies import POLICIES, make_policy
from services.core.policy import ClusterState
from services.core.workloads import make_workload


def plan_for(keys: list[str], replicas: int) -> Plan:
    table = {k: (i % replicas,) for i, k in enumerate(keys)}
    return Plan(version=1, parent_version=0, created_at=0.0, replica_ids=tuple(f"r{i}" for i in range(replicas)),
                q_cap=10.0, warm_slots=8, table=table, rates={k: 1.0 for k in table},
                expected_load=(1.0,) * replicas, predicted_imbalance=1.0, total_keys=len(table),
                admitted_keys=len(table), admitted_rate_share=1.0)


def time_policy(policy, requests, replicas: int) -> float:
    state = ClusterState.empty(replicas)
    picked: list[int] = []
    start = time.perf_counter()
    for i, r in enumerate(requests):
        replica = policy.pick(r, state).replica
        picked.append(replica)
        state.in_flight[replica] += 1
        if i % 3 == 0:
            j = picked[i // 2]
            state.in_flight[j] = max(0, state.in_flight[j] - 1)
    return (time.perf_counter() - start) / len(requests)


def time_baseline(requests, table: dict, replicas: int) -> float:
    rng = random.Random(0)
    start = time.perf_counter()
    for r in requests:
        table.get(r.key)
        rng.randrange(replicas)
    return (time.perf_counter() - start) / len(requests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--replicas", type=int, default=30)
    args = parser.parse_args()
    w = make_workload("paper", qps=200, duration=args.requests / 200 + 1, seed=1)
    requests = w.requests[: args.requests]
    plan = plan_for(list(w.keys[:100]), args.replicas)
    base = time_baseline(requests, dict(plan.table), args.replicas)
    print(f"baseline (dict lookup + randrange): {base * 1e6:.2f} us/pick")
    print("| policy | us/pick | x baseline | picks/s |")
    print("|---|---|---|---|")
    for name in POLICIES:
        policy = make_policy(name, args.replicas, seed=1)
        policy.set_plan(plan)
        per = time_policy(policy, requests, args.replicas)
        print(f"| {name} | {per * 1e6:.1f} | {per / base:.1f} | {1 / per:,.0f} |")


if __name__ == "__main__":
    main()
