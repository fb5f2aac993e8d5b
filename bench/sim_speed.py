"""Simulator speed at flagship settings: simulated requests per wall-clock second.

Flagship: 70B fp8 profile, 30 replicas, paper workload (128 active keys, prompts ~3,500
tokens, outputs ~240), 100 QPS. Each policy runs the same requests twice in one process:
with the decode fast-forward (the simulator's default) and without it (one event per engine
step, the baseline), checking both give the same TTFTs. q_cap is fixed (--q-cap) so the timed
run excludes calibration; the calibration time is reported on its own.

    .venv/bin/python bench/sim_speed.py [--duration 300] [--policies flat,cacheroute]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from services.core.engine import PROFILES  # noqa: E402
from services.core.policies import make_policy  # noqa: E402
from services.core.workloads import make_workload  # noqa: E402
from services.sim import calibrate  # noqa: E402
from services.sim.simulator import SimConfig, Simulator  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--qps", type=float, default=100.0)
    ap.add_argument("--replicas", type=int, default=30)
    ap.add_argument("--policies", default="flat,cacheroute")
    ap.add_argument("--q-cap", type=float, default=6.0)
    ap.add_argument("--baseline-duration", type=float, default=120.0,
                    help="arrival seconds for the no-fast-forward comparison (it is slow)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    profile = PROFILES["llama3-70b-fp8-h100x2"]
    t = time.perf_counter()
    wl = make_workload("paper", qps=args.qps, duration=args.duration, seed=args.seed)
    reqs = wl.requests
    print(f"workload generation: {time.perf_counter() - t:.2f} s")
    short = [q for q in reqs if q.arrival < args.baseline_duration]
    print(f"workload: {len(reqs)} requests over {args.duration:g} s, mean prompt "
          f"{np.mean([q.prompt_tokens for q in reqs]):.0f}, mean output {np.mean([q.output_tokens for q in reqs]):.0f}")
    t = time.perf_counter()
    q_cap = calibrate.q_cap_for(profile, reqs, args.replicas)
    print(f"q_cap calibration (not timed below): {q_cap:.2f} req/s per replica in {time.perf_counter() - t:.1f} s")
    print()
    print("| policy | requests | wall s | sim req/s | events/req | hit rate | p99 TTFT s | no-FF req/s (first "
          f"{args.baseline_duration:g} s) | FF speed-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.policies.split(","):
        cfg = SimConfig(profile, args.replicas, q_cap=args.q_cap)
        res = Simulator(cfg, make_policy(name, args.replicas, seed=args.seed), reqs).run()
        rate = len(reqs) / res.wall_seconds
        # same-run baseline on the first part of the requests, fast-forward on and off
        cfg_s = SimConfig(profile, args.replicas, q_cap=args.q_cap, end=args.baseline_duration)
        on = Simulator(cfg_s, make_policy(name, args.replicas, seed=args.seed), short).run()
        off = Simulator(SimConfig(profile, args.replicas, q_cap=args.q_cap, end=args.baseline_duration,
                                  fast_forward=False),
                        make_policy(name, args.replicas, seed=args.seed), short).run()
        same = np.allclose(on.ttft, off.ttft, rtol=1e-9, atol=1e-12, equal_nan=True)
        rate_on = len(short) / on.wall_seconds
        rate_off = len(short) / off.wall_seconds
        print(f"| {name} | {len(reqs)} | {res.wall_seconds:.2f} | {rate:,.0f} | {res.events / len(reqs):.2f} | "
              f"{res.metrics.hit_rate:.3f} | {res.metrics.ttft_p99:.3f} | {rate_off:,.0f} | "
              f"{rate_on / rate_off:.1f}x{'' if same else ' (TTFTs DIFFER)'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
