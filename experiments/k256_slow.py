"""Diagnosis behind docs/experiments.md "Warm spill": K = 256 (q_cap 11.125) at QPS, per policy, the
time-averaged in-flight balance and where the requests slower than 1 s come from (pick reason, replica,
5 s bin, key). Simulated time.  .venv/bin/python experiments/k256_slow.py sglang,cacheroute 300 0
"""
import numpy as np, sys
from experiments.inflight import Recording, balance
from services.sim.runs import RunSpec, config_for, load_requests
from services.core.policies import make_policy
from services.core.policy import Reason
class R2(Recording):
    def run(self):
        self.reason = {}
        return super().run()
    def _send(self, i, q, t, r, reason):
        super()._send(i, q, t, r, reason); self.reason[i] = reason
qps = float(sys.argv[2]) if len(sys.argv) > 2 else 300.0
seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
for pol in sys.argv[1].split(","):
    spec = RunSpec(policy=pol, qps=qps, duration=150.0, warmup=60.0, first_plan_at=5.0, seed=seed,
                   workload="paper", workload_knobs={"active_set": 256}, q_cap=11.125)
    reqs = load_requests(spec)
    sim = R2(config_for(spec), make_policy(pol, 30, seed=seed), reqs); res = sim.run()
    lo, hi = res.warmup, res.end
    win = (res.arrival >= lo) & (res.arrival < hi) & (res.replica >= 0)
    ttft = res.ttft
    print(pol, "p99", np.percentile(ttft[win], 99).round(2), "p90", np.percentile(ttft[win], 90).round(2), "hit", round(res.metrics.hit_rate, 4), "p99m", round(res.metrics.ttft_p99, 2))
    print(" balance", {k: round(v, 3) for k, v in balance(res.replica, sim.sent, sim.done, 30, lo, hi).items()})
    reason = np.array([sim.reason.get(i, Reason.COLD).name for i in range(len(reqs))])
    slow = win & (ttft > 1.0)
    print(" slow (>1s):", slow.sum(), "of", win.sum(), "by reason", {n: int((slow & (reason == n)).sum()) for n in set(reason)},
          "share by reason", {n: round(float((win & (reason == n)).sum() / win.sum()), 3) for n in set(reason)})
    reps = np.bincount(res.replica[slow], minlength=30)
    print(" slow by replica (top)", sorted(((int(c), r) for r, c in enumerate(reps) if c), reverse=True)[:8])
    tb = np.floor(res.arrival[slow] / 5) * 5
    print(" slow by 5s bin", dict(zip(*np.unique(tb, return_counts=True))))
    keys = np.array([q.key for q in reqs])
    ks, kc = np.unique(keys[slow], return_counts=True)
    print(" slow keys top", sorted(zip(kc.tolist(), ks.tolist()), reverse=True)[:6], "distinct", len(ks))
    prompt = res.prompt
    print(" slow prompt mean", prompt[slow].mean().round(0) if slow.any() else 0, "all mean", prompt[win].mean().round(0),
          "cached frac of slow", (res.cached[slow].sum() / max(1, prompt[slow].sum())).round(3))
