"""The Mooncake conversation row of docs/experiments.md with a tier of routers and the record bus
(services.sim.tier): the same run as

    .venv/bin/cacheroute sim compare --trace $CACHEROUTE_DATA/mooncake/conversation_trace.first_half.jsonl \
        --profile llama3-8b-h100 --replicas 8 --policies cacheroute --qps-grid 4,8 --slo-p99 20 --first-plan-at 5

(the CLI's defaults otherwise: seed 0, 30 s control interval, q_cap calibrated once for the grid),
through services.sim.runs.sweep with RunSpec.tier / record_delay / record_memory, which the CLI
does not expose. One JSON line per point: hit %, p99 TTFT (s), the miss split (points).

    .venv/bin/python -m experiments.bus_mooncake --tier 1,4 --record-delay none,0.1 --record-memory on,off \
        --out experiments/results/bussim/mooncake.jsonl

Delays are virtual seconds (this trace runs unscaled: model time is wall time).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from dataclasses import replace

from experiments.bound_tenants import bus_grid
from services.sim.runs import RunSpec, run_spec, sweep

TRACE = "mooncake/conversation_trace.first_half.jsonl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=os.path.join(os.environ.get("CACHEROUTE_DATA", "data"), TRACE))
    parser.add_argument("--grid", default="4,8", help="offered QPS, comma-separated")
    parser.add_argument("--tier", default="1,4")
    parser.add_argument("--record-delay", default="none", help="virtual seconds, comma-separated; none: no bus")
    parser.add_argument("--record-memory", default="on")
    parser.add_argument("--knobs", default="{}", help="JSON cacheroute knobs")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    grid = [float(q) for q in args.grid.split(",")]
    base = RunSpec(policy="cacheroute", qps=None, replicas=8, profile="llama3-8b-h100", duration=None,
                   trace=args.trace, first_plan_at=5.0, policy_knobs=json.loads(args.knobs))
    buses = bus_grid(args.record_delay, args.record_memory)
    specs = [replace(base, tier=int(n), record_delay=d, record_memory=m)
             for n in args.tier.split(",") for d, m in (buses if int(n) > 1 else [(None, True)])]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for spec in specs:
            for p in sweep(spec, grid, run=lambda ss: list(pool.imap(run_spec, ss))):
                m = p["misses"]
                row = {"tier": spec.tier, "record_delay": spec.record_delay, "record_memory": spec.record_memory,
                       "knobs": spec.policy_knobs, "qps": p["offered_qps"], "hit": round(p["hit_rate"] * 100, 2),
                       "p99_s": round(p["ttft_p99"], 3), "p50_s": round(p["ttft_p50"], 3),
                       **{k: round(m[k] * 100, 2) for k in ("bound", "first_on_replica", "evicted", "spilled")}}
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as fh:
                        fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
