"""CacheRoute policy variants on the simulator's capacity workloads (docs/experiments.md, "Routing
rules, third pass"): each variant's knobs on K = 256 (`paper`, 250 / 300 QPS, q_cap 10.75 as the
guard-factor check) and on the calibrated flagship (100-175 QPS, the `flagship` experiment's
settings), simulated time, so the machine's load does not matter. Prints one JSON line a point.

    .venv/bin/python -m experiments.spill_rule '{"base": {"spill_pays": false}, "pays": {}}' --seeds 0
    .venv/bin/python -m experiments.spill_rule '{"pays": {}}' --workloads flagship --grid 100,125,150,175
    .venv/bin/python -m experiments.spill_rule '{"ring": {"memory_keys": 0, "no_plan": true}, "memory": {"no_plan": true}}' \
        --workloads flagship --grid 150

`"no_plan": true` (not a policy knob) runs the policy with every plan ignored: its cold tail alone,
the probe behind "The plan moved what the cold tail placed" in docs/experiments.md.

The engine-bound live regime has its own runner (experiments/bound_tenants.py).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys

from services.sim.runs import RunSpec, run_spec

WORKLOADS = {
    "k256": dict(workload="paper", workload_knobs={"active_set": 256}, q_cap=10.75, grid=(250.0, 300.0)),
    "flagship": dict(workload="flagship", kv_blocks=19388, grid=(100.0, 125.0, 150.0, 175.0),
                     workload_knobs={"active_set": 4864, "shared_tokens": 4096, "context_median": 2048}),
}


def one(args) -> dict:
    name, knobs, workload, qps, seed = args
    knobs = dict(knobs)
    no_plan = knobs.pop("no_plan", False)
    w = WORKLOADS[workload]
    spec = RunSpec(policy="cacheroute", qps=qps, duration=150.0, warmup=60.0, workload=w["workload"],
                   workload_knobs=w["workload_knobs"], first_plan_at=5.0, q_cap=w.get("q_cap"),
                   kv_blocks=w.get("kv_blocks"), seed=seed, policy_knobs=knobs)
    if spec.q_cap is None:
        from services.sim.runs import calibrated_q_cap

        from dataclasses import replace
        spec = replace(spec, q_cap=calibrated_q_cap(spec))
    out = run_spec(spec) if not no_plan else _without_plans(spec)
    m = out["misses"]
    return {"variant": name, "workload": workload, "qps": qps, "seed": seed,
            "p99": round(out["ttft_p99"], 2), "hit": round(out["hit_rate"] * 100, 2),
            "first_on_replica": round(m["first_on_replica"] * 100, 2), "evicted": round(m["evicted"] * 100, 2),
            "spilled": round(m["spilled"] * 100, 2), "imbalance": round(out["imbalance"], 3),
            "preemptions": out["preemptions"]}


def _without_plans(spec: RunSpec) -> dict:
    """run_spec with a cacheroute policy that ignores every plan (its cold tail alone)."""
    import random

    from services.core.policies.cacheroute import CacheRoutePolicy
    from services.sim.runs import config_for, load_requests
    from services.sim.simulator import Simulator

    class ColdTailOnly(CacheRoutePolicy):
        def set_plan(self, plan) -> None:
            pass

    policy = ColdTailOnly(spec.replicas, rng=random.Random(spec.seed), **spec.policy_knobs)
    return Simulator(config_for(spec), policy, load_requests(spec)).run().as_dict()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", help='JSON {"name": {policy knobs}}')
    ap.add_argument("--workloads", default="k256,flagship")
    ap.add_argument("--grid", help="QPS list for every workload (default: each workload's)")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    variants = json.loads(args.variants)
    jobs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for wl in args.workloads.split(","):
            grid = [float(q) for q in args.grid.split(",")] if args.grid else WORKLOADS[wl]["grid"]
            jobs += [(name, knobs, wl, q, seed) for q in grid for name, knobs in variants.items()]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for row in pool.imap(one, jobs):
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
