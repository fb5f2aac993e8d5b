"""`cacheroute plans ...`: read and control the planner's stored plan versions.

  cacheroute plans build [--rates RATES.csv] [--replicas IDS] [--q-cap Q] [--warm-slots W]
                        [--incremental] [--activate --expected N] [--shadow]
  cacheroute plans list [--limit N] [--before V]
  cacheroute plans show VERSION [--table]          (0: the active version)
  cacheroute plans diff A B [--max-moves N]        (B = 0: the active version)
  cacheroute plans activate VERSION --expected N [--reason R]
  cacheroute plans rollback --expected N [--to V] [--reason R]
  cacheroute plans mode planned|flat [--reason R]
  cacheroute plans pin [VERSION] | unpin
  cacheroute plans status

`build` has the planner build (and store) a candidate from a `key,rate` CSV (as `cacheroute plan
build` reads; a million keys go as a BuildPlanStream in slices) or, without --rates, from its
telemetry window, and prints the plan without its table.

Every command takes --planner ADDR (env CACHEROUTE_PLANNER, default 127.0.0.1:50051),
--token-file F (env CACHEROUTE_AUTH_TOKEN_FILE, or the token itself in CACHEROUTE_AUTH_TOKEN)
and --timeout SECONDS (default 5), and prints one JSON document. gRPC errors exit 2 with one
line: "CODE: details".
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict

from clients.cli import CliError
from clients.client import CacheRouteClient
from services.flags import flag
from services.rpc import env, read_secret


def _add_common(p: argparse.ArgumentParser) -> None:
    flag(p, "--planner", env="PLANNER", default="127.0.0.1:50051", help="planner address")
    flag(p, "--token-file", env="AUTH_TOKEN_FILE", default=None,
         help="bearer token file for control commands (or the token itself in CACHEROUTE_AUTH_TOKEN)")
    p.add_argument("--timeout", type=float, default=5.0, help="deadline per call, seconds (default 5)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plans", help="list, show, diff, activate, roll back, pin plan versions; set the mode",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cmds = p.add_subparsers(dest="plans_command", metavar="ACTION", required=True)

    def cmd(name: str, func: Callable[[CacheRouteClient, argparse.Namespace], Any], help_: str) -> argparse.ArgumentParser:
        c = cmds.add_parser(name, help=help_)
        _add_common(c)
        c.set_defaults(func=lambda args: _run(args, func))
        return c

    c = cmd("build", _build, "build (and store; --activate: activate) a candidate on the planner")
    c.add_argument("--rates", metavar="RATES.csv", help="CSV with header columns key,rate (default: the telemetry window)")
    c.add_argument("--replicas", default="", help="comma-separated replica ids (default: the planner's)")
    c.add_argument("--q-cap", type=float, default=0.0, help="req/s per replica at the knee (default: the planner's)")
    c.add_argument("--warm-slots", type=int, default=0, help="W (default: the planner's)")
    c.add_argument("--incremental", action="store_true", help="churn-aware placement from the active plan")
    c.add_argument("--activate", action="store_true", help="activate after building (needs --expected)")
    c.add_argument("--expected", type=int, default=None, help="the version you believe is active (0: none)")
    c.add_argument("--shadow", action="store_true", help="run the shadow gate before activating")
    c = cmd("list", lambda cl, a: cl.list_plans(a.limit, a.before, timeout=a.timeout), "stored versions, newest first")
    c.add_argument("--limit", type=int, default=20)
    c.add_argument("--before", type=int, default=0, help="only versions below this one")
    c = cmd("show", lambda cl, a: cl.get_plan(a.version, summary_only=not a.table, timeout=a.timeout), "one version")
    c.add_argument("version", type=int, help="0: the active version")
    c.add_argument("--table", action="store_true", help="include the routing table")
    c = cmd("diff", lambda cl, a: cl.diff_plans(a.a, a.b, a.max_moves, timeout=a.timeout), "churn and moved keys from A to B")
    c.add_argument("a", type=int)
    c.add_argument("b", type=int, help="0: the active version")
    c.add_argument("--max-moves", type=int, default=20)
    c = cmd("activate", lambda cl, a: cl.activate_plan(a.version, a.expected, a.reason, timeout=a.timeout),
            "compare-and-set the active version")
    c.add_argument("version", type=int)
    c.add_argument("--expected", type=int, required=True, help="the version you believe is active (0: none)")
    c.add_argument("--reason", default="cli")
    c = cmd("rollback", lambda cl, a: cl.rollback(a.expected, a.to, a.reason, timeout=a.timeout),
            "re-activate the previous version (or --to V)")
    c.add_argument("--expected", type=int, required=True)
    c.add_argument("--to", type=int, default=0)
    c.add_argument("--reason", default="cli")
    c = cmd("mode", lambda cl, a: cl.set_mode(a.mode, a.reason, timeout=a.timeout), "planned routing or flat fallback")
    c.add_argument("mode", choices=("planned", "flat"))
    c.add_argument("--reason", default="cli")
    c = cmd("pin", lambda cl, a: cl.pin_plan(a.version, timeout=a.timeout), "pin the active version")
    c.add_argument("version", type=int, nargs="?", default=0, help="must be the active version (default: it)")
    cmd("unpin", lambda cl, a: cl.unpin_plan(timeout=a.timeout), "remove the pin")
    cmd("status", lambda cl, a: cl.planner_status(timeout=a.timeout), "planner state")


def _build(client: CacheRouteClient, args: argparse.Namespace) -> Any:
    if args.activate and args.expected is None:
        raise CliError("--activate needs --expected N (the version you believe is active; 0: none)")
    if args.warm_slots < 0 or not 0 <= args.q_cap < float("inf"):
        raise CliError("--q-cap and --warm-slots must be >= 0 (0: the planner's)")
    rates: dict[str, float] = {}
    if args.rates:
        from clients.cli.plan import read_rates

        keys, values = read_rates(args.rates)
        rates = dict(zip(keys, values.tolist()))
    reply = client.build_plan(rates, replica_ids=[r for r in args.replicas.split(",") if r], q_cap=args.q_cap,
                              warm_slots=args.warm_slots, incremental=args.incremental, activate=args.activate,
                              expected_active_version=args.expected or 0, shadow=args.shadow, whole=False,
                              timeout=args.timeout)
    del reply.plan.table[:]            # the summary, not a million entries
    reply.plan.ClearField("columns")
    reply.plan.table_offset = reply.plan.table_size = 0
    return reply


def _token(args: argparse.Namespace) -> str | None:
    try:
        return read_secret(env("AUTH_TOKEN") or None, args.token_file)
    except OSError as exc:
        raise CliError(f"cannot read token file {args.token_file}: {exc.strerror}") from None


# integer arguments and the width of the proto field each one fills
_INTS = {"version": 64, "a": 64, "b": 64, "before": 64, "expected": 64, "to": 64, "limit": 32, "max_moves": 32,
         "warm_slots": 32}


def _check_numbers(args: argparse.Namespace) -> None:
    """Versions and counts are unsigned: a negative or too large one is a one-line error."""
    for name, bits in _INTS.items():
        value = getattr(args, name, None)
        if value is not None and not 0 <= value < 1 << bits:
            flag = name if name in ("version", "a", "b") else "--" + name.replace("_", "-")
            bound = ">= 0" if value < 0 else f"at most {(1 << bits) - 1}"
            raise CliError(f"{flag} must be {bound}, got {value}")


def _run(args: argparse.Namespace, func: Callable[[CacheRouteClient, argparse.Namespace], Any]) -> int:
    _check_numbers(args)
    with CacheRouteClient(planner=args.planner, token=_token(args), timeout=args.timeout) as client:
        try:
            reply = func(client, args)
        except grpc.RpcError as err:
            raise CliError(f"{err.code().name}: {' '.join((err.details() or '').split())}") from None
    doc = MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    print(json.dumps(_numbers(reply.DESCRIPTOR, doc), indent=2, sort_keys=True))
    return 0


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


def _numbers(desc: Descriptor, doc: dict) -> dict:
    """Proto3 JSON writes 64-bit integers as strings; a CLI reader wants numbers (versions)."""
    for f in desc.fields:
        if f.name not in doc:
            continue
        value = doc[f.name]
        repeated = isinstance(value, list)
        if f.message_type is not None:
            for item in value if repeated else [value]:
                _numbers(f.message_type, item)
        elif f.type in _INT64:
            doc[f.name] = [int(v) for v in value] if repeated else int(value)
    return doc
