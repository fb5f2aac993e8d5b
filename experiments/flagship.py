"""The paper's flagship workload: calibration of its prompt structure (issue 13, docs/experiments.md).

`--workload flagship` (services/core/workloads.py) replays the full 128,824-key population
(every key can send traffic); a prompt is one prefix shared by every key (S tokens) + the
key's own context (log-normal, median C, sigma 0.5) + a unique suffix (the `paper` suffix).
The paper does not give its prompt structure, so S and C are calibrated once, from what the
paper reports about its *baselines* only: Flat-LB 64.1% and Sticky 87.3% served hit rate at
100 QPS (70B fp8, 30 replicas). Nothing here looks at any other policy.

Search (chosen before running; the objective is lexicographic because Flat-LB is cache-agnostic,
so its hit rate pins the share of the widely shared prefix, and Sticky then pins the per-key
context):
  for each C in CONTEXTS: bisect S (3 steps, multiples of 256 tokens) until Flat-LB's hit rate
  at 100 QPS is within 1 point of 64.1%; then run Sticky at that (S, C).
  Pick the C whose Sticky hit is closest to 87.3%.
Settings are those of every experiment here: 150 s of arrivals, 60 s warm-up, seed 0, Poisson.
The measured-window infinite-cache bound (services.core.traces.window_hit_bound) of every
probed workload is recorded beside it: no router can exceed it.

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
    ap.add_argument("what", choices=("calibrate",))
    ap.add_argument("--jobs", type=int, default=1, choices=(1, 2))
    args = ap.parse_args(argv)
    res = calibrate(args.jobs)
    sys.stdout.write(orjson.dumps(res["chosen"], option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
