"""Failure repair on the flagship cluster: a replica dies mid-interval and returns later.

  .venv/bin/python -m experiments.beyond.repair [--qps 100]

Flagship settings (70B, 30 replicas, `paper` K=128), 240 s of arrivals, 30 s control
interval, churn-aware re-planning every interval (replan_incremental over the healthy
replicas). Replica 7 fails at t = 75 s (mid-interval) and returns empty at t = 135 s.
Arms at the failure: none (wait for the next plan at 90 s), replan (full LPT over the
survivors at once), repair (repair_plan at once). Arms at the return (all with repair at the
failure): unbounded incremental rebalancing vs at most 2 key moves per interval, and
from-scratch LPT every interval (the re-warm storm). Figures: hit rate and p99 over
[75, 90) and [135, 165), requests lost, churn of the plans installed.
Writes experiments/results/beyond/repair.json.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from experiments.beyond.common import save
from experiments.harness.repair import RepairSimulator, incremental_plan_fn, timeline, window_summary
from services.core.policies import make_policy
from services.sim.runs import RunSpec, calibrated_q_cap, config_for, load_requests
from services.sim.simulator import Failure, default_plan_fn

DOWN, BACK, DEAD = 75.0, 135.0, 7


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qps", type=float, default=100.0)
    args = ap.parse_args(argv)
    spec = RunSpec(policy="cacheroute", qps=args.qps, duration=240, warmup=60)
    reqs = load_requests(spec)
    q_cap = calibrated_q_cap(spec, reqs)
    base = replace(config_for(spec), q_cap=q_cap, failures=(Failure(DEAD, DOWN, BACK),))
    arms = {
        "none": ("none", incremental_plan_fn()),
        "replan": ("replan", incremental_plan_fn()),
        "repair": ("repair", incremental_plan_fn()),
        "repair+bounded-return": ("repair", incremental_plan_fn(max_moves=2)),
        "repair+scratch-every-interval": ("repair", default_plan_fn),
    }
    out = {"qps": args.qps, "q_cap": q_cap, "down": DOWN, "back": BACK, "arms": {}}
    for label, (on_failure, plan_fn) in arms.items():
        res = RepairSimulator(replace(base, plan_fn=plan_fn), make_policy("cacheroute", spec.replicas, seed=0), reqs,
                              on_failure=on_failure).run()
        on_returned = ((res.arrival >= BACK) & (res.arrival < BACK + 30) & (res.replica == DEAD)).sum()
        out["arms"][label] = {
            "before": window_summary(res, DOWN - 15, DOWN),
            "after_failure": window_summary(res, DOWN, DOWN + 15),
            "down": window_summary(res, DOWN, BACK),
            "after_return": window_summary(res, BACK, BACK + 30),
            "whole": {"hit_rate": res.metrics.hit_rate, "ttft_p99": res.metrics.ttft_p99, "failed": res.metrics.failed},
            "served_on_returned_first_30s": int(on_returned),
            "plans": [{"at": p.at, "churn": p.churn} for p in res.plans],
            "timeline": timeline(res, 5.0, 45.0, 195.0),
        }
        a = out["arms"][label]
        print(f"{label}: hit before {a['before']['hit_rate']:.3f} after-failure {a['after_failure']['hit_rate']:.3f} "
              f"p99 {a['after_failure']['ttft_p99']:.2f} | after-return {a['after_return']['hit_rate']:.3f} "
              f"p99 {a['after_return']['ttft_p99']:.2f} | lost {a['down']['failed']} | "
              f"churn {[(p['at'], round(p['churn'], 3)) for p in a['plans'] if p['churn'] is not None]}",
              flush=True)
        save("repair", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
