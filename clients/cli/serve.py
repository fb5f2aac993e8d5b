"""`cacheroute serve SERVICE [ARGS...]`: run one service in the foreground.

Each service's `services/<name>/__main__.py` owns its flags (`main(argv) -> int`), so
`cacheroute serve planner --help` and `python -m services.planner --help` agree.
"""

from __future__ import annotations

import argparse
import importlib

SERVICES = ("planner", "collector", "dispatcher", "engine")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run one service (planner, collector, dispatcher, engine)",
                       description="Run one CacheRoute service. Flags after the service name go to it.")
    p.add_argument("service", choices=SERVICES)
    p.add_argument("args", nargs=argparse.REMAINDER, help="the service's own flags (see SERVICE --help)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"services.{args.service}.__main__")
    return module.main(args.args)
