"""The paper's flagship workload: calibration of its active set and KV on both anchors (issue 23),
and the earlier calibration of the full population's prompt structure (issue 13).

Both calibrate from what the paper reports about its *baselines* only: Flat-LB 64.1% and Sticky
87.3% served hit rate at 100 QPS (70B fp8 profile `llama3-70b-fp8-h100x2`, 30 replicas). Nothing
here runs or looks at any other policy. Settings are those of every experiment here: 150 s of
arrivals, 60 s warm-up, seed 0, Poisson, p99 TTFT SLO 3.5 s (recorded, not an objective). The
measured-window infinite-cache bound (services.core.traces.window_hit_bound) of every probed
workload is recorded beside it: no router can exceed it.

`calibrate-anchors` (issue 23, SPEC section 5; the flagship of experiments/run.py). Workload
`flagship` with an active set: the top-K keys of the 128,824-key log-normal population (rates
renormalised), prompt = one prefix shared by every key (S = 4,096 tokens) + the key's own context
(log-normal, median C = 2,048 tokens, sigma 0.5) + the `paper` unique suffix, the prompt shape SPEC
section 5 suggests, fixed. Two knobs, fixed before running:
  (a) K, the active-set size, in ACTIVE_SETS = 1,024 .. 16,384 keys;
  (b) the KV blocks per replica, KV_FACTORS = 0.5x .. 1.5x the profile's 14,100.
  objective  |Flat-LB hit - 0.641| + |Sticky hit - 0.873| (both at 100 QPS)
  stage 1    the full grid ACTIVE_SETS x KV_FACTORS (40 cells, Flat-LB and Sticky at each)
  stage 2    around the best stage-1 cell (K*, f*): K in {K* 2^-1/4, K*, K* 2^1/4} (rounded to
             64 keys) x f in {f* - 0.125, f*, f* + 0.125} (8 new cells)
  chosen     the lowest objective over every probed cell (ties: f nearer 1, then smaller K)
Expected direction (SPEC: K = 4,096 at the profile's KV gave Flat 63.5%, Sticky 84.9%, bound
92.7%): a larger K lowers both hits and the bound, more KV raises both.

  .venv/bin/python -m experiments.flagship calibrate-anchors [--jobs 2]
      -> experiments/results/flagship-anchors/results.json

`calibrate` (issue 13; now the `flagship-full` variant): the full population, where every key can
send traffic; a prompt is one prefix shared by every key (S tokens) + the key's own context
(log-normal, median C, sigma 0.5) + a unique suffix. Search (the objective is lexicographic
because Flat-LB is cache-agnostic, so its hit rate pins the share of the widely shared prefix, and
Sticky then pins the per-key context):
  for each C in CONTEXTS: bisect S (3 steps, multiples of 256 tokens) until Flat-LB's hit rate
  at 100 QPS is within 1 point of 64.1%; then run Sticky at that (S, C).
  Pick the C whose Sticky hit is closest to 87.3%.

  .venv/bin/python -m experiments.flagship calibrate [--jobs 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys

import orjson

from experiments.run import RESULTS

TARGET_FLAT, TARGET_STICKY = 0.641, 0.873
CONTEXTS = (256, 512, 1024, 2048)
S_LOW, S_HIGH = 256, 8192
OUT = os.path.join(RESULTS, "flagship-calibration", "results.json")

# calibrate-anchors (module header), fixed before running
PROFILE, PROFILE_KV = "llama3-70b-fp8-h100x2", 14_100
ANCHOR_SHAPE = {"shared_tokens": 4096, "context_median": 2048}
ACTIVE_SETS = (1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
KV_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5)
STEP_K, STEP_F = 2 ** 0.25, 0.125
ANCHORS_OUT = os.path.join(RESULTS, "flagship-anchors", "results.json")


def _run(args):
    from services.core.traces import window_hit_bound
    from services.sim.runs import RunSpec, load_requests, run_spec

    policy, shared, context = args
    spec = RunSpec(policy=policy, qps=100.0, duration=150.0, warmup=60.0, workload="flagship",
                   workload_knobs={"shared_tokens": shared, "context_median": context})
    reqs = load_requests(spec)
    out = run_spec(spec, reqs)
    return {"policy": policy, "shared_tokens": shared, "context_median": context, "hit_rate": out["hit_rate"],
            "ttft_p99": out["ttft_p99"], "preemptions": out["preemptions"],
            "bound": window_hit_bound(reqs, 60.0, 150.0),
            "ceiling": sum(q.prefix_tokens for q in reqs) / sum(q.prompt_tokens for q in reqs)}


def kv_blocks(factor: float) -> int:
    return int(round(factor * PROFILE_KV))


def _anchor_run(args) -> dict:
    from services.core.traces import window_hit_bound
    from services.sim.runs import RunSpec, load_requests, run_spec

    policy, active, factor = args
    spec = RunSpec(policy=policy, qps=100.0, duration=150.0, warmup=60.0, workload="flagship", profile=PROFILE,
                   kv_blocks=kv_blocks(factor), workload_knobs={**ANCHOR_SHAPE, "active_set": active})
    reqs = load_requests(spec)
    out = run_spec(spec, reqs)
    measured = [q for q in reqs if 60.0 <= q.arrival < 150.0]
    return {"policy": policy, "active_set": active, "kv_factor": factor, "kv_blocks": kv_blocks(factor),
            "hit_rate": out["hit_rate"], "ttft_p99": out["ttft_p99"], "preemptions": out["preemptions"],
            "bound": window_hit_bound(reqs, 60.0, 150.0),
            "keys_seen": len({q.key for q in reqs}),
            "mean_prompt_tokens": sum(q.prompt_tokens for q in measured) / len(measured)}


def objective(flat: float, sticky: float) -> float:
    return abs(flat - TARGET_FLAT) + abs(sticky - TARGET_STICKY)


def cells(probes: list[dict]) -> list[dict]:
    """One row per probed (K, f) cell holding both policies: hits, bound, objective."""
    by: dict[tuple, dict] = {}
    for p in probes:
        by.setdefault((p["active_set"], p["kv_factor"]), {})[p["policy"]] = p
    rows = []
    for (k, f), pol in sorted(by.items()):
        if "flat" not in pol or "sticky" not in pol:
            continue
        fl, st = pol["flat"], pol["sticky"]
        rows.append({"active_set": k, "kv_factor": f, "kv_blocks": kv_blocks(f), "flat": fl["hit_rate"],
                     "sticky": st["hit_rate"], "bound": fl["bound"], "objective": objective(fl["hit_rate"],
                                                                                           st["hit_rate"]),
                     "flat_p99": fl["ttft_p99"], "sticky_p99": st["ttft_p99"],
                     "flat_preemptions": fl["preemptions"], "sticky_preemptions": st["preemptions"],
                     "keys_seen": fl["keys_seen"], "mean_prompt_tokens": fl["mean_prompt_tokens"]})
    return rows


def best_cell(rows: list[dict]) -> dict:
    return min(rows, key=lambda r: (round(r["objective"], 9), abs(r["kv_factor"] - 1.0), r["active_set"]))


def stage2_cells(k: int, f: float) -> list[tuple[int, float]]:
    ks = sorted({max(64, int(round(k * m / 64)) * 64) for m in (1 / STEP_K, 1.0, STEP_K)})
    fs = sorted({round(f + d, 3) for d in (-STEP_F, 0.0, STEP_F) if f + d > 0})
    return [(a, b) for a in ks for b in fs if (a, b) != (k, f)]


def calibrate_anchors(jobs: int) -> dict:
    pool = multiprocessing.get_context("spawn").Pool(jobs) if jobs > 1 else None
    mapper = pool.imap if pool is not None else map
    probes: list[dict] = []

    def probe(grid: list[tuple[int, float]]) -> None:
        todo = [(pol, k, f) for k, f in grid for pol in ("flat", "sticky")]
        for r in mapper(_anchor_run, todo):
            probes.append(r)
            sys.stderr.write(f"{r['policy']} K={r['active_set']} kv={r['kv_factor']:g}x: hit {r['hit_rate']:.3f} "
                             f"p99 {r['ttft_p99']:.2f} s (bound {r['bound']:.3f})\n")

    try:
        probe([(k, f) for k in ACTIVE_SETS for f in KV_FACTORS])
        first = best_cell(cells(probes))
        probe(stage2_cells(first["active_set"], first["kv_factor"]))
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    rows = cells(probes)
    chosen = best_cell(rows)
    result = {"targets": {"flat": TARGET_FLAT, "sticky": TARGET_STICKY},
              "settings": {"profile": PROFILE, "replicas": 30, "qps": 100.0, "duration": 150.0, "warmup": 60.0,
                           "seed": 0, "arrivals": "poisson", "workload": "flagship", **ANCHOR_SHAPE,
                           "active_sets": list(ACTIVE_SETS), "kv_factors": list(KV_FACTORS)},
              "stage1_best": first, "chosen": chosen, "cells": rows, "probes": probes}
    os.makedirs(os.path.dirname(ANCHORS_OUT), exist_ok=True)
    with open(ANCHORS_OUT, "wb") as f:
        f.write(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return result


def calibrate(jobs: int) -> dict:
    pool = multiprocessing.get_context("spawn").Pool(jobs) if jobs > 1 else None
    mapper = pool.map if pool is not None else lambda f, xs: list(map(f, xs))
    probes: list[dict] = []
    # bisection state per C: (lo, hi) in units of 256 tokens, flat hit increasing in S
    state = {c: [S_LOW // 256, S_HIGH // 256] for c in CONTEXTS}
    best: dict[int, dict] = {}
    try:
        for _ in range(4):
            todo = []
            for c, (lo, hi) in state.items():
                if c in best and abs(best[c]["hit_rate"] - TARGET_FLAT) <= 0.01:
                    continue
                todo.append(("flat", 256 * ((lo + hi) // 2), c))
            if not todo:
                break
            for r in mapper(_run, todo):
                probes.append(r)
                sys.stderr.write(f"flat S={r['shared_tokens']} C={r['context_median']}: hit {r['hit_rate']:.3f} "
                                 f"(bound {r['bound']:.3f})\n")
                c, mid = r["context_median"], r["shared_tokens"] // 256
                if c not in best or abs(r["hit_rate"] - TARGET_FLAT) < abs(best[c]["hit_rate"] - TARGET_FLAT):
                    best[c] = r
                if r["hit_rate"] < TARGET_FLAT:
                    state[c][0] = mid
                else:
                    state[c][1] = mid
        sticky = mapper(_run, [("sticky", best[c]["shared_tokens"], c) for c in CONTEXTS])
        for r in sticky:
            probes.append(r)
            sys.stderr.write(f"sticky S={r['shared_tokens']} C={r['context_median']}: hit {r['hit_rate']:.3f}\n")
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    chosen = min(sticky, key=lambda r: abs(r["hit_rate"] - TARGET_STICKY))
    result = {"targets": {"flat": TARGET_FLAT, "sticky": TARGET_STICKY}, "probes": probes,
              "chosen": {"shared_tokens": chosen["shared_tokens"], "context_median": chosen["context_median"],
                         "flat": best[chosen["context_median"]], "sticky": chosen}}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "wb") as f:
        f.write(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="experiments.flagship")
    ap.add_argument("what", choices=("calibrate", "calibrate-anchors"))
    ap.add_argument("--jobs", type=int, default=1, choices=(1, 2))
    args = ap.parse_args(argv)
    res = calibrate_anchors(args.jobs) if args.what == "calibrate-anchors" else calibrate(args.jobs)
    sys.stdout.write(orjson.dumps(res["chosen"], option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
