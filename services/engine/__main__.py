"""`cacheroute serve engine` / `python -m services.engine`: one simulated engine replica.

Environment variables (flags override them):
  CACHEROUTE_REPLICA_ID (engine-0)            id reported in chunks, stats and telemetry
  CACHEROUTE_PROFILE (llama3-8b-h100)         engine profile (services.core.engine.PROFILES)
  CACHEROUTE_TIME_SCALE (1.0)                 wall seconds slept per model second
  CACHEROUTE_KV_BLOCKS (profile's)            KV pool size in 16-token blocks
  CACHEROUTE_COLLECTOR ("")                   collector address for cache stats (off if empty)
  CACHEROUTE_REPORT_INTERVAL (1.0)            seconds between cache-stat reports
  CACHEROUTE_MAX_PROMPT_TOKENS (131072)       longer prompts are INVALID_ARGUMENT
  CACHEROUTE_MAX_OUTPUT_TOKENS (8192)         larger max_tokens is INVALID_ARGUMENT
  CACHEROUTE_MAX_REQUESTS (4096)              more in flight is RESOURCE_EXHAUSTED
  CACHEROUTE_HTTP_PORT (-1)                   OpenAI HTTP API port (services/engine/http.py), -1 off, 0 ephemeral
"""

from __future__ import annotations

import argparse
import sys

from services.core.engine import get_profile
from services.engine.service import EngineConfig, serve
from services.engine.servicer import Limits
from services.flags import flag
from services.rpc import add_server_flags, run_service, server_config


def parse_args(argv: list[str] | None) -> EngineConfig:
    parser = argparse.ArgumentParser(prog="cacheroute serve engine", description="A simulated engine replica.",
                                     epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_flags(parser, default_port=50061, default_metrics_port=9161)
    g = parser.add_argument_group("engine")
    flag(g, "--replica-id", env="REPLICA_ID", default="engine-0", help="id reported in chunks, stats and telemetry")
    flag(g, "--profile", env="PROFILE", default="llama3-8b-h100", help="engine profile (services.core.engine.PROFILES)")
    flag(g, "--time-scale", env="TIME_SCALE", default=1.0, type=float, help="wall seconds per model second")
    kv = flag(g, "--kv-blocks", env="KV_BLOCKS", default=0, type=int, shown="0 = the profile's",
              help="KV pool in 16-token blocks")
    kv.default = kv.default or None
    flag(g, "--collector", env="COLLECTOR", default="", shown='"" = off', help="collector address for cache stats")
    flag(g, "--report-interval", env="REPORT_INTERVAL", default=1.0, type=float,
         help="seconds between cache-stat reports")
    flag(g, "--max-prompt-tokens", env="MAX_PROMPT_TOKENS", default=131072, type=int,
         help="longer prompts are INVALID_ARGUMENT")
    flag(g, "--max-output-tokens", env="MAX_OUTPUT_TOKENS", default=8192, type=int,
         help="larger max_tokens is INVALID_ARGUMENT")
    flag(g, "--max-requests", env="MAX_REQUESTS", default=4096, type=int, help="more in flight is RESOURCE_EXHAUSTED")
    flag(g, "--http-port", env="HTTP_PORT", default=-1, type=int,
         help="OpenAI HTTP API port (services/engine/http.py), -1 = off, 0 = ephemeral")
    args = parser.parse_args(argv)
    try:
        get_profile(args.profile)
    except ValueError as exc:
        parser.error(str(exc))
    if args.time_scale <= 0:
        parser.error("--time-scale must be > 0")
    return EngineConfig(
        server=server_config("engine", args), replica_id=args.replica_id, profile=args.profile,
        time_scale=args.time_scale, kv_blocks=args.kv_blocks, collector=args.collector,
        report_interval=args.report_interval,
        limits=Limits(max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens),
        max_requests=args.max_requests, http_port=args.http_port)


def main(argv: list[str] | None = None) -> int:
    return run_service("engine", lambda: parse_args(argv), serve)


if __name__ == "__main__":
    sys.exit(main())
