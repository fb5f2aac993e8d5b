"""The capacity advisor against the simulator's own capacity sweep over N (issue 21, item 6).

For each workload (paper; whale: two keys carrying 35% of the traffic, above q_cap at 120 QPS,
so k_b > 1; bursty: paper with gamma gaps of CV 1.9), offered rate and seed, on the 8B profile
with a p99 TTFT SLO:

- **sim N**: the simulator's own answer. The workload's requests (their own output lengths,
  log-normal around 242 tokens) run through the cacheroute policy with its control loop (plans
  re-built every interval, q_cap fixed at the planner's default) on N = 1, 2, ... replicas for
  `--duration` seconds; sim N is the smallest N whose p99 meets the SLO (the sweep goes on one
  N past it to check the next N passes too).
- **advise**: `services.planner.advisor.advise` given only what telemetry would hold over the
  same run: per-key rates (count / duration), mean prompt and prefix tokens, the measured mean
  output per request (what the engines' completion counters report) and the gap CV of the
  arrivals (the collector's inter-arrival sample). N0 is ceil(qps / q_cap) + 2 with spread 3, so
  the tried range does not depend on the answer. Three configurations:
  `measured` (the defaults, output and CV from the telemetry), `default out` (no output measured:
  the 200-token fallback; CV measured) and `old` (main's defaults before this check: 64 output
  tokens, 60 s / 4,000 requests, Poisson).

Simulated time only; the CPU seconds of one `measured` advice (7 simulations) are printed.

  .venv/bin/python -m experiments.advisor_check [--seeds 0,1] [--slo 2] [--duration 300]
  .venv/bin/python -m experiments.advisor_check --cpu     # one advice for 8 replicas: CPU s
"""

from __future__ import annotations

import argparse
import math
import time
from collections import defaultdict

import numpy as np

from services.core.metrics import gap_cv
from services.core.workloads import make_workload
from services.planner.advisor import AdviceConfig, KeyLoad, advise
from services.sim.runs import RunSpec, run_spec

PROFILE = "llama3-8b-h100"
Q_CAP = 20.0
WORKLOADS = {"paper": ("paper", {}), "whale": ("whale", {"whales": 2}), "bursty": ("paper", {"cv": 1.9})}
QPS = (60.0, 120.0)


def telemetry(requests, duration: float) -> tuple[list[KeyLoad], float, float | None]:
    """What the collector's window would hold for these requests: loads, mean output, gap CV."""
    n, prompt, prefix = defaultdict(int), defaultdict(float), defaultdict(float)
    for q in requests:
        n[q.key] += 1
        prompt[q.key] += q.prompt_tokens
        prefix[q.key] += q.prefix_tokens
    loads = [KeyLoad(k, c / duration, prompt[k] / c, prefix[k] / c) for k, c in n.items()]
    loads.sort(key=lambda k: -k.rate)
    output = float(np.mean([q.output_tokens for q in requests]))
    return loads, output, gap_cv(np.diff([q.arrival for q in requests]).tolist())


def sim_n(workload: str, knobs: dict, qps: float, seed: int, slo: float, duration: float) -> tuple[int | None, dict]:
    """The smallest N whose simulated p99 meets the SLO, and p99 per N tried."""
    p99s: dict[int, float] = {}
    n = max(1, math.floor(qps / (2 * Q_CAP)))
    found = None
    while n <= 4 * math.ceil(qps / Q_CAP) + 4:
        out = run_spec(RunSpec(policy="cacheroute", qps=qps, replicas=n, profile=PROFILE, duration=duration,
                               seed=seed, workload=workload, workload_knobs=knobs, q_cap=Q_CAP))
        p99 = out["ttft_p99"] if out["ttft_p99"] is not None else math.inf
        p99s[n] = p99
        if p99 <= slo and found is None:
            found = n
        elif found is not None:
            break                 # one N past the answer, to see it holds
        n += 1
    return found, p99s


def check(seeds, slo: float, duration: float) -> list[dict]:
    rows = []
    for name, (workload, knobs) in WORKLOADS.items():
        for qps in QPS:
            for seed in seeds:
                truth, p99s = sim_n(workload, knobs, qps, seed, slo, duration)
                reqs = make_workload(workload, qps=qps, duration=duration, seed=seed, **knobs).requests
                loads, output, cv = telemetry(reqs, duration)
                n0 = math.ceil(qps / Q_CAP) + 2
                base = AdviceConfig(profile=PROFILE, replicas=n0, spread=3, slo_p99=slo, q_cap=Q_CAP, seed=seed)
                t0 = time.process_time()
                measured = advise(loads, base, output_tokens=output, cv=cv)
                cpu = time.process_time() - t0
                fallback = advise(loads, base, cv=cv)
                old = advise(loads, AdviceConfig(profile=PROFILE, replicas=n0, spread=3, slo_p99=slo, q_cap=Q_CAP,
                                                 seed=seed, seconds=60, max_requests=4000, output_tokens=64))
                row = {"workload": name, "qps": qps, "seed": seed, "sim": truth, "p99s": p99s,
                       "measured": measured.recommended, "default": fallback.recommended, "old": old.recommended,
                       "output": output, "cv": cv, "cpu": cpu, "range": (max(1, n0 - 3), n0 + 3),
                       "requests": measured.requests}
                rows.append(row)
                print(row, flush=True)
    return rows


def table(rows: list[dict], slo: float) -> str:
    def n(v, row):
        return f"> {row['range'][1]}" if v is None else str(v)

    head = ["workload", "QPS", "seed", "sim N", f"sim p99 s at N-1 / N", "advise measured", "advise default out",
            "advise old", "mean output", "gap CV", "CPU s (measured)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        t, p = r["sim"], r["p99s"]
        around = "-" if t is None else " / ".join("-" if p.get(x) is None else f"{p[x]:.2f}" for x in (t - 1, t))
        cells = [r["workload"], f"{r['qps']:g}", str(r["seed"]), "none" if t is None else str(t), around,
                 n(r["measured"], r), n(r["default"], r), n(r["old"], r), f"{r['output']:.0f}",
                 "-" if r["cv"] is None else f"{r['cv']:.2f}", f"{r['cpu']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    agree = {k: sum(r[k] == r["sim"] for r in rows) for k in ("measured", "default", "old")}
    low = {k: sum(r[k] is not None and r["sim"] is not None and r[k] < r["sim"] for r in rows)
           for k in ("measured", "default", "old")}
    lines.append("")
    lines.append(f"SLO p99 {slo:g} s, {PROFILE}, q_cap {Q_CAP:g}. Equal to sim N: "
                 + ", ".join(f"{k} {agree[k]}/{len(rows)}" for k in agree)
                 + "; below sim N: " + ", ".join(f"{k} {low[k]}" for k in low) + ".")
    return "\n".join(lines) + "\n"


def cpu_of_one_advice() -> str:
    """CPU and wall seconds of one advice for 8 replicas (N = 6..10) at the default stream size:
    `paper` at 100 req/s, so the 12,000-request cap binds."""
    reqs = make_workload("paper", qps=100.0, duration=300.0, seed=0).requests
    loads, output, cv = telemetry(reqs, 300.0)
    t, w = time.process_time(), time.monotonic()
    a = advise(loads, AdviceConfig(profile=PROFILE, replicas=8, spread=2, slo_p99=2.0, q_cap=Q_CAP),
               output_tokens=output, cv=cv)
    return (f"8 replicas (N = 6..10), paper at 100 req/s: {a.requests} requests simulated, recommended "
            f"{a.recommended}; {time.process_time() - t:.1f} CPU s, {time.monotonic() - w:.1f} s wall")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--slo", type=float, default=2.0)
    p.add_argument("--duration", type=float, default=300.0)
    p.add_argument("--cpu", action="store_true", help="only time one advice for 8 replicas")
    args = p.parse_args(argv)
    if args.cpu:
        print(cpu_of_one_advice())
        return 0
    rows = check([int(s) for s in args.seeds.split(",")], args.slo, args.duration)
    print(table(rows, args.slo))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
