"""bench/peers.py's (e) rolling restart of a tier, in simulated time, to find which lost state costs
the hit-rate bins after a restart (issue 24 (e); docs/experiments.md "Rolling restart of a tier in the
simulator").

The live run (`bench/peers.py --scale bound --workload restart --tier 4 --grid 16 --control`): the
tenants traffic for 180 s (30 s warm-up), router instance i restarted at 60 + 20 i s, the same request
list replayed without restarts as the control; its figure is the worst 10 s bin below the control's
same bin in the 3 bins from a restart, beside the noise floor (the largest |difference| of a bin from
the warm-up's end to the first restart). This runs the same point through the simulator
(experiments.bound_tenants' engines and CacheRoute settings; services.sim.tier `Tier(restarts=...)`)
once without restarts and once per variant of what a restarted member keeps:

    fresh   nothing (a live restart: the plan comes back, the per-instance state does not)
    memory  the cold tail's key memory (where each key's latest request went)
    record  the cold-home rule's record of what each replica holds
    both    both (a restart that loses nothing but its pick order; must equal the control up to that)
    peer    both, copied from the next member (a hand-over from a live peer, as a restarted dispatcher
            could take one over the bus)

with the record bus off and on (`--bus`, `Tier(record_delay=0.1 s wall, record_memory=True)`, the live
default). Bins are token-weighted prefix hits over requests arriving in each 10 s of wall time
(model time x the scale's time scale), as bench/peers.py bins the live series; the dip and floor are
bench/peers_misses.paired_dip's.

    .venv/bin/python -m experiments.restart_tier --seeds 1,2,3,4,5,6,7,8 --bus off,on --out experiments/results/simrestart/runs.jsonl
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from dataclasses import replace
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

VARIANTS = {"fresh": (), "memory": ("memory",), "record": ("record",), "both": ("memory", "record"),
            "peer": ("peer", "memory", "record")}
BUS_DELAY_WALL = 0.1        # the live record bus's interval (services/dispatcher/recordbus.py)


def series(result, ts: float, bin_s: float, duration: float) -> list[dict]:
    """Token-weighted hit per `bin_s` wall seconds of arrival, as bench/peers.py's series."""
    t = result.arrival * ts
    ok = ~result.failed
    out = []
    for b in range(int(duration // bin_s)):
        sel = ok & (t >= b * bin_s) & (t < (b + 1) * bin_s)
        prompt = float(result.prompt[sel].sum())
        out.append({"t": b * bin_s, "hit": float(result.cached[sel].sum()) / prompt if prompt else None})
    return out


def point(args) -> dict:
    import peers
    from peers_misses import paired_dip

    from experiments.bound_tenants import spec_for
    from experiments.bound_tenants import requests as make_requests
    from services.core.policies import make_policy
    from services.sim.runs import config_for
    from services.sim.simulator import Simulator
    from services.sim.tier import Tier

    qps, seed, tier, bus, variants = args
    scale = peers.BOUND
    ts = scale.time_scale
    duration, warmup = scale.timing("restart")
    spec = replace(spec_for("cacheroute", {}, qps, seed), duration=duration / ts, warmup=warmup / ts)
    reqs = make_requests(qps, seed, "restart")
    config = replace(config_for(spec), rate_window=60.0 / ts)
    events = [scale.restart_at + i * scale.restart_gap for i in range(tier)]
    delay = BUS_DELAY_WALL / ts if bus else None

    def run(restarts=(), keep=()):
        policy = Tier(lambda i: make_policy("cacheroute", spec.replicas, seed=spec.seed + i), tier,
                      record_delay=delay, restarts=restarts, keep=keep)
        res = Simulator(config, policy, reqs).run()
        d = res.as_dict()
        return res, d, policy.restarted

    base, base_d, _ = run()
    control = series(base, ts, scale.bin_s, duration)
    row = {"qps": qps, "seed": seed, "tier": tier, "bus": bus, "control_hit": round(base_d["hit_rate"] * 100, 2),
           "variants": {}}
    for name in variants:
        res, d, made = run([(t / ts, i) for i, t in enumerate(events)], VARIANTS[name])
        s = series(res, ts, scale.bin_s, duration)
        pd = paired_dip(s, control, events, bin_s=scale.bin_s, start=warmup) or {}
        m = d["misses"]
        row["variants"][name] = {
            "hit": round(d["hit_rate"] * 100, 2), "restarts": made,
            "dip": round(pd.get("dip", 0) * 100, 2), "floor": round((pd.get("floor") or 0) * 100, 2),
            "diff": [None if a["hit"] is None or c["hit"] is None else round((a["hit"] - c["hit"]) * 100, 1)
                     for a, c in zip(s, control)],
            "first_on_replica": round(m["first_on_replica"] * 100, 2), "evicted": round(m["evicted"] * 100, 2),
            "spilled": round(m["spilled"] * 100, 2)}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="16", help="wall req/s, comma-separated")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--tier", type=int, default=4)
    parser.add_argument("--bus", default="off,on", help="record bus off/on, comma-separated")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", help="append each point as a JSON line to this file")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",")]
    if bad := [v for v in variants if v not in VARIANTS]:
        parser.error(f"unknown variant(s) {', '.join(bad)}; valid: {', '.join(VARIANTS)}")
    onoff = {"off": False, "on": True}
    if bad := [b for b in args.bus.split(",") if b not in onoff]:
        parser.error(f"--bus takes off/on, got {', '.join(bad)}")
    if args.tier < 2:
        parser.error("a rolling restart needs --tier 2 or more")
    jobs = [(float(q), int(s), args.tier, onoff[b], variants)
            for q in args.rates.split(",") for s in args.seeds.split(",") for b in args.bus.split(",")]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for row in pool.imap(point, jobs):
            print(json.dumps(row), flush=True)
            if args.out:
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                with open(args.out, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
