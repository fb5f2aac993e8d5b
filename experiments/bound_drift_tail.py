"""The tail of the simulated (d) drift point (experiments/bound_drift.py, the live planner's loop):
every request at or over the p99 TTFT, with its arrival (wall s), replica, TTFT (wall ms), the share
of its prompt that was cached, its key, whether it was spilled and its prompt tokens.

    .venv/bin/python experiments/bound_drift_tail.py 16 2 '{"cold_home": null}'   # wall req/s, seed, knobs
"""
import os
sys_path_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
import sys, json
from dataclasses import replace
import numpy as np
sys.path[:0] = [sys_path_root, os.path.join(sys_path_root, 'bench')]
from experiments import bound_drift as bd
import peers
from services.core.policies import make_policy
from services.sim.simulator import Simulator
from services.sim.runs import RunSpec, config_for
qps=float(sys.argv[1]); seed=int(sys.argv[2]); knobs=json.loads(sys.argv[3]) if len(sys.argv)>3 else {}
ts=2.0
scale=peers.BOUND
duration,warmup=scale.timing("drift")
spec=RunSpec(policy="cacheroute", qps=qps*ts, replicas=4, profile=scale.profile, duration=duration/ts, seed=seed,
  kv_blocks=scale.kv_blocks, warmup=warmup/ts, policy_knobs=knobs, control_interval=5.0, q_cap=40.0, warm_slots=64, first_plan_at=2.5)
reqs=bd.requests(qps,seed)
prefix={}
for q in reqs: prefix.setdefault(q.key,q.prefix_tokens)
fn=bd.live_plan_fn(ts,prefix)
config=replace(config_for(spec), rate_window=30.0, plan_fn=fn)
pol=make_policy("cacheroute",4,seed=seed,**knobs)
sim=Simulator(config,pol,reqs); res=sim.run()
m=(res.arrival>=15)&~np.isnan(res.ttft)
t=res.ttft[m]; p99=np.percentile(t,99)
print("p99 wall ms", p99*ts*1000, "n", m.sum())
idx=np.flatnonzero(m)
tail=idx[res.ttft[idx]>=p99]
sp=np.array(sim._spilled)
rows=[]
for i in sorted(tail, key=lambda i: res.arrival[i]):
    q=reqs[i]
    rows.append((round(res.arrival[i]*ts,1), int(res.replica[i]), round(res.ttft[i]*ts*1000), round(res.cached[i]/res.prompt[i],2), q.key, bool(sp[i]), q.prompt_tokens))
for r in rows: print(r)
# per replica share of tail and of hits
print("tail by replica", np.bincount(res.replica[tail],minlength=4))
print("tail cached>0.5", sum(1 for r in rows if r[3]>0.5), "of", len(rows))
# time since rotation
print("phase in period (s)", sorted(round(r[0]%60) for r in rows))
