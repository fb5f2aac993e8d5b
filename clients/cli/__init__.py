"""`cacheroute` command line. Each command group lives in its own module with a
`register(subparsers)` that adds its parser and sets `func(args) -> int`."""

from __future__ import annotations

import argparse
import importlib
import sys

import grpc

# command-group modules under clients.cli, in help order
GROUPS = ("plan", "sim", "serve", "plans", "engines", "route", "status", "shadow", "up", "demo", "advise")


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


DEFAULT_PLANNER = "127.0.0.1:50051"
DEFAULT_COLLECTOR = "127.0.0.1:50052"
DEFAULT_DISPATCHERS = "127.0.0.1:50053"


def add_address_flags(p: argparse.ArgumentParser, *, planner: bool = False, dispatchers: bool = False,
                      collector: bool = False, dispatchers_default: str | None = DEFAULT_DISPATCHERS) -> None:
    """The address flags every command that talks to a stack spells the same way, declared with
    services.flags: --planner, --dispatchers A,B (--dispatcher is the same flag; CACHEROUTE_DISPATCHERS,
    then CACHEROUTE_DISPATCHER, an empty one meaning the default), --collector."""
    from services.flags import flag

    if planner:
        flag(p, "--planner", env="PLANNER", default=DEFAULT_PLANNER, help="planner address")
    if dispatchers:
        flag(p, "--dispatchers", "--dispatcher", dest="dispatchers", env=("DISPATCHERS", "DISPATCHER"),
             default=dispatchers_default, empty_is_default=True, shown=dispatchers_default or "none",
             help="dispatcher addresses, comma-separated")
    if collector:
        flag(p, "--collector", env="COLLECTOR", default=DEFAULT_COLLECTOR, help="collector address")


def lab_module(name: str, *, optional: bool = False):
    """A module of the `lab` extra (matplotlib, tqdm): a one-line CliError when it is not
    installed, or None when `optional` (the command then does without it)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name.split(".")[0]:
            raise
        if optional:
            return None
        raise CliError(f"{name} is not installed: this command needs the lab extra "
                       "(pip install 'cacheroute[lab]')") from None


def _error(message: str) -> int:
    print(f"cacheroute: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


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
        return _error(str(exc))
    except grpc.RpcError as exc:   # a call a command did not expect to fail: still one line
        return _error(f"{exc.code().name}: {exc.details()}")  # type: ignore[attr-defined]
    except (OSError, ValueError) as exc:
        return _error(f"{type(exc).__name__}: {exc}" if isinstance(exc, OSError) else str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
