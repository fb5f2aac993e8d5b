"""Byte-aware admission: top-rate (the paper's) vs value-density admission (lambda * P / k per
slot) on a workload whose prefix lengths are mixed, next to Flat-LB.

  .venv/bin/python -m experiments.beyond.admission [--active-set 1000] [--replicas 10] [--grid 10,20,...]

Workload ("mixed-prefix", built here, nothing else changes): the `paper` workload with
`active_set` keys (1,000: more than the C = R x W ~ 360 slots of 10 replicas, so admission
binds while most keys still recur within a window), where every other key by popularity
rank gets a short prefix (256 tokens) and the rest a long one (6,144 tokens); suffixes and
outputs are the paper workload's. Under top-rate admission half of the admitted slots go to
short-prefix keys that save little prefill; density admission spends them on long ones.
70B profile, 10 replicas (a smaller cluster so the budget binds), SLO 3.5 s, 150 s runs,
60 s warm-up.
Writes experiments/results/beyond/admission.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from experiments.beyond.common import save
from services.core.metrics import slo_capacity
from services.core.planning import build_plan
from services.core.policies import make_policy
from services.core.request import BLOCK_TOKENS, Request
from services.core.workloads import block_hashes, make_workload
from services.sim import calibrate
from services.sim.runs import RunSpec, config_for
from services.sim.simulator import Simulator

SHORT, LONG = 256, 6144


def mixed_prefix(qps: float, duration: float, seed: int, active_set: int) -> tuple[list[Request], dict[str, int]]:
    wl = make_workload("paper", qps=qps, duration=duration, seed=seed, active_set=active_set)
    prefix = {key: (SHORT if rank % 2 == 0 else LONG) for rank, key in enumerate(wl.keys)}
    chains = {}
    out = []
    for q in wl.requests:
        p = prefix[q.key]
        chain = chains.get(q.key)
        if chain is None:
            chain = chains[q.key] = block_hashes("mixed-prefix", q.key, p // BLOCK_TOKENS)
        suffix = q.prompt_tokens - wl.prefix_tokens[q.key]
        out.append(Request(q.rid, q.arrival, q.key, p + suffix, q.output_tokens, chain))
    return out, prefix


def plan_fn_for(admission: str, prefix: dict[str, int]):
    def plan_fn(*, now, keys, rates, healthy, active, q_cap, warm_slots, version, replicas, window):
        kw = {"prefix_tokens": [prefix[k] for k in keys]} if admission == "density" else {}
        return build_plan(keys, rates, [f"r{j}" for j in range(replicas)], q_cap, warm_slots, version=version,
                          parent=active, created_at=now, window_seconds=window, admission=admission, **kw)
    return plan_fn


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--active-set", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=10)
    ap.add_argument("--grid", default="10,20,30,40,50,60")
    ap.add_argument("--slo-p99", type=float, default=3.5)
    ap.add_argument("--out", default="admission", help="result name under experiments/results/beyond")
    args = ap.parse_args(argv)
    grid = sorted(float(x) for x in args.grid.split(","))
    spec = RunSpec(policy="cacheroute", qps=grid[0], duration=150, warmup=60, replicas=args.replicas)
    base = config_for(spec)
    first, _ = mixed_prefix(grid[0], 150, 0, args.active_set)
    q_cap = calibrate.q_cap_for(base.profile, first, spec.replicas)
    out = {"active_set": args.active_set, "replicas": args.replicas, "q_cap": q_cap, "arms": {}}
    for arm in ("flat", "rate", "density"):
        points = []
        t = time.time()
        for qps in grid:
            reqs, prefix = mixed_prefix(qps, 150, 0, args.active_set)
            if arm == "flat":
                res = Simulator(base, make_policy("flat", spec.replicas, seed=0), reqs).run()
            else:
                cfg = replace(base, q_cap=q_cap, plan_fn=plan_fn_for(arm, prefix))
                res = Simulator(cfg, make_policy("cacheroute", spec.replicas, seed=0), reqs).run()
            m = res.metrics
            plan = res.plans[-1] if res.plans else None
            points.append({"offered_qps": qps, "hit_rate": m.hit_rate, "ttft_p99": m.ttft_p99, "ttft_p50": m.ttft_p50,
                           "imbalance": m.imbalance, "requests": m.requests,
                           "admitted_keys": plan.admitted_keys if plan else None,
                           "admitted_rate_share": plan.admitted_rate_share if plan else None,
                           "warm_slots": plan.warm_slots if plan else None})
            print(f"{arm} {qps}: hit {m.hit_rate:.3f} p99 {m.ttft_p99:.2f}", file=sys.stderr, flush=True)
            if not m.ttft_p99 <= args.slo_p99:
                break
        cap = slo_capacity([(p["offered_qps"], p["ttft_p99"]) for p in points], args.slo_p99)
        out["arms"][arm] = {"capacity": cap.capacity, "censored": cap.censored, "points": points,
                            "wall_seconds": time.time() - t}
        save(args.out, out)
    for arm, r in out["arms"].items():
        print(arm, r["capacity"], r["censored"], [(p["offered_qps"], round(p["hit_rate"], 3), round(p["ttft_p99"], 2))
                                                   for p in r["points"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
