"""Headline tables over 3 seeds: mean ± sd of capacity, hit rate and p99 (the paper reports 5).

Every seed, 0 included, re-runs the stored experiment's command (COMPARE[base]) on the current
code with `--seed N` (workload draw and policy randomness both change), for the policies and
grid points listed in SETS, into experiments/results/seeds/NAME-sN/. q_cap is the value the
stored seed-0 sweep calibrated, fixed for every seed (calibrated once, never per seed or policy).
The grids start at the first point that decides a capacity in the stored seed-0 results; a
capacity counts every point below the grid as passing (true at seed 0, not re-checked for
seeds 1 and 2).

  .venv/bin/python -m experiments.seeds run [NAME ...]     # seeds 0, 1, 2 (skips runs already stored)
  .venv/bin/python -m experiments.seeds table [NAME ...]   # markdown, from the stored runs
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from experiments.run import COMPARE, RESULTS, load, load_path, resolve

NINE = "flat,sticky,chwbl,sglang,llmd,dynamo,preble,dualmap,cacheroute"

# name -> (stored experiment whose command is re-run, policies, grid, QPS at which hit and p99 are quoted).
# Sized for the shared 2-core machine: K = 256 without Flat-LB, Sticky and Dynamo (capacity 50-150 at
# seed 0, far below the rest; their overloaded runs cost the most), from 150 QPS up; the ablation's
# affinity rows on the low grid where they fail (60, 120, 180), the others from 240 up.
SETS = {
    # the flagship calibrated on both anchors (issue 23): the knee lies between 100 and 200 QPS
    "flagship": ("flagship", NINE, "50,75,100,125,150,175,200,250", 100.0),
    # the strongest baselines only, around the knee (issue 23's third pass): ~10 min on 2 cores
    "flagship-strong": ("flagship", "sglang,preble,dualmap,cacheroute", "100,125,150,175", 100.0),
    "flagship-full": ("flagship-full", NINE, "200,225,250,275,300", 200.0),
    "flagship-full-history": ("flagship-full-history", "cacheroute", "200,225,250,275,300", 200.0),
    "flagship-k256": ("flagship-k256", "chwbl,sglang,llmd,preble,dualmap,cacheroute", "150,200,250,275,300", 200.0),
    "flagship-hold": ("flagship", "cacheroute", "100,125,150,175", 100.0),
    "flagship-k256-hold": ("flagship-k256", "cacheroute", "150,200,250,275,300", 200.0),
    "second-k256-w8": ("second-k256-w8", "cacheroute", "150,200,250,275,300", 200.0),
    "ablation": ("ablation", "flat,cacheroute", "240,300,360,420,500", 240.0),
    "ablation-affinity": ("ablation", "affinity,affinity-replication", "60,120,180", 60.0),
    # (d) with correlated bursts: one 90 s window of a 10 s-dwell MMPP offers far from its nominal
    # mean (seed 0: 119 at 100, 382 at 250), so more draws matter here; seed 0 is burst-mmpp itself
    "burst-mmpp": ("burst-mmpp", "flat,sglang,cacheroute", "20,50,75,100,125,150,175,200,225,250,275,300", 100.0),
    # the replayed Azure arrivals are the same for every seed; keys, lengths and policy draws change
    "burst-azure": ("burst-azure", "flat,sglang,cacheroute", "20,50,75,100,125,150,175,200,225,250,275,300", 100.0),
}
# extra arguments of a set's command (policy knobs: the set runs a variant of the stored experiment)
EXTRA = {
    # the hold rule (docs/experiments.md, "Hold at the dispatcher"): CacheRoute only, beside flagship-strong's baselines
    "flagship-hold": ["--policy-knob", "hold=true"],
    "flagship-k256-hold": ["--policy-knob", "hold=true"],
}
SEEDS = (0, 1, 2)


def out_dir(name: str, seed: int) -> str:
    return os.path.join(RESULTS, "seeds", f"{name}-s{seed}")


def command(name: str, seed: int) -> list[str]:
    base, policies, grid, _ = SETS[name]
    argv = list(COMPARE[base])
    argv[argv.index("--policies") + 1] = policies
    argv[argv.index("--qps-grid") + 1] = grid
    q_cap = _seed0_q_cap(base)          # calibrated once, on the stored seed 0; every seed uses it
    if q_cap is not None and "--q-cap" not in argv:
        argv += ["--q-cap", f"{q_cap:g}"]
    return [*argv, *EXTRA.get(name, []), "--seed", str(seed), "--out", os.path.relpath(out_dir(name, seed))]


def run(names: list[str]) -> int:
    from clients.cli import main as cli

    for name in names:
        for seed in SEEDS:
            if os.path.exists(os.path.join(out_dir(name, seed), "results.json")):
                continue
            rc = cli(resolve(command(name, seed)))
            if rc:
                return rc
    return 0


def _seed0_q_cap(name: str) -> float | None:
    stored = load(name) or {}
    row = stored.get("cacheroute")
    return row["points"][0].get("q_cap") if row and row["points"] else None


def _stats(values: list[float], digits: int | None = None) -> str:
    """mean ± sample sd; `digits` decimals (default: 2 below 10, else 0)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    if any(math.isinf(v) for v in vals):
        return "inf"
    mean = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    d = digits if digits is not None else (2 if mean < 10 else 0)
    return f"{mean:.{d}f} ± {sd:.{d}f}"


def capacity(report: dict, grid: list[float], slo: float) -> float:
    """Highest grid QPS passing with every lower grid point passing (the same grid for every seed);
    0 if the first grid point fails."""
    by_q = {p["offered_qps"]: p for p in report["points"]}
    cap = 0.0
    for q in grid:
        p = by_q.get(q)
        p99 = math.inf if p is None or p["ttft_p99"] is None else p["ttft_p99"]
        if p99 > slo:
            break
        cap = q
    return cap


def table(names: list[str]) -> str:
    lines = []
    for name in names:
        _, policies, grid_s, at = SETS[name]
        grid = [float(q) for q in grid_s.split(",")]
        runs = [load_path(os.path.join(out_dir(name, s), "results.json")) for s in SEEDS]
        have = [r for r in runs if r]
        lines += [f"**{name}** ({len(have)} seeds; grid {grid_s}; hit and p99 at {at:g} QPS)", "",
                  "| policy | capacity (QPS) | hit rate | p99 TTFT s | imbalance | capacity per seed |",
                  "|---|---|---|---|---|---|"]
        for policy in policies.split(","):
            caps, hits, p99s, imbs = [], [], [], []
            for r in have:
                row = r.get(policy)
                if row is None:
                    continue
                caps.append(capacity(row, grid, row["slo_p99"]))
                p = next((p for p in row["points"] if p["offered_qps"] == at), None)
                if p is not None:
                    hits.append(100 * p["hit_rate"])
                    p99s.append(math.inf if p["ttft_p99"] is None else p["ttft_p99"])
                    imbs.append(p["imbalance"])
            cap_txt = _stats(caps) + (" (≥ top of grid)" if caps and min(caps) == grid[-1] else "")
            lines.append(f"| {policy} | {cap_txt} | {_stats(hits, 1)}% | {_stats(p99s)} | {_stats(imbs)}x | "
                         f"{', '.join(f'{c:g}' for c in caps)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="experiments.seeds")
    ap.add_argument("what", choices=("run", "table", "print"))
    ap.add_argument("names", nargs="*", default=list(SETS))
    args = ap.parse_args(argv)
    if args.what == "table":
        sys.stdout.write(table(args.names))
        return 0
    if args.what == "print":
        for name in args.names:
            for seed in SEEDS:
                print("cacheroute " + " ".join(command(name, seed)))
        return 0
    return run(args.names)


if __name__ == "__main__":
    sys.exit(main())
