"""Gated CacheRoute (re-plan each interval, shadow-gate each candidate on the last window, Flat-LB
fallback) vs plain CacheRoute and Flat-LB, on the experiment page's workloads.

  .venv/bin/python -m experiments.beyond.gated [--sources a,b] [--arms x,y] [--margin 0.1] [--cold p2c|chwbl]

Sweeps stop at the first grid point whose p99 misses the SLO (SLO capacity needs every lower
point to pass, so higher points cannot change it). `--cold` sets the cold tail of both
cacheroute arms; `--arms` re-runs only some arms (flat, cacheroute, cacheroute-gated) and keeps the
stored others. Writes experiments/results/beyond/gated.json (gated-chwbl.json with --cold chwbl).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from experiments.beyond.common import load, save, source as source_spec
from experiments.harness.gated import run_gated_spec
from services.core.metrics import slo_capacity
from services.sim.runs import PLANNED, calibrated_q_cap, run_spec

KEEP = ("offered_qps", "hit_rate", "ttft_p99", "imbalance", "requests", "planned_share")


def sweep_until_miss(spec, grid, slo, one) -> dict:
    if spec.policy in PLANNED and spec.q_cap is None:
        spec = replace(spec, q_cap=calibrated_q_cap(replace(spec, qps=grid[0])))
    points = []
    for qps in sorted(grid):
        p = one(replace(spec, qps=qps))
        points.append({k: p.get(k) for k in KEEP})
        if not p["ttft_p99"] <= slo:
            break
    cap = slo_capacity([(p["offered_qps"], p["ttft_p99"]) for p in points], slo)
    return {"capacity": cap.capacity, "censored": cap.censored, "points": points}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sources", default="flagship-k128,low-reuse,burst,mooncake-conversation,mooncake-synthetic")
    ap.add_argument("--margin", type=float, default=0.10)
    ap.add_argument("--cold", default="p2c", choices=("p2c", "chwbl"))
    ap.add_argument("--arms", default="flat,cacheroute,cacheroute-gated")
    args = ap.parse_args(argv)
    cold = {"cold": args.cold}
    name = "gated" if args.cold == "p2c" else f"gated-{args.cold}"
    out = load(name)          # sources and arms run earlier stay; the ones named here are replaced
    for source in args.sources.split(","):
        base, grid, slo = source_spec(source)
        out.setdefault(source, {})
        arms = {"flat": (replace(base, policy="flat"), run_spec),
                "cacheroute": (replace(base, policy="cacheroute", policy_knobs=cold), run_spec),
                "cacheroute-gated": (replace(base, policy="cacheroute", policy_knobs=cold),
                                     lambda s: run_gated_spec(s, slo_p99=slo, margin=args.margin))}
        for label in args.arms.split(","):
            spec, one = arms[label]
            t = time.time()
            out[source][label] = sweep_until_miss(spec, grid, slo, one)
            print(f"{source} {label}: {out[source][label]['capacity']} [{time.time() - t:.0f}s]", file=sys.stderr,
                  flush=True)
        save(name, out)
    for source, arms in out.items():
        flat = arms["flat"]["capacity"]
        print(f"{source}: " + ", ".join(f"{k} {v['capacity']:g} ({v['censored']})" for k, v in arms.items())
              + (f"; gated/flat {arms['cacheroute-gated']['capacity'] / flat:.2f}" if flat else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
