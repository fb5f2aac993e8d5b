"""bench/peers.py's engine-bound (d) drift point in simulated time, with the live planner's loop:
the same textload workload (128 tenants whose popularity ranks rotate by 32 every 60 s wall),
4 x 70B engines at time scale 2 with 2,200 KV blocks, CacheRoute with the live stack's defaults,
and the plan lifecycle the planner service runs (services.planner.candidate.propose): every
10 s wall a churn-aware candidate from the last 60 s of arrivals (a sliding window of the
intervals' counts), new keys admitted where they were last served, at most 8 rebalancing moves
a loop and none inside the switching rule's 120 s dwell, installed only when
services.core.switching.decide_switch says so. The planner's arithmetic runs in wall units
(rates / time scale, times x time scale), so its SwitchConfig is the live one.

    .venv/bin/python -m experiments.bound_drift --rates 16,24 --seeds 1,2
    .venv/bin/python -m experiments.bound_drift --rates 16 --seeds 1 --series     # per-bin, per-replica view
    .venv/bin/python -m experiments.bound_drift --lifecycle sim                    # the simulator's own lifecycle
    .venv/bin/python -m experiments.bound_drift --tier 1,4 --tier-record-delay none,0.1 --tier-record-memory on,off

`--tier N`: N router instances of the policy, requests round-robin over them, one plan
(services.sim.tier; experiments.bound_tenants has the same flags); `--tier-record-delay` (wall
seconds, "none" = off) and `--tier-record-memory` run the record bus between them.

Printed per point (JSON line): hit %, bound, miss split (points), p50/p99 TTFT in wall ms, the
plan installs and the switching decisions; with --series per 10 s wall bin: hit %, p99 and
requests per replica, spilled share and the plan's predicted load per replica.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from services.core.metrics import percentile  # noqa: E402
from services.core.switching import SwitchConfig, decide_switch, loads_under  # noqa: E402
from services.sim.runs import RunSpec, config_for  # noqa: E402

from experiments.bound_tenants import bus_grid, requests, run_points  # noqa: E402

INTERVAL, WINDOW, MAX_MOVES, Q_CAP, WARM_SLOTS = 10.0, 60.0, 8, 20.0, 64   # wall units: the stack's defaults


def live_plan_fn(ts: float, prefix_tokens: dict[str, float], config: SwitchConfig = SwitchConfig(),
                 max_moves: int | None = MAX_MOVES, rates_fn=None, home_rho: float | None = None):
    """The planner service's loop as a simulator plan_fn (module header), in wall units. `rates_fn`
    (keys, wall rates, wall now) -> wall rates: a variant's rate estimate (None: the window's)."""
    from services.core.replan import build_at_home, replan_incremental, ring_homes, served_homes

    last_switch = [0.0]
    decisions: list[dict] = []

    def plan_fn(*, now, keys, rates, healthy, active, q_cap, warm_slots, version, replicas, window,
                served_at=None):
        ids = [f"r{j}" for j in range(replicas)]
        wall_now, wall_window = now * ts, window * ts
        wall_rates = [r / ts for r in rates]
        if rates_fn is not None:
            wall_rates = rates_fn(keys, wall_rates, wall_now)
        homes = served_homes(served_at or {}, ring_homes(replicas))
        q = q_cap / ts
        if active is None:
            last_switch[0] = wall_now
            return build_at_home(keys, wall_rates, ids, q, warm_slots, homes, version=version,
                                 created_at=wall_now, window_seconds=wall_window)
        moves = max_moves
        if wall_now - last_switch[0] < config.min_dwell_seconds:
            moves = 0                    # grow_in_dwell: no rebalancing inside the dwell
        more = {} if home_rho is None else {"home_rho": home_rho}
        cand = replan_incremental(active, keys, wall_rates, ids, q, warm_slots, version=version,
                                  created_at=wall_now, window_seconds=wall_window, homes=homes, max_moves=moves,
                                  **more)
        d = decide_switch(active, cand, dict(zip(keys, wall_rates)), prefix_tokens, now=wall_now,
                          last_switch_at=last_switch[0], config=config)
        decisions.append({"at": round(wall_now, 1), "switch": d.switch, "reason": d.reason,
                          "staleness": round(d.staleness_penalty, 4), "rewarm": round(d.rewarm_penalty, 3),
                          "moves": cand.extra.get("moves"), "predicted": [round(x, 2) for x in cand.expected_load],
                          "active_loads": [round(x, 2) for x in loads_under(active, dict(zip(keys, wall_rates)))]})
        if not d.switch:
            return active
        last_switch[0] = wall_now
        return cand

    plan_fn.wants_served = True
    plan_fn.decisions = decisions
    return plan_fn


def series(result, ts: float, bin_wall: float = 10.0) -> list[dict]:
    """Per wall bin (by arrival): hit %, requests, p99 TTFT (wall ms) and spilled share per replica."""
    R = result.replicas
    served = ~np.isnan(result.ttft)
    end = float(result.arrival.max()) * ts
    out = []
    spilled = np.asarray(result.extra.get("spilled_mask", np.zeros(len(result.arrival), bool)))
    for b0 in np.arange(0.0, end, bin_wall):
        m = (result.arrival * ts >= b0) & (result.arrival * ts < b0 + bin_wall)
        s = m & served
        row = {"t": float(b0), "hit": round(100 * result.cached[s].sum() / max(1, result.prompt[s].sum()), 1),
               "n": [int(np.count_nonzero(m & (result.replica == r))) for r in range(R)],
               "p99_ms": [round(percentile(result.ttft[s & (result.replica == r)] * ts * 1000, 99))
                          if np.any(s & (result.replica == r)) else None for r in range(R)],
               "spilled": int(np.count_nonzero(m & spilled))}
        out.append(row)
    return out


def point(args) -> dict:
    import peers

    from services.core.policies import make_policy
    from services.sim.simulator import Simulator
    from services.sim.tier import Tier

    knobs, qps_wall, seed, lifecycle, want_series, workload, variant, name, *bus = args
    tier, delay_wall, memory = bus if bus else (1, None, True)
    variant = dict(variant)
    window = variant.pop("window", WINDOW)
    q_cap_wall = variant.pop("q_cap", Q_CAP)
    if "dwell" in variant:
        variant["config"] = SwitchConfig(min_dwell_seconds=variant.pop("dwell"))
    scale = peers.BOUND
    ts = scale.time_scale
    duration, warmup = scale.timing(workload)
    spec = RunSpec(policy=name, qps=qps_wall * ts, replicas=scale.replicas, profile=scale.profile,
                   duration=duration / ts, seed=seed, kv_blocks=scale.kv_blocks, warmup=warmup / ts,
                   policy_knobs=knobs, control_interval=INTERVAL / ts, q_cap=q_cap_wall * ts, warm_slots=WARM_SLOTS,
                   first_plan_at=5.0 / ts, lifecycle="churn")
    reqs = requests(qps_wall, seed, workload)
    config = replace(config_for(spec), rate_window=window / ts)
    plan_fn = None
    if name != "cacheroute":
        config = replace(config, plan_fn=None)
        lifecycle = "-"
    elif lifecycle == "live":
        prefix = {}
        for q in reqs:
            prefix.setdefault(q.key, q.prefix_tokens)
        plan_fn = live_plan_fn(ts, prefix, **variant)
        config = replace(config, plan_fn=plan_fn)
    policy = make_policy(name, spec.replicas, seed=seed, **knobs) if tier == 1 else \
        Tier(lambda i: make_policy(name, spec.replicas, seed=seed + i, **knobs), tier,
             record_delay=None if delay_wall is None else delay_wall / ts, record_memory=memory)
    sim = Simulator(config, policy, reqs)
    res = sim.run()
    res.extra["spilled_mask"] = np.asarray(sim._spilled, dtype=bool)
    m = res.extra["misses"]
    out = {"policy": name, "workload": workload, "lifecycle": lifecycle, "knobs": knobs, "variant": args[7],
           "tier": tier, "record_delay": delay_wall, "record_memory": memory, "qps": qps_wall, "seed": seed,
           "hit": round(res.metrics.hit_rate * 100, 2), "bound": round(m["bound"] * 100, 2),
           "first_on_replica": round(m["first_on_replica"] * 100, 2), "evicted": round(m["evicted"] * 100, 2),
           "spilled": round(m["spilled"] * 100, 2), "first_sight": round(m.get("first_sight", 0.0) * 100, 2),
           "p50_ms": round(res.metrics.ttft_p50 * ts * 1000), "p99_ms": round(res.metrics.ttft_p99 * ts * 1000),
           "preemptions": res.preemptions,
           "shares": [round(x / max(1, sum(res.metrics.served_per_replica)), 3) for x in res.metrics.served_per_replica],
           "installs": [(round(p.at * ts, 1), p.version, None if p.churn is None else round(p.churn, 3))
                        for p in res.plans]}
    if plan_fn is not None:
        out["decisions"] = plan_fn.decisions
    if want_series:
        out["series"] = series(res, ts)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="cacheroute", help="cacheroute and/or unplanned baselines (sglang, ...)")
    parser.add_argument("--knobs", default="{}", help="JSON policy knobs for cacheroute (variants)")
    parser.add_argument("--rates", default="16,24", help="wall req/s, comma-separated")
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--workload", default="drift", help="bench/peers.py workload (drift, tenants, whales)")
    parser.add_argument("--lifecycle", choices=("live", "sim"), default="live",
                        help="live: the planner service's loop (module header); sim: the simulator's default")
    parser.add_argument("--variant", default="{}",
                        help="JSON planner variant: window, q_cap (wall), dwell (s), max_moves, home_rho")
    parser.add_argument("--series", action="store_true", help="add the per-bin, per-replica series")
    parser.add_argument("--tier", default="1", help="router instances per point, comma-separated")
    parser.add_argument("--tier-record-delay", default="none",
                        help="record bus delay(s) in wall seconds, comma-separated; none: no bus (services.sim.tier)")
    parser.add_argument("--tier-record-memory", default="on",
                        help="on/off, comma-separated: peers' picks also enter the cold tail's key memory")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", help="append each point as a JSON line to this file")
    args = parser.parse_args(argv)
    knobs = json.loads(args.knobs)
    variant = json.loads(args.variant)
    buses = bus_grid(args.tier_record_delay, args.tier_record_memory)
    jobs = [(knobs if p == "cacheroute" else {}, float(q), int(s), args.lifecycle, args.series, args.workload,
             variant, p, int(n), *bus)
            for s in args.seeds.split(",") for q in args.rates.split(",") for n in args.tier.split(",")
            for bus in (buses if int(n) > 1 else [(None, True)]) for p in args.policies.split(",")]
    run_points(point, jobs, args.jobs, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
