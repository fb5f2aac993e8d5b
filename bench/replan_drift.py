"""Re-planning under rate drift: from-scratch LPT vs churn-aware incremental re-planning.

    .venv/bin/python bench/replan_drift.py [--intervals 6] [--seed 7]

Drift workload (generated here, seeded): 128,824 keys with log-normal rates (sigma 1.65),
total 150 req/s; each interval every key's log-rate takes an
independent N(0, 0.3^2) step (the paper's drift setting), then rates are rescaled to the same
total so only the shape drifts. R = 30, q_cap = 6 req/s, W = 100 (C = 3,000 slots).

Interval 0 builds one LPT plan that both chains start from. Each later interval builds
  scratch      build_plan(new rates, parent = previous scratch plan)
  incremental  replan_incremental(previous incremental plan, new rates)
and prints the churn of each against its own parent (share of the new plan's admitted rate
whose replica-id set changed), the predicted imbalance of each, and the build time.
Goal: incremental churn <= 10% per interval and imbalance within 5% of from-scratch.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from services.core.planning import build_plan
from services.core.replan import replan_incremental

def drift_rates(n_keys: int, intervals: int, seed: int, total: float, sigma: float = 0.3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    rates = rng.lognormal(0.0, 1.65, n_keys)
    rates *= total / rates.sum()
    log_rates = np.log(rates)
    out = []
    for step in range(intervals + 1):
        if step:
            log_rates = log_rates + rng.normal(0.0, sigma, n_keys)
        r = np.exp(log_rates)
        out.append(r * (total / r.sum()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=128_824)
    ap.add_argument("--intervals", type=int, default=6)
    ap.add_argument("--replicas", type=int, default=30)
    ap.add_argument("--q-cap", type=float, default=6.0)
    ap.add_argument("--warm-slots", type=int, default=100)
    ap.add_argument("--total-rate", type=float, default=150.0)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)

    keys = [f"k{i:07d}" for i in range(args.keys)]
    replica_ids = [f"r{i}" for i in range(args.replicas)]
    series = drift_rates(args.keys, args.intervals, args.seed, args.total_rate)
    scratch = incremental = build_plan(keys, series[0], replica_ids, args.q_cap, args.warm_slots, version=1)
    print(f"interval 0: admitted={scratch.admitted_keys} share={scratch.admitted_rate_share:.3f} "
          f"imbalance={scratch.predicted_imbalance:.4f}")
    print("interval | churn scratch | churn incremental | imbalance scratch | imbalance incremental | "
          "ratio | moves | t scratch | t incremental")
    ok = True
    for step in range(1, args.intervals + 1):
        rates = series[step]
        t0 = time.perf_counter()
        scratch = build_plan(keys, rates, replica_ids, args.q_cap, args.warm_slots, version=step + 1, parent=scratch)
        t1 = time.perf_counter()
        incremental = replan_incremental(incremental, keys, rates, replica_ids, args.q_cap, args.warm_slots,
                                         version=step + 1, tolerance=args.tolerance)
        t2 = time.perf_counter()
        ratio = incremental.predicted_imbalance / scratch.predicted_imbalance
        print(f"{step:8d} | {scratch.churn:13.1%} | {incremental.churn:17.1%} | {scratch.predicted_imbalance:17.4f} | "
              f"{incremental.predicted_imbalance:20.4f} | {ratio:5.3f} | {incremental.extra['moves']:5d} | "
              f"{(t1 - t0) * 1e3:7.1f} ms | {(t2 - t1) * 1e3:9.1f} ms")
        ok &= incremental.churn <= 0.10 and ratio <= 1.0 + args.tolerance + 1e-9
    print("goal met" if ok else "goal NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
