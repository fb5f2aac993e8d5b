"""The overload guard's balance factor c on the second workload (docs/experiments.md, "Routing rules,
second pass"): cacheroute with policy knobs, simulated time, seed 0, 150 s, 60 s warm-up, first plan
at 5 s, q_cap 10.75. Prints policy variant, active set, QPS, p99 TTFT, hit %, spilled points, imbalance.

    .venv/bin/python -m experiments.guard_factor '{"c1.1": {"balance_factor": 1.1}, "base": {}, "c1.5": {"balance_factor": 1.5}}' 250,300 256
"""

from __future__ import annotations

import json
import multiprocessing
import sys

from services.sim.runs import RunSpec, run_spec


def one(args):
    name, knobs, qps, k = args
    spec = RunSpec(policy="cacheroute", qps=qps, duration=150.0, warmup=60.0, workload="paper",
                   workload_knobs={"active_set": k}, first_plan_at=5.0, q_cap=10.75, policy_knobs=knobs)
    out = run_spec(spec)
    return (name, k, qps, round(out["ttft_p99"], 2), round(out["hit_rate"] * 100, 2),
            round(out["misses"]["spilled"] * 100, 2), round(out["imbalance"], 3))


def main(argv: list[str]) -> int:
    variants = json.loads(argv[0])
    grid = [float(x) for x in argv[1].split(",")]
    k = int(argv[2])
    jobs = [(name, knobs, q, k) for name, knobs in variants.items() for q in grid]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        for row in pool.imap(one, jobs):
            print(*row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
