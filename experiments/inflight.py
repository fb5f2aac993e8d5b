"""In-flight balance at the flagship's knee (issue 23's goal "in-flight max/mean <= 1.05").

The simulator's `imbalance` is max/mean of requests *served* per replica; the goal is about
requests *in flight* (routed, not finished). This probe records each request's send and finish
time (a Simulator subclass; the run itself is the seeds' `flagship-strong` point: q_cap 6.5, 150 s,
60 s warm-up, first plan at 5 s), and over the measured window [60, 150) s reports
  time_avg   max/mean over replicas of the time-averaged in-flight count (Little's law per replica)
  instant    the time-average of max_r / mean_r of the instantaneous in-flight counts
Simulated time. Prints one JSON line a point.

    .venv/bin/python -m experiments.inflight --policies sglang,cacheroute --qps 150 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from services.core.policies import make_policy
from services.sim.runs import RunSpec, config_for, load_requests
from services.sim.simulator import Simulator

FLAGSHIP = dict(workload="flagship", kv_blocks=19388, q_cap=6.5,
                workload_knobs={"active_set": 4864, "shared_tokens": 4096, "context_median": 2048})


class Recording(Simulator):
    """Records send (first routed) and finish times per request."""

    def run(self):
        n = len(self.requests)
        self.sent, self.done = np.full(n, np.nan), np.full(n, np.nan)
        return super().run()

    def _send(self, i, q, t, r, reason):
        super()._send(i, q, t, r, reason)
        self.sent[i] = t

    def _apply(self, r, t, res):
        super()._apply(r, t, res)
        for rid in res.finished:
            self.done[self._index[rid]] = t


def balance(replica: np.ndarray, sent: np.ndarray, done: np.ndarray, replicas: int, lo: float, hi: float) -> dict:
    """Time-averaged and instantaneous in-flight max/mean over [lo, hi)."""
    ok = replica >= 0
    r, s, d = replica[ok], sent[ok], np.where(np.isnan(done[ok]), np.inf, done[ok])
    overlap = np.clip(np.minimum(d, hi) - np.maximum(s, lo), 0, None)
    avg = np.bincount(r, weights=overlap, minlength=replicas) / (hi - lo)
    # instantaneous: +1 at send, -1 at finish, swept in time order
    times = np.concatenate([s, d])
    deltas = np.zeros((times.size, replicas))
    deltas[np.arange(s.size), r] = 1
    deltas[s.size + np.arange(d.size), r] = -1
    order = np.argsort(times, kind="stable")
    times, counts = times[order], np.cumsum(deltas[order], axis=0)
    dt = np.diff(np.clip(np.append(times, np.inf), lo, hi))
    mean = counts.mean(axis=1)
    ratio = np.where(mean > 0, counts.max(axis=1) / np.where(mean > 0, mean, 1), 1.0)
    w = dt.sum()
    return {"time_avg": float(avg.max() / avg.mean()), "instant": float((ratio * dt).sum() / w),
            "mean_in_flight": float(avg.mean()), "max_in_flight_avg": float(avg.max())}


def one(policy: str, qps: float, seed: int, knobs: dict) -> dict:
    spec = RunSpec(policy=policy, qps=qps, duration=150.0, warmup=60.0, first_plan_at=5.0, seed=seed,
                   workload=FLAGSHIP["workload"], workload_knobs=FLAGSHIP["workload_knobs"],
                   kv_blocks=FLAGSHIP["kv_blocks"], q_cap=FLAGSHIP["q_cap"], policy_knobs=knobs)
    reqs = load_requests(spec)
    sim = Recording(config_for(spec), make_policy(policy, spec.replicas, seed=seed, **knobs), reqs)
    res = sim.run()
    out = balance(res.replica, sim.sent, sim.done, res.replicas, res.warmup, res.end)
    m = res.extra["misses"]
    return {"policy": policy, "knobs": knobs, "qps": qps, "seed": seed, **{k: round(v, 3) for k, v in out.items()},
            "served_imbalance": round(res.metrics.imbalance, 3), "p99": round(res.metrics.ttft_p99, 2),
            "hit": round(100 * res.metrics.hit_rate, 2), "preemptions": res.preemptions,
            "spilled": round(100 * m["spilled"], 2), "evicted": round(100 * m["evicted"], 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="sglang,cacheroute")
    ap.add_argument("--qps", default="150")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--knobs", default="{}", help="JSON policy knobs (cacheroute only)")
    args = ap.parse_args(argv)
    for seed in (int(s) for s in args.seeds.split(",")):
        for qps in (float(q) for q in args.qps.split(",")):
            for policy in args.policies.split(","):
                knobs = json.loads(args.knobs) if policy.startswith("cacheroute") else {}
                print(json.dumps(one(policy, qps, seed, knobs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
