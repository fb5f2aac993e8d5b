"""`cacheroute shadow`: the shadow-replay gate (services.core.shadow) from the shell.

  cacheroute shadow --trace FILE (--plan PLAN.json | --policy cacheroute) [--json] ...

FILE is a Mooncake .jsonl or Azure .csv trace (reduced to aggregate records: key, time, prompt,
prefix and output tokens) or an aggregate records file, JSON lines of
`{"key", "time", "prompt_tokens", "prefix_tokens", "output_tokens"?}`. The candidate is a plan
file, or with `--policy cacheroute` a fresh LPT plan built from the replayed window's rates
(q_cap calibrated unless --q-cap, W from the KV size unless --warm-slots). Prints the
ShadowReport plus the validated range; exit status 0 when the candidate passed, 1 when not.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import orjson

from clients.cli import CliError
from services.model import COLD_TAILS, DEFAULT_COLD_TAIL


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("shadow", help="shadow-replay a candidate plan against Flat-LB",
                       description="Replay recorded traffic under a candidate plan and under Flat-LB at matched and "
                                   "scaled load; pass when p99 or SLO capacity improves by the margin.")
    p.add_argument("--trace", required=True, help="Mooncake .jsonl, Azure .csv, or aggregate records .jsonl")
    cand = p.add_mutually_exclusive_group(required=True)
    cand.add_argument("--plan", help="candidate plan file (JSON, as written by `cacheroute plan build`)")
    cand.add_argument("--policy", choices=("cacheroute",), help="build the candidate from the window's rates")
    p.add_argument("--replicas", type=int, default=30)
    p.add_argument("--profile", default="llama3-70b-fp8-h100x2")
    p.add_argument("--kv-blocks", type=int, help="KV blocks per replica (default: the profile's)")
    p.add_argument("--qps", type=float, help="rescale a Mooncake/Azure trace to this mean rate")
    p.add_argument("--slo-p99", type=float, default=3.5, help="p99 TTFT SLO for the capacity estimate (s)")
    p.add_argument("--margin", type=float, default=0.10, help="required relative improvement (default 0.10)")
    p.add_argument("--max-requests", type=int, default=2000, help="replay the latest N records (default 2000)")
    p.add_argument("--load-scales", default="1,1.5,2,3,4", help="load multipliers, must include 1")
    p.add_argument("--cold", default=DEFAULT_COLD_TAIL, choices=COLD_TAILS,
                   help=f"candidate's cold-tail policy (default {DEFAULT_COLD_TAIL}, as live dispatchers)")
    p.add_argument("--balance-factor", default=None,
                   help="candidate's overload guard c, or 'off' (default: the cacheroute policy's, as live)")
    p.add_argument("--q-cap", type=float, help="with --policy: req/s per replica (default: calibrated)")
    p.add_argument("--warm-slots", type=int, help="with --policy: W per replica (default: from the KV size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON line (default: indented)")
    p.set_defaults(func=cmd_shadow)


def cmd_shadow(args: argparse.Namespace) -> int:
    from services.core.engine import get_profile
    from services.core.shadow import ShadowConfig, latest, validated_range
    from services.sim.replay import shadow_replay

    try:
        profile = get_profile(args.profile)
        scales = tuple(float(x) for x in args.load_scales.split(",") if x.strip())
        config = ShadowConfig(profile, args.replicas, kv_blocks=args.kv_blocks, slo_p99=args.slo_p99, margin=args.margin,
                              max_requests=args.max_requests, load_scales=scales, cold=args.cold, seed=args.seed,
                              **_guard(args.balance_factor))
        records = latest(load_records(args.trace, args.qps), config.max_requests)
        plan = _candidate(args, records, profile)
        report = shadow_replay(records, plan, config)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    out = {f: getattr(report, f) for f in report.__dataclass_fields__}
    if report.passed:
        (lo, hi), p99 = validated_range(report)
        out["validated_range"] = {"active_keys": [lo, hi], "ttft_p99_max": p99}
    opt = orjson.OPT_SERIALIZE_NUMPY | (0 if args.json else orjson.OPT_INDENT_2)
    sys.stdout.write(orjson.dumps(out, option=opt).decode() + "\n")
    return 0 if report.passed else 1


def load_records(path: str, qps: float | None):
    """Aggregate records from a trace or a records file (ValueError naming the file on bad input)."""
    from services.core.shadow import ReplayRecord, requests_to_records
    from services.sim import tracefiles

    if path.endswith(".csv"):
        return requests_to_records(tracefiles.load_azure(path, qps=qps).requests)
    try:
        with open(path, "rb") as f:
            first = f.readline()
    except OSError as exc:
        raise ValueError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    try:
        is_records = b'"key"' in first and "key" in orjson.loads(first)
    except orjson.JSONDecodeError:
        raise ValueError(f"{path}:1: not JSON") from None
    if not is_records:
        return requests_to_records(tracefiles.load_mooncake(path, qps=qps).requests)
    if qps is not None:
        raise ValueError("--qps rescales Mooncake/Azure traces only")
    out = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = orjson.loads(line)
                out.append(ReplayRecord(str(d["key"]), float(d["time"]), int(d["prompt_tokens"]),
                                         int(d["prefix_tokens"]), int(d.get("output_tokens", 0))))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: malformed record: {exc}") from None
    return out


def _candidate(args: argparse.Namespace, records, profile):
    if args.plan:
        from services.wire.codec import read_plan_file

        try:
            return read_plan_file(args.plan)
        except OSError as exc:
            raise ValueError(f"cannot read plan {args.plan}: {exc.strerror or exc}") from None
    from services.core.planning import build_plan
    from services.core.shadow import records_to_requests
    from services.sim import calibrate

    reqs = records_to_requests(records)
    if len(reqs) < 2 or reqs[-1].arrival <= 0:
        raise ValueError("too few records to measure rates")
    span = reqs[-1].arrival
    counts = Counter(q.key for q in reqs)
    q_cap = args.q_cap or calibrate.q_cap_for(profile, reqs, args.replicas)
    mean_prefix = sum(q.prefix_tokens for q in reqs) / len(reqs)
    w = args.warm_slots or calibrate.warm_slots(profile, mean_prefix)
    keys = list(counts)
    return build_plan(keys, [counts[k] / span for k in keys], [f"r{j}" for j in range(args.replicas)], q_cap, w)


def _guard(text: str | None) -> dict:
    """--balance-factor: absent -> the policy's default, 'off' -> None, else a number."""
    if text is None:
        return {}
    if text.strip().lower() == "off":
        return {"balance_factor": None}
    try:
        return {"balance_factor": float(text)}
    except ValueError:
        raise ValueError(f"--balance-factor must be a number >= 1 or 'off', got {text!r}") from None
