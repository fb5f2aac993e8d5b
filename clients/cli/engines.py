"""`cacheroute engines ...`: add, drain and remove engines on a running deployment.

  cacheroute engines list [--keys]                  every slot: id, address, state, source (--keys:
                                                    keys the active plan places there, health)
  cacheroute engines add ADDRESS [--id ID]          host:port or KIND+URL, in the next slot; the planner
                                                    places its share at the next re-plan (now)
  cacheroute engines drain ENGINE [--wait S]        stop placing keys there and move its keys now;
                                                    --wait: until the active plan holds none there
  cacheroute engines remove ENGINE [--force]        a drained engine leaves (its slot stays empty);
                                                    --force: an active one, drained and removed at once

ENGINE is an id or an address. The engine set is versioned in the store next to the plans, so
every planner and dispatcher follows it and restarts keep it (services/core/engines.py). Every
command takes --planner, --token-file and --timeout as `cacheroute plans` does and prints one
JSON document; gRPC errors exit 2 with one line, "CODE: details".
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

from clients.cli import CliError
from clients.cli.plans import _add_common, _run
from clients.client import CacheRouteClient


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engines", help="list, add, drain and remove engines on a running deployment",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cmds = p.add_subparsers(dest="engines_command", metavar="ACTION", required=True)

    def cmd(name: str, func: Callable[[CacheRouteClient, argparse.Namespace], Any], help_: str) -> argparse.ArgumentParser:
        c = cmds.add_parser(name, help=help_)
        _add_common(c)
        c.set_defaults(func=lambda args: _run(args, func))
        return c

    c = cmd("list", lambda cl, a: cl.list_engines(planned_keys=a.keys, timeout=a.timeout), "the engine set")
    c.add_argument("--keys", action="store_true", help="count the active plan's keys per engine")
    c = cmd("add", lambda cl, a: cl.add_engine(a.address, a.id, timeout=a.timeout), "add an engine")
    c.add_argument("address", help="host:port (cacheroute engines) or KIND+URL, e.g. vllm+http://10.0.0.5:8000")
    c.add_argument("--id", default="", help="engine id (default e<slot>)")
    c = cmd("drain", _drain, "stop placing keys on an engine and move its keys")
    c.add_argument("engine", help="engine id or address")
    c.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait up to SECONDS until the active plan places no key there (default 0: do not wait)")
    c = cmd("remove", lambda cl, a: cl.remove_engine(a.engine, force=a.force, timeout=a.timeout),
            "remove a drained engine")
    c.add_argument("engine", help="engine id or address")
    c.add_argument("--force", action="store_true", help="remove an active engine (drained and removed at once)")


def _drain(client: CacheRouteClient, args: argparse.Namespace) -> Any:
    if not args.wait >= 0:
        raise CliError("--wait must be >= 0")
    change = client.drain_engine(args.engine, timeout=args.timeout)
    deadline = time.monotonic() + args.wait
    while args.wait:
        listed = client.list_engines(planned_keys=True, timeout=args.timeout)
        left = next((e.planned_keys for e in listed.engines if e.id == change.engine.id), 0)
        if not left:
            change.engine.planned_keys = 0
            break
        if time.monotonic() >= deadline:
            raise CliError(f"engine {change.engine.id} still has {left} planned key(s) after {args.wait:g}s")
        time.sleep(0.2)
    return change
