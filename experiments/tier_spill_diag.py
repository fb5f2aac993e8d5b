"""Which branch spills at a tier of N vs 1 on the engine-bound tenants point (simulated), and whether
the home really lost the prefix when the cold-home rule fired (checked against the engines' exact
caches). Diagnostic, monkeypatches the policy: .venv/bin/python experiments/tier_spill_diag.py TIER QPS [KNOBS]"""
import sys, json, collections
sys.path.insert(0, "bench")
from experiments import bound_tenants as bt
from services.core.policies import cacheroute as cr
from services.core.policy import Reason
from services.core.request import BLOCK_TOKENS

stats = collections.Counter()
spread = collections.defaultdict(collections.Counter)   # key -> replica -> count (FALLBACK by cold home)
orig = cr.CacheRoutePolicy._off_cold_home
orig_choose = cr.CacheRoutePolicy._choose

def off(self, request, best, members, state):
    out = orig(self, request, best, members, state)
    if out is not None and out.reason == Reason.FALLBACK:
        pre = request.prefix_tokens // BLOCK_TOKENS
        truth = state.prefix_match(best, request.blocks[:pre]) >= (pre + 1) // 2
        stats["coldhome_fire"] += 1
        stats["coldhome_fire_home_really_holds" if truth else "coldhome_fire_home_lost"] += 1
        tgt = state.prefix_match(out.replica, request.blocks[:pre]) >= (pre + 1) // 2
        stats["target_holds" if tgt else "target_cold"] += 1
        spread[request.key][out.replica] += 1
    return out

def choose(self, request, state):
    p = orig_choose(self, request, state)
    stats[p.reason.name] += 1
    return p
cr.CacheRoutePolicy._off_cold_home = off
cr.CacheRoutePolicy._choose = choose

tier, qps = int(sys.argv[1]), float(sys.argv[2])
knobs = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
import peers
ts = peers.BOUND.time_scale
spec = bt.spec_for("cacheroute", knobs, qps, 1)
reqs = bt.requests(qps, 1)
out = bt.run(spec, reqs, tier)
m = out["misses"]
print(json.dumps({"tier": tier, "qps": qps, "knobs": knobs, "hit": round(out["hit_rate"]*100, 2),
                  **{k: round(m[k]*100, 2) for k in ("spilled", "evicted", "first_on_replica")},
                  "p99_ms": round(out["ttft_p99"]*ts*1000), **stats,
                  "keys_spilled_to_2plus": sum(1 for c in spread.values() if len(c) >= 2)}))
