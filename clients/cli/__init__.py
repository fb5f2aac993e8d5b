"""`cacheroute` command line. Each command group lives in its own module with a
`register(subparsers)` that adds its parser and sets `func(args) -> int`."""

from __future__ import annotations

import argparse
import importlib
import sys

# command-group modules under clients.cli, in help order
GROUPS = ("plan", "sim", "serve", "plans", "stack", "shadow", "local")


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cacheroute", description="Planned prefix-affinity routing for LLM serving.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in GROUPS:
        importlib.import_module(f"clients.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"cacheroute: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
