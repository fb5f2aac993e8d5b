"""bench/peers.py's engine-bound (a) tenants point in simulated time: the same textload workload,
engines and CacheRoute settings as the live run, through the simulator, so a routing rule can be
checked against the live regime without a quiet machine (and then confirmed live).

    .venv/bin/python -m experiments.bound_tenants --policies sglang,cacheroute --rates 16,24 --seeds 1,2
    .venv/bin/python -m experiments.bound_tenants --policies cacheroute \
        --knobs '{"balance_factor": 1.5}' --rates 16,24
    .venv/bin/python -m experiments.bound_tenants --policies cacheroute --tier 1,4 --rates 16,24
    .venv/bin/python -m experiments.bound_tenants --policies cacheroute --tier 2,4 --rates 16,24 \
        --tier-record-delay none,0.1 --tier-record-memory on,off      # the record bus (services.sim.tier)

Rates are wall req/s as bench/peers.py states them; the simulator runs in model time (rates x the
scale's time scale, durations / it). CacheRoute's settings are the live stack's defaults
(bench/peers_routers.py: q_cap 20 wall req/s, W 64 warm slots, a 10 s loop over a 60 s rate
window) in model time. The routing key is
the tenant (the live key is the prompt's first 128 tokens, which lie inside the tenant's system
prompt). Printed per point: hit %, the infinite-cache bound, miss split (points), p50/p99 TTFT in
wall ms (model x time scale), preemptions, in-flight imbalance.

The record bus (services.sim.tier, `Tier(record_delay=...)`): `--tier-record-delay` in wall seconds
(converted to model time like every other duration; "none" = no bus, the default) and
`--tier-record-memory` on/off (whether peers' picks also enter the cold tail's key memory), both
comma-separated grids; a tier of 1 has no peers, so it runs once, without the bus.
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

from services.core.policies import PLANNED_POLICIES  # noqa: E402
from services.core.request import Request  # noqa: E402
from services.sim.runs import RunSpec, calibrated_q_cap, config_for  # noqa: E402


def requests(qps_wall: float, seed: int, workload: str = "tenants") -> list[Request]:
    """bench/peers.py's engine-bound `workload` at `qps_wall` as simulator requests (model time)."""
    import peers

    from services.http import oai
    from services.core import routing

    scale = peers.BOUND
    wl = peers.make_workload(scale, workload, qps_wall, seed)
    ts = scale.time_scale
    out = []
    for q in wl.requests:
        ids = routing.tokenize(oai.chat_text(q.messages()))
        out.append(Request(q.rid, q.at / ts, q.group, len(ids), q.max_tokens, routing.prompt_hashes(ids)))
    return out


def run_points(point, jobs: list, processes: int, out: str | None) -> None:
    """`point` over `jobs` in spawned processes, each row printed (and appended to `out`) as a JSON line."""
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        for row in pool.imap(point, jobs):
            print(json.dumps(row), flush=True)
            if out:
                with open(out, "a") as fh:
                    fh.write(json.dumps(row) + "\n")


def run(spec: RunSpec, reqs: list[Request], tier: int = 1, record_delay: float | None = None,
        record_memory: bool = True) -> dict:
    """run_spec with the live planner's rate window (60 s wall) instead of one control interval;
    `tier` router instances, requests round-robin over them (services.sim.tier), with the record bus
    at `record_delay` model seconds (None: off) and `record_memory`."""
    from services.core.policies import make_policy
    from services.sim.simulator import Simulator
    from services.sim.tier import Tier

    import peers

    config = replace(config_for(spec), rate_window=60.0 / peers.BOUND.time_scale)
    policy = Tier(lambda i: make_policy(spec.policy, spec.replicas, seed=spec.seed + i, **spec.policy_knobs), tier,
                  record_delay=record_delay, record_memory=record_memory)
    return Simulator(config, policy, reqs).run().as_dict()


def spec_for(policy: str, knobs: dict, qps_wall: float, seed: int, q_cap: float | None = None,
             lifecycle: str = "churn") -> RunSpec:
    """The bound scale's tenants point in simulated time (bench/peers.py BOUND, wall figures / time scale)."""
    import peers

    scale = peers.BOUND
    ts = scale.time_scale
    duration, warmup = scale.timing("tenants")
    planned = policy in PLANNED_POLICIES
    return RunSpec(policy=policy, qps=qps_wall * ts, replicas=scale.replicas, profile=scale.profile,
                   duration=duration / ts, seed=seed, kv_blocks=scale.kv_blocks, warmup=warmup / ts,
                   policy_knobs=knobs, control_interval=10.0 / ts,
                   q_cap=(q_cap or 20.0) * ts if planned else None, warm_slots=64 if planned else None,
                   first_plan_at=5.0 / ts if planned else None, lifecycle=lifecycle)


def point(args) -> dict:
    import peers

    policy, knobs, qps_wall, seed, q_cap, lifecycle, tier, *bus = args
    delay_wall, memory = bus if bus else (None, True)
    ts = peers.BOUND.time_scale
    spec = spec_for(policy, knobs, qps_wall, seed, q_cap, lifecycle)
    reqs = requests(qps_wall, seed)
    if policy in PLANNED_POLICIES and q_cap == 0:
        spec = replace(spec, q_cap=calibrated_q_cap(spec, reqs))
    out = run(spec, reqs, tier, None if delay_wall is None else delay_wall / ts, memory)
    m = out["misses"]
    return {"policy": policy, "knobs": knobs, "tier": tier, "record_delay": delay_wall, "record_memory": memory,
            "qps": qps_wall, "seed": seed,
            "hit": round(out["hit_rate"] * 100, 2), "bound": round(m["bound"] * 100, 2),
            "first_on_replica": round(m["first_on_replica"] * 100, 2), "evicted": round(m["evicted"] * 100, 2),
            "spilled": round(m["spilled"] * 100, 2),
            "p50_ms": round(out["ttft_p50"] * ts * 1000), "p99_ms": round(out["ttft_p99"] * ts * 1000),
            "preemptions": out["preemptions"], "imbalance": round(out["imbalance"], 3),
            "q_cap_wall": round(spec.q_cap / ts, 2) if spec.q_cap else None}


def bus_grid(delays: str, memories: str) -> list[tuple[float | None, bool]]:
    """(delay in wall s or None, memory) pairs from the comma-separated flags; "none" has no memory
    variants. ValueError on a value that is neither."""
    mem = {"on": True, "off": False}
    out: list[tuple[float | None, bool]] = []
    for d in delays.split(","):
        d = d.strip().lower()
        if d == "none":
            out.append((None, True))
            continue
        delay = float(d)
        if not delay >= 0:
            raise ValueError(f"--tier-record-delay must be none or >= 0 wall seconds, got {d!r}")
        for m in memories.split(","):
            m = m.strip().lower()
            if m not in mem:
                raise ValueError(f"--tier-record-memory takes on/off, got {m!r}")
            out.append((delay, mem[m]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="sglang,cacheroute")
    parser.add_argument("--knobs", default="{}", help="JSON policy knobs for cacheroute (variants)")
    parser.add_argument("--rates", default="16,24", help="wall req/s, comma-separated")
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--q-cap", type=float, default=20.0,
                        help="CacheRoute's q_cap in wall req/s (default 20, the stack's); 0: calibrated "
                             "from the engine model on the point's requests (services.sim.calibrate)")
    parser.add_argument("--lifecycle", default="churn", help="planned policies' re-plan (sim --lifecycle)")
    parser.add_argument("--tier", default="1", help="router instances per point, comma-separated "
                        "(requests round-robin over them, as bench/peers.py --tier spreads its client)")
    parser.add_argument("--tier-record-delay", default="none",
                        help="record bus delay(s) in wall seconds, comma-separated; none: no bus (services.sim.tier)")
    parser.add_argument("--tier-record-memory", default="on",
                        help="on/off, comma-separated: peers' picks also enter the cold tail's key memory")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", help="append each point as a JSON line to this file")
    args = parser.parse_args(argv)
    knobs = json.loads(args.knobs)
    buses = bus_grid(args.tier_record_delay, args.tier_record_memory)
    jobs = [(p, knobs if p.startswith("cacheroute") else {}, float(q), int(s), args.q_cap, args.lifecycle, int(n),
             *bus)
            for s in args.seeds.split(",") for q in args.rates.split(",") for n in args.tier.split(",")
            for bus in (buses if int(n) > 1 else [(None, True)]) for p in args.policies.split(",")]
    run_points(point, jobs, args.jobs, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
