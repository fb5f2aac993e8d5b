"""`cacheroute route`: ask a dispatcher where a request goes (JSON).

It takes the shared address flags (`clients.cli.add_address_flags`); an unreachable or failing
dispatcher is a one-line error (exit 2). `cacheroute status` lives in clients/cli/status.py and
shares `print_json` / `enum_name` with it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import grpc
import orjson

from cacheroute.v1 import common_pb2
from clients.cli import CliError, add_address_flags
from clients.client import CacheRouteClient, RetryPolicy
from services.rpc import env, read_secret


def print_json(doc: Any) -> None:
    sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")


def enum_name(enum_type, value: int) -> str:
    return enum_type.Name(value).split("_", 2)[-1].lower() if value else "unspecified"


def decision_doc(d: common_pb2.RouteDecision) -> dict[str, Any]:
    return {"key": d.key, "replica_id": d.replica_id, "address": d.address, "plan_version": d.plan_version,
            "reason": enum_name(common_pb2.RouteReason, d.reason)}


# ---------------------------------------------------------------- route

def add_route(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("route", help="ask a dispatcher where a request goes",
                       description="Print a dispatcher's routing decision for KEY (or a prompt) as JSON.")
    p.add_argument("key", nargs="?", help="routing key (omit with --prompt)")
    p.add_argument("--prompt", help="derive the key from this prompt text instead")
    add_address_flags(p, dispatchers=True)
    p.add_argument("--timeout", type=float, default=2.0, help="deadline per attempt, seconds (default 2)")
    p.set_defaults(func=run_route)


def run_route(args: argparse.Namespace) -> int:
    if (args.key is None) == (args.prompt is None):
        raise CliError("give a KEY or --prompt TEXT")
    key = env("API_KEY") or read_secret(env("AUTH_TOKEN") or None, env("AUTH_TOKEN_FILE") or None)
    with CacheRouteClient(args.dispatchers, api_key=key, timeout=args.timeout, retry=RetryPolicy(rounds=2)) as client:
        try:
            decision = client.route(args.key, prompt=args.prompt)
        except grpc.RpcError as err:
            raise CliError(f"route failed at {args.dispatchers}: {err.code().name}: {err.details()}") from None  # type: ignore[attr-defined]
    print_json(decision_doc(decision))
    return 0


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [add_route]


def register(sub: argparse._SubParsersAction) -> None:
    for add in COMMANDS:
        add(sub)
