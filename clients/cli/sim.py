"""`cacheroute sim run | capacity | compare`: the discrete-event simulator from the shell.

  run       one simulation -> one JSON object (hit_rate, ttft_p50, ttft_p99, imbalance, ...)
  capacity  a QPS sweep -> SLO capacity with censoring and every grid point's figures
  compare   several policies over a QPS grid -> markdown table + PNG plots in --out
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from dataclasses import replace

import orjson

from clients.cli import CliError, lab_module
from services.sim.runs import PROFILE_NAMES, RunSpec, capacity_report, check_names, load_requests, run_spec, sweep

# workload knobs with their own flags; anything else via --knob NAME=VALUE
WORKLOAD_FLAGS = (("--active-set", "active_set", int), ("--cv", "cv", float), ("--whales", "whales", int),
                  ("--whale-share", "whale_share", float), ("--keys", "keys", int),
                  ("--interval", "interval", float))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="discrete-event simulation of a routed cluster",
                       description="Simulate R engine replicas behind one routing policy.")
    cmds = p.add_subparsers(dest="sim_command", metavar="SUBCOMMAND", required=True)

    run = cmds.add_parser("run", help="one simulation, printed as JSON")
    _common(run)
    run.add_argument("--policy", required=True)
    run.add_argument("--qps", type=float, help="offered req/s (a trace: rescale to this mean; omit to replay)")
    run.add_argument("--json", action="store_true", help="one JSON line (default: indented)")
    run.set_defaults(func=cmd_run)

    cap = cmds.add_parser("capacity", help="SLO capacity over a QPS grid")
    _common(cap)
    cap.add_argument("--policy", required=True)
    _grid(cap)
    cap.add_argument("--json", action="store_true")
    cap.set_defaults(func=cmd_capacity)

    cmp_ = cmds.add_parser("compare", help="policies side by side: table and plots")
    _common(cmp_)
    cmp_.add_argument("--policies", required=True, help="comma-separated policy names")
    _grid(cmp_)
    cmp_.add_argument("--out", required=True, help="output directory (results.json, table.md, *.png)")
    cmp_.add_argument("--jobs", type=int, default=1, choices=(1, 2), help="worker processes (max 2)")
    cmp_.set_defaults(func=cmd_compare)


def _common(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", help="synthetic workload: paper, whale, low-reuse, drift, flagship")
    src.add_argument("--trace", help="Mooncake .jsonl or Azure .csv trace")
    p.add_argument("--replicas", type=int, default=30)
    p.add_argument("--profile", default="llama3-70b-fp8-h100x2", help=f"one of {', '.join(PROFILE_NAMES)}")
    p.add_argument("--duration", type=float, help="seconds of arrivals (workloads: default 300; traces: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-blocks", type=int, help="KV blocks per replica (default: the profile's)")
    p.add_argument("--q-cap", type=float, help="req/s per replica at the knee (default: calibrated)")
    p.add_argument("--warm-slots", type=int, help="W per replica (default: from the KV size)")
    p.add_argument("--warmup", type=float, help="seconds excluded from metrics (default: 2 control intervals, <= 25%%)")
    p.add_argument("--control-interval", type=float, default=30.0, help="re-plan period, virtual seconds")
    p.add_argument("--first-plan-at", type=float,
                   help="bootstrap the first plan at this time from the arrivals so far (default: first interval)")
    p.add_argument("--rate-horizon", type=float,
                   help="planned policies: EWMA horizon of per-key rates, seconds (default: last window only)")
    p.add_argument("--rate-history", type=float,
                   help="planned policies: seconds of aggregated per-key rate history known at t = 0 "
                        "(an independent draw of the workload; paper and flagship only)")
    p.add_argument("--lifecycle", choices=("churn", "scratch"), default="churn",
                   help="planned policies' re-plan every interval: churn (default: the planner's churn-aware "
                        "re-plan, keys keep their replicas unless moving pays) or scratch (a fresh LPT plan, "
                        "the paper's)")
    p.add_argument("--arrivals", metavar="CSV",
                   help="synthetic workloads: replay this Azure trace's arrival times, looped and time-scaled "
                        "to the offered QPS, instead of drawing them")
    for flag, _, kind in WORKLOAD_FLAGS:
        p.add_argument(flag, type=kind, help="workload knob")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE", help="other workload knob")
    p.add_argument("--policy-knob", action="append", default=[], metavar="NAME=JSON",
                   help="a knob of the planned (cacheroute) policies, e.g. hold=true")


def _grid(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slo-p99", type=float, required=True, help="p99 TTFT SLO, seconds")
    p.add_argument("--qps-grid", required=True, help="comma-separated offered QPS values")


def _spec(args: argparse.Namespace, policy: str, qps: float | None = None) -> RunSpec:
    knobs = {}
    for _, name, _ in WORKLOAD_FLAGS:
        if getattr(args, name) is not None:
            knobs[name] = getattr(args, name)
    for item in args.knob:
        name, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--knob wants NAME=VALUE, got {item!r}")
        knobs[name.replace("-", "_")] = _number(value)
    policy_knobs = {}
    for item in args.policy_knob:
        name, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--policy-knob wants NAME=JSON, got {item!r}")
        try:
            policy_knobs[name.replace("-", "_")] = json.loads(value)
        except ValueError:
            policy_knobs[name.replace("-", "_")] = value
    if not policy.startswith("cacheroute"):
        policy_knobs = {}
    duration = args.duration if args.duration is not None or args.trace else 300.0
    spec = RunSpec(policy=policy, qps=qps, replicas=args.replicas, profile=args.profile, duration=duration,
                   seed=args.seed, workload=args.workload, trace=args.trace, workload_knobs=knobs,
                   q_cap=args.q_cap, warm_slots=args.warm_slots, warmup=args.warmup,
                   control_interval=args.control_interval, first_plan_at=args.first_plan_at,
                   rate_horizon=args.rate_horizon, rate_history=args.rate_history, arrival_trace=args.arrivals,
                   lifecycle=args.lifecycle, kv_blocks=args.kv_blocks, policy_knobs=policy_knobs)
    try:
        if args.arrivals is not None and (args.trace is not None or not os.path.isfile(args.arrivals)):
            raise ValueError("--arrivals wants a readable Azure .csv and a --workload")
        for name in ("rate_horizon", "rate_history"):
            value = getattr(args, name)
            if value is not None and not (value > 0 and value != float("inf")):
                raise ValueError(f"--{name.replace('_', '-')} must be a positive number of seconds")
        if args.kv_blocks is not None and args.kv_blocks < 1:
            raise ValueError("--kv-blocks must be positive (blocks of 16 tokens per replica)")
        check_names(policy, args.profile)
        if args.workload is not None:
            from services.core.workloads import WORKLOADS

            if args.workload not in WORKLOADS:
                raise ValueError(f"unknown workload {args.workload!r}; choose from {', '.join(WORKLOADS)}")
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return spec


def _number(text: str) -> object:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _qps_grid(text: str) -> list[float]:
    try:
        grid = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise CliError(f"--qps-grid wants comma-separated numbers, got {text!r}") from None
    if not grid or grid[0] <= 0:
        raise CliError("--qps-grid needs positive values")
    return grid


def _emit(obj: object, compact: bool) -> None:
    opt = orjson.OPT_SERIALIZE_NUMPY | (0 if compact else orjson.OPT_INDENT_2)
    sys.stdout.write(orjson.dumps(obj, option=opt).decode() + "\n")


def _guard(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def cmd_run(args: argparse.Namespace) -> int:
    spec = _spec(args, args.policy, args.qps)
    if spec.trace is None and spec.qps is None:
        raise CliError("--qps is required with --workload")
    _emit(_guard(run_spec, spec), args.json)
    return 0


def cmd_capacity(args: argparse.Namespace) -> int:
    spec = _spec(args, args.policy)
    grid = _qps_grid(args.qps_grid)
    points = _guard(sweep, spec, grid)
    _emit(capacity_report(points, args.slo_p99), args.json)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    tqdm = lab_module("tqdm").tqdm
    lab_module("matplotlib")       # the plots, before hours of sweeps
    from services.sim import report

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        raise CliError("--policies is empty")
    grid = _qps_grid(args.qps_grid)
    specs = {p: _spec(args, p) for p in policies}
    _guard(load_requests, replace(specs[policies[0]], qps=grid[0]))   # fail fast on a bad source
    os.makedirs(args.out, exist_ok=True)
    bar = tqdm(total=len(policies) * len(grid), desc="sim compare", unit="run", file=sys.stderr)
    pool = multiprocessing.get_context("spawn").Pool(args.jobs) if args.jobs > 1 else None

    def run_many(ss: list[RunSpec]) -> list[dict]:
        out = []
        mapper = pool.imap if pool is not None else map
        for point in mapper(run_spec, ss):
            out.append(point)
            bar.update(1)
        return out

    try:
        results = {p: capacity_report(_guard(sweep, specs[p], grid, run=run_many), args.slo_p99) for p in policies}
    finally:
        bar.close()
        if pool is not None:
            pool.close()
            pool.join()
    files = report.write(results, args.out)
    sys.stdout.write(report.table(results))
    sys.stderr.write("wrote " + ", ".join(files) + "\n")
    return 0
