"""`cacheroute advise`: the capacity advisor (services/planner/advisor.py) over a live stack.

  cacheroute advise --collector HOST:PORT --replicas 8 [--spread 2] [--slo-p99 2] [--json]

Reads the telemetry window from the collector (GetRates, the planner's input; CACHEROUTE_AUTH_TOKEN
/ _FILE when the collector wants a token): per-key rates and mean prompt and prefix tokens, the
mean output tokens per request the engines and dispatchers measured (--output-tokens when none
was, or to override it) and the arrivals' burstiness. It simulates the plan the planner would
build on N-k .. N+k replicas of the engine profile, and prints the predicted hit rate and p99
TTFT per N and the smallest N meeting the SLO. Exit status 0 when some N meets it, 1 when none
of the tried does.

  cacheroute advise --last --planner HOST:PORT [--json]

prints the planner's latest advice instead (GetAdvice: the one behind its
cacheroute_recommended_replicas gauge, planner flag --advise-slo-p99), computing nothing.
"""

from __future__ import annotations

import argparse
import math
import sys

import grpc
import orjson

from clients.cli import CliError, add_address_flags


def register(sub: argparse._SubParsersAction) -> None:
    from services.flags import flag

    p = sub.add_parser("advise", help="capacity advisor: predicted hit rate and p99 TTFT on N-k..N+k replicas",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_address_flags(p, collector=True, planner=True)
    p.add_argument("--last", action="store_true", help="print the planner's latest advice (GetAdvice) instead")
    p.add_argument("--replicas", type=int, help="current replica count N (required without --last)")
    p.add_argument("--spread", type=int, default=2, help="try N-k .. N+k (default 2)")
    p.add_argument("--slo-p99", type=float, default=2.0, help="p99 TTFT SLO, seconds (default 2)")
    flag(p, "--profile", env="PROFILE", default="llama3-8b-h100", help="engine profile")
    flag(p, "--q-cap", env="Q_CAP", default=20.0, type=float, help="req/s per replica at the knee")
    p.add_argument("--window", type=float, default=0.0, help="telemetry window, seconds (0: the collector's)")
    p.add_argument("--seconds", type=float, default=120.0, help="simulated traffic, seconds (default 120)")
    p.add_argument("--max-requests", type=int, default=12_000,
                   help="the simulated stream is shortened to stay within this (default 12000)")
    p.add_argument("--output-tokens", type=int, default=0,
                   help="output tokens per request (default 0: the window's measured mean, else "
                        "the advisor's default, 200)")
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def fetch_loads(collector: str, window: float, timeout: float):
    from cacheroute.v1 import collector_pb2, collector_pb2_grpc
    from services.planner.advisor import KeyLoad
    from services.rpc import bearer_metadata, env, read_secret

    token = read_secret(env("AUTH_TOKEN") or None, env("AUTH_TOKEN_FILE") or None)
    with grpc.insecure_channel(collector) as ch:
        reply = collector_pb2_grpc.CollectorStub(ch).GetRates(
            collector_pb2.GetRatesRequest(window_seconds=window), timeout=timeout, metadata=bearer_metadata(token))
    return [KeyLoad(r.key, r.rate, r.mean_prompt_tokens, r.mean_prefix_tokens) for r in reply.rates], reply


def last_advice(planner: str, timeout: float):
    from cacheroute.v1 import planner_pb2, planner_pb2_grpc

    with grpc.insecure_channel(planner) as ch:
        return planner_pb2_grpc.PlannerStub(ch).GetAdvice(planner_pb2.GetAdviceRequest(), timeout=timeout)


def print_last(args: argparse.Namespace) -> int:
    a = last_advice(args.planner, args.timeout)
    points = [{"replicas": p.replicas, "hit_rate": p.hit_rate,
               "ttft_p99": p.ttft_p99 if math.isfinite(p.ttft_p99) else None, "meets_slo": p.meets_slo}
              for p in a.points]
    source = "measured" if a.output_measured else "default"
    if args.json:
        print(orjson.dumps({"recommended": a.recommended or None, "gauge": a.gauge, "slo_p99": a.slo_p99,
                            "replicas": a.replicas, "qps": a.qps, "requests": a.requests,
                            "output_tokens": a.output_tokens, "output_source": source, "arrival_cv": a.arrival_cv,
                            "computed_at": a.computed_at, "points": points}).decode())
    else:
        print(f"planner advice at {a.computed_at:.0f} (unix s): simulated {a.requests} requests at {a.qps:.1f} req/s, "
              f"{a.output_tokens} output tokens each ({source}), arrival CV {a.arrival_cv:.2f}")
        print_table(a.points, a.replicas, a.slo_p99)
        print(f"recommended: {a.recommended}" if a.recommended else
              f"recommended: more than {a.points[-1].replicas if a.points else a.replicas} (gauge {a.gauge})")
    return 0 if a.recommended else 1


def print_table(points, current: int, slo: float) -> None:
    print(f"{'replicas':>8}  {'hit rate':>8}  {'p99 TTFT':>9}  SLO {slo:g} s")
    for p in points:
        mark = " <- current" if p.replicas == current else ""
        print(f"{p.replicas:>8}  {p.hit_rate:>8.3f}  {p.ttft_p99:>8.3f}s  {'ok' if p.meets_slo else 'miss'}{mark}")


def run(args: argparse.Namespace) -> int:
    from services.planner.advisor import DEFAULT_OUTPUT_TOKENS, AdviceConfig, advise

    if args.last:
        return print_last(args)
    if args.replicas is None:
        raise CliError("--replicas is required (or --last for the planner's latest advice)")
    if args.output_tokens < 0:
        raise CliError("--output-tokens must be >= 0")
    try:
        config = AdviceConfig(profile=args.profile, replicas=args.replicas, spread=args.spread, slo_p99=args.slo_p99,
                              q_cap=args.q_cap, seconds=args.seconds, max_requests=args.max_requests,
                              output_tokens=args.output_tokens or DEFAULT_OUTPUT_TOKENS)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    loads, reply = fetch_loads(args.collector, args.window, args.timeout)
    if not loads:
        raise CliError(f"the collector's window ({reply.window_seconds:g} s) has no traffic to advise on")
    measured = None if args.output_tokens else (reply.mean_output_tokens or None)
    try:
        advice = advise(loads, config, output_tokens=measured, cv=reply.arrival_cv or None)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    source = "measured" if advice.output_measured else ("--output-tokens" if args.output_tokens else "default")
    if args.json:
        print(orjson.dumps({"recommended": advice.recommended, "slo_p99": args.slo_p99, "qps": advice.qps,
                            "requests": advice.requests, "keys": len(loads), "output_tokens": advice.output_tokens,
                            "output_source": source, "arrival_cv": advice.cv,
                            "points": [{"replicas": p.replicas, "hit_rate": p.hit_rate,
                                        "ttft_p99": p.ttft_p99 if math.isfinite(p.ttft_p99) else None,
                                        "meets_slo": p.meets_slo} for p in advice.points]}).decode())
    else:
        print(f"window {reply.window_seconds:g} s: {len(loads)} keys, simulated {advice.requests} requests "
              f"at {advice.qps:.1f} req/s on {args.profile}, {advice.output_tokens} output tokens each "
              f"({source}), arrival CV {advice.cv:.2f}")
        print_table(advice.points, args.replicas, args.slo_p99)
        print(f"recommended: {advice.recommended}" if advice.recommended is not None
              else f"recommended: more than {args.replicas + args.spread} (none of the tried meets the SLO)")
    return 0 if advice.recommended is not None else 1
