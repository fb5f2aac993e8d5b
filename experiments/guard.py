"""Choosing the overload guard's balance factor c once (services/core/policies/cacheroute.py).

One sweep over c at the points that decide it, with the paper experiments' settings (docs/experiments.md,
"Setup": 150 s, 60 s warm-up, bootstrap plan at 5 s, seed 0, q_cap as calibrated by the
stored sweeps): the flagship (70B, K = 128) at 250 and 300 QPS, where the unguarded plan
passes and then fails; the ablation (8B whale) at 240 QPS, where the plan's own sizing
floor is ~1.3x mean (a guard that fires there undoes the plan), and at 420 QPS; low-reuse
at 80 and 100 QPS, where balance decides capacity. `None` = guard off (the previous
behaviour; re-measured at one point to check the runs repeat the first run's figures).

  .venv/bin/python -m experiments.guard            -> experiments/results/guard/results.json
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ProcessPoolExecutor

import orjson

from services.sim.runs import RunSpec, run_spec

ROOT = os.path.dirname(os.path.abspath(__file__))
FACTORS = (1.1, 1.25, 1.5, 2.0)
BASE = dict(duration=150.0, warmup=60.0, first_plan_at=5.0, seed=0)
SETUPS = {
    "flagship-k128": (dict(workload="paper", workload_knobs={"active_set": 128}, q_cap=10.75), (250.0, 300.0)),
    "ablation": (dict(workload="whale", profile="llama3-8b-h100", q_cap=16.25), (240.0, 420.0)),
    "low-reuse": (dict(workload="low-reuse", q_cap=3.15625), (80.0, 100.0)),
}


def specs() -> list[tuple[str, float | None, RunSpec]]:
    out = []
    for name, (knobs, grid) in SETUPS.items():
        for c in FACTORS:
            for qps in grid:
                out.append((name, c, RunSpec(policy="cacheroute", qps=qps, policy_knobs={"balance_factor": c},
                                             **BASE, **knobs)))
    knobs, _ = SETUPS["flagship-k128"]
    out.append(("flagship-k128", None, RunSpec(policy="cacheroute", qps=300.0, policy_knobs={"balance_factor": None},
                                               **BASE, **knobs)))
    return out


def _one(spec: RunSpec) -> dict:
    out = run_spec(spec)
    return {k: out[k] for k in ("offered_qps", "hit_rate", "ttft_p50", "ttft_p99", "imbalance", "served")}


def main() -> int:
    todo = specs()
    with ProcessPoolExecutor(2) as pool:
        points = list(pool.map(_one, [s for _, _, s in todo]))
    rows = [{"setup": name, "balance_factor": c, **p} for (name, c, _), p in zip(todo, points)]
    path = os.path.join(ROOT, "results", "guard")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "results.json"), "wb") as f:
        f.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    sys.stdout.write("| setup | c | QPS | hit | p99 s | imbalance |\n|---|---|---|---|---|---|\n")
    for r in rows:
        c = "off" if r["balance_factor"] is None else f"{r['balance_factor']:g}"
        sys.stdout.write(f"| {r['setup']} | {c} | {r['offered_qps']:g} | {100 * r['hit_rate']:.1f}% | "
                         f"{r['ttft_p99']:.2f} | {r['imbalance']:.2f}x |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
