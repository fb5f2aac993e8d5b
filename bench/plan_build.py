"""Plan-build benchmark: the fast builder vs a plain heapq transcription of the paper.

    .venv/bin/python bench/plan_build.py [--repeats 5] [--seed 7]

Workload (seeded): 128,824 keys with log-normal rates, sigma 1.65, scaled to a total of
150 req/s, plus six whale keys (rates 6.5..20 req/s) so that with q_cap = 6 req/s some keys
need k_b = 2..4 replicas; R = 30, W = 100 (C = 3,000 slots), so admission binds. Both builders
run in the same process, best of N, and must agree exactly (same table, same per-replica loads,
hence the same imbalance). Then 1,000,000 keys (same per-key rate distribution) with the fast
builder, and the non-binding case (W large enough to admit every key) for both builders.

`--replan N` (0: skip; default 128,824): one steady control interval as bench/control_loop.py
runs it, in process: N keys (log-normal counts over a 300 s window), R = 32, every key
admitted (W = ceil(N / 32)), an active LPT plan, then 2% of the keys get new counts and the
churn-aware re-plan (`replan_incremental`) and the switching rule (`decide_switch`) run, the
vectorised ones against the per-key Python ones they replaced (tests/reference/*_v1.py), CPU
seconds (time.process_time, so other load on the machine counts less), best of `--repeats`;
both must give the same table, loads, churn and decision.
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from services.core.planning import build_plan

WHALES = (20.0, 15.0, 12.0, 9.0, 7.0, 6.5)


def reference_build(keys: Sequence[str], rates: Sequence[float], replica_ids: Sequence[str], q_cap: float,
                    warm_slots: int) -> tuple[dict[str, tuple[int, ...]], list[float]]:
    """The paper's pseudocode, written plainly: sort, greedy skip-and-continue admission,
    heap-based LPT. Table rows list replica indices ascending; the cold-tail sum uses math.fsum."""
    replicas = len(replica_ids)
    budget = replicas * warm_slots
    order = sorted(range(len(keys)), key=lambda i: (-rates[i], keys[i]))
    admitted: list[tuple[int, int]] = []
    used = 0
    for i in order:
        lam = rates[i]
        if lam <= 0:
            continue
        k = min(replicas, max(1, math.ceil(lam / q_cap)))
        if used + k <= budget:
            admitted.append((i, k))
            used += k
    chosen = {i for i, _ in admitted}
    cold = math.fsum(rates[i] for i in range(len(keys)) if i not in chosen) / replicas
    heap = [(cold, r) for r in range(replicas)]
    table: dict[str, tuple[int, ...]] = {}
    for i, k in admitted:
        share = rates[i] / k
        picked = [heapq.heappop(heap) for _ in range(k)]
        table[keys[i]] = tuple(sorted(r for _, r in picked))
        for load, r in picked:
            heapq.heappush(heap, (load + share, r))
    loads = [0.0] * replicas
    for load, r in heap:
        loads[r] = load
    return table, loads


def workload(n_keys: int, seed: int, total_rate: float, whales: Sequence[float] = WHALES) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    rates = rng.lognormal(mean=0.0, sigma=1.65, size=n_keys)
    rates *= total_rate / rates.sum()
    rates[: len(whales)] = whales
    keys = [f"k{i:07d}" for i in range(n_keys)]
    return keys, rates


def best_of(repeats: int, fn: Callable[[], object]) -> tuple[float, object]:
    best, result = math.inf, None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def compare(keys: list[str], rates: np.ndarray, replica_ids: list[str], q_cap: float, warm_slots: int,
            repeats: int, label: str) -> bool:
    rate_list = rates.tolist()
    t_ref, (ref_table, ref_loads) = best_of(repeats, lambda: reference_build(keys, rate_list, replica_ids, q_cap, warm_slots))
    t_fast, plan = best_of(repeats, lambda: build_plan(keys, rates, replica_ids, q_cap, warm_slots))
    ref_imb = max(ref_loads) / (math.fsum(ref_loads) / len(ref_loads))
    same = dict(plan.table) == ref_table and list(plan.expected_load) == ref_loads
    whales = sum(1 for row in plan.table.values() if len(row) > 1)
    print(f"{label}: keys={len(keys)} R={len(replica_ids)} q_cap={q_cap} W={warm_slots} "
          f"admitted={plan.admitted_keys} (k_b>1: {whales}) share={plan.admitted_rate_share:.3f} "
          f"imbalance={plan.predicted_imbalance:.6f} (ref {ref_imb:.6f})")
    print(f"  heapq reference {t_ref * 1e3:8.1f} ms   fast {t_fast * 1e3:7.1f} ms   "
          f"speed-up {t_ref / t_fast:5.1f}x   identical={same}")
    return same and abs(plan.predicted_imbalance - ref_imb) <= 1e-6


def cpu_best_of(repeats: int, fn: Callable[[], object]) -> tuple[float, object]:
    best, out = math.inf, None
    for _ in range(repeats):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def replan_interval(n_keys: int, repeats: int, seed: int) -> bool:
    """Steady re-plan and switching rule, vectorised vs per-key (module header)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from services.core import replan, switching
    from tests.reference import replan_v1, switching_v1

    rng = np.random.default_rng(seed)
    keys = [f"tenant-{i}" for i in range(n_keys)]
    counts = 1 + np.floor(rng.lognormal(0.0, 1.65, n_keys))
    ids = [f"r{i}" for i in range(32)]
    warm = math.ceil(n_keys / 32)
    q_cap = 1.2 * counts.sum() / 300.0 / 32
    active = build_plan(keys, counts / 300.0, ids, q_cap, warm, version=1)
    picked = rng.choice(n_keys, n_keys // 50, replace=False)
    counts[picked] = 1 + np.floor(rng.lognormal(0.0, 1.65, len(picked)))
    rates = counts / 300.0
    rate_map = dict(zip(keys, rates.tolist()))
    tokens = {k: float(t) for k, t in zip(keys, rng.integers(0, 4000, n_keys).tolist())}
    out = {}
    for name, rp, sw in (("per-key", replan_v1, switching_v1), ("vectorised", replan, switching)):
        t_build, plan = cpu_best_of(repeats, lambda: rp.replan_incremental(active, keys, rates, ids, q_cap, warm,
                                                                         version=2, created_at=1.0))
        cfg = sw.SwitchConfig()
        t_decide, decision = cpu_best_of(repeats, lambda: sw.decide_switch(active, plan, rate_map, tokens, now=1000.0,
                                                                           last_switch_at=0.0, config=cfg))
        out[name] = (t_build, t_decide, plan, decision)
        print(f"replan {n_keys:,} keys ({plan.admitted_keys:,} admitted, churn {plan.churn:.4f}, "
              f"{plan.extra['moves']} moves), {name}: re-plan {t_build:.3f} s, switching rule {t_decide:.3f} s CPU "
              f"(best of {repeats})")
    (b0, d0, p0, x0), (b1, d1, p1, x1) = out["per-key"], out["vectorised"]
    same = (dict(p0.table) == dict(p1.table) and p0.expected_load == p1.expected_load and p0.churn == p1.churn
            and x0 == x1)
    print(f"replan speed-up: re-plan {b0 / b1:.1f}x, switching rule {d0 / d1:.1f}x; identical: {'yes' if same else 'NO'}")
    return same


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=128_824)
    ap.add_argument("--replicas", type=int, default=30)
    ap.add_argument("--q-cap", type=float, default=6.0)
    ap.add_argument("--warm-slots", type=int, default=100)
    ap.add_argument("--total-rate", type=float, default=150.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--big", type=int, default=1_000_000, help="key count for the large fast-only run (0: skip)")
    ap.add_argument("--replan", type=int, default=128_824, help="key count of the steady re-plan run (0: skip)")
    args = ap.parse_args(argv)
    if args.replan:
        ok = replan_interval(args.replan, args.repeats, args.seed)
        if not (args.keys and args.big):
            return 0 if ok else 1

    replica_ids = [f"r{i}" for i in range(args.replicas)]
    keys, rates = workload(args.keys, args.seed, args.total_rate)
    ok = compare(keys, rates, replica_ids, args.q_cap, args.warm_slots, args.repeats, "binding")
    all_slots = -(-len(keys) * 4 // args.replicas)  # enough slots for every key
    ok &= compare(keys, rates, replica_ids, args.q_cap, all_slots, max(1, args.repeats // 2), "non-binding")

    if args.big:
        big_keys, big_rates = workload(args.big, args.seed + 1, args.total_rate * args.big / args.keys)
        t_big, plan = best_of(3, lambda: build_plan(big_keys, big_rates, replica_ids, args.q_cap, args.warm_slots))
        print(f"big: keys={args.big} admitted={plan.admitted_keys} fast build {t_big * 1e3:.1f} ms "
              f"(best of 3) imbalance={plan.predicted_imbalance:.6f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
