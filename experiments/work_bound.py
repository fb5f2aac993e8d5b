"""The engine-work ceiling on capacity (services/sim/bound.py) for the flagship and K = 256, per
offered QPS and seed: the least mean utilization any router needs, every request hitting what an
infinite cache would. Above 1.0 no routing policy serves the rate; docs/experiments.md ("Hold at
the dispatcher") reads it against the capacity goals. Pure arithmetic over the workload draw
(seconds of CPU).

    .venv/bin/python -m experiments.work_bound --workloads flagship,k256 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import sys

from services.core.engine import get_profile
from services.sim.bound import utilization_bound
from services.sim.runs import RunSpec, load_requests

# the seeds sets' workloads (experiments/run.py COMPARE "flagship" and "flagship-k256"): 150 s, 60 s warm-up
WORKLOADS = {
    "flagship": (dict(workload="flagship", workload_knobs={"active_set": 4864, "shared_tokens": 4096,
                                                           "context_median": 2048}),
                 (150.0, 175.0, 187.5, 200.0)),
    "k256": (dict(workload="paper", workload_knobs={"active_set": 256}), (300.0, 330.0, 360.0, 400.0)),
}


def rows(workloads: list[str], seeds: list[int], grid: list[float] | None = None):
    for name in workloads:
        w, default_grid = WORKLOADS[name]
        for seed in seeds:
            for qps in grid or default_grid:
                spec = RunSpec(policy="flat", qps=qps, duration=150.0, warmup=60.0, seed=seed, **w)
                u = utilization_bound(get_profile(spec.profile), load_requests(spec), spec.replicas, 60.0, 150.0)
                yield {"workload": name, "seed": seed, "qps": qps, "utilization_bound": round(u, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="flagship,k256")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--grid", help="QPS list for every workload (default: each workload's)")
    args = ap.parse_args(argv)
    grid = [float(q) for q in args.grid.split(",")] if args.grid else None
    for row in rows(args.workloads.split(","), [int(s) for s in args.seeds.split(",")], grid):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
