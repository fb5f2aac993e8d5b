"""p99 TTFT by 10 s arrival bin for fresh-plan CacheRoute on the flagship K=128 near its knee, with
the P2C and the CHWBL cold tail (docs/experiments.md, (a) "Near the knee").

  .venv/bin/python -m experiments.knee_bins [QPS]      (default 300; ~1 min)

Same settings as experiments.run flagship-k128-knee (q_cap fixed at 10.75, bootstrap plan at 5 s,
150 s of arrivals, seed 0). Shows whether a failing point fails from the start-up transient or
later in the run.
"""

from __future__ import annotations

import sys

import numpy as np

from services.core.policies import make_policy
from services.sim.runs import RunSpec, config_for, load_requests
from services.sim.simulator import Simulator


def bins(qps: float, cold: str, width: float = 10.0) -> list[tuple[float, float]]:
    spec = RunSpec(policy="cacheroute", qps=qps, duration=150.0, warmup=60.0, first_plan_at=5.0, q_cap=10.75,
                   workload_knobs={"active_set": 128})
    res = Simulator(config_for(spec), make_policy("cacheroute", spec.replicas, seed=spec.seed, cold=cold),
                    load_requests(spec)).run()
    out = []
    for lo in np.arange(0.0, spec.duration, width):
        ttft = res.ttft[(res.arrival >= lo) & (res.arrival < lo + width)]
        out.append((float(lo), float(np.nanpercentile(ttft, 99))))
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    qps = float(args[0]) if args else 300.0
    for cold in ("p2c", "chwbl"):
        print(f"{cold} tail, p99 s by arrival bin: " + " ".join(f"{lo:g}:{p99:.1f}" for lo, p99 in bins(qps, cold)),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
