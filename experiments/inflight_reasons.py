"""Diagnosis behind docs/experiments.md "Issue 23 simulator goals, status": time-averaged in-flight
per replica split by the pick's reason (planned / cold / fallback), cacheroute, flagship 150 QPS, seed 0.
Simulated time.  .venv/bin/python experiments/inflight_reasons.py
"""
import numpy as np, json
from experiments.inflight import Recording, FLAGSHIP, balance
from services.sim.runs import RunSpec, config_for, load_requests
from services.core.policies import make_policy
from services.core.policy import Reason
class R2(Recording):
    def run(self):
        self.reason = {}
        return super().run()
    def _send(self, i, q, t, r, reason):
        super()._send(i, q, t, r, reason); self.reason[i] = reason
spec = RunSpec(policy="cacheroute", qps=150.0, duration=150.0, warmup=60.0, first_plan_at=5.0, seed=0,
               workload="flagship", workload_knobs=FLAGSHIP["workload_knobs"], kv_blocks=19388, q_cap=6.5)
reqs = load_requests(spec)
sim = R2(config_for(spec), make_policy("cacheroute", 30, seed=0), reqs); res = sim.run()
lo, hi = res.warmup, res.end
reason = np.array([sim.reason.get(i, Reason.COLD).name for i in range(len(reqs))])
for name in sorted(set(reason)):
    m = reason == name
    rep = np.where(m, res.replica, -1)
    ok = rep >= 0; s=sim.sent; d=np.where(np.isnan(sim.done), np.inf, sim.done)
    ov = np.clip(np.minimum(d, hi) - np.maximum(s, lo), 0, None); ov[~ok]=0
    avg = np.bincount(np.where(ok, rep, 0), weights=ov, minlength=30) / (hi - lo)
    win = (res.arrival>=lo)&(res.arrival<hi)
    print(name, "share", round((m&win).sum()/win.sum(),3), "avg in flight per replica min/mean/max", avg.min().round(1), avg.mean().round(1), avg.max().round(1))
tot = balance(res.replica, sim.sent, sim.done, 30, lo, hi); print(tot)
# per-replica totals and planned, sorted by total
s=sim.sent; d=np.where(np.isnan(sim.done), np.inf, sim.done); ov=np.clip(np.minimum(d,hi)-np.maximum(s,lo),0,None)
ok=res.replica>=0
tot_r=np.bincount(res.replica[ok], weights=ov[ok], minlength=30)/(hi-lo)
pl=(reason=="PLANNED")&ok
pl_r=np.bincount(res.replica[pl], weights=ov[pl], minlength=30)/(hi-lo)
o=np.argsort(-tot_r)
print("top replicas total/planned:", [(int(r), round(tot_r[r]), round(pl_r[r])) for r in o[:5]], "bottom:", [(int(r), round(tot_r[r]), round(pl_r[r])) for r in o[-3:]])
print("corr(total, planned)", np.corrcoef(tot_r, pl_r)[0,1].round(2), "sd planned", pl_r.std().round(1), "sd cold", (tot_r-pl_r).std().round(1), "sd total", tot_r.std().round(1))
# output length part: in-flight dominated by decode
